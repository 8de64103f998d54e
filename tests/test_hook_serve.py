"""`nvhook serve`: the warm hook service behind csrc/hookfront.c, with real runc containers
on a simulated a100x8 host.

Served, a container gets what the exec'd hook gives it (only GPU 1; ENXIO/EPERM; our
one-line errors fail `runc create`); with no server (never started, or killed and its
socket left behind) the front falls back to exec'ing Python; non-root peers are refused;
a worker that dies or hangs fails its container and the server carries on; a host that
changes is seen on the next request; the container's env never reaches server or worker.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from libinject.linux.child import Child
from support import hookenv, serve_client
from support.serve import Serve
from support.canary import evil_env, make_canary, plant
from support.hookenv import ENV, PROBE, assert_only_gpu1, gpu_container
from support.runc import RuncError

def _runc(tmp_path, config, sock, env, args, mode="v1", stage="prestart", hook_env=()):
    return gpu_container(tmp_path, config, env, args, mode, stage, hook_env=hook_env,
                         socket=str(sock))


# -- served ------------------------------------------------------------------------------

def test_served_gpu1(tmp_path, hook_config, server, gpu_uuids):
    with _runc(tmp_path, hook_config, server.sock, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE) as c:
        r = c.run()
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)
    assert server.statuses(1) == [0], server.log()              # the server did it, not a fallback
    assert "prestart: done" in (tmp_path / "hook.log").read_text()
    assert "imported after fork" not in server.log()


def test_requests_go_to_a_spare_forked_before_them(tmp_path, hook_config, server, gpu_uuids):
    """The worker for a request is forked ahead of it (a spare, named nvhook-spare while it
    waits): it serves the request and a new spare takes its place. A spare that is gone
    when a request comes (killed) costs nothing but the fork it saved."""
    server.wait_until(lambda: len(server.spares()) == 1, "a spare worker waiting")
    [first] = server.spares()
    with _runc(tmp_path, hook_config, server.sock, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE) as c:
        r = c.run()
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)
    server.wait_until(lambda: len(server.spares()) == 1 and server.spares() != [first], "a new spare")
    assert not Path(f"/proc/{first}").exists()          # it served the request and exited
    [second] = server.spares()
    os.kill(second, signal.SIGKILL)
    with _runc(tmp_path, hook_config, server.sock, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE) as c:
        r = c.run()
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)
    assert server.statuses(2) == [0, 0], server.log()
    assert f"spare worker {second}:" in server.log()    # the request got a worker of its own


@pytest.mark.parametrize("stage", ["prestart", "createContainer"])
def test_hooks_outside_the_service_namespace_do_it_themselves(tmp_path, hook_config, server,
                                                               gpu_uuids, stage):
    """runc in a private mount namespace (v2 mode) runs its hooks there: the service serves
    only peers in its own, and a createContainer hook (the container's namespaces) never
    asks. The front falls back to exec'ing Python and the container is the same."""
    with _runc(tmp_path, hook_config, server.sock, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE, "v2", stage) as c:
        r = c.run()
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)
    assert server.statuses() == [], server.log()
    assert f"{stage}: done" in (tmp_path / "hook.log").read_text()


@pytest.mark.parametrize("env, message", [
    (["NVIDIA_VISIBLE_DEVICES=9"], "nvhook: unknown device: 9"),
    (["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_REQUIRE_CUDA=cuda>=99.0"],
     "unsatisfied condition: cuda>=99.0, please update your driver"),
])
def test_served_errors_fail_create(tmp_path, hook_config, server, env, message):
    with _runc(tmp_path, hook_config, server.sock, env, "sleep 100") as c:
        with pytest.raises(RuncError) as e:
            c.create()
        rootfs = str(c.rootfs)
    assert message in str(e.value)
    assert "stderr: nvhook:" in str(e.value) and str(e.value).count("nvhook:") == 1   # one line
    assert server.statuses(1) == [1]
    assert hookenv.mounts_naming(rootfs) == []


def test_served_and_exec_give_the_same_container(tmp_path, hook_config, server):
    probe = ("grep -o ' /[^ ]*nvidia[^ ]* ' /proc/self/mountinfo | sort; ls -l /dev | grep nvidia; "
             "ls /usr/lib/x86_64-linux-gnu | grep -i nvidia; ls -l /usr/bin | grep nvidia")
    out = []
    for sock in (server.sock, "none"):
        with _runc(tmp_path, hook_config, sock, ["NVIDIA_VISIBLE_DEVICES=0,1",
                                                 "NVIDIA_DRIVER_CAPABILITIES=all"], probe) as c:
            r = c.run()
        assert r.returncode == 0, r.stderr
        out.append(r.stdout)
    assert server.statuses(1) == [0]             # the first one only: "none" turns the service off
    assert out[0] == out[1] and "dev/nvidia1" in out[0] and "libnvidia-ml.so.1" in out[0]


# -- fallback ------------------------------------------------------------------------------

def test_fallback_without_server(tmp_path, hook_config, sockdir, gpu_uuids):
    sock = sockdir / "run/hook.sock"
    with _runc(tmp_path, hook_config, sock, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE) as c:   # ENOENT
        r = c.run()
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)

    s = Serve(hook_config, sock)
    assert s.stop(signal.SIGKILL) == -signal.SIGKILL
    assert sock.is_socket()                     # left behind: connect() says ECONNREFUSED
    with _runc(tmp_path, hook_config, sock, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE) as c:
        r = c.run()
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)
    with _runc(tmp_path, hook_config, sock, ["NVIDIA_VISIBLE_DEVICES=9"], "true") as c:
        with pytest.raises(RuncError, match="nvhook: unknown device: 9"):
            c.create()

    # A new server takes the stale socket over; a second one on the same path is refused.
    s = Serve(hook_config, sock)
    try:
        r = subprocess.run([hookenv.ensure_front(), "--config", str(hook_config), "serve", "--socket",
                            str(sock)], capture_output=True, text=True, env={}, timeout=60)
        assert r.returncode == 1 and r.stderr == f"nvhook: another nvhook serve is listening on {sock}\n"
        with _runc(tmp_path, hook_config, sock, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE) as c:
            r = c.run()
        assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)
        assert s.statuses(1) == [0]
    finally:
        assert s.stop() == 0


def test_socket_dir_must_be_private(tmp_path, hook_config, sockdir):
    d = sockdir / "open"
    d.mkdir(mode=0o777)
    os.chmod(d, 0o777)
    r = subprocess.run([hookenv.ensure_front(), "--config", str(hook_config), "serve", "--socket",
                        str(d / "hook.sock")], capture_output=True, text=True, env={}, timeout=60)
    assert r.returncode == 1 and "writable by nobody else" in r.stderr
    d = sockdir / "ok"
    d.mkdir(mode=0o700)
    (d / "hook.sock").write_text("not a socket")
    r = subprocess.run([hookenv.ensure_front(), "--config", str(hook_config), "serve", "--socket",
                        str(d / "hook.sock")], capture_output=True, text=True, env={}, timeout=60)
    assert r.returncode == 1 and "exists and is not a socket" in r.stderr


# -- who may ask -------------------------------------------------------------------------------

def _as_nobody(fn) -> int:
    """fn() in a forked child running as nobody; its return value (0-255) is the result."""
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            code = fn()
        finally:
            os._exit(code)
    with Child(pid) as child:       # killed and reaped on the way out
        code = child.wait(60)
        if code is None:
            pytest.fail("the child running as nobody did not finish within 60 s")
        return code


def test_non_root_peer_is_refused(tmp_path, server):
    b = tmp_path / "bundle"
    b.mkdir()
    state = f'{{"ociVersion":"1.0.2","id":"x","status":"creating","pid":1,"bundle":"{b}"}}'.encode()

    def ask() -> int:
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.connect(str(server.sock))
        except PermissionError:
            return 13
        r = serve_client.call(str(server.sock), ["nvhook-hook", "prestart"], state)
        return 0 if r is None else 1        # None: the front would fall back to exec

    # The socket is root's, in a root-only dir: nobody cannot even connect.
    assert _as_nobody(ask) == 13
    # Opened up, the server's own check (SO_PEERCRED) still refuses.
    for d in (server.sock.parent.parent, server.sock.parent):
        os.chmod(d, 0o755)
    os.chmod(server.sock, 0o666)
    assert _as_nobody(ask) == 0
    assert re.search(r"refused peer pid=\d+ uid=65534", server.log()), server.log()
    assert server.statuses() == []


def test_malformed_requests_are_declined(tmp_path, server):
    from libinject.runtime.serve import protocol

    def raw(msg: bytes, fds: list[int]) -> bytes:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.settimeout(30)
            s.connect(str(server.sock))
            assert serve_client.hello(s)
            anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))] if fds else []
            s.sendmsg([msg], anc)
            s.settimeout(30)
            return b"".join(iter(lambda: s.recv(16), b""))

    good = serve_client.encode_request(["nvhook-hook", "prestart"])
    state = os.memfd_create("state")
    d = os.open("/", os.O_PATH)
    ns = serve_client.own_ns_fds()
    other = os.open("/proc/self/ns/net", os.O_RDONLY)     # a namespace fd, not the right one
    ok = [state, *ns]
    try:
        assert raw(good, ok)[:1] == protocol.ACCEPTED                       # (then not committed)
        assert raw(b"hello\0", ok)[:1] != protocol.ACCEPTED
        assert raw(good, [])[:1] != protocol.ACCEPTED
        assert raw(good, [state])[:1] != protocol.ACCEPTED                  # no namespace proof
        assert raw(good, [state, 1, 2])[:1] != protocol.ACCEPTED            # stdio is never taken
        assert raw(good, [state, other, ns[1]])[:1] != protocol.ACCEPTED    # not our mount ns
        assert raw(serve_client.encode_request(["x", "poststop"]), ok)[:1] != protocol.ACCEPTED
        assert raw(serve_client.encode_request(["x", "createContainer"]), ok)[:1] != protocol.ACCEPTED
        assert raw(good + b"eLD_PRELOAD=/x\0", ok)[:1] != protocol.ACCEPTED     # no env items
        assert raw(good, [d, *ns])[:1] != protocol.ACCEPTED                 # state not a file
    finally:
        for fd in (state, d, other, *ns):
            os.close(fd)
    assert server.log().count("declined:") == 9, server.log()     # (and 9 "declined after")
    assert serve_client.call(str(server.sock), ["nvhook-hook", "poststop"], b"{}") is None


def test_front_that_gave_up_is_not_served(tmp_path, hook_config, server):
    """A front that stopped waiting before committing (no "G") runs the hook itself; the
    worker must then do nothing, or the container would be configured twice."""
    from libinject.runtime.serve import protocol

    with _runc(tmp_path, hook_config, server.sock, ["NVIDIA_VISIBLE_DEVICES=1"], "sleep 100") as c:
        c.config["hooks"] = {}
        pid = c.create()
        state = (f'{{"ociVersion":"1.0.2","id":"{c.id}","status":"created","pid":{pid},'
                 f'"bundle":"{c.bundle}"}}').encode()
        mfd = os.memfd_create("state")
        os.write(mfd, state)
        ns = serve_client.own_ns_fds()
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.settimeout(30)
            s.connect(str(server.sock))
            assert serve_client.hello(s)
            msg = serve_client.encode_request(["nvhook-hook", "--config", str(hook_config), "prestart"])
            s.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", mfd, *ns))])
            assert s.recv(16)[:1] == protocol.ACCEPTED
        for fd in (mfd, *ns):
            os.close(fd)
        server.wait_until(lambda: "abandoned: the front gave up" in server.log(), "done with the request")
        assert server.statuses() == []      # never "status 0": it did nothing
        # the worker returned before the hook ran: nothing even opened the hook's log
        assert not (tmp_path / "hook.log").exists()
        assert hookenv.mounts_naming("nvidia", pid) == []
        # the same request, committed, is served
        assert serve_client.call(str(server.sock), ["nvhook-hook", "--config", str(hook_config), "prestart"],
                               state) == 0
        assert hookenv.mounts_naming("nvidia1", pid)


def test_parse_request():
    from libinject.runtime.serve.protocol import Request, parse_request
    from support.serve_client import encode_request

    msg = encode_request(["nvhook-hook", "--config", "/c", "prestart"], "/run/bundle")
    assert parse_request(msg) == Request(("nvhook-hook", "--config", "/c", "prestart"), "/run/bundle")
    assert parse_request(msg).stage == "prestart"
    assert parse_request(encode_request(["a", "prestart"], None)).cwd is None
    for bad in (b"", b"NVHOOK2\0", b"NVHOOK1\0anvhook\0aprestart\0", msg[:-1], b"NVHOOK2\0xa\0ab\0",
                encode_request(["a", "b"]) + b"ePYTHONPATH=/x\0", b"NVHOOK2\0aa\0ab\0crel\0",
                encode_request(["a", "b"], "/x") + b"c/y\0", b"NVHOOK2\0a\xff\0ab\0",
                msg + b"a" * (64 << 10)):
        with pytest.raises(ValueError):
            parse_request(bad)


# -- failures inside the server ---------------------------------------------------------------

def _hanging_config(tmp_path, host) -> Path:
    # A driver root of its own whose NVML hangs (the warm cache is for `host`, so the
    # worker discovers this one itself) and a wait on it far past the test: the worker
    # blocks, while the front, which never discovers, waits for the server. (A FIFO as
    # the log file once did this; the log now refuses one without opening it.)
    from libinject.sim.build import create_host

    slow = create_host(tmp_path / "hanging-host", profile="t4x1")
    (slow / "etc/nvhook-sim").mkdir(parents=True, exist_ok=True)
    (slow / "etc/nvhook-sim/nvml.conf").write_text("delay_ms = 300000\n")
    return hookenv.write_config(tmp_path / "hang.toml", slow, extra="nvml-timeout = 600\n")


def _front(config: Path, sock: Path, bundle: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    state = f'{{"ociVersion":"1.0.2","id":"x","status":"creating","pid":1,"bundle":"{bundle}"}}'
    return subprocess.run([hookenv.ensure_front(), "--config", str(config), "--socket", str(sock),
                           "prestart"], input=state, capture_output=True, text=True, env={},
                          timeout=timeout)


def test_server_survives_a_worker_crash(tmp_path, a100_host, hook_config, server, gpu_uuids):
    hang = _hanging_config(tmp_path, a100_host)
    with _runc(tmp_path, hang, server.sock, ["NVIDIA_VISIBLE_DEVICES=1"], "true") as c:
        c.write_config()
        result: dict[str, subprocess.CompletedProcess[str]] = {}
        t = threading.Thread(target=lambda: result.setdefault("r", _front(hang, server.sock, c.bundle)))
        t.start()
        server.wait_until(server.workers, "running a worker")
        for w in server.workers():
            os.kill(w, signal.SIGKILL)
        t.join(90)          # _front() gives up after 60 s
        assert not t.is_alive(), "the front still waits for the server 90 s after its worker died"
    r = result["r"]
    assert (r.returncode, r.stderr) == (1, "nvhook: hook service: worker died configuring the container\n")
    assert "died of signal 9" in server.log()
    # and the next container is served as ever
    with _runc(tmp_path, hook_config, server.sock, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE) as c:
        r = c.run()
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)
    assert server.statuses(2) == [-1, 0]


def test_worker_timeout(tmp_path, a100_host, hook_config, sockdir):
    hang = _hanging_config(tmp_path, a100_host)
    s = Serve(hook_config, sockdir / "hook.sock", "--timeout", "1")
    try:
        with _runc(tmp_path, hang, s.sock, ["NVIDIA_VISIBLE_DEVICES=1"], "true") as c:
            c.write_config()
            t = time.monotonic()
            r = _front(hang, s.sock, c.bundle)
        assert (r.returncode, r.stderr) == (1, "nvhook: hook service: timed out configuring the container\n")
        assert time.monotonic() - t < 10
        assert "timed out after 1s, killed" in s.log() and s.statuses(1) == [-2]
        assert s.workers() == []
    finally:
        assert s.stop() == 0


# -- no stale data, no foreign env -------------------------------------------------------------

def _snapshot_config(tmp_path: Path, host: Path) -> Path:
    """hook config for host with snapshots on: the service warms that driver root and
    keeps its discovery, fingerprints (the prober) and plans."""
    cfg = hookenv.write_config(tmp_path / "c.toml", host, log=tmp_path / "hook.log",
                               extra=f'snapshot-dir = "{tmp_path}/snap"\n')
    cfg.write_text(cfg.read_text().replace("snapshot = false", "snapshot = true"))
    return cfg


def _said(s: Serve) -> list[tuple[str, str]]:
    """(fingerprint, plan): where each request's came from, as its worker logged (-v)."""
    return re.findall(r": fingerprint (.+?), plan (.+)", s.log())


def test_changed_host_is_seen(tmp_path, fresh_sim_host, sockdir):
    """The fingerprint of a request is taken after it came (by the prober), so a host
    changed since the previous one is seen."""
    host = fresh_sim_host("a100x8")
    cfg = _snapshot_config(tmp_path, host)
    # (the node goes, the driver still lists GPU 7: load-kmods would make the node again)
    cfg.write_text(cfg.read_text().replace("[nvhook]", "load-kmods = false\n[nvhook]", 1))
    s = Serve(cfg, sockdir / "hook.sock")
    try:
        assert "warm: driver 550" in s.log()
        with _runc(tmp_path, cfg, s.sock, ["NVIDIA_VISIBLE_DEVICES=7"], "nvidia-smi -L") as c:
            r = c.run()
        assert r.returncode == 0 and r.stdout.count("GPU ") == 1, r.stdout + r.stderr
        assert "learned" not in s.log()         # served from the warm cache

        (host / "dev/nvidia7").unlink()         # GPU 7 is gone
        with _runc(tmp_path, cfg, s.sock, ["NVIDIA_VISIBLE_DEVICES=7"], "true") as c:
            with pytest.raises(RuncError, match="nvhook: unknown device: 7"):
                c.create()
        # (the server learns once the worker has exited, after the front had its status)
        s.wait_until(lambda: "learned 1 driver(s)" in s.log(), "the server rediscovered")
        with _runc(tmp_path, cfg, s.sock, ["NVIDIA_VISIBLE_DEVICES=all"], "nvidia-smi -L") as c:
            r = c.run()
        assert r.returncode == 0 and r.stdout.count("GPU ") == 7, r.stdout + r.stderr
        assert s.statuses(3) == [0, 1, 0]
        assert [f for f, _ in _said(s)] == ["the prober's"] * 3, s.log()
        assert "imported after fork" not in s.log()     # rediscovery too: all preloaded
    finally:
        assert s.stop() == 0


def _served_with_a_prober(tmp_path, fresh_sim_host, sockdir) -> tuple[Path, Serve, int]:
    """(config, a service on a fresh a100x8 host, its prober's pid once it has one)."""
    cfg = _snapshot_config(tmp_path, fresh_sim_host("a100x8"))
    s = Serve(cfg, sockdir / "hook.sock")
    try:
        s.wait_until(lambda: len(s.probers()) == 1, "a prober")
    except BaseException:
        s.stop()
        raise
    return cfg, s, s.probers()[0]


def test_without_its_prober_a_worker_takes_its_own_fingerprint(tmp_path, fresh_sim_host, sockdir,
                                                               gpu_uuids):
    """A prober that does not answer (stopped) costs a request PROBE_WAIT, never its
    container; one that died is replaced, and the next request has its fingerprint."""
    from libinject.runtime.serve.driver_cache import PROBE_WAIT

    cfg, s, prober = _served_with_a_prober(tmp_path, fresh_sim_host, sockdir)
    try:
        os.kill(prober, signal.SIGSTOP)
        t = time.monotonic()
        with _runc(tmp_path, cfg, s.sock, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE) as c:
            r = c.run()
        assert time.monotonic() - t >= PROBE_WAIT
        assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)
        assert s.statuses(1) == [0] and _said(s)[-1][0] == "taken here", s.log()

        os.kill(prober, signal.SIGKILL)
        s.wait_until(lambda: f"prober {prober} is gone" in s.log(), "the prober's death seen")
        s.wait_until(lambda: len(s.probers()) == 1 and s.probers() != [prober], "a new prober")
        with _runc(tmp_path, cfg, s.sock, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE) as c:
            r = c.run()
        assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)
        assert s.statuses(2) == [0, 0] and _said(s)[-1][0] == "the prober's", s.log()
    finally:
        assert s.stop() == 0


def _seize(pid: int) -> None:
    """Trace pid (PTRACE_SEIZE: no stop): its exit is ours to wait for first."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    if libc.ptrace(0x4206, pid, None, None) != 0:
        raise OSError(ctypes.get_errno(), f"PTRACE_SEIZE {pid}")


def test_a_dead_prober_is_reaped_while_the_service_idles(tmp_path, fresh_sim_host, sockdir):
    """The kernel closes a dying child's files (the server sees its socket's EOF) before
    its exit can be waited for. A tracer holding the prober's exit keeps that window open
    as long as the test likes: once it lets go, the idle server reaps the zombie (it
    watches its pidfd), with no request to wake it, and one prober is left."""
    _, s, prober = _served_with_a_prober(tmp_path, fresh_sim_host, sockdir)
    try:
        _seize(prober)
        os.kill(prober, signal.SIGKILL)
        s.wait_until(lambda: f"prober {prober} is gone" in s.log(), "the prober's death seen")
        s.wait_until(lambda: len(s.probers()) == 2, "a new prober beside the dead one")
        time.sleep(0.3)
        assert Path(f"/proc/{prober}/stat").read_text().split(") ")[1][0] == "Z"   # not yet reapable
        pid, status = os.waitpid(prober, os.__dict__.get("__WALL", 0x40000000))
        assert pid == prober and os.WTERMSIG(status) == signal.SIGKILL
        s.wait_until(lambda: not Path(f"/proc/{prober}").exists(), "the dead prober reaped", timeout=5)
        assert len(s.probers()) == 1 and s.probers() != [prober], s.log()
    finally:
        assert s.stop() == 0


def test_a_prober_lost_with_a_request_waiting_is_replaced(tmp_path, fresh_sim_host, sockdir):
    """The prober dies while a connection waits (the server stopped meanwhile), so the
    server meets the request before the prober's end: its probe cannot be sent. The
    request is served (its worker takes its own fingerprint) and a new prober takes
    the next requests' fingerprints."""
    host = fresh_sim_host("a100x8")
    cfg = _snapshot_config(tmp_path, host)
    s = Serve(cfg, sockdir / "hook.sock")
    try:
        s.wait_until(lambda: len(s.probers()) == 1 and len(s.spares()) == 1, "a prober and a spare")
        [prober] = s.probers()
        os.kill(s.proc.pid, signal.SIGSTOP)
        result = {}

        def start() -> None:
            with _runc(tmp_path / "a", cfg, s.sock, ["NVIDIA_VISIBLE_DEVICES=1"], "true") as c:
                result["r"] = c.run()
        (tmp_path / "a").mkdir()
        t = threading.Thread(target=start)
        t.start()
        time.sleep(1.0)                     # the front has connected and waits for b"H"
        os.kill(prober, signal.SIGKILL)
        time.sleep(0.2)
        os.kill(s.proc.pid, signal.SIGCONT)
        t.join(60)
        assert result["r"].returncode == 0 and s.statuses(1) == [0], s.log()
        assert f"prober {prober}: " in s.log()
        s.wait_until(lambda: len(s.probers()) == 1 and s.probers() != [prober], "a new prober")
        with _runc(tmp_path, cfg, s.sock, ["NVIDIA_VISIBLE_DEVICES=1"], "true") as c:
            assert c.run().returncode == 0
        assert s.statuses(2) == [0, 0] and _said(s)[-1][0] == "the prober's", s.log()
    finally:
        assert s.stop() == 0


def test_a_worker_report_never_puts_its_driver_in_the_cache(fresh_sim_host, tmp_path):
    """A worker that discovered anew reports what for; the server rediscovers that
    itself, for the driver root it warmed only, and only when its own fingerprint says
    the host changed. A Driver in the report (the format before: a compromised worker
    could name /etc/shadow as a library) is never taken."""
    from libinject.discover.options import DiscoverOptions
    from libinject.record import asdict, replace
    from libinject.runtime.serve.server import Server

    host = fresh_sim_host("a100x8")
    opts = DiscoverOptions(root=str(host), snapshot=True, snapshot_dir=str(tmp_path / "snap"))
    server = Server(str(tmp_path / "s.sock"))
    server.warm(opts)
    [(key, d)] = server.cache.entries.items()
    forged = asdict(replace(d, libraries=tuple(replace(lib, path="/etc/shadow") for lib in d.libraries)))
    forged_key = [*key[:4], "f" * 48]
    for report in ({"drivers": [[forged_key, forged]]}, {"drivers": [forged_key]},
                   {"drivers": [["/elsewhere", "/elsewhere", "/elsewhere/etc/ld.so.cache", False, "0"]]},
                   {"drivers": "x"}):
        server._learn_from(report, 1)
        assert server.cache.entries == {key: d}     # the host did not change: nothing to do
    os.unlink(host / "dev/nvidia7")                 # it does now
    server._learn_from({"drivers": [forged_key]}, 2)    # (what a worker reports: keys)
    [(key2, d2)] = server.cache.entries.items()
    assert key2 != key and len(d2.info.gpus) == 7
    assert all(lib.path.startswith(str(host) + "/") for lib in d2.libraries)


def test_a_huge_request_does_not_hold_the_server(tmp_path, fresh_sim_host, sockdir):
    """A hostile spec (half a megabyte of NVIDIA_REQUIRE_*, every GPU) costs its own
    worker seconds of planning; the server must not make that plan again in its loop
    (it did: the next container then waited for it, or fell back to exec): the next
    container is served at once."""
    host = fresh_sim_host("a100x8")
    cfg = _snapshot_config(tmp_path, host)
    s = Serve(cfg, sockdir / "hook.sock")
    try:
        hostile = ["NVIDIA_VISIBLE_DEVICES=all"] + [
            f"NVIDIA_REQUIRE_X{i}=" + ",".join(["cuda>=1.0"] * 12000) for i in range(4)]
        (tmp_path / "hostile").mkdir()
        with _runc(tmp_path / "hostile", cfg, s.sock, hostile, "true") as c:
            assert c.run().returncode == 0
        t = time.monotonic()
        with _runc(tmp_path, cfg, s.sock, ["NVIDIA_VISIBLE_DEVICES=1"], "true") as c:
            assert c.run().returncode == 0
        assert time.monotonic() - t < 1.0
        assert s.statuses(2) == [0, 0], s.log()
    finally:
        assert s.stop() == 0


def test_a_failed_rediscovery_is_not_tried_again_at_once(fresh_sim_host, tmp_path):
    """Rediscovery runs in the server's loop (NVML with it, up to its timeout): after one
    that failed, worker reports do not start another for REDISCOVER_BACKOFF."""
    import shutil

    from libinject.discover.options import DiscoverOptions
    from libinject.runtime.serve.server import Server

    host = fresh_sim_host("a100x8")
    opts = DiscoverOptions(root=str(host), snapshot=True, snapshot_dir=str(tmp_path / "snap"))
    logs = tmp_path / "log"
    fd = os.open(logs, os.O_WRONLY | os.O_CREAT, 0o600)
    server = Server(str(tmp_path / "s.sock"), log_fd=fd)
    server.warm(opts)
    [key] = server.cache.entries
    shutil.rmtree(host / "proc/driver/nvidia")      # the driver is gone: discovery fails
    for _ in range(3):
        server._learn_from({"drivers": [[*key[:4], "0" * 48]]}, 7)
    os.close(fd)
    tries = logs.read_text().count("rediscovering after worker 7")
    assert tries == 1, logs.read_text()
    server.rediscover_after = 0.0
    shutil.rmtree(host)                             # the driver root itself is gone
    fd = os.open(logs, os.O_WRONLY | os.O_APPEND)
    server.log_fd = fd
    server._learn_from({"drivers": [[*key[:4], "1" * 48]]}, 8)     # one line, no exception
    os.close(fd)
    assert "rediscovering after worker 8: cannot read driver root" in logs.read_text()


def test_the_server_remembers_only_small_requests_plans(fresh_sim_host):
    """A plan is made again by the server for requests of a real size only (a hostile
    spec's megabyte of NVIDIA_REQUIRE_* would cost the server seconds, in its loop); a
    report names at most PLANS_PER_REPORT."""
    from libinject.request.model import Request
    from libinject.runtime.serve.driver_cache import MAX_PLANNED_REQUEST, DriverCache

    host = str(fresh_sim_host("a100x8"))
    worker = DriverCache()
    d = worker.discover(host, snapshot=True, snapshot_dir=host + "/../snaps")
    lib, lib32 = "/usr/lib/x86_64-linux-gnu", "/usr/lib/i386-linux-gnu"
    big = Request(devices="0", requirements=tuple(f"cuda>=1.{i}" for i in range(MAX_PLANNED_REQUEST // 4)))
    small = [Request(devices=str(i)) for i in range(6)]
    for r in (big, *small):
        worker.plan(r, d, lib_dir=lib, lib32_dir=lib32)
    report = worker.dump_planned()
    assert [item[1]["devices"] for item in report] == ["0", "1", "2", "3"]    # big left out
    server = DriverCache()
    server.entries = dict(worker.entries)
    from libinject.request.model import to_json

    [k] = worker.entries
    assert server.load_planned([[list(k), to_json(big), lib, lib32]]) == 0
    assert server.load_planned(report) == 4 and big not in {m[1] for m in server.plans}


def test_plans_are_remembered_per_request(tmp_path, fresh_sim_host, sockdir, gpu_uuids):
    """The server keeps each plan a worker made (it makes it again itself) for workers
    forked after: GPU 1, GPU 0, then both again from memory, each container with its
    own GPU only."""
    host = fresh_sim_host("a100x8")
    cfg = _snapshot_config(tmp_path, host)
    s = Serve(cfg, sockdir / "hook.sock")
    try:
        for n, gpu in enumerate([1, 0, 1, 0], 1):
            with _runc(tmp_path, cfg, s.sock, [f"NVIDIA_VISIBLE_DEVICES={gpu}"], "nvidia-smi -L") as c:
                r = c.run()
            assert r.returncode == 0, r.stdout + r.stderr
            assert re.findall(r"GPU (\d+):.*\(UUID: (\S+)\)", r.stdout) == [("0", gpu_uuids[gpu])]
            assert s.statuses(n) == [0] * n
        assert [p for _, p in _said(s)] == ["made here", "made here", "remembered", "remembered"], s.log()
    finally:
        assert s.stop() == 0


def test_container_env_reaches_neither_server_nor_worker(tmp_path, hook_config, server):
    canary = make_canary(tmp_path)
    out, lib, pydir = canary["out"], canary["lib"], canary["pydir"]

    hook_env = [f"LD_PRELOAD={lib}", f"PYTHONPATH={pydir}", "PYTHONHOME=/nonexistent",
                "NVHOOK_CONFIG=/nonexistent", "XDG_CONFIG_HOME=/nonexistent"]
    with _runc(tmp_path, hook_config, server.sock, [], "nvidia-smi -L", hook_env=hook_env) as c:
        plant(c.rootfs, canary)
        c.config["process"]["env"] = ENV + ["NVIDIA_VISIBLE_DEVICES=1", *evil_env(canary, c.rootfs)]
        r = c.run()
    assert "GPU 0: NVIDIA" in r.stdout, r.stdout + r.stderr
    assert server.statuses(1) == [0]
    # what the worker ran with: PATH, nothing else (neither the container's env nor the hook's)
    assert "env=[PATH]" in server.log(), server.log()
    assert not out.exists(), out.read_text()
    # nor did anything reach the server's own environment
    environ = Path(f"/proc/{server.proc.pid}/environ").read_bytes()
    assert b"LD_PRELOAD" not in environ and b"PYTHON" not in environ and b"NVIDIA" not in environ


# -- pre-faulted spares ---------------------------------------------------------------------

def _private_dirty_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Private_Dirty:"):
            return int(line.split()[1])
    raise AssertionError("no Private_Dirty")


def test_spares_copy_ahead_the_pages_requests_write(tmp_path, a100_host, hook_config, server):
    """Each worker reports the server's pages it holds copies of; the server keeps their
    union and the spares forked after copy those pages while they wait, at idle priority,
    so the request they get takes few copy-on-write faults (bench/ab_served.py counts
    them). Seen from outside: a later spare holds that many more private pages than the
    first one did, and a spare waits under SCHED_IDLE, from its fork on."""
    server.wait_until(lambda: len(server.spares()) == 1, "a spare worker waiting")
    [first] = server.spares()
    assert os.sched_getscheduler(first) == os.SCHED_IDLE       # (nothing to pre-fault yet)
    before = _private_dirty_kib(first)
    for _ in range(3):      # the third request's spare is forked after the first's report
        with _runc(tmp_path, hook_config, server.sock, ["NVIDIA_VISIBLE_DEVICES=1"], "true") as c:
            assert c.run().returncode == 0
    assert server.statuses(3) == [0, 0, 0], server.log()
    pages = int(re.findall(r"spares pre-fault (\d+) pages", server.log())[-1])
    assert 100 < pages <= 4096
    server.wait_until(lambda: len(server.spares()) == 1 and
                      _private_dirty_kib(server.spares()[0]) > before + pages * 4 // 2,
                      "a spare holding the learned pages")
    [spare] = server.spares()
    assert os.sched_getscheduler(spare) == os.SCHED_IDLE      # until it gets a request:
    hang = _hanging_config(tmp_path, a100_host)                 # (a hook that waits on its log)
    with _runc(tmp_path, hang, server.sock, ["NVIDIA_VISIBLE_DEVICES=1"], "true") as c:
        c.write_config()
        t = threading.Thread(target=_front, args=(hang, server.sock, c.bundle))
        t.start()
        server.wait_until(server.workers, "running a worker")
        assert server.workers() == [spare]
        assert os.sched_getscheduler(spare) == os.SCHED_OTHER   # the request's worker: normal
        os.kill(spare, signal.SIGKILL)
        t.join(90)
    assert "imported after fork" not in server.log()


def test_a_burst_is_served_by_spares_with_no_time_to_set_up(tmp_path, hook_config, server):
    """Containers started at once: each request takes the spare forked a moment before
    (no time yet to set up or to say it pre-faults; the server has closed its end by
    then). Every one is still served by the service: none falls back to Python."""
    from concurrent.futures import ThreadPoolExecutor

    for _ in range(3):      # pages learned: spares have something to pre-fault
        with _runc(tmp_path, hook_config, server.sock, ["NVIDIA_VISIBLE_DEVICES=1"], "true") as c:
            assert c.run().returncode == 0
    assert "spares pre-fault" in server.log()

    def one(_):
        with _runc(tmp_path, hook_config, server.sock, ["NVIDIA_VISIBLE_DEVICES=1"], "true") as c:
            return c.run().returncode

    with ThreadPoolExecutor(12) as pool:
        assert list(pool.map(one, range(12))) == [0] * 12
    server.wait_until(lambda: len(server.statuses()) == 15, "15 statuses")
    assert server.statuses(15) == [0] * 15, server.log()
    # each one went through a worker's request path (a spare that gave up would still
    # leave "status 0", from the server, and its front would have run Python itself)
    assert server.log().count(" env=[PATH]") == 15, server.log()


def _in_fork(fn, *args):
    """fn(*args) in a forked child (a fork, as a worker is); its result (repr/eval)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            os.write(w, repr(fn(*args)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with Child(pid) as c:
        out = b"".join(iter(lambda: os.read(r, 65536), b""))
        assert c.wait(30) == 0
    os.close(r)
    return eval(out)


def _buffer(npages: int):
    """An anonymous mapping of npages, every page present (written)."""
    import mmap

    from libinject.linux.native import address_of
    from libinject.runtime.serve.prefault import PAGE

    m = mmap.mmap(-1, npages * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for i in range(npages):
        m[i * PAGE] = 1
    return m, address_of(m) // PAGE


def _own(first: int, npages: int) -> list[int]:
    """Which of the pages first.. this process holds its own copy of (copied_pages)."""
    from libinject.runtime.serve.prefault import copied_pages

    return [p - first for f, n in copied_pages() for p in range(f, f + n) if first <= p < first + npages]


def test_copied_pages_are_the_pages_a_fork_wrote():
    from libinject.runtime.serve.prefault import PAGE

    m, first = _buffer(16)

    def child():
        for i in (3, 4, 10):
            m[i * PAGE + 7] = 2
        return _own(first, 16)

    assert _in_fork(child) == [3, 4, 10]
    assert _own(first, 16) == list(range(16))       # all the parent's own (no other mapper)


def test_prefault_copies_and_writes_nothing():
    import resource

    from libinject.runtime.serve.prefault import PAGE, populate_write_works, prefault

    assert populate_write_works()       # Linux >= 5.14, as on this machine kind
    m, first = _buffer(48)
    m[5 * PAGE:5 * PAGE + 4] = b"keep"
    ahead, other, warm = [*range(8), *range(20, 24)], list(range(8, 20)), list(range(32, 44))

    def write(pages) -> int:
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for i in pages:
            m[i * PAGE + 9] = 3
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0

    def child():
        asked = prefault([(first, 8), (first + 20, 4)])
        own = _own(first, 48)
        kept = bytes(m[5 * PAGE:5 * PAGE + 4])
        write(warm)                 # (the loop's own first faults)
        return asked, own, kept, write(ahead), write(other)

    asked, own, kept, faults_ahead, faults_other = _in_fork(child)
    assert asked == 12 and own == ahead and kept == b"keep"    # copied, nothing written
    assert faults_other >= 12 and faults_ahead <= 2, (faults_ahead, faults_other)


def test_prefault_stops_for_a_request():
    from libinject.runtime.serve.prefault import PREFAULT_STEP, prefault

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with a, b:
        # pages not mapped (madvise says ENOMEM): only the count of pages asked for matters
        runs = [(1000 + 10 * i, PREFAULT_STEP) for i in range(4)]
        assert prefault(runs, a) == 4 * PREFAULT_STEP
        b.send(b"x")        # a request is waiting: it stops at its next look
        assert prefault(runs, a) == PREFAULT_STEP


def test_learned_pages_are_checked_and_bounded(sockdir):
    from libinject.runtime.serve.prefault import MAX_PREFAULT
    from libinject.runtime.serve.server import Server

    s = Server(str(sockdir / "x.sock"))
    s._keep_pages([[10, 2], [20, 1]])
    s._keep_pages([[12, 1]])
    assert s.prefault_runs == [(10, 3), (20, 1)]
    for bad in ([["10", 1]], [[-1, 1]], [[5, 0]], [[5, True]], [[5, 1, 1]], [5, 1], {"5": 1},
                [[30, 1], [0, MAX_PREFAULT]],           # (too many: none of it is taken)
                [[1 << 60, 1]]):                         # (above any user address)
        s._keep_pages(bad)
        assert s.prefault_runs == [(10, 3), (20, 1)]
    s._keep_pages([[100, MAX_PREFAULT - 1]])        # the union would be too large: only this
    assert s.prefault_runs == [(100, MAX_PREFAULT - 1)]


def test_probed_fingerprint_is_used_for_its_inputs_only(fresh_sim_host, monkeypatch):
    """What the prober wrote is the key, for the inputs it names; anything else (other
    inputs, not a key, nothing within PROBE_WAIT, nothing at all) and the worker takes
    its own."""
    import json

    from libinject.runtime.serve import driver_cache
    from libinject.runtime.serve.driver_cache import DriverCache

    host = str(fresh_sim_host("a100x8"))
    snaps = host + "/../snaps"
    cache = DriverCache()
    d = cache.discover(host, snapshot=True, snapshot_dir=snaps)
    [key] = cache.entries
    calls = []
    real = DriverCache.key
    monkeypatch.setattr(DriverCache, "key", staticmethod(lambda *a: calls.append(a) or real(*a)))
    monkeypatch.setattr(driver_cache, "PROBE_WAIT", 0.2)     # (where DriverCache._probed reads it)

    def probed(written: bytes | None, inputs=(host, None, None), close: bool = True):
        r, w = os.pipe()
        if written is not None:
            os.write(w, written)
        if close:
            os.close(w)
        cache.prefetch(host, None, None, r)
        t = time.monotonic()
        got = cache.discover(host, snapshot=True, snapshot_dir=snaps)
        if not close:
            os.close(w)
        assert cache.ahead is None
        return got, cache.said["fingerprint"], time.monotonic() - t

    good = json.dumps([[host, None, None], list(key)]).encode()
    assert probed(good)[:2] == (d, "the prober's") and calls == []
    forged = json.dumps([[host, None, None], [*key[:4], "0" * 48]]).encode()
    got, said, _ = probed(forged)       # (a key no entry has: discovered afresh)
    assert said == "the prober's" and got is not d
    calls.clear()
    for bad in (json.dumps([["/elsewhere", None, None], list(key)]).encode(), b"[1, 2]", b"{",
                json.dumps([[host, None, None], [*key[:3], "yes", key[4]]]).encode(), b""):
        got, said, _ = probed(bad)
        assert said == "taken here" and len(calls) == 1, bad
        calls.clear()
    got, said, waited = probed(None, close=False)       # a prober that never answers
    assert said == "taken here" and len(calls) == 1 and waited >= 0.2


def test_plans_are_made_by_the_server_from_what_workers_asked(fresh_sim_host):
    """A worker reports what it planned (the request, the driver's key, the library
    dirs); the server makes those plans itself (load_planned), so a report can name a
    plan but never choose it; requests that fail to plan, drivers it does not have and
    malformed items are not kept."""
    import json

    from libinject.plan.planner import plan
    from libinject.request.model import Request
    from libinject.runtime.serve.driver_cache import DriverCache

    host = str(fresh_sim_host("a100x8"))
    worker = DriverCache()
    d = worker.discover(host, snapshot=True, snapshot_dir=host + "/../snaps")
    [key] = worker.entries
    lib, lib32 = "/usr/lib/x86_64-linux-gnu", "/usr/lib/i386-linux-gnu"
    r1 = Request(devices="1", capabilities=frozenset({"utility", "compute", "graphics"}))
    e1 = worker.plan(r1, d, lib_dir=lib, lib32_dir=lib32)
    assert e1 == plan(r1, d, lib_dir=lib, lib32_dir=lib32) and worker.said["plan"] == "made here"
    report = json.loads(json.dumps(worker.dump_planned()))

    server = DriverCache()
    server.entries = dict(worker.entries)
    assert server.load_planned(report) == 1
    assert server.plans == {(key, r1, lib, lib32): e1}
    assert server.load_planned(report) == 0                 # (kept already)
    [[k, r, _, _]] = report
    assert server.load_planned([[k, {**r, "devices": "9"}, lib, lib32],    # unknown device: fails
                                [[*k[:4], "0" * 48], r, lib, lib32],       # no such driver
                                [k, r, 7, lib32]]) == 0
    with pytest.raises(ValueError):
        server.load_planned([[k, {**r, "devices": 1}, lib, lib32]])
    assert len(server.plans) == 1
    # a worker forked from it: served from memory, nothing to report
    server.last = key
    assert server.plan(r1, d, lib_dir=lib, lib32_dir=lib32) is server.plans[(key, r1, lib, lib32)]
    assert server.said["plan"] == "remembered" and server.planned == []
    r0 = Request(devices="0")
    assert server.plan(r0, d, lib_dir=lib, lib32_dir=lib32) == plan(r0, d, lib_dir=lib, lib32_dir=lib32)
    assert server.said["plan"] == "made here"


def test_prefetched_fingerprint_is_used_once(fresh_sim_host, monkeypatch):
    """A worker takes its request's fingerprint while the front answers b"A"
    (DriverCache.prefetch); discover() uses it once, for the same inputs only, and
    takes a fresh one otherwise: a host changed since is still seen by the next."""
    from libinject.runtime.serve.driver_cache import DriverCache

    host = str(fresh_sim_host("a100x8"))
    cache = DriverCache()
    calls = []
    real = DriverCache.key
    monkeypatch.setattr(DriverCache, "key", staticmethod(lambda *a: calls.append(a) or real(*a)))
    cache.prefetch(host, None, None)
    assert len(calls) == 1 and cache.ahead is not None
    d = cache.discover(host, snapshot=False)     # no caching asked: the prefetch is not used
    assert len(calls) == 1 and cache.ahead is not None
    d = cache.discover(host, snapshot=True, snapshot_dir=host + "/../snaps")
    assert cache.ahead is None
    assert len(calls) == 2          # its own key() after the miss (the host unchanged while discovering)
    assert cache.discover(host, snapshot=True, snapshot_dir=host + "/../snaps") is d
    assert len(calls) == 3          # nothing prefetched: its own
    cache.prefetch(host, "/other/ld.so.cache", None)
    os.unlink(host + "/dev/nvidia7")
    d2 = cache.discover(host, snapshot=True, snapshot_dir=host + "/../snaps")   # other inputs
    assert len(d2.info.gpus) == 7 and cache.ahead is None
