"""What every `nvhook setup` target shares: one file put in place atomically, what was
there before kept for --undo, and the change shown as a unified diff for --dry-run.

A Target is one file nvhook manages. The first run that changes it keeps what was
there (bytes, mode, owner; or the symlink) as NAME.nvhook-backup in the target's backup
directory, or an empty NAME.nvhook-none when there was nothing; later runs keep that
first backup, so --undo always puts back what was there before nvhook. The backup
directory is the file's own unless the file is a drop-in in a directory the engine
reads whole (CRI-O reads every file under crio.conf.d, subdirectories too): then it is
the parent of that directory. Writes go through libinject.linux.atomic (a temp file
made with O_EXCL | O_NOFOLLOW, fsync'ed, renamed over the name; directories opened
with O_NOFOLLOW): a reader sees the old file or the new one.
"""
from __future__ import annotations

import os
import stat

from libinject.errors import NvhookError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

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
    """What Target.install did: changed (False: the file was already as wanted) and the
    backup it kept this time (its name, or path when not beside the file; None: none
    kept, or one kept by an earlier run)."""

    __slots__ = ("changed", "backup")

    def __init__(self, changed: bool, backup: str | None) -> None:
        self.changed, self.backup = changed, backup


class Target:
    """One file nvhook manages: `path`, with its backups in `backup_dir` (default: the
    file's own directory). With `make_dirs`, a missing directory is made (0755) when the
    file is first written."""

    def __init__(self, path: str, backup_dir: str | None = None, *, make_dirs: bool = False,
                 limit: int = MAX_FILE) -> None:
        self.path = os.path.abspath(path)
        self.dir, self.name = os.path.split(self.path)
        self.backup_dir = os.path.abspath(backup_dir) if backup_dir else self.dir
        self.make_dirs = make_dirs
        self.limit = limit

    @property
    def backup_name(self) -> str:
        return self.name + BACKUP

    @property
    def backup_path(self) -> str:
        return os.path.join(self.backup_dir, self.backup_name)

    def _shown(self, name: str) -> str:
        """A backup's name as messages show it: bare when it is beside the file."""
        return name if self.backup_dir == self.dir else os.path.join(self.backup_dir, name)

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

    def saved(self) -> tuple[Entry | None, bool]:
        """(the backup kept by the first run, whether that run found no file)."""
        bfd = self._dfd(self.backup_dir)
        if bfd is None:
            return None, False
        try:
            return (Entry.read(bfd, self.backup_name, self.backup_path, self.limit),
                    exists(bfd, self.name + NONE))
        finally:
            os.close(bfd)

    def has_backup(self) -> bool:
        backup, had_none = self.saved()
        return backup is not None or had_none

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
        dfd = self._made_dir(self.dir)
        try:
            bfd = dfd if self.backup_dir == self.dir else self._made_dir(self.backup_dir)
            try:
                made = None
                if not exists(bfd, self.backup_name) and not exists(bfd, self.name + NONE):
                    made = self.name + (NONE if cur is None else BACKUP)
                    (Entry.file(b"") if cur is None else cur).put(bfd, made)
                try:
                    wanted.put(dfd, self.name)
                except BaseException:
                    if made:
                        unlink(bfd, made)
                    raise
                return Installed(True, self._shown(made) if made and cur is not None else None)
            finally:
                if bfd != dfd:
                    os.close(bfd)
        finally:
            os.close(dfd)

    def undo(self) -> str | None:
        """Put back what the first run found (or remove the file if it found none) and
        drop the backup: what was done, or None if there is no backup."""
        backup, had_none = self.saved()
        if backup is None and not had_none:
            return None
        dfd = open_dir(self.dir)
        try:
            bfd = dfd if self.backup_dir == self.dir else open_dir(self.backup_dir)
            try:
                if backup is not None:
                    backup.put(dfd, self.name)
                    what = f"restored {self.path} from {self._shown(self.backup_name)}"
                else:
                    unlink(dfd, self.name)
                    what = f"removed {self.path}"
                for name in (self.backup_name, self.name + NONE):
                    unlink(bfd, name)
                return what
            finally:
                if bfd != dfd:
                    os.close(bfd)
        finally:
            os.close(dfd)

    def undo_diff(self) -> str | None:
        """--undo --dry-run: the diff undo() would make, or None if there is no backup."""
        backup, had_none = self.saved()
        if backup is None and not had_none:
            return None
        return diff(self.path, self.read(), backup)


def edit_file(target: Target, edit: Callable[[bytes | None], bytes], *, dry_run: bool = False,
              undo: bool = False) -> tuple[bool, str]:
    """The whole run for one config file: `edit(current bytes or None) -> wanted bytes`
    (raises NvhookError for a file it cannot parse: nothing is written). Returns
    (changed or would change, the text to show). A symlink at path is refused: the
    engine reads the file it points to, so that is the one to name with --config."""
    if undo:
        text = target.undo_diff() if dry_run else target.undo()
        if text is None:
            return False, f"nothing to undo: no {target.backup_name} or {target.name + NONE} in {target.backup_dir}\n"
        return True, text if dry_run else text + "\n"
    cur = target.read()
    if cur is not None and cur.kind == "link":
        raise NvhookError(f"{target.path} is a symlink: name the file it points to with --config")
    wanted = Entry.file(edit(cur.data if cur is not None else None), cur)
    if dry_run:
        return not wanted.same(cur), diff(target.path, cur, wanted)
    done = target.install(wanted, cur)
    if not done.changed:
        return False, f"unchanged: {target.path}\n"
    return True, f"wrote {target.path}" + (f" (the one there before: {done.backup})" if done.backup else "") + "\n"


def venv_program(name: str, check: bool = True) -> str:
    """This install's program `name` beside the venv's python (`make venv` builds the
    compiled fronts nvhook-hook and nvhook-runtime there); check: that it is there and
    only root could have put it there (trusted_program)."""
    import sys

    path = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), name)
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
