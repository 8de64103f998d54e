"""The front's fallback from `nvhook serve` (csrc/serveclient.h): a service that is there
but does not take a start -- its spare stopped, or the whole service starved of CPU by its
cgroup's quota -- costs the start one bounded wait (5 s in all, not per step), after which
the front runs the hook itself, says so in one line on stderr and in the hook's log, and
the service logs what became of the request it never ran (never "status 0")."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from support import hookenv
from support.cpucg import CpuCgroup
from support.hookenv import PROBE, assert_only_gpu1, gpu_container

LINE = "hook service at {sock} did not take the start within 5 s; running it without the service"


@contextlib.contextmanager
def _created(tmp_path: Path, hook_config: Path):
    """A runc container created without hooks (GPU 1 asked for): (its pid, its state)."""
    with gpu_container(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=1"], "sleep 100") as c:
        c.config["hooks"] = {}
        pid = c.create()
        yield pid, (f'{{"ociVersion":"1.0.2","id":"{c.id}","status":"created","pid":{pid},'
                    f'"bundle":"{c.bundle}"}}')


def _prestart(config: Path, sock: Path, state: str) -> subprocess.CompletedProcess[str]:
    """The front as runc runs a prestart hook (the state on stdin, an empty env)."""
    return subprocess.run([hookenv.ensure_front(), "--config", str(config), "--socket", str(sock),
                           "prestart"], input=state, capture_output=True, text=True, env={},
                          timeout=60)


def test_a_stopped_spare_costs_a_bounded_wait_said_in_one_line(tmp_path, hook_config, server):
    server.wait_until(lambda: len(server.spares()) == 1, "a spare worker waiting")
    [spare] = server.spares()
    os.kill(spare, signal.SIGSTOP)      # it will be handed the request, and never answer
    try:
        with _created(tmp_path, hook_config) as (pid, state):
            r = _prestart(hook_config, server.sock, state)
            assert (r.returncode, r.stderr) == (0, f"nvhook: {LINE.format(sock=server.sock)}\n")
            assert hookenv.mounts_naming("nvidia1", pid)            # the front's own hook did it
        log = (tmp_path / "hook.log").read_text()
        assert "WARNING prestart: hook service did not take the start within 5 s; running it without the service" in log, log
        assert "prestart: done" in log
    finally:
        os.kill(spare, signal.SIGCONT)
    # The spare, going on, finds the front gone: the service says so, and logs no status.
    server.wait_until(lambda: "abandoned: the front gave up" in server.log(), "the request abandoned")
    assert server.statuses() == [], server.log()
    assert server.workers() == []


def test_a_starved_service_costs_a_bounded_wait_said_in_one_line(tmp_path, hook_config, server,
                                                                 gpu_uuids):
    server.wait_until(lambda: len(server.spares()) == 1, "a spare worker waiting")
    # 1 ms of CPU a second, shared with busy loops: the service cannot say "A" within 5 s.
    with CpuCgroup(1000, 1_000_000) as cg:
        for p in (server.proc.pid, *server.children()):
            cg.add(p)
        cg.hog(16)
        with _created(tmp_path, hook_config) as (pid, state):
            r = _prestart(hook_config, server.sock, state)
            assert (r.returncode, r.stderr) == (0, f"nvhook: {LINE.format(sock=server.sock)}\n")
            assert hookenv.mounts_naming("nvidia1", pid)
    assert "WARNING prestart: hook service did not take the start within 5 s" in (tmp_path / "hook.log").read_text()
    # Fed again, it serves the next start; the one it never ran got no status.
    with gpu_container(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE,
                       socket=str(server.sock)) as c:
        r = c.run()
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)
    assert server.statuses(1) == [0], server.log()
