"""Where `nvhook setup` keeps what was there before its first change of a file.

One record per target in the store, STORE_DIR (/var/lib/nvhook/setup; --backup-dir
names another), named by a hash of the target's path: what was there (a file's bytes,
mode and owner; a symlink's target; or that there was nothing), sealed with a keyed
BLAKE2b MAC over the target's path and all of that. The key (KEY_NAME, 32 random
bytes, 0600, made with O_EXCL + link the first time a record is written) lives in the
directory above the default store (/var/lib/nvhook, beside the snapshots' key); with
--backup-dir D it lives in D itself (never above it: D's parent may be anyone's, e.g.
/tmp), beside the records, whose names never clash with it.

Why a store: a directory beside the engine's file may be writable by others (a sticky
one, a group's), and a backup planted there was put back by --undo. Why sealed: /var/lib
is a directory administrators sometimes hand to a container as a volume, so a record
read back from it is untrusted input; one this node's key did not seal (forged, edited,
another target's record moved to this one's name) is refused, never restored. Both
directories must be ours alone (owned by us, writable by nobody else; made 0700), and
each component of the path is opened without following a symlink, so nothing on the
way can send our writes elsewhere. Limit: a process that can read the key (root given
all of /var/lib/nvhook) can seal a record; it can as well rewrite the engines' own
state under /var/lib, so it is not a neighbour this could stop.
"""
from __future__ import annotations

import errno
import json
import os
import stat

from libinject import hostkey
from libinject.errors import NvhookError

STORE_DIR = "/var/lib/nvhook/setup"
KEY_NAME = "setup.key"
KEY_BYTES = hostkey.KEY_BYTES
MAGIC = b"nvhook-setup-backup 1\n"
SUFFIX = ".backup"
MAX_HEADER = 4096
_MAC_HEX = 64
_FIELDS = {"path": str, "kind": str, "mode": int, "uid": int, "gid": int}
_KINDS = ("file", "link", "none")

try:
    from _operator import _compare_digest   # hmac.compare_digest, without OpenSSL
except ImportError:  # pragma: no cover
    from hmac import compare_digest as _compare_digest


class BackupRefused(NvhookError):
    """A backup nvhook did not write (or cannot tell it did): never restored."""


class Record:
    """What was at `path` before the first run: kind "file" (data: bytes, with mode,
    uid, gid), "link" (data: its target) or "none" (no file)."""

    __slots__ = ("path", "kind", "data", "mode", "uid", "gid")

    def __init__(self, path: str, kind: str, data: bytes = b"", mode: int = 0, uid: int = 0,
                 gid: int = 0) -> None:
        self.path, self.kind, self.data = path, kind, data
        self.mode, self.uid, self.gid = mode, uid, gid

    def header(self) -> bytes:
        return json.dumps({"path": self.path, "kind": self.kind, "mode": self.mode,
                           "uid": self.uid, "gid": self.gid}, sort_keys=True).encode()


def name_for(path: str) -> str:
    """The record's file name for target `path` (absolute)."""
    import hashlib

    return hashlib.blake2b(os.fsencode(path), digest_size=16, person=b"nvhook-setup").hexdigest() + SUFFIX


def _mac(key: bytes, body: bytes) -> bytes:
    import hashlib

    return hashlib.blake2b(body, digest_size=32, key=key, person=b"nvhook-setup").hexdigest().encode()


def seal(key: bytes, rec: Record) -> bytes:
    body = rec.header() + b"\n" + rec.data
    return MAGIC + _mac(key, body) + b"\n" + body


def unseal(key: bytes, data: bytes, path: str, shown: str) -> Record:
    """The record in `data` if `key` sealed it for target `path`; else BackupRefused."""
    def bad(why: str) -> BackupRefused:
        return BackupRefused(f"{shown} (the backup of {path}): {why}; not restored, nothing changed")

    if not data.startswith(MAGIC):
        raise bad("not a backup nvhook setup wrote")
    rest = data[len(MAGIC):]
    mac, body = rest[:_MAC_HEX], rest[_MAC_HEX + 1:]
    if rest[_MAC_HEX:_MAC_HEX + 1] != b"\n" or not _compare_digest(mac, _mac(key, body)):
        raise bad("its seal does not match: not written by nvhook setup with this node's key")
    head, nl, payload = body.partition(b"\n")
    try:
        h = json.loads(head) if nl and len(head) <= MAX_HEADER else None
    except ValueError:
        h = None
    # Sealed by us, so well-formed unless the key is shared with something else: still checked.
    if (not isinstance(h, dict) or h.keys() != _FIELDS.keys()
            or any(type(h[k]) is not t for k, t in _FIELDS.items())
            or h["kind"] not in _KINDS or not 0 <= h["mode"] <= 0o7777
            or not 0 <= h["uid"] < 0xFFFFFFFF or not 0 <= h["gid"] < 0xFFFFFFFF
            or (h["kind"] == "none" and payload)
            or (h["kind"] == "link" and (not payload or b"\0" in payload))):
        raise bad("not a backup nvhook setup wrote")
    if h["path"] != path:
        raise bad(f"it is the backup of {h['path']}, not of this file")
    return Record(path, h["kind"], payload, h["mode"], h["uid"], h["gid"])


# -- the directory and its key --------------------------------------------------------------

def _ours_alone(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def open_store(directory: str, create: bool) -> tuple[int, int] | None:
    """fds of (the directory that holds the key: the one above the default store, else
    the store itself; the store), each
    component of the path opened with O_NOFOLLOW (a symlink anywhere on the way is
    refused); a missing one is made (0700) when `create`, else None is returned.
    Refused unless both are ours alone."""
    directory = os.path.abspath(directory)
    parts = [p for p in directory.split("/") if p]
    if not parts:
        raise NvhookError("backup directory /: name a directory of its own; nothing changed")
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    up, fd = -1, os.open("/", flags)
    at = "/"
    try:
        for part in parts:
            at = os.path.join(at, part)
            try:
                nfd = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    return None
                try:
                    os.mkdir(part, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
                nfd = os.open(part, flags, dir_fd=fd)
            if up >= 0:
                os.close(up)
            up, fd = fd, nfd
        if directory != STORE_DIR:
            os.close(up)
            up = os.dup(fd)
        for d, dfd in ((key_dir(directory), up), (directory, fd)):
            if not _ours_alone(os.fstat(dfd)):
                raise NvhookError(f"backup directory {d} must be owned by root and writable by "
                                  "nobody else; nothing changed")
        out, up, fd = (up, fd), -1, -1
        return out
    except OSError as e:
        if _is_link(at):
            raise NvhookError(f"backup directory {directory}: {at} is a symlink (not followed); "
                              "nothing changed") from None
        raise NvhookError(f"backup directory {at}: {e.strerror}; nothing changed") from None
    finally:
        for x in (up, fd):
            if x >= 0:
                os.close(x)


def key_dir(directory: str) -> str:
    """Where the key of the store `directory` is (see open_store)."""
    directory = os.path.abspath(directory)
    return os.path.dirname(directory) if directory == STORE_DIR else directory


def _close(fds: tuple[int, int]) -> None:
    for fd in fds:
        os.close(fd)


def _is_link(path: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def _key_at(dfd: int) -> bytes | None:
    return hostkey.key_at(dfd, KEY_NAME)


def _ensure_key(dfd: int) -> bytes:
    """The store's key, made if there is none. One that is not ours alone is refused,
    not replaced: records sealed with it would be refused too, and removing it is the
    administrator's call."""
    return hostkey.ensure_key(dfd, KEY_NAME, replace_unusable=False)


# -- records --------------------------------------------------------------------------------

def read(directory: str, path: str, limit: int) -> tuple[Record, str] | None:
    """(the record of target `path`, where it is), or None when there is none.
    BackupRefused for one this node's key did not seal for `path`."""
    fds = open_store(directory, create=False)
    if fds is None:
        return None
    name = name_for(path)
    shown = os.path.join(os.path.abspath(directory), name)

    def bad(why: str) -> BackupRefused:
        return BackupRefused(f"{shown} (the backup of {path}): {why}; not restored, nothing changed")

    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fds[1])
        except FileNotFoundError:
            return None
        except OSError as e:
            raise bad("a symlink" if e.errno == errno.ELOOP else e.strerror) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not _ours_alone(st):
                raise bad("not a file of root's alone")
            # Bounded before reading: a record is its header and at most `limit` bytes.
            cap = len(MAGIC) + _MAC_HEX + 1 + MAX_HEADER + 1 + limit
            if st.st_size > cap:
                raise bad("larger than any backup nvhook setup writes")
            data = read_all(fd, cap)
        finally:
            os.close(fd)
        key = _key_at(fds[0])
        if key is None:
            raise bad(f"no usable key {os.path.join(key_dir(directory), KEY_NAME)}")
        return unseal(key, data, path, shown), shown
    finally:
        _close(fds)


def read_all(fd: int, cap: int) -> bytes:
    """fd's bytes, at most cap + 1 (one more: the caller can tell it was larger)."""
    chunks, n = [], 0
    while n <= cap:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
        n += len(chunk)
    return b"".join(chunks)[:cap + 1]


def write(directory: str, rec: Record) -> str:
    """Seal and keep `rec` (the store and its key made if missing); where it is."""
    from libinject.linux.atomic import write_at

    fds = open_store(directory, create=True)
    assert fds is not None
    try:
        name = name_for(rec.path)
        try:
            write_at(fds[1], name, seal(_ensure_key(fds[0]), rec), 0o600)
        except OSError as e:
            raise NvhookError(f"cannot keep the backup of {rec.path} in {directory}: {e.strerror}; "
                              "nothing changed") from None
        return os.path.join(os.path.abspath(directory), name)
    finally:
        _close(fds)


def remove(directory: str, path: str) -> None:
    """Drop target `path`'s record (none there: nothing to do)."""
    fds = open_store(directory, create=False)
    if fds is None:
        return
    try:
        os.unlink(name_for(path), dir_fd=fds[1])
    except FileNotFoundError:
        pass
    except OSError as e:
        raise NvhookError(f"cannot remove the backup of {path} from {directory}: {e.strerror}") from None
    finally:
        _close(fds)
