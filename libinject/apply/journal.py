"""The apply's journal: what it did to a container rootfs, so it can be undone.

A Journal records every mount and every entry created or replaced; rollback() undoes
them in reverse order (all-or-nothing apply). With a DiskJournal it also writes each
step to /run/nvhook/journal, so that what a killed apply left in the rootfs is undone
by the next apply on it (RootFS.replay): a mount's record ahead of it (a phase's
mounts in one write, expect_mounts; each names the very mount, so the replay passes
over a record whose mount a kill prevented), a replaced entry's ahead of the rename,
a new entry's right after the syscall that made it (its identity is known only then),
a temp file's name before it is made. The records are sealed and bound to the rootfs
(DiskJournal): a writer of /run can neither forge them nor aim them at another rootfs.

RootFS's replay() is here (ReplayMixin): the undoing of those records, after a kill.
"""
from __future__ import annotations

import binascii
import fcntl
import os
import stat
import time

from libinject import jsonc
from libinject.errors import NvhookError
from libinject.hostkey import journal_key
from libinject.linux import atomic, native
from libinject.linux.proc import proc_fd
from libinject.linux.resolve import RESOLVE, openat2, split
from libinject.record import field, record

try:
    from _blake2 import blake2b as _blake2b    # hashlib would load OpenSSL first (~2.5 ms)
except ImportError:  # pragma: no cover
    from hashlib import blake2b as _blake2b
try:
    from _operator import _compare_digest       # hmac's, without OpenSSL
except ImportError:  # pragma: no cover
    from hmac import compare_digest as _compare_digest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Iterable

SAVE_LIMIT = 1 << 24        # the largest image file we save for rollback (ld.so.cache)
JOURNAL_DIR = "/run/nvhook/journal"
JOURNAL_WAIT = 60.0         # s to wait for another apply on the same rootfs to finish


def umount_fd(mnt_fd: int) -> None:
    """Detach the mount whose root mnt_fd refers to (through /proc/self/fd/N of the
    /proc taken by proc_fd(), whatever the namespace's own /proc is)."""
    cwd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fchdir(proc_fd())
        native.umount2(f"self/fd/{mnt_fd}", native.MNT_DETACH)
    finally:
        os.fchdir(cwd)
        os.close(cwd)


class DiskJournal:
    """The journal's write-ahead copy on the host, for what a killed apply leaves (a
    runtime's hook timeout, serve-timeout): lines in a root-only file
    /run/nvhook/journal/<hash of the rootfs path>, locked (flock) while an apply runs
    and removed when it ends, committed or rolled back. A file found unlocked is what a
    killed apply did: `stale` holds its records, for RootFS.replay(). /run is a tmpfs:
    after a reboot nothing is replayed.

    /run is not ours alone (a container can be given it as a volume), so nothing read
    back from it is taken on trust. Each line is `MAC JSON`, the MAC a keyed BLAKE2b
    (journal_key: derived from the host key in /var/lib/nvhook, kept apart from /run)
    chained over every line before it, so a line cannot be forged, altered, moved or
    spliced in from another journal. The first line names the rootfs the records are
    about (_rootfs_identity: its path, its root's inode number and birth time; the
    container's id where the file system keeps no birth time). Records are replayed only
    when that is the rootfs now applied to: another container's rootfs made later at
    the same path (a killed start of tenant A, then tenant B) gets none of A's. A
    forged, foreign or oversized journal is a note (`notes`, which the caller logs) and
    is discarded. With no usable key no records are kept (the lock still is): a killed
    apply's leftovers then stay, as before journals, but nothing is replayed unproven.
    Replay itself undoes only what it can see is that apply's (RootFS.replay)."""

    MAX_BYTES = 3 * SAVE_LIMIT      # the largest journal we read back (a saved cache, base64)

    def __init__(self, fd: int, dir_fd: int, name: str, stale: list[dict], header: dict,
                 key: bytes | None, notes: list[str]):
        self.fd, self.dir_fd, self.name, self.stale = fd, dir_fd, name, stale
        self.header, self.key, self.notes = header, key, notes
        self.chain = None       # the MAC state over the lines written; None: no header yet

    @property
    def path(self) -> str:
        return f"{JOURNAL_DIR}/{self.name}"

    @classmethod
    def open(cls, rootfs: str, directory: str = JOURNAL_DIR, wait: float = JOURNAL_WAIT,
             owner: str | None = None, key: bytes | None = None) -> "DiskJournal":
        """The journal of `rootfs` (a host path), locked; waits up to `wait` s for
        another apply on the same rootfs. owner: the container's id, where known.
        key: the MAC key (default: journal_key())."""
        rootfs = os.path.abspath(rootfs)
        header = _rootfs_identity(rootfs, owner)
        if key is None:
            key = journal_key()
        try:
            try:
                dfd = atomic.open_dir(directory)
            except FileNotFoundError:       # (the first apply on this host since boot)
                os.makedirs(directory, 0o700, exist_ok=True)
                dfd = atomic.open_dir(directory)
        except OSError as e:
            raise NvhookError(f"journal directory {directory}: {os.strerror(e.errno)}") from None
        try:
            st = os.fstat(dfd)
            if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                raise NvhookError(f"journal directory {directory} is writable by others than its owner")
            name = _blake2b(os.fsencode(rootfs), digest_size=20).hexdigest() + ".journal"
            fd = cls._lock(dfd, name, time.monotonic() + wait, rootfs, directory)
        except BaseException:
            os.close(dfd)
            raise
        notes: list[str] = []
        stale = cls._read(fd, f"{directory}/{name}", header, key, notes)
        j = cls(fd, dfd, name, stale, header, key, notes)
        if not stale and (notes or os.lseek(fd, 0, os.SEEK_CUR)):
            j.restart()     # (nothing of ours in it: start it afresh)
        return j

    @classmethod
    def _read(cls, fd: int, path: str, header: dict, key: bytes | None, notes: list[str]) -> list[dict]:
        """The records of a killed apply on this very rootfs, each checked against its
        MAC; what is not (forged, foreign, too big) is a note and is not returned."""
        size = os.fstat(fd).st_size
        if size == 0:
            return []
        if key is None:
            notes.append(f"journal {path}: no journal key, its records discarded")
            return []
        if size > cls.MAX_BYTES:
            notes.append(f"journal {path}: {size} bytes, more than any apply writes; discarded")
            return []
        chunks = [os.read(fd, 1 << 16)]
        head = chunks[0].split(b"\n", 1)[0]
        mac, _, body = head.partition(b" ")
        if not _compare_digest(mac, _seal_line(_chain(key), body)):
            # (the header first: a forged file costs what its first line does, not its size)
            notes.append(f"journal {path}: line 1 fails its seal (not written by this host's "
                         "nvhook); it and what follows discarded")
            return []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        lines = b"".join(chunks).split(b"\n")
        lines.pop()             # after the last newline: empty, or the line a kill cut short
        chain, recs = _chain(key), []
        for i, line in enumerate(lines):
            mac, _, body = line.partition(b" ")
            if not _compare_digest(mac, _seal_line(chain, body)):
                notes.append(f"journal {path}: line {i + 1} fails its seal (not written by this "
                             f"host's nvhook); it and what follows discarded")
                break
            try:
                rec = jsonc.loads(body)
            except ValueError:      # (sealed, so ours: never)
                break
            if i == 0:
                if rec != header:
                    notes.append(f"journal {path}: written for another rootfs at this path "
                                 f"(container {rec.get('owner') if isinstance(rec, dict) else None}); "
                                 "discarded")
                    return []
                continue
            if isinstance(rec, dict):
                recs.append(rec)
        return recs

    @staticmethod
    def _lock(dfd: int, name: str, deadline: float, rootfs: str, directory: str) -> int:
        while True:
            try:
                fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=dfd)
            except OSError as e:
                raise NvhookError(f"cannot open journal {directory}/{name} for rootfs {rootfs}: "
                                  f"{os.strerror(e.errno)}") from None
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        os.close(fd)
                        raise NvhookError(f"another nvhook is still applying to rootfs {rootfs}") from None
                    time.sleep(0.01)
            # The apply we waited for removes its file when it ends: lock the one named.
            mine = os.fstat(fd)
            try:
                now = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                if not stat.S_ISREG(mine.st_mode):
                    os.close(fd)
                    raise NvhookError(f"journal {directory}/{name} for rootfs {rootfs} is not a regular file")
                return fd
            os.close(fd)

    def restart(self) -> None:
        """Replayed (or nothing to replay): start the file afresh for this apply's records."""
        try:
            os.ftruncate(self.fd, 0)
        except OSError as e:
            raise NvhookError(f"cannot write journal {self.path}: {os.strerror(e.errno)}") from None
        os.lseek(self.fd, 0, os.SEEK_SET)
        self.stale = []
        self.chain = None

    def write(self, rec: dict) -> None:
        self.write_many((rec,))

    def write_many(self, recs: Iterable[dict]) -> None:
        """Records, sealed, in one write(2) (the header first, with the first ones).
        A kill in the middle of it leaves a cut line, which ends the stale records."""
        if self.key is None:
            return
        out, chain = [], self.chain
        if chain is None:
            recs = (self.header, *recs)
            chain = _chain(self.key)
        else:
            chain = chain.copy()        # (advanced only once the lines are written)
        for rec in recs:
            body = jsonc.dumps(rec, compact=True).encode()
            out.append(_seal_line(chain, body) + b" " + body + b"\n")
        data = b"".join(out)
        try:
            while data:
                data = data[os.write(self.fd, data):]
        except OSError as e:
            raise NvhookError(f"cannot write journal {self.path}: {os.strerror(e.errno)}") from None
        self.chain = chain

    def done(self) -> None:
        """The apply ended (committed, or fully rolled back): nothing to replay; and the
        journals of dead starts go (sweep)."""
        try:
            os.unlink(self.name, dir_fd=self.dir_fd)
        except FileNotFoundError:
            pass
        try:
            self.sweep(self.dir_fd, self.key, self.name)
        except OSError:
            pass        # (only tidying: the next apply tries again)
        self.close()

    SWEEP_MAX = 16      # journals looked at per sweep: what an apply's end may cost

    @classmethod
    def sweep(cls, dfd: int, key: bytes | None, skip: str = "") -> list[str]:
        """Remove the journals no apply can ever replay: a killed start's whose rootfs
        is gone (the container removed) or is another directory now. Kept: those of a
        rootfs still there (its next apply replays them), those an apply holds (locked),
        and any not sealed by us (the apply of its rootfs says so, then discards it). Each is
        opened in the root-only journal dir by fd, never following a link, and removed
        only while we hold its lock and it is still the file of that name. Names removed."""
        if key is None:
            return []       # nothing can be told apart: left as before journals
        gone: list[str] = []
        names = [n for n in os.listdir(dfd) if n.endswith(".journal") and n != skip]
        for name in names[:cls.SWEEP_MAX]:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY,
                             dir_fd=dfd)
            except OSError:
                continue        # (a link, gone meanwhile)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue    # an apply is running on it
                now = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or cls._replayable(fd, key):
                    continue
                os.unlink(name, dir_fd=dfd)
                gone.append(name)
            finally:
                os.close(fd)
        return gone

    @staticmethod
    def _replayable(fd: int, key: bytes) -> bool:
        """Not provably dead: False only for a journal whose first line is sealed by us
        and names a rootfs that is no longer the very directory it was."""
        head = os.read(fd, 1 << 16).split(b"\n", 1)
        if len(head) < 2:
            return True         # no whole header: not ours to judge
        mac, _, body = head[0].partition(b" ")
        if not _compare_digest(mac, _seal_line(_chain(key), body)):
            return True
        try:
            header = jsonc.loads(body)
            return _rootfs_identity(header["rootfs"], header.get("owner")) == header
        except NvhookError:
            return False        # the rootfs is gone
        except (ValueError, KeyError, TypeError):
            return True

    def close(self) -> None:
        """Keep the file (what could not be undone is retried by the next apply)."""
        if self.fd >= 0:
            os.close(self.fd)
            os.close(self.dir_fd)
            self.fd = self.dir_fd = -1


def _chain(key: bytes):
    return _blake2b(digest_size=16, key=key, person=b"nvhook-journal")


def _seal_line(chain, body: bytes) -> bytes:
    """The MAC of a line: over it and every line before it (`chain`, advanced here)."""
    chain.update(body + b"\n")
    return chain.hexdigest().encode()


def _rootfs_identity(rootfs: str, owner: str | None) -> dict:
    """What the journal's records are about: this rootfs (its path, and its root's inode
    number and birth time: a directory made later at the same path, even with a reused
    inode number, is another; the same in every mount namespace, unlike mount ids)."""
    try:
        fd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise NvhookError(f"rootfs {rootfs}: {os.strerror(e.errno)}") from None
    try:
        ino = os.fstat(fd).st_ino
        born = native.birth_time(fd)
    except OSError as e:
        raise NvhookError(f"rootfs {rootfs}: {os.strerror(e.errno)}") from None
    finally:
        os.close(fd)
    # The container's id only where the birth time is unknown: with it, the rootfs is
    # told apart already, and another container on the very same directory (a retry
    # under a new id) is owed the cleanup of what a killed start left there.
    return {"op": "begin", "rootfs": rootfs, "ino": ino, "born": born,
            "owner": owner if born is None else None}


@record
class Journal:
    """Undo log: entries are undone in reverse order; fds are kept until commit.
    `disk`: the write-ahead copy (DiskJournal) of the steps that outlive a killed apply
    (entries on the rootfs's own mount, and mounts), or None."""
    # (what, undo) pairs: plain tuples, ~80 an apply (a record costs 10x a tuple to make)
    entries: list[tuple[str, Callable[[], None]]] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)     # container paths, in order
    created: list[str] = field(default_factory=list)    # container paths, in order
    mount_ids: set[int] = field(default_factory=set)    # mountinfo ids of our mounts
    disk: DiskJournal | None = None
    owner: str | None = None    # the container's id, where known (DiskJournal.open)
    _fds: list[int] = field(default_factory=list)
    generation: int = 0     # bumped by rollback/commit (RootFS drops its cached dirs)

    def keep(self, fd: int) -> int:
        self._fds.append(fd)
        return fd

    def add(self, what: str, undo: Callable[[], None]) -> None:
        self.entries.append((what, undo))

    def record(self, *recs: dict) -> None:
        """Write records ahead (in one write when several)."""
        if self.disk is not None and recs:
            self.disk.write_many(recs)

    def mount(self, path: str, mnt_fd: int) -> None:
        """mnt_fd is the root of the mount we attached; unmount through it (the
        mount itself, whatever happened to the path since)."""
        self.keep(mnt_fd)
        self.mounts.append(path)
        self.add(f"umount {path}", lambda: umount_fd(mnt_fd))

    def create(self, path: str, parent_fd: int, name: str, is_dir: bool,
               st: os.stat_result | None = None, *, durable: bool = False,
               alias: str | None = None) -> None:
        """An entry we made; undo removes it only while it is still the same inode
        (something swapped in since is not ours to delete). durable: on the rootfs's
        own mount, so it outlives the container: recorded on disk (`alias`: the temp
        name it had before a rename, with the same identity)."""
        pfd = self.keep(os.dup(parent_fd))
        self.created.append(path)
        if st is None:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        ident = (st.st_dev, st.st_ino)

        def undo() -> None:
            try:
                now = os.stat(name, dir_fd=pfd, follow_symlinks=False)
            except FileNotFoundError:
                return
            if (now.st_dev, now.st_ino) != ident:
                return
            os.rmdir(name, dir_fd=pfd) if is_dir else os.unlink(name, dir_fd=pfd)
        # Its undo before its record: a record that cannot be written (a full /run)
        # fails the apply, whose rollback must still remove the entry.
        self.add(f"remove {path}", undo)
        if durable:
            self.record({"op": "create", "path": path, "alias": alias, **_identity(st)})

    def temp(self, path: str, parent_fd: int, tmp: str, durable: bool) -> None:
        """A temp entry `tmp` (beside `path`, in parent_fd) about to be made: recorded
        *before* it exists (by name: a kill between its creation and its identity's
        record would otherwise leave it in the image for good); its rollback is
        discarded_on_error's or the rename's."""
        if durable:
            self.record({"op": "temp", "path": path, "alias": tmp})

    def rollback(self) -> list[str]:
        """Undo everything; returns what could not be undone (empty when clean)."""
        errors = []
        for what, undo in reversed(self.entries):
            try:
                undo()
            except OSError as err:
                errors.append(f"{what}: {os.strerror(err.errno)}")
        self.entries.clear()
        self.mounts.clear()
        self.created.clear()
        self.mount_ids.clear()
        self._close()
        self.generation += 1
        if self.disk is not None:
            self.disk.close() if errors else self.disk.done()
            self.disk = None
        return errors

    def commit(self) -> None:
        self.entries.clear()
        self._close()
        self.generation += 1
        if self.disk is not None:
            self.disk.done()
            self.disk = None

    def _close(self) -> None:
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()


def _identity(st: os.stat_result) -> dict:
    """What identifies an entry we made after a remount of the rootfs (an overlay's
    st_dev changes): its inode number and type, and for files and symlinks (whose
    mtime we never change after this) the mtime."""
    kind = "dir" if stat.S_ISDIR(st.st_mode) else "link" if stat.S_ISLNK(st.st_mode) else "file"
    return {"kind": kind, "ino": st.st_ino, "mtime": None if kind == "dir" else st.st_mtime_ns}


def _matches(st: os.stat_result, rec: dict) -> bool:
    return _identity(st) == {"kind": rec.get("kind"), "ino": rec.get("ino"), "mtime": rec.get("mtime")}


def temp_name(name: str) -> str:
    return f".{name}.nvhook-{os.getpid()}-{os.urandom(4).hex()}"


def _is_temp_name(name: str, of: str) -> bool:
    """One of ours for `of` (temp_name): a replayed record never names another file."""
    head = f".{of}.nvhook-"
    return name.startswith(head) and "/" not in name and all(
        c in "0123456789abcdef-" for c in name[len(head):])


def put_back(pfd: int, name: str, rec: dict, saved: bytes | str) -> None:
    """Put a saved entry (rec: its kind, mode, owner, times) back at `name`, by rename."""
    t = f".{name}.nvhook-undo-{os.urandom(4).hex()}"
    if rec["kind"] == "link":
        os.symlink(saved, t, dir_fd=pfd)
    else:
        f = os.open(t, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                    0o600, dir_fd=pfd)
        try:
            view = memoryview(saved)  # type: ignore[arg-type]
            while view:
                view = view[os.write(f, view):]
            os.fchmod(f, rec["mode"])
        finally:
            os.close(f)
    try:
        os.chown(t, rec["uid"], rec["gid"], dir_fd=pfd, follow_symlinks=False)
        os.utime(t, ns=(rec["atime"], rec["mtime"]), dir_fd=pfd, follow_symlinks=False)
        os.rename(t, name, src_dir_fd=pfd, dst_dir_fd=pfd)
    except BaseException:
        os.unlink(t, dir_fd=pfd)
        raise


class ReplayMixin:
    """RootFS.replay(): these fields and resolve() and forget_dirs() are RootFS's."""
    fd: int                     # the rootfs
    mnt_id: int                 # its mount
    _ns: int | None             # our mount namespace's inode, when needed
    _made: dict[str, dict]      # path -> its create record

    def replay(self, records: list[dict]) -> list[str]:
        """Undo what a killed apply recorded (DiskJournal.stale), in the rootfs as it is
        now: mounts first, then the rest, each newest first. An entry is removed only
        while it is still the one recorded (inode, type, mtime) and only on the rootfs's
        own mount; a saved file is put back unless the original is still there; a mount
        is detached only if its root is the recorded source and (recorded in this
        namespace) it is the very mount recorded. Mounts go first since their records
        are written ahead a phase at a time (expect_mounts), before the entries made
        for them, and an entry under a mount cannot be reached to be removed.
        Returns what could not be undone."""
        left = []
        recs = list(reversed(records))
        # The entry each path got from that apply (its newest create record): a saved
        # original is put back only over it, never over what someone else put there.
        self._made = {}
        for r in records:
            if r.get("op") == "create" and isinstance(r.get("path"), str):
                self._made[r["path"]] = r
        for rec in ([r for r in recs if r.get("op") == "mount"]
                    + [r for r in recs if r.get("op") != "mount"]):
            try:
                self._replay(rec)
            except (OSError, NvhookError, KeyError, TypeError, ValueError) as e:
                why = os.strerror(e.errno) if isinstance(e, OSError) and e.errno else str(e)
                left.append(f"{rec.get('op')} {rec.get('path')}: {why}")
        self.forget_dirs()
        return left

    def _replay(self, rec: dict) -> None:
        op, path = rec.get("op"), rec.get("path")
        if not isinstance(path, str):
            return
        if op == "mount":
            # The very mount, when recorded in this namespace; else (older records, or
            # another namespace's: one copied from it has copies of its mounts, with
            # ids of their own) any stacked there with the recorded root.
            if self._ns is None:
                self._ns = os.stat("self/ns/mnt", dir_fd=proc_fd()).st_ino
            mnt = rec.get("mnt") if rec.get("ns") == self._ns else None
            for _ in range(1 if mnt is not None else 8):  # one per mount stacked there
                try:
                    fd = self.resolve(path)
                except OSError:
                    return
                try:
                    st = os.fstat(fd)
                    mid, is_root = native.mount_id(fd)
                    if not is_root or (st.st_dev, st.st_ino) != (rec["dev"], rec["ino"]):
                        return
                    if mnt is not None and mid != mnt:
                        return      # another's mount (or ours never made: a kill came first)
                    umount_fd(fd)
                finally:
                    os.close(fd)
            return
        parts = split(path)
        if not parts:
            return
        try:
            pfd = openat2(self.fd, "/".join(parts[:-1]) or ".",
                          os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, RESOLVE)
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            if native.mount_id(pfd)[0] != self.mnt_id:     # not the rootfs's: not ours
                return
            name = parts[-1]
            if op == "temp":
                alias = rec.get("alias")
                if isinstance(alias, str) and _is_temp_name(alias, name):
                    try:
                        st = os.stat(alias, dir_fd=pfd, follow_symlinks=False)
                    except FileNotFoundError:
                        return
                    if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                        os.unlink(alias, dir_fd=pfd)
            elif op == "create":
                for n in (name, rec.get("alias")):
                    if not n or "/" in n or n in (".", ".."):
                        continue
                    try:
                        st = os.stat(n, dir_fd=pfd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if _matches(st, rec):
                        os.rmdir(n, dir_fd=pfd) if rec["kind"] == "dir" else os.unlink(n, dir_fd=pfd)
            elif op in ("absent", "save"):
                try:
                    st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
                except FileNotFoundError:
                    st = None
                if op == "absent":
                    if st is not None and stat.S_ISREG(st.st_mode):
                        os.unlink(name, dir_fd=pfd)
                    return
                if st is not None and (st.st_ino, st.st_mtime_ns) == (rec["ino"], rec["mtime"]):
                    return      # the original is still there
                made = self._made.get(path)
                if made is not None and (st is None or not _matches(st, made)):
                    return      # not the entry that apply put there: not ours to replace
                data = rec["data"] if rec["kind"] == "link" else binascii.a2b_base64(rec["data"])
                put_back(pfd, name, rec, data)
        finally:
            os.close(pfd)
