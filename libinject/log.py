"""One small logger: a line per decision, appended to files we were told to use.

Not `logging`: importing it costs the hook's start-up more than all of this. A log
that cannot be written never fails the container. Formats:
- "hook": `2026-11-22T14:00:00.123 nvhook[PID] INFO <ident>msg` (the hook, `nvhook serve`);
- "json" / "text": runc's own log formats, for the runtime shim (containerd reads them).
Paths must be absolute (libinject.config resolves relative ones against the config
file's directory; a relative path here would land wherever the process's cwd is).

Root writes these files for every container, so nobody else may choose where a line
lands or what it looks like: the directory is reached by fd (libinject.linux.safedir:
no link or directory another user planted, and nobody but root can write the directory
holding the file; for host root only, as the fronts' checks: in a rootless engine's user
namespace root's files show as the overflow uid), the file is opened O_NOFOLLOW and must
be a regular file of ours with one link; a path failing that is not written, with one
`nvhook:` line on stderr (never failing the container). Control characters, and
whatever else a terminal or a line-based reader could take for structure, are escaped
(escape()): a value from the container cannot end a line or forge the next.
"""
from __future__ import annotations

import errno
import os
import stat

from libinject.errors import NvhookError

# A log file is kept under this: past it, the file becomes FILE.1 (the one before is
# dropped) and the next line starts a new one, so a busy node's log is bounded at twice
# this (logrotate, where an administrator runs it, works as usual: each line opens the
# file anew).
MAX_BYTES = 16 << 20
LEVELS = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40}


class Log:
    def __init__(self, *paths: str, level: str = "info", fmt: str = "hook", ident: str = "",
                 prefix: str = "") -> None:
        self.paths = [p for p in paths if p and p != "/dev/null"]
        self.level = LEVELS.get(level.lower(), 20)
        self.fmt = fmt
        self.ident = ident
        self.prefix = prefix
        self._refused: set[str] = set()
        self._dirs: dict[str, int] = {}     # path -> its directory's fd, checked once

    def close(self) -> None:
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs.clear()

    def __del__(self) -> None:
        try:
            self.close()
        except (OSError, AttributeError, TypeError):    # (at interpreter exit)
            pass

    def enabled(self, level: str) -> bool:
        return bool(self.paths) and LEVELS[level] >= self.level

    def _line(self, level: str, msg: str) -> str:
        import time

        t = time.time()
        msg = f"{self.prefix}{self.ident}{msg}"
        if self.fmt == "hook":
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"
            return f"{stamp} nvhook[{os.getpid()}] {level.upper()} {escape(msg)}"
        from libinject import jsonc      # (JSON strings escape every control character)

        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1e6) % 1000000:06d}Z"
        if self.fmt == "json":
            return jsonc.dumps({"level": level, "msg": msg, "time": stamp})
        return f"time={jsonc.dumps(stamp)} level={level} msg={jsonc.dumps(msg)}"

    def write(self, level: str, msg: str) -> None:
        if not self.enabled(level):
            return
        data = (self._line(level, msg) + "\n").encode(errors="replace")
        for path in self.paths:
            if path in self._refused:
                continue
            try:
                dfd = self._dirs.get(path)
                if dfd is None:
                    dfd = self._dirs[path] = open_dir(path)
                append_at(dfd, path, data)
            except NvhookError as e:
                self._refused.add(path)     # one line per file, not one per line
                try:
                    os.write(2, f"nvhook: {escape(str(e))}; not logging there\n".encode(errors="replace"))
                except OSError:
                    pass
            except OSError:     # no such directory, a full disk: a log never fails a container
                pass

    def debug(self, msg: str) -> None:
        self.write("debug", msg)

    def info(self, msg: str) -> None:
        self.write("info", msg)

    def error(self, msg: str) -> None:
        self.write("error", msg)


def escape(text: str) -> str:
    """text with backslashes doubled and every character str.isprintable() rejects (C0
    and C1 controls: newline, CR, ESC, ...; U+2028, bidi overrides, surrogates) written as
    an escape: \\n, \\r, \\t, \\xNN (a surrogateescape'd byte too), \\uNNNN."""
    if text.isprintable() and "\\" not in text:
        return text
    out = []
    for c in text:
        if c == "\\":
            out.append("\\\\")
        elif c.isprintable():
            out.append(c)
        elif c in _NAMED:
            out.append(_NAMED[c])
        else:
            n = ord(c)
            if 0xDC80 <= n <= 0xDCFF:        # a byte that was not UTF-8 (surrogateescape)
                n -= 0xDC00
            out.append(f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}")
    return "".join(out)


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def open_dir(path: str) -> int:
    """An fd of log file `path`'s directory, reached as the module doc says.
    NvhookError: a path we refuse (planted, or another user could have); OSError: one
    we cannot reach (a missing directory)."""
    from libinject.linux import safedir

    directory, name = os.path.split(os.path.abspath(path))
    if not name:
        raise NvhookError(f"log file {path}: not a file name")
    if not safedir.host_root():     # (a rootless runtime's shim: the user's own writes)
        return os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return safedir.open_dir(directory, f"log file {path}")


def append_at(dfd: int, path: str, data: bytes) -> None:
    """data appended to log file `path` (its directory: dfd, from open_dir), then
    rotated past MAX_BYTES. NvhookError: a file we refuse; OSError: one we cannot write."""
    from libinject.linux import safedir

    what = f"log file {path}"
    name = os.path.basename(os.path.abspath(path))
    try:
        # O_NONBLOCK: a FIFO there must not stop the start (ENXIO without a reader).
        fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_NOCTTY | os.O_CLOEXEC, 0o640, dir_fd=dfd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NvhookError(f"{what}: a symlink (not followed)") from None
        if e.errno == errno.ENXIO:
            raise NvhookError(f"{what}: a fifo, not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            from libinject.linux.files import kind

            raise NvhookError(f"{what}: {kind(st.st_mode)}, not a regular file")
        if st.st_uid not in (0, os.geteuid()) and safedir.host_root():
            raise NvhookError(f"{what}: owned by uid {st.st_uid}")
        if st.st_nlink > 1:     # another name for it may be someone else's file
            raise NvhookError(f"{what}: has {st.st_nlink} hard links")
        os.write(fd, data)
        if os.fstat(fd).st_size > MAX_BYTES:
            _rotate(dfd, name, fd)
    finally:
        os.close(fd)


def _rotate(dfd: int, name: str, fd: int) -> None:
    """name becomes name.1 -- if it is still the file fd is: another writer may have
    rotated it already, and renaming the new one would drop the old. Whoever rotates
    holds a lock on the file itself from that check to the rename, so two writers past
    the limit cannot both pass the check; one that finds the lock taken leaves the
    rotation to its holder."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        now = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
            os.rename(name, name + ".1", src_dir_fd=dfd, dst_dir_fd=dfd)
    except OSError:
        pass
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
