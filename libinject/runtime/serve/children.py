"""What the server and its children (spares, workers, the prober) do to those children's
processes: their scheduling class (a spare runs on idle CPU until it has a request) and
the file descriptors they keep (nothing of the server's)."""
from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    from libinject.runtime.serve.driver_cache import DriverCache

    class Parent(Protocol):
        """What a child (worker, spare, prober) uses of the server that forked it
        (libinject.runtime.serve.server.Server): the children never import the server."""
        cache: DriverCache
        log_fd: int | None
        ns_ids: list[tuple[int, int]]
        pid: int
        prefault_runs: list[tuple[int, int]]
        prefaulting: bool
        probe_inputs: tuple | None
        timeout: float
        verbose: bool

        def log(self, msg: str) -> None: ...


def _set_idle(pid: int, idle: bool) -> bool:
    """SCHED_IDLE (runs only on a CPU nothing else wants) or back to SCHED_OTHER; False
    if that could not be done (gone: the server reaps it later; not allowed)."""
    try:
        os.sched_setscheduler(pid, os.SCHED_IDLE if idle else os.SCHED_OTHER, os.sched_param(0))
    except OSError:
        return False
    return True


def _close_all_but(keep: set[int]) -> None:
    from libinject.linux import proc

    keep = keep | {proc.opened()}      # the cached /proc fd stays ours
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
