"""Trust boundaries of the hook, its front and the hook service, attacked for real.

Each test is an attack that worked before these boundaries were drawn: the hook's
environment (a createContainer hook gets the container's under runc), a listener that
is not the service, a peer that is not the runtime, a wedged service, hook entries that
run Python with the environment it was given, and the unprivileged-request policy.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from conftest import NVHOOK, REPO
from libinject.constants import SAFE_PATH
from support import hookenv, serve_client
from support.hookenv import PROBE, assert_only_gpu1, gpu_container
from support.runc import RuncContainer, RuncError

PY = str(REPO / ".venv/bin/python")

# A fake `nvhook serve`: accepts connections on SOCK and records what each sent (bytes and
# how many fds), holding the fds (as a wedged service would) until it is killed.
FAKE_SERVER = textwrap.dedent("""
    import os, socket, sys, time
    sock, out = sys.argv[1], sys.argv[2]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(sock)
    s.listen(8)
    open(out + ".ready", "w").close()
    held = []
    while True:
        c, _ = s.accept()
        held.append(c)
        c.settimeout(10)
        try:
            data, anc, _, _ = c.recvmsg(1 << 16, socket.CMSG_SPACE(64))
        except OSError:
            data, anc = b"", []
        fds = [f for _, _, p in anc for f in [int.from_bytes(p[i:i + 4], "little")
                                                 for i in range(0, len(p) - 3, 4)]]
        held += fds
        with open(out, "a") as f:
            f.write(f"{len(data)} {len(fds)}\\n")
""")


class FakeServer:
    def __init__(self, sock: Path, out: Path, *, unshare: bool = False) -> None:
        self.out = out
        argv = [PY, "-I", "-c", FAKE_SERVER, str(sock), str(out)]
        if unshare:   # root, but in a mount namespace of its own (as in a container)
            argv = ["unshare", "-m", "--propagation", "private", *argv]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env={})
        deadline = time.monotonic() + 30
        while not Path(str(out) + ".ready").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail("the fake server did not start")
            time.sleep(0.02)

    def requests(self) -> list[str]:
        return self.out.read_text().splitlines() if self.out.exists() else []

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(30)


def _bare_hook(stage: str, *args: str) -> dict:
    """A hook entry with no env at all: runc then runs a createContainer hook with the
    container's environment."""
    return {"path": hookenv.ensure_front(), "args": ["nvhook-hook", *args, stage], "timeout": 60}


# -- 1. the hook's environment chooses nothing ---------------------------------------------------

def test_container_env_cannot_choose_the_config(tmp_path, a100_host):
    """NVHOOK_CONFIG / XDG_CONFIG_HOME in the container's env named a config (driver root,
    NVML user, log file) that the createContainer hook then used as host root."""
    canary = tmp_path / "evil.log"
    evil = tmp_path / "evil.toml"
    evil.write_text(f'[nvidia-container-cli]\nroot = "{a100_host}"\nuser = "0:0"\n'
                    f'[nvhook]\nsnapshot = false\nlog-file = "{canary}"\nlog-level = "debug"\n')
    xdg = tmp_path / "xdg/nvidia-container-runtime"
    xdg.mkdir(parents=True)
    (xdg / "config.toml").write_text(evil.read_text())
    env = ["NVIDIA_VISIBLE_DEVICES=1", f"NVHOOK_CONFIG={evil}", f"XDG_CONFIG_HOME={tmp_path / 'xdg'}"]
    with RuncContainer(tmp_path / "c", mode="v2", args=["true"], env=hookenv.ENV + env,
                       hooks={"createContainer": [_bare_hook("createContainer", "--socket", "none")]}) as c:
        with pytest.raises(RuncError) as e:
            c.create()
    # The default config (/etc, absent here) says driver root "/": no driver on this host.
    assert "nvhook: NVML not found under driver root /" in str(e.value)
    assert not canary.exists()


def test_container_env_cannot_choose_the_service_socket(tmp_path, a100_host, sockdir):
    """NVHOOK_SOCKET in the container's env made the front hand a socket of the
    container's choosing the host's root, its cwd and runc's stdio."""
    fake = FakeServer(sockdir / "evil.sock", tmp_path / "evil.requests")
    try:
        cfg = hookenv.write_config(tmp_path / "config.toml", a100_host)
        env = ["NVIDIA_VISIBLE_DEVICES=1", f"NVHOOK_SOCKET={sockdir / 'evil.sock'}"]
        with RuncContainer(tmp_path / "c", mode="v2", args=["true"], env=hookenv.ENV + env,
                           hooks={"createContainer": [_bare_hook("createContainer", "--config", str(cfg))]}) as c:
            c.create()
        assert fake.requests() == []
    finally:
        fake.stop()


def test_console_script_as_a_hook_runs_isolated(tmp_path, a100_host):
    """`.venv/bin/nvhook` as a hook entry: Python started with the environment it was given
    (PYTHONPATH shadowing a module the hook imports late). It re-execs through the front."""
    out = tmp_path / "canary"
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "tomllib.py").write_text(f"open({str(out)!r}, 'a').write('tomllib\\n')\nfrom json import *\n")
    cfg = hookenv.write_config(tmp_path / "config.toml", a100_host)
    entry = {"path": NVHOOK, "args": ["nvhook", "--config", str(cfg), "--socket", "none", "createContainer"],
             "timeout": 60}
    with RuncContainer(tmp_path / "c", mode="v2", args=["sh", "-c", "ls /dev"],
                       env=hookenv.ENV + ["NVIDIA_VISIBLE_DEVICES=1", f"PYTHONPATH={evil}"],
                       hooks={"createContainer": [entry]}) as c:
        r = c.run()
    assert r.returncode == 0, r.stderr
    assert "nvidia1" in r.stdout
    assert not out.exists()


def test_hook_entries_nvhook_writes_use_the_front(tmp_path, a100_host):
    from libinject import config
    from libinject.runtime import shim

    front = hookenv.ensure_front()
    spec = json.loads(subprocess.run(
        [front, "--config", str(hookenv.write_config(tmp_path / "c.toml", a100_host)), "cdi", "generate"],
        capture_output=True, text=True, check=True, env={}, timeout=120).stdout)
    hooks = [h for d in spec["devices"] for h in d["containerEdits"].get("hooks", [])]
    hooks += spec["containerEdits"].get("hooks", [])
    assert hooks and {(h["path"], h["args"][0]) for h in hooks} == {(front, "nvhook-hook")}
    assert all(h["env"] == [f"PATH={SAFE_PATH}"] for h in hooks)
    legacy = shim.legacy_hook()
    assert (legacy["path"], legacy["args"], legacy["env"]) == (
        front, ["nvhook-hook", "prestart"], [f"PATH={SAFE_PATH}"])
    cfg = config.parse("", "/srv/nvhook.toml")
    assert shim.legacy_hook(shim._explicit_config(cfg))["args"] == [
        "nvhook-hook", "--config", "/srv/nvhook.toml", "prestart"]


# -- 2. the front talks only to the real service ---------------------------------------------------

def test_front_does_not_talk_to_a_listener_in_another_mount_namespace(tmp_path, hook_config, gpu_uuids,
                                                                       sockdir):
    """A root listener at the configured path that is not in the runtime's mount namespace
    (a container that could bind there) gets nothing: no request, no fds."""
    fake = FakeServer(sockdir / "hook.sock", tmp_path / "requests", unshare=True)
    try:
        with gpu_container(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE,
                           socket=str(sockdir / "hook.sock")) as c:
            r = c.run()
        assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)      # the front did it itself
        assert fake.requests() == ["0 0"]                     # it connected, then sent nothing
    finally:
        fake.stop()


# -- 3. the service serves only the runtime ---------------------------------------------------------

def test_service_refuses_a_root_peer_in_another_mount_namespace(tmp_path, server):
    """Root in a container that reaches the socket: refused before anything is read (the
    worker used to enter the peer's namespaces and root, and exec from there)."""
    b = tmp_path / "bundle"
    b.mkdir()
    state = f'{{"ociVersion":"1.0.2","id":"x","status":"creating","pid":1,"bundle":"{b}"}}'
    code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
            "from support import serve_client\n"
            "r = serve_client.call(sys.argv[3], ['nvhook-hook', 'prestart'], sys.argv[4].encode())\n"
            "print('fell back' if r is None else f'served {r}')")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", PY, "-I", "-c", code,
                        str(REPO / "tests"), str(REPO), str(server.sock), state],
                       capture_output=True, text=True, timeout=60, env={})
    assert r.stdout.strip() == "fell back", r.stdout + r.stderr
    assert "in another mount namespace" in server.log(), server.log()
    assert server.statuses() == []
    # the same request from the runtime's namespace is served
    assert serve_client.call(str(server.sock), ["nvhook-hook", "prestart"], state.encode()) is not None


# -- 9. a stuck service never blocks a container start ------------------------------------------------

def test_wedged_service_never_holds_the_runtime(tmp_path, hook_config, gpu_uuids, sockdir):
    """A service that accepts and never answers: the front falls back after its wait (5 s),
    and since it never hands over runc's stdout/stderr, `runc run` is not left waiting for
    EOF on them for as long as the service is stuck."""
    fake = FakeServer(sockdir / "hook.sock", tmp_path / "requests")
    try:
        t = time.monotonic()
        with gpu_container(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE,
                           socket=str(sockdir / "hook.sock")) as c:
            r = c.run(timeout=40)
        assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)
        assert time.monotonic() - t < 30
        deadline = time.monotonic() + 10
        while not fake.requests() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert fake.requests() == ["0 0"]       # it never said hello: the front sent nothing
    finally:
        fake.stop()


def test_socket_appears_only_once_warm(tmp_path, fresh_sim_host, sockdir):
    """Bound before warm-up, a service made every front wait for it (or fall back)."""
    from support.serve import Serve

    cfg = hookenv.slow_warm_config(tmp_path, fresh_sim_host("t4x1"))
    sock = sockdir / "run/hook.sock"
    s = Serve(cfg, sock)
    try:
        log = s.log()
        assert log.index("warm: driver") < log.index("listening on"), log
    finally:
        assert s.stop() == 0


# -- 6. one device policy on every path --------------------------------------------------------------

def test_unprivileged_cdi_annotation_gets_no_gpu_when_envvar_not_accepted(tmp_path, a100_host):
    cfg = hookenv.write_config(tmp_path / "config.toml", a100_host, log=tmp_path / "hook.log",
                               top="accept-nvidia-visible-devices-envvar-when-unprivileged = false\n")
    with gpu_container(tmp_path, cfg, [], "ls /dev; nvidia-smi -L") as c:
        c.config["annotations"] = {"cdi.k8s.io/gpu": "nvidia.com/gpu=1"}
        r = c.run()
    assert "nvidia1" not in r.stdout and "GPU 0:" not in r.stdout, r.stdout + r.stderr
    assert "ignoring CDI annotations in an unprivileged container" in (tmp_path / "hook.log").read_text()


def test_fake_server_records_what_it_gets(tmp_path, sockdir):
    """The fake server itself: it sees what a client sends (so an empty record above
    means nothing was sent)."""
    fake = FakeServer(sockdir / "f.sock", tmp_path / "requests")
    try:
        mfd = os.memfd_create("x")
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.connect(str(sockdir / "f.sock"))
            s.sendmsg([b"hello"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("2i", mfd, mfd))])
            deadline = time.monotonic() + 10
            while not fake.requests() and time.monotonic() < deadline:
                time.sleep(0.02)
        os.close(mfd)
        assert fake.requests() == ["5 2"]
        assert serve_client.encode_request(["a", "prestart"]).startswith(b"NVHOOK2\0")
    finally:
        fake.stop()


def _hook_with_config(tmp_path: Path, cfg: Path) -> subprocess.CompletedProcess:
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True, exist_ok=True)
    (bundle / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2", "root": {"path": "rootfs"},
        "process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=9"]}}))
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 1,
                        "bundle": str(bundle)})
    return subprocess.run([hookenv.ensure_front(), "--config", str(cfg), "--socket", "none", "prestart"],
                          input=state, capture_output=True, text=True, env={}, timeout=60)


def test_hook_reads_only_a_config_only_root_could_write(tmp_path, a100_host):
    """The hook entry names the config, but a file (or a directory or symlink on its way)
    that someone else could have written or swapped chooses nothing."""
    good = hookenv.write_config(tmp_path / "good.toml", a100_host)
    assert _hook_with_config(tmp_path, good).stderr == "nvhook: unknown device: 9\n"  # read
    mine = hookenv.write_config(tmp_path / "mine.toml", a100_host)
    os.chown(mine, 65534, 65534)
    wide = tmp_path / "wide"
    wide.mkdir(mode=0o777)
    os.chmod(wide, 0o777)
    in_wide = hookenv.write_config(wide / "c.toml", a100_host)
    link = tmp_path / "link.toml"
    os.symlink(good, link)
    os.lchown(link, 65534, 65534)
    for cfg, what in ((mine, "the file"), (in_wide, f"directory {wide}"), (link, f"symlink {link}")):
        r = _hook_with_config(tmp_path, cfg)
        assert r.returncode == 1 and r.stderr == (
            f"nvhook: config file {cfg}: {what} must be owned by root and writable by nobody else\n"), r.stderr
