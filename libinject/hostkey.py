"""Root-only MAC keys: one home for the keys that seal what nvhook reads back from host
directories a container could be given as a volume (snapshots: libinject.discover.snapshot;
the journal, whose key is derived from the default snapshot dir's: journal_key();
setup's backups: libinject.setup.store).

A key is KEY_BYTES random bytes in a file of its own directory, made whole in a temp
file (O_EXCL, 0600) and linked into place, which fails if another writer made one first
(theirs is used: nobody ever reads a half-written key). A key is used only while it is
ours alone: a regular file of our uid, 0600 or less, of exactly KEY_BYTES.
"""
from __future__ import annotations

import os
import stat

from libinject.constants import SNAPSHOT_KEY_DIR
from libinject.linux import atomic

KEY_BYTES = 32
SNAPSHOT_KEY = "snapshot.key"   # the snapshots' key (its name in its directory)


def key_at(dfd: int, name: str) -> bytes | None:
    """The key `name` in directory dfd if it is ours alone, else None."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077
                or st.st_size != KEY_BYTES):
            return None
        data = os.read(fd, KEY_BYTES + 1)
        return data if len(data) == KEY_BYTES else None
    finally:
        os.close(fd)


def ensure_key(dfd: int, name: str, *, replace_unusable: bool) -> bytes:
    """The key `name` in dfd, made if there is none. One there that is not ours alone is
    replaced (replace_unusable: what it sealed is only a cache, rebuilt) or refused with
    PermissionError (what it sealed must not be lost without the administrator)."""
    key = key_at(dfd, name)
    if key is not None:
        return key
    new = os.urandom(KEY_BYTES)
    tmp = f".{name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    try:
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, new)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
        except FileExistsError:
            key = key_at(dfd, name)
            if key is not None:
                return key
            if not replace_unusable:
                raise PermissionError(13, "a key file that is not ours alone") from None
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        return new
    finally:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass


def own_key(kdir: str, name: str, *, replace_unusable: bool = True) -> bytes:
    """The key `name` in directory kdir, made if there is none (kdir too: root-only;
    ensure_key for replace_unusable). OSError when it cannot be, or when kdir is not
    ours alone."""
    os.makedirs(kdir, mode=0o700, exist_ok=True)
    kfd = atomic.open_dir(kdir)
    try:
        st = os.fstat(kfd)
        if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise PermissionError(f"{kdir} is not ours alone")
        return ensure_key(kfd, name, replace_unusable=replace_unusable)
    finally:
        os.close(kfd)


def journal_key() -> bytes | None:
    """The journal's MAC key (libinject.apply.journal): derived from the host key of the
    default snapshot dir (root-only, in /var/lib/nvhook, made if missing), so no writer
    of /run can seal a record. None where there is none and none can be made (a
    read-only /var/lib)."""
    try:
        from _blake2 import blake2b  # hashlib would load OpenSSL first (~2.5 ms)
    except ImportError:  # pragma: no cover
        from hashlib import blake2b

    try:
        host = own_key(SNAPSHOT_KEY_DIR, SNAPSHOT_KEY)
    except OSError:
        return None
    return blake2b(key=host, person=b"nvhook-jkey", digest_size=32).digest()
