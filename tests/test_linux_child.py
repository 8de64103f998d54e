"""libinject.linux.child: every wait bounded; a child past its deadline killed (with its
process group) and reaped."""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from libinject.linux import child
from libinject.linux.child import Child, collect, run


def _spawn(argv: list[str], *, stdout: int | None = None, stderr: int | None = None,
           group: bool = False) -> Child:
    actions = [(os.POSIX_SPAWN_DUP2, fd, n) for fd, n in ((stdout, 1), (stderr, 2))
               if fd is not None]
    pid = os.posix_spawnp(argv[0], argv, os.environ, file_actions=actions, setsid=group)
    return Child(pid, group=group)


def _gone(pid: int, within: float = 5.0) -> bool:
    """pid exits (or is a zombie) within `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def _pipe() -> tuple[int, int]:
    return os.pipe()


def _spawn_to_pipe(argv: list[str], *, group: bool = False) -> tuple[Child, int]:
    """_spawn(argv) writing its stdout into a new pipe (our write end closed): the child
    and the pipe's read end."""
    r, w = _pipe()
    c = _spawn(argv, stdout=w, group=group)
    os.close(w)
    return c, r


def test_wait_gives_the_exit_code():
    with _spawn(["sh", "-c", "exit 7"]) as c:
        assert c.wait(10) == 7
        assert c.wait(0) == 7                   # reaped once; asked again, the same


def test_wait_is_bounded_and_reap_kills():
    with _spawn(["sleep", "30"]) as c:
        t = time.monotonic()
        assert c.wait(0.2) is None
        assert c.reap(0.1) == -signal.SIGKILL
        assert time.monotonic() - t < 5
        assert _gone(c.pid, 0)


def test_close_kills_and_reaps():
    c = _spawn(["sleep", "30"])
    c.close()
    assert c.code == -signal.SIGKILL and c.pidfd == -1
    assert _gone(c.pid, 0)
    c.close()                                   # twice: nothing


def test_group_kill_takes_the_grandchildren():
    c, r = _spawn_to_pipe(["sh", "-c", "sleep 30 & echo $!; wait"], group=True)
    grandchild = int(os.read(r, 64))
    os.close(r)
    with c:
        assert c.reap(0) == -signal.SIGKILL
    assert _gone(grandchild), "grandchild survived its group's SIGKILL"


def test_collect_reads_everything_and_the_status():
    r1, w1 = _pipe()
    r2, w2 = _pipe()
    c = _spawn(["sh", "-c", "head -c 200000 /dev/zero; echo err >&2; exit 3"], stdout=w1, stderr=w2)
    os.close(w1)
    os.close(w2)
    with c:
        code, (out, err) = collect(c, [r1, r2], 10)
    assert (code, len(out), err) == (3, 200000, b"err\n")
    os.close(r1)
    os.close(r2)


def test_collect_limit_keeps_the_child_going():
    c, r = _spawn_to_pipe(["head", "-c", "300000", "/dev/zero"])
    with c:
        code, (out,) = collect(c, [r], 10, limit=1000)
    assert (code, out) == (0, bytes(1000))
    os.close(r)


def test_collect_deadline_kills():
    c, r = _spawn_to_pipe(["sh", "-c", "echo started; exec sleep 30"])
    t = time.monotonic()
    with c:
        with pytest.raises(TimeoutError, match=r"^timed out after 0.3s$"):
            collect(c, [r], 0.3)
        assert c.code == -signal.SIGKILL
    assert time.monotonic() - t < 5
    os.close(r)


def test_collect_does_not_wait_for_a_pipe_held_elsewhere():
    # The child exits while a process it started in a session of its own (not ours
    # to kill) keeps the pipe open: reading stops DRAIN seconds after the exit.
    c, r = _spawn_to_pipe(["sh", "-c", "setsid sleep 30 & echo $!; exit 0"])
    t = time.monotonic()
    out = b""
    try:
        with c:
            code, (out,) = collect(c, [r], 10)
        assert code == 0
        assert time.monotonic() - t < child.DRAIN + 2
    finally:
        if out.strip():
            os.kill(int(out), signal.SIGKILL)
        os.close(r)


def test_run():
    code, out, err = run([sys.executable, "-c", "import os, sys; print(os.getsid(0) == os.getpid()); "
                          "sys.stderr.write(os.environ['X']); sys.exit(2)"],
                         timeout=30, env={"X": "x"})
    assert (code, out, err) == (2, b"True\n", b"x")


def test_run_timeout_kills_the_whole_session(tmp_path: Path):
    pids = tmp_path / "pids"
    t = time.monotonic()
    with pytest.raises(TimeoutError):
        run(["sh", "-c", f"sleep 30 & echo $! $$ > {pids}; exec sleep 30"], timeout=1,
            env={"PATH": os.environ["PATH"]})
    assert time.monotonic() - t < 6
    for pid in map(int, pids.read_text().split()):
        assert _gone(pid), pid


def test_run_cannot_start():
    with pytest.raises(FileNotFoundError):
        run(["/nonexistent/x"], timeout=5, env={})
