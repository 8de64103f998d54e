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
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from support import hookenv
from support.runc import RuncContainer, RuncError
from test_hook_runtimes import PROBE, assert_only_gpu1

ENV = ["PATH=/usr/bin:/bin"]


class Serve:
    """`nvhook-hook --config CFG serve --socket SOCK -v` (through the front: python -I and
    a clean env, as a unit file would start it), stopped by stop()."""

    def __init__(self, config: Path, sock: Path, *extra: str) -> None:
        self.sock = sock
        self.logfile = sock.parent.parent / f"serve-{os.urandom(3).hex()}.log"
        self.proc = subprocess.Popen(
            [hookenv.ensure_front(), "--config", str(config), "serve", "--socket", str(sock), "-v", *extra],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(self.logfile, "wb"), env={})
        deadline = time.monotonic() + 60
        while "listening on" not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"nvhook serve did not start: {self.log()}")
            time.sleep(0.02)
        while "warm:" not in self.log() and "snapshot = false" not in config.read_text():
            time.sleep(0.02)

    def log(self) -> str:
        return self.logfile.read_text(errors="replace")

    def statuses(self) -> list[int]:
        return [int(s) for s in re.findall(r"request from pid \d+: status (-?\d+)", self.log())]

    def workers(self) -> list[int]:
        try:
            return [int(p) for p in Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()]
        except FileNotFoundError:
            return []

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="module")
def host(sim_host) -> Path:
    return sim_host("a100x8")


@pytest.fixture(scope="module")
def gpu_uuids(host) -> list[str]:
    return hookenv.gpu_uuids(host)


@pytest.fixture
def sockdir():
    # Short: sun_path holds 108 bytes, pytest's tmp_path can be longer.
    d = Path(tempfile.mkdtemp(prefix="nvs", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def hook_config(tmp_path, host) -> Path:
    return hookenv.write_config(tmp_path / "config.toml", host, log=tmp_path / "hook.log")


@pytest.fixture
def server(hook_config, sockdir):
    s = Serve(hook_config, sockdir / "run/hook.sock")
    yield s
    assert s.stop() == 0, s.log()
    assert not s.sock.exists()          # it removed its socket on the way out


def _runc(tmp_path, config, sock, env, args, mode="v1", stage="prestart", hook_env=()):
    entry = hookenv.hook_entry(config, stage, env=[f"NVHOOK_SOCKET={sock}", *hook_env])
    return RuncContainer(tmp_path, mode=mode, args=["sh", "-c", args], env=ENV + env,
                         devices=[("/dev/nvidia0", 195, 0)], hooks={stage: [entry]})


# -- served ------------------------------------------------------------------------------

@pytest.mark.parametrize("mode, stage", [("v1", "prestart"), ("v2", "prestart"), ("v2", "createContainer")])
def test_served_gpu1(tmp_path, hook_config, server, gpu_uuids, mode, stage):
    with _runc(tmp_path, hook_config, server.sock, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE, mode, stage) as c:
        r = c.run()
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)
    assert server.statuses() == [0], server.log()              # the server did it, not a fallback
    assert f"{stage}: done" in (tmp_path / "hook.log").read_text()
    assert "imported after fork" not in server.log()           # nothing read from the front's fs


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
    assert server.statuses() == [1]
    with open("/proc/self/mountinfo") as f:
        assert rootfs not in f.read()


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
    assert server.statuses() == [0]             # the first one only: "none" turns the service off
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
        assert s.statuses() == [0]
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
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_non_root_peer_is_refused(tmp_path, server):
    from libinject.runtime import service as hookserver

    b = tmp_path / "bundle"
    b.mkdir()
    state = f'{{"ociVersion":"1.0.2","id":"x","status":"creating","pid":1,"bundle":"{b}"}}'.encode()

    def ask() -> int:
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.connect(str(server.sock))
        except PermissionError:
            return 13
        r = hookserver.call(str(server.sock), ["nvhook-hook", "prestart"], state)
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
    from libinject.runtime import service as hookserver

    def raw(msg: bytes, fds: list[int]) -> bytes:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.connect(str(server.sock))
            anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))] if fds else []
            s.sendmsg([msg], anc)
            s.settimeout(30)
            return b"".join(iter(lambda: s.recv(16), b""))

    good = hookserver.encode_request(["nvhook-hook", "prestart"], {})
    five = [0, 1, 2, os.open("/", os.O_PATH), os.open("/", os.O_PATH)]
    try:
        assert raw(b"hello\0", five)[:1] != hookserver.ACCEPTED
        assert raw(good, five[:3])[:1] != hookserver.ACCEPTED
        assert raw(hookserver.encode_request(["x", "poststop"], {}), five)[:1] != hookserver.ACCEPTED
        assert raw(hookserver.encode_request(["x", "prestart"], {"LD_PRELOAD": "/x"}), five)[:1] != hookserver.ACCEPTED
        assert raw(good, [five[3], 1, 2, five[3], five[4]])[:1] != hookserver.ACCEPTED   # state not a file
    finally:
        os.close(five[3])
        os.close(five[4])
    assert server.log().count("declined") == 5, server.log()
    assert hookserver.call(str(server.sock), ["nvhook-hook", "poststop"], b"{}") is None


def test_front_that_gave_up_is_not_served(tmp_path, hook_config, server):
    """A front that stopped waiting before committing (no "G") runs the hook itself; the
    worker must then do nothing, or the container would be configured twice."""
    from libinject.runtime import service as hookserver

    with _runc(tmp_path, hook_config, server.sock, ["NVIDIA_VISIBLE_DEVICES=1"], "sleep 100") as c:
        c.config["hooks"] = {}
        pid = c.create()
        state = (f'{{"ociVersion":"1.0.2","id":"{c.id}","status":"created","pid":{pid},'
                 f'"bundle":"{c.bundle}"}}').encode()
        mfd = os.memfd_create("state")
        os.write(mfd, state)
        dirs = [os.open("/", os.O_PATH), os.open("/", os.O_PATH)]
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.connect(str(server.sock))
            msg = hookserver.encode_request(["nvhook-hook", "--config", str(hook_config), "prestart"], {})
            s.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("5i", mfd, 1, 2, *dirs))])
            assert s.recv(16) == hookserver.ACCEPTED
        for fd in (mfd, *dirs):
            os.close(fd)
        deadline = time.monotonic() + 30
        while not server.statuses() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.statuses() == [0]
        log = tmp_path / "hook.log"
        assert not log.exists() or "configuring" not in log.read_text()
        with open(f"/proc/{pid}/mountinfo") as f:
            assert "nvidia" not in f.read()
        # the same request, committed, is served
        assert hookserver.call(str(server.sock), ["nvhook-hook", "--config", str(hook_config), "prestart"],
                               state) == 0
        with open(f"/proc/{pid}/mountinfo") as f:
            assert "nvidia1" in f.read()


def test_parse_request():
    from libinject.runtime.service import Request, encode_request, parse_request

    msg = encode_request(["nvhook-hook", "--config", "/c", "prestart"], {"NVHOOK_CONFIG": "/a=b"})
    assert parse_request(msg) == Request(("nvhook-hook", "--config", "/c", "prestart"), {"NVHOOK_CONFIG": "/a=b"})
    assert parse_request(msg).stage == "prestart"
    for bad in (b"", b"NVHOOK1\0", b"NVHOOK2\0anvhook\0aprestart\0", msg[:-1], b"NVHOOK1\0xa\0ab\0",
                encode_request(["a", "b"], {"PYTHONPATH": "/x"}), b"NVHOOK1\0aa\0eNVHOOK_CONFIG\0",
                b"NVHOOK1\0a\xff\0ab\0", msg + b"a" * (64 << 10)):
        with pytest.raises(ValueError):
            parse_request(bad)


# -- failures inside the server ---------------------------------------------------------------

def _hanging_config(tmp_path, host) -> Path:
    # The hook log is a FIFO nobody reads: the worker blocks opening it (the exec'd hook
    # would too), while the front, which never touches the log, waits for the server.
    fifo = tmp_path / "hang.fifo"
    os.mkfifo(fifo)
    return hookenv.write_config(tmp_path / "hang.toml", host, log=fifo)


def _front(config: Path, sock: Path, bundle: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    state = f'{{"ociVersion":"1.0.2","id":"x","status":"creating","pid":1,"bundle":"{bundle}"}}'
    return subprocess.run([hookenv.ensure_front(), "--config", str(config), "prestart"], input=state,
                          capture_output=True, text=True, env={"NVHOOK_SOCKET": str(sock)}, timeout=timeout)


def test_server_survives_a_worker_crash(tmp_path, host, hook_config, server, gpu_uuids):
    hang = _hanging_config(tmp_path, host)
    with _runc(tmp_path, hang, server.sock, ["NVIDIA_VISIBLE_DEVICES=1"], "true") as c:
        c.write_config()
        result: dict[str, subprocess.CompletedProcess[str]] = {}
        t = threading.Thread(target=lambda: result.setdefault("r", _front(hang, server.sock, c.bundle)))
        t.start()
        deadline = time.monotonic() + 30
        while not server.workers() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.workers(), server.log()
        for w in server.workers():
            os.kill(w, signal.SIGKILL)
        t.join(60)
    r = result["r"]
    assert (r.returncode, r.stderr) == (1, "nvhook: hook service: worker died configuring the container\n")
    assert "died of signal 9" in server.log()
    # and the next container is served as ever
    with _runc(tmp_path, hook_config, server.sock, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE) as c:
        r = c.run()
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)
    assert server.statuses() == [-1, 0]


def test_worker_timeout(tmp_path, host, hook_config, sockdir):
    hang = _hanging_config(tmp_path, host)
    s = Serve(hook_config, sockdir / "hook.sock", "--timeout", "1")
    try:
        with _runc(tmp_path, hang, s.sock, ["NVIDIA_VISIBLE_DEVICES=1"], "true") as c:
            c.write_config()
            t = time.monotonic()
            r = _front(hang, s.sock, c.bundle)
        assert (r.returncode, r.stderr) == (1, "nvhook: hook service: timed out configuring the container\n")
        assert time.monotonic() - t < 10
        assert "timed out after 1s, killed" in s.log() and s.statuses() == [-2]
        assert s.workers() == []
    finally:
        assert s.stop() == 0


# -- no stale data, no foreign env -------------------------------------------------------------

def test_changed_host_is_seen(tmp_path, fresh_sim_host, sockdir):
    host = fresh_sim_host("a100x8")
    cfg = hookenv.write_config(tmp_path / "c.toml", host, log=tmp_path / "hook.log",
                               extra=f'snapshot-dir = "{tmp_path}/snap"\n')
    cfg.write_text(cfg.read_text().replace("snapshot = false", "snapshot = true"))
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
        assert "learned 1 driver(s)" in s.log()
        with _runc(tmp_path, cfg, s.sock, ["NVIDIA_VISIBLE_DEVICES=all"], "nvidia-smi -L") as c:
            r = c.run()
        assert r.returncode == 0 and r.stdout.count("GPU ") == 7, r.stdout + r.stderr
        assert s.statuses() == [0, 1, 0]
        assert "imported after fork" not in s.log()     # rediscovery too: all preloaded
    finally:
        assert s.stop() == 0


def test_container_env_reaches_neither_server_nor_worker(tmp_path, hook_config, server):
    from test_hook_isolation import _evil_env, _plant, make_canary

    canary = make_canary(tmp_path)
    out, lib, pydir = canary["out"], canary["lib"], canary["pydir"]

    hook_env = [f"LD_PRELOAD={lib}", f"PYTHONPATH={pydir}", "PYTHONHOME=/nonexistent",
                f"NVHOOK_CONFIG={hook_config}", "XDG_CONFIG_HOME=/nonexistent"]
    with _runc(tmp_path, hook_config, server.sock, [], "nvidia-smi -L", hook_env=hook_env) as c:
        _plant(c.rootfs, canary)
        c.config["process"]["env"] = ENV + ["NVIDIA_VISIBLE_DEVICES=1", *_evil_env(canary, c.rootfs)]
        r = c.run()
    assert "GPU 0: NVIDIA" in r.stdout, r.stdout + r.stderr
    assert server.statuses() == [0]
    # what the worker ran with: PATH and the two config entries, nothing else
    assert "env=[NVHOOK_CONFIG PATH XDG_CONFIG_HOME]" in server.log(), server.log()
    assert not out.exists(), out.read_text()
    # nor did anything reach the server's own environment
    environ = Path(f"/proc/{server.proc.pid}/environ").read_bytes()
    assert b"LD_PRELOAD" not in environ and b"PYTHON" not in environ and b"NVIDIA" not in environ
