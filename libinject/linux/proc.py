"""The host's /proc, opened once per process; what /proc/self says of us."""
from __future__ import annotations

import os

_PROC_FD: int | None = None


def proc_fd() -> int:
    """An fd of the host's /proc, opened once. Take it before entering a container's
    mount namespace: there /proc may be the container's procfs (another pid namespace,
    so no /proc/self) or absent, yet we still need our own /proc/self/fd and mountinfo."""
    global _PROC_FD
    if _PROC_FD is None:
        _PROC_FD = os.open("/proc", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return _PROC_FD


def opened() -> int | None:
    """proc_fd()'s fd if this process has opened it (a caller closing every other fd
    must keep it: the number would be reused)."""
    return _PROC_FD


def in_user_namespace() -> bool:
    """Whether this process is outside the initial user namespace: only there does
    /proc/self/uid_map map every uid onto itself. Unreadable: False (try as before;
    the kernel still refuses what we may not do)."""
    try:
        with open("/proc/self/uid_map", "rb") as f:
            return f.read(4096).split() != [b"0", b"0", b"4294967295"]
    except OSError:
        return False
