"""What every `nvhook setup` target shares: one file put in place atomically, what was
there before kept for --undo, and the change shown as a unified diff for --dry-run.

A Target is one file nvhook manages. The first run that changes it keeps what was
there (bytes, mode, owner; or the symlink; or that there was nothing) as a sealed
record in the store (libinject.setup.store: /var/lib/nvhook/setup, root's alone);
later runs keep that first record, so --undo always puts back what was there before
nvhook. Nothing is kept beside the file any more: a directory there may be writable by
others, and a backup planted in it was put back. An earlier nvhook's NAME.nvhook-backup
(or empty NAME.nvhook-none) beside the file -- or, for a drop-in in a directory the
engine reads whole, in the directory above -- is still put back by --undo when only
root could have put it there (Target._legacy); any other is refused, as is a store
record this node's key did not seal. For an engine's config that others edit too (a
Target with fmt "toml" or "json"), the settings each run set are recorded as well, and
--undo takes out only those that still hold nvhook's value, keeping later edits
(libinject.setup.threeway). Writes go through libinject.linux.atomic (a temp
file made with O_EXCL | O_NOFOLLOW, fsync'ed, renamed over the name; directories
opened with O_NOFOLLOW): a reader sees the old file or the new one.
"""
from __future__ import annotations

import errno
import os
import stat

from libinject.errors import NvhookError
from libinject.setup import store

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, NoReturn

# An earlier nvhook's backups beside the file (read by --undo, never written now):
BACKUP = ".nvhook-backup"       # NAME + this: the file that was there before the first run
NONE = ".nvhook-none"           # NAME + this (empty): there was none, --undo removes NAME
MAX_FILE = 1 << 20


class Entry:
    """What a directory entry is: kind "file" (data: its bytes) or "link" (data: its
    target), with its stat (None for one not written yet)."""

    __slots__ = ("kind", "data", "st")

    def __init__(self, kind: str, data: bytes, st: os.stat_result | None = None) -> None:
        self.kind, self.data, self.st = kind, data, st

    @classmethod
    def file(cls, data: bytes, like: Entry | None = None) -> Entry:
        """A file with `data`; with the mode and owner of `like` (a file there now)."""
        return cls("file", data, like.st if like is not None and like.kind == "file" else None)

    @classmethod
    def read(cls, dfd: int, name: str, shown: str, limit: int = MAX_FILE) -> Entry | None:
        """Entry `name` of dfd (None if there is none); shown: its path, for messages."""
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                return cls("link", os.fsencode(os.readlink(name, dir_fd=dfd)), st)
            if not stat.S_ISREG(st.st_mode):
                raise NvhookError(f"{shown} is neither a file nor a symlink")
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
            try:
                data = b""
                while len(data) <= limit:
                    chunk = os.read(fd, 1 << 16)
                    if not chunk:
                        break
                    data += chunk
            finally:
                os.close(fd)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise NvhookError(f"{shown}: {e.strerror}") from None
        if len(data) > limit:
            raise NvhookError(f"{shown} is larger than {limit} bytes")
        return cls("file", data, st)

    def same(self, other: Entry | None) -> bool:
        """Would writing self change nothing where other is?"""
        return (other is not None and other.kind == self.kind and other.data == self.data
                and (other.st is None or self.kind == "link"
                     or stat.S_IMODE(other.st.st_mode) == self.mode))

    @property
    def mode(self) -> int:
        return stat.S_IMODE(self.st.st_mode) if self.st is not None else 0o644

    def put(self, dfd: int, name: str) -> None:
        """Make entry `name` of dfd this, atomically (a file: its bytes, mode and owner;
        a link: its target)."""
        from libinject.linux.atomic import discarded_on_error, write_at

        try:
            if self.kind == "link":
                tmp = f".{name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
                os.symlink(self.data, tmp, dir_fd=dfd)
                with discarded_on_error(dfd, tmp):
                    self._chown(dfd, tmp)
                    os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            else:
                write_at(dfd, name, self.data, self.mode)
                self._chown(dfd, name)
        except OSError as e:
            raise NvhookError(f"cannot write {name}: {e.strerror}") from None

    def _chown(self, dfd: int, name: str) -> None:
        if self.st is not None and (self.st.st_uid, self.st.st_gid) != (os.geteuid(), os.getegid()):
            os.chown(name, self.st.st_uid, self.st.st_gid, dir_fd=dfd, follow_symlinks=False)

    def lines(self) -> list[str]:
        if self.kind == "link":
            return [f"(a symlink to {os.fsdecode(self.data)})\n"]
        return self.data.decode(errors="replace").splitlines(keepends=True)


def exists(dfd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dfd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def unlink(dfd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise NvhookError(f"cannot remove {name}: {e.strerror}") from None


def diff(path: str, old: Entry | None, new: Entry | None) -> str:
    """`unchanged: PATH`, or the change from old to new as a unified diff (None: no file)."""
    import difflib

    if (new is None and old is None) or (new is not None and new.same(old)):
        return f"unchanged: {path}\n"
    a = old.lines() if old is not None else []
    b = new.lines() if new is not None else []
    out = []
    for line in difflib.unified_diff(a, b, fromfile=path if old is not None else "/dev/null",
                                     tofile=path if new is not None else "/dev/null"):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    if a == b and old is not None and new is not None:
        out.append(f"mode {oct(old.mode)} -> {oct(new.mode)}\n")
    return "".join(out)


def open_dir(path: str, what: str = "directory") -> int:
    """An O_NOFOLLOW fd of directory path; a missing one is an error naming `what`."""
    from libinject.linux.atomic import open_dir as _open

    try:
        return _open(path)
    except OSError as e:
        raise NvhookError(f"{what} {path}: {e.strerror}") from None


class Installed:
    """What Target.install did: changed (False: the file was already as wanted) and
    where it kept what was there (None: nothing kept this time, or an earlier run kept
    it, or there was no file)."""

    __slots__ = ("changed", "backup")

    def __init__(self, changed: bool, backup: str | None) -> None:
        self.changed, self.backup = changed, backup


class Saved:
    """What the first run found at a target: `entry` (None: there was no file), kept
    at `where` (a record of the store, or an earlier nvhook's NAME.nvhook-backup /
    NAME.nvhook-none: `legacy`, the names to remove once it is put back)."""

    __slots__ = ("entry", "where", "legacy")

    def __init__(self, entry: Entry | None, where: str, legacy: tuple[str, ...] = ()) -> None:
        self.entry, self.where, self.legacy = entry, where, legacy


def _entry_of(rec: store.Record) -> Entry | None:
    if rec.kind == "none":
        return None
    fmt = stat.S_IFLNK if rec.kind == "link" else stat.S_IFREG
    st = os.stat_result((fmt | rec.mode, 0, 0, 1, rec.uid, rec.gid, len(rec.data), 0, 0, 0))
    return Entry(rec.kind, rec.data, st)


def _record_of(path: str, cur: Entry | None) -> store.Record:
    if cur is None:
        return store.Record(path, "none")
    st = cur.st
    assert st is not None
    return store.Record(path, cur.kind, cur.data, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)


class Target:
    """One file nvhook manages: `path`, with what was there before the first run kept
    in the store (libinject.setup.store: `store`, default STORE_DIR). `legacy_dir` is
    where an earlier nvhook kept its NAME.nvhook-backup (default: the file's own
    directory), still put back by --undo when it is provably root's (_legacy). With
    `make_dirs`, a missing directory is made (0755) when the file is first written."""

    def __init__(self, path: str, legacy_dir: str | None = None, *, store: str | None = None,
                 make_dirs: bool = False, limit: int = MAX_FILE, fmt: str | None = None) -> None:
        self.path = os.path.abspath(path)
        # "toml" / "json": an engine's config that others edit too; --undo takes back only
        # nvhook's settings (libinject.setup.threeway). None: a file that is wholly nvhook's.
        self.fmt = fmt
        self.dir, self.name = os.path.split(self.path)
        self.legacy_dir = os.path.abspath(legacy_dir) if legacy_dir else self.dir
        self.store = store
        self.make_dirs = make_dirs
        self.limit = limit

    @property
    def store_dir(self) -> str:
        return self.store or store.STORE_DIR

    @property
    def backup_name(self) -> str:
        return self.name + BACKUP

    # -- reading --

    def _dfd(self, path: str) -> int | None:
        """fd of directory path, or None when it is missing and make_dirs allows that."""
        if self.make_dirs and not os.path.lexists(path):
            return None
        return open_dir(path)

    def read(self) -> Entry | None:
        """What is at path now (None: nothing, or no directory yet)."""
        dfd = self._dfd(self.dir)
        if dfd is None:
            return None
        try:
            return Entry.read(dfd, self.name, self.path, self.limit)
        finally:
            os.close(dfd)

    def saved(self) -> Saved | None:
        """What the first run found (None: no backup). store.BackupRefused for one
        nvhook cannot show it wrote: the store's record when there is one, else an
        earlier nvhook's beside the file."""
        found = store.read(self.store_dir, self.path, self.limit)
        if found is not None:
            rec, where = found
            return Saved(_entry_of(rec), where)
        return self._legacy()

    def _legacy(self) -> Saved | None:
        """An earlier nvhook's NAME.nvhook-backup (or empty NAME.nvhook-none) in
        legacy_dir, trusted only if nobody but root could have put it there: a regular
        file, root's, writable by nobody else, with one link, in a directory of root's
        that nobody else can write (not even a sticky one). Anything else is refused:
        a user who could write that directory may have planted it."""
        bfd = self._dfd(self.legacy_dir)
        if bfd is None:
            return None
        try:
            names = [n for n in (self.backup_name, self.name + NONE) if exists(bfd, n)]
            if not names:
                return None
            dst = os.fstat(bfd)
            shown = os.path.join(self.legacy_dir, names[0])
            if dst.st_uid != 0 or dst.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                self._refuse(shown, f"its directory {self.legacy_dir} is not root's alone")
            entries = [self._legacy_file(bfd, n) for n in names]
        finally:
            os.close(bfd)
        # Both there (never by one nvhook): the backup is what to put back, as before.
        entry = entries[0] if names[0] == self.backup_name else None
        if entry is None and entries[0].data:
            self._refuse(shown, "not empty")
        return Saved(entry, shown, tuple(names))

    def _legacy_file(self, bfd: int, name: str) -> Entry:
        shown = os.path.join(self.legacy_dir, name)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=bfd)
        except OSError as e:
            self._refuse(shown, "a symlink" if e.errno == errno.ELOOP else e.strerror)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self._refuse(shown, "not a regular file")
            if st.st_uid != 0:
                self._refuse(shown, f"owned by uid {st.st_uid}, not root")
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                self._refuse(shown, f"mode {oct(stat.S_IMODE(st.st_mode))}: writable by others")
            if st.st_nlink != 1:
                self._refuse(shown, f"{st.st_nlink} links to it")
            if st.st_size > self.limit:
                self._refuse(shown, f"larger than {self.limit} bytes")
            data = store.read_all(fd, self.limit)
        finally:
            os.close(fd)
        if len(data) > self.limit:
            self._refuse(shown, f"larger than {self.limit} bytes")
        return Entry("file", data, st)

    def _refuse(self, shown: str, why: str) -> NoReturn:
        raise store.BackupRefused(f"{shown}: not trusted as the backup an earlier nvhook kept of "
                                  f"{self.path} ({why}); not restored, nothing changed (check it, "
                                  "then put it back by hand or remove it)")

    def has_backup(self) -> bool:
        return self.saved() is not None

    # -- the settings nvhook set (fmt files) --

    @property
    def _changes_key(self) -> str:
        # A record of its own in the store, sealed for this name (never taken for the backup).
        return self.path + "\0changes"

    def changes(self) -> dict | None:
        """The settings nvhook set in this file (key path -> value), None if none were
        recorded (a file set up by an earlier nvhook, or not a fmt file)."""
        from libinject.setup import threeway

        if self.fmt is None:
            return None
        found = store.read(self.store_dir, self._changes_key, self.limit)
        if found is None:
            return None
        rec, where = found
        changes = threeway.decode(rec.data)
        if changes is None:
            raise store.BackupRefused(f"{where} (the settings nvhook set in {self.path}): not a record "
                                      "nvhook setup wrote; not used, nothing changed")
        return changes

    def _record_changes(self, before: Entry | None, wanted: Entry, saved: Saved | None) -> None:
        """Add what this run set to the record (before: the file as this run found it).
        A file whose backup an earlier nvhook kept without a record: everything that
        differs from that backup counts as nvhook's."""
        from libinject.setup import threeway

        try:
            old = self.changes() or {}
            if saved is not None and not old and (saved.entry is None or saved.entry.kind == "file"):
                before = saved.entry
            base = threeway.plain(self.fmt, threeway.parse(self.fmt, before.data if before is not None
                                                           and before.kind == "file" else None, self.path))
            new = threeway.changed(base, threeway.plain(self.fmt, threeway.parse(self.fmt, wanted.data, self.path)))
        except NvhookError:
            return          # not parseable as fmt: --undo puts back the whole file, as before
        old.update(new)
        store.write(self.store_dir, store.Record(self._changes_key, "file", threeway.encode(old), 0o600))

    def _undone(self, saved: Saved) -> tuple[Entry | None, str, bool]:
        """What --undo puts at path: (the entry, None for no file; what is said; whether
        to write at all). A fmt file changed since set-up: only nvhook's settings go."""
        from libinject.setup import threeway

        changes = self.changes()
        if changes is None or (saved.entry is not None and saved.entry.kind != "file"):
            return saved.entry, "", True
        cur = self.read()
        if cur is None:
            return None, f"left {self.path} absent: removed since nvhook set it up\n", False
        if cur.kind != "file":
            raise NvhookError(f"{self.path}: a symlink now, not the file nvhook set up; nothing undone "
                              "(put back what was there by hand)")
        try:
            data, kept = threeway.undo(self.fmt, saved.entry.data if saved.entry is not None else None,
                                       cur.data, changes, self.path)
        except NvhookError:
            raise NvhookError(f"{self.path}: changed since nvhook set it up and no longer valid {self.fmt.upper()}: "
                              "cannot tell nvhook's settings from others'; nothing undone (fix the file, "
                              "then run --undo again)") from None
        note = (f"kept in {self.path}, changed since nvhook set them: {', '.join(kept)}\n" if kept else "")
        if data is None:
            return None, note, True
        if saved.entry is not None and data == saved.entry.data:
            return saved.entry, note, True
        return Entry.file(data, cur), note + f"took nvhook's settings out of {self.path}; kept the rest\n", True

    # -- writing --

    def _made_dir(self, path: str) -> int:
        if self.make_dirs and not os.path.lexists(path):
            try:
                os.makedirs(path, 0o755, exist_ok=True)
            except OSError as e:
                raise NvhookError(f"cannot make directory {path}: {e.strerror}") from None
        return open_dir(path)

    def install(self, wanted: Entry, cur: Entry | None) -> Installed:
        """Put `wanted` at path (`cur`: what read() found), keeping what was there first."""
        if wanted.same(cur):
            return Installed(False, None)
        saved = self.saved()                    # refused: before anything is written
        dfd = self._made_dir(self.dir)
        try:
            made = None if saved is not None else store.write(self.store_dir, _record_of(self.path, cur))
            try:
                if self.fmt is not None:
                    self._record_changes(cur, wanted, saved)
                wanted.put(dfd, self.name)
            except BaseException:
                if made:
                    store.remove(self.store_dir, self.path)
                    if self.fmt is not None:
                        store.remove(self.store_dir, self._changes_key)
                raise
            return Installed(True, made if cur is not None else None)
        finally:
            os.close(dfd)

    def undo(self) -> str | None:
        """Put back what the first run found (or remove the file if it found none) and
        drop the backup: what was done, or None if there is no backup."""
        saved = self.saved()
        if saved is None:
            return None
        entry, note, write = self._undone(saved)
        dfd = open_dir(self.dir)
        try:
            if not write:
                what = note.rstrip("\n")
            elif entry is not None and entry is saved.entry:
                entry.put(dfd, self.name)
                what = note + f"restored {self.path} from {saved.where}"
            elif entry is not None:
                entry.put(dfd, self.name)
                what = note.rstrip("\n")
            else:
                unlink(dfd, self.name)
                what = note + f"removed {self.path}"
        finally:
            os.close(dfd)
        if saved.legacy:
            bfd = open_dir(self.legacy_dir)
            try:
                for name in saved.legacy:
                    unlink(bfd, name)
            finally:
                os.close(bfd)
        else:
            store.remove(self.store_dir, self.path)
        if self.fmt is not None:
            store.remove(self.store_dir, self._changes_key)
        return what

    def undo_diff(self) -> str | None:
        """--undo --dry-run: the diff undo() would make, or None if there is no backup."""
        saved = self.saved()
        if saved is None:
            return None
        entry, note, write = self._undone(saved)
        cur = self.read()
        return note + diff(self.path, cur, entry if write else cur)


def nothing_to_undo(path: str) -> str:
    return f"nothing to undo: nvhook setup has kept no backup of {path}\n"


def edit_file(target: Target, edit: Callable[[bytes | None], bytes], *, dry_run: bool = False,
              undo: bool = False) -> tuple[bool, str]:
    """The whole run for one config file: `edit(current bytes or None) -> wanted bytes`
    (raises NvhookError for a file it cannot parse: nothing is written). Returns
    (changed or would change, the text to show). A symlink at path is refused: the
    engine reads the file it points to, so that is the one to name with --config."""
    if undo:
        text = target.undo_diff() if dry_run else target.undo()
        if text is None:
            return False, nothing_to_undo(target.path)
        return True, text if dry_run else text + "\n"
    cur = target.read()
    if cur is not None and cur.kind == "link":
        raise NvhookError(f"{target.path} is a symlink: name the file it points to with --config")
    wanted = Entry.file(edit(cur.data if cur is not None else None), cur)
    if dry_run:
        if not wanted.same(cur):
            target.saved()      # a backup the real run would refuse: refused now
        return not wanted.same(cur), diff(target.path, cur, wanted)
    done = target.install(wanted, cur)
    if not done.changed:
        return False, f"unchanged: {target.path}\n"
    return True, f"wrote {target.path}" + (f" (the one there before: {done.backup})" if done.backup else "") + "\n"


def venv_program(name: str, check: bool = True) -> str:
    """This install's program `name` beside the venv's python (`make venv` builds the
    compiled fronts nvhook-hook and nvhook-runtime there); check: that it is there and
    only root could have put it there (trusted_program)."""
    from libinject.installpath import program

    path = program(name)
    if check and not os.access(path, os.X_OK):
        raise NvhookError(f"no {name} at {path} (`make venv` builds it)")
    if check:
        trusted_program(path)
    return path


def trusted_program(path: str) -> None:
    """Refuse to point an engine (or systemd) at `path` unless the file and every
    directory above it are root's and writable by nobody else (a sticky directory may
    be): root runs it on every container start, and a venv a user can write would be
    that user's root."""
    import stat

    real = os.path.realpath(path)
    st = os.stat(real)
    if st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise NvhookError(f"{real} must be owned by root and writable by nobody else: root "
                          "would run it for every container")
    d = os.path.dirname(real)
    while True:
        dst = os.stat(d)
        if dst.st_uid != 0 or (dst.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not dst.st_mode & stat.S_ISVTX):
            raise NvhookError(f"directory {d} (above {real}) must be owned by root and writable "
                              "by nobody else: root would run what is in it for every container")
        if d == "/":
            return
        d = os.path.dirname(d)
