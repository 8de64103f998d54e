"""One small logger: a line per decision, appended to files we were told to use.

Not `logging`: importing it costs the hook's start-up more than all of this. A log
that cannot be written never fails the container. Formats:
- "hook": `2026-11-22T14:00:00.123 nvhook[PID] INFO <ident>msg` (the hook, `nvhook serve`);
- "json" / "text": runc's own log formats, for the runtime shim (containerd reads them).
Paths must be absolute (libinject.config resolves relative ones against the config
file's directory; a relative path here would land wherever the process's cwd is).
"""
from __future__ import annotations

import os

# A log file is kept under this: past it, the file becomes FILE.1 (the one before is
# dropped) and the next line starts a new one, so a busy node's log is bounded at twice
# this (logrotate, where an administrator runs it, works as usual: we append by path).
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

    def enabled(self, level: str) -> bool:
        return bool(self.paths) and LEVELS[level] >= self.level

    def _line(self, level: str, msg: str) -> str:
        import time

        t = time.time()
        msg = f"{self.prefix}{self.ident}{msg}".replace("\n", " ")
        if self.fmt == "hook":
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"
            return f"{stamp} nvhook[{os.getpid()}] {level.upper()} {msg}"
        from libinject import jsonc

        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1e6) % 1000000:06d}Z"
        if self.fmt == "json":
            return jsonc.dumps({"level": level, "msg": msg, "time": stamp})
        return f"time={jsonc.dumps(stamp)} level={level} msg={jsonc.dumps(msg)}"

    def write(self, level: str, msg: str) -> None:
        if not self.enabled(level):
            return
        data = (self._line(level, msg) + "\n").encode(errors="replace")
        for path in self.paths:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOCTTY,
                             0o640)
                try:
                    os.write(fd, data)
                    if os.fstat(fd).st_size > MAX_BYTES:
                        _rotate(path, fd)
                finally:
                    os.close(fd)
            except OSError:
                pass

    def debug(self, msg: str) -> None:
        self.write("debug", msg)

    def info(self, msg: str) -> None:
        self.write("info", msg)

    def error(self, msg: str) -> None:
        self.write("error", msg)


def _rotate(path: str, fd: int) -> None:
    """path becomes path.1 -- if it is still the file fd is (another writer may have
    rotated it already: renaming the new one would lose the old)."""
    try:
        st = os.fstat(fd)
        now = os.stat(path, follow_symlinks=False)
        if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
            os.rename(path, path + ".1")
    except OSError:
        pass
