"""What one container's start may cost the node: a memory ceiling, and the OOM killer's
aim, for the process that reads the image's data (the exec'd hook; a served worker once
it takes a request).

The parsers of image bytes (libinject.apply.ldcache_merge, ldconfig.update_musl) bound
their memory by the input's size; this is the backstop should one of them (or a bug)
not. RLIMIT_DATA (private writable memory: the heap, anonymous mappings; not the
libraries' mappings nor glibc's PROT_NONE arena reservations) at MEMORY_CEILING: past
it an allocation fails (MemoryError: one line, the start fails, the journal undoes it)
instead of the node running out. It applies to the children forked without exec too
(the NVML child); the sandboxed ldconfig sets its own, lower, limits.

The runtime that runs an exec'd hook usually has a negative oom_score_adj (containerd
-999, dockerd -500), and so has the service (its unit: -500; the DaemonSet's
system-node-critical pod: -997): the OOM killer would take a bystander first. Raised to
0 (never lowered) here, a start that does blow its cgroup's memory is what gets killed.
A few syscalls and a /proc write, once per process (contain()).
"""
from __future__ import annotations

import os
import resource

MEMORY_CEILING = 512 << 20   # RLIMIT_DATA; a normal start: < 25 MiB of data (a100x8, served or not)
OOM_SCORE_ADJ = 0           # at least this


_contained = False      # this process did it already (a served worker: before its request)


def contain(ceiling: int = MEMORY_CEILING) -> None:
    """Limit this process (and what it forks) to `ceiling` bytes of data, never raising
    a lower limit, and make its oom_score_adj at least OOM_SCORE_ADJ. Once per process:
    a served worker does it as it is forked (a spare: before a request comes, off the
    start's path; ~0.15 ms in a fresh fork, page faults mostly), the hook's own call is
    then free."""
    global _contained
    if _contained:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    lim = ceiling if hard == resource.RLIM_INFINITY else min(ceiling, hard)
    cur = lim if soft == resource.RLIM_INFINITY else min(soft, lim)
    try:
        if (cur, lim) != (soft, hard):
            resource.setrlimit(resource.RLIMIT_DATA, (cur, lim))
        from libinject.linux.proc import proc_fd

        fd = os.open("self/oom_score_adj", os.O_RDWR | os.O_CLOEXEC, dir_fd=proc_fd())
        try:
            if int(os.pread(fd, 16, 0) or b"0") < OOM_SCORE_ADJ:
                os.write(fd, b"%d" % OOM_SCORE_ADJ)
        finally:
            os.close(fd)
    except (OSError, ValueError) as e:
        from libinject.errors import NvhookError

        raise NvhookError(f"cannot set this start's memory ceiling and OOM score: {e}") from None
    _contained = True
