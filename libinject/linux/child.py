"""Children with deadlines: every wait is bounded, and a child past its deadline is
killed (SIGKILL; its whole process group when it leads one) and reaped.

A Child holds a pidfd, so signals never reach a recycled pid; its process group is
safe to signal until we reap it (its pid, and so its group id, stays taken until then).
"""
from __future__ import annotations

import os
import select
# The C module: `signal` wraps it in enums (enum, functools, collections: ~5 ms of the
# exec'd hook's start-up) that nothing here needs.
import _signal as signal
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# After SIGKILL: a child in an uninterruptible sleep (a hung driver's ioctl) dies only
# when that returns. We wait this long for it, then leave it (unreaped, still killed).
KILL_GRACE = 5.0
# After the child exited: how long we go on reading its pipes for what it wrote last
# (a grandchild that inherited them may keep them open for ever).
DRAIN = 0.5
UNKNOWN = 255       # exit code of a child something else reaped (SIGCHLD ignored)


def _readable(fd: int, timeout: float) -> bool:
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(max(0, int(timeout * 1000 + 0.999))))


class Child:
    """A child process of ours (forked or spawned by the caller). group=True: it leads
    its own process group (setsid/setpgid), and kill() kills the whole group."""

    def __init__(self, pid: int, *, group: bool = False) -> None:
        self.pid = pid
        self.group = group
        self.pidfd = os.pidfd_open(pid)
        self.code: int | None = None    # once reaped: exit code, or -signal if killed

    def kill(self) -> None:
        """SIGKILL it (and its group); nothing if it was reaped already."""
        if self.code is not None:
            return
        if self.group:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:  # no group yet (not at its setsid) or gone
                pass
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> int | None:
        """Its exit code once it has exited (and is reaped), waiting at most `timeout`
        seconds; None if it is still running then."""
        deadline = time.monotonic() + timeout
        while self.code is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.code = UNKNOWN
                break
            if pid:
                self.code = os.waitstatus_to_exitcode(status)
                break
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            _readable(self.pidfd, left)
        return self.code

    def exited(self) -> bool:
        """Whether it has exited (its pidfd is readable), reaped or not: a traced child
        can have exited and still not be ours to wait for."""
        return self.code is not None or _readable(self.pidfd, 0)

    def reap(self, timeout: float = 0.0) -> int | None:
        """Give it `timeout` seconds to exit, then kill it; reaped either way. None only
        if it is still there KILL_GRACE seconds after SIGKILL (stuck in the kernel)."""
        code = self.wait(timeout)
        if code is None:
            self.kill()
            code = self.wait(KILL_GRACE)
        return code

    def close(self) -> None:
        """Kill it unless it has exited, reap it, release the pidfd."""
        if self.pidfd < 0:
            return
        try:
            self.reap()
        finally:
            os.close(self.pidfd)
            self.pidfd = -1

    def __enter__(self) -> "Child":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def collect(child: Child, fds: Sequence[int], timeout: float, *,
            limit: int = 1 << 24) -> tuple[int | None, list[bytes]]:
    """Read `fds` (pipes from the child) until the child exits, and reap it: its exit
    code and what each fd gave (at most `limit` bytes each; the rest is read and
    dropped, so the child never blocks on a full pipe). After the exit, what is still
    in the pipes is read for at most DRAIN seconds. The fds are left open.
    Past the deadline the child is killed and reaped, and TimeoutError raised."""
    deadline = time.monotonic() + timeout
    bufs = {fd: bytearray() for fd in fds}
    live = list(fds)
    end = None              # when draining stops, once the child has exited
    while live or child.code is None:
        now = time.monotonic()
        if child.code is None:
            if now >= deadline:
                child.reap()
                raise TimeoutError(f"timed out after {timeout:g}s")
            wait = deadline - now
        else:
            if end is None:
                end = now + DRAIN
            wait = end - now
            if wait <= 0:
                break
        p = select.poll()
        for fd in live:
            p.register(fd, select.POLLIN)
        if child.code is None:
            p.register(child.pidfd, select.POLLIN)
        ready = {fd for fd, _ in p.poll(max(0, int(wait * 1000 + 0.999)))}
        for fd in [fd for fd in live if fd in ready]:
            chunk = os.read(fd, 65536)
            if not chunk:
                live.remove(fd)
            elif len(bufs[fd]) < limit:
                bufs[fd] += chunk[:limit - len(bufs[fd])]
        if child.code is None and (child.pidfd in ready or not live):
            child.wait(0)
    return child.code, [bytes(bufs[fd]) for fd in fds]


def run(argv: Sequence[str], *, timeout: float, env: Mapping[str, str], cwd: str = "/",
        limit: int = 1 << 24) -> tuple[int | None, bytes, bytes]:
    """Run argv in a session of its own (stdin /dev/null, stdout and stderr piped, no
    other fds): (exit code, stdout, stderr). Raises OSError if it cannot start, and
    TimeoutError past the deadline, after killing its whole process group."""
    import subprocess   # here: the children we fork ourselves do not need it

    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(env), cwd=cwd, close_fds=True,
                            start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        try:
            child = Child(proc.pid, group=True)
        except OSError:     # no pidfd (kernels before 5.3): nothing to watch it with
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        with child:
            try:
                code, (out, err) = collect(child, [proc.stdout.fileno(), proc.stderr.fileno()],
                                           timeout, limit=limit)
            finally:
                # Reaped by us, not by Popen (which would wait without a deadline).
                proc.returncode = child.reap() if child.code is None else child.code
        return code, out, err
    finally:
        proc.stdout.close()
        proc.stderr.close()
