"""The runtime shim's `create` served by `nvhook serve` (csrc/shimfront.c ->
libinject/runtime/serve/shim.py), with real runc and a real service on a simulated a100x8
host: a GPU container's create is taken by the service (no Python started by the front),
rewrites the bundle exactly as the exec'd shim does and the container sees only its GPU,
in legacy and cdi modes; no service, or a front the service must not serve: the exec'd
shim does it; a create that wants no GPU never reaches the service; a bad bundle fails
with one `nvhook:` line, served as exec'd."""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import struct
import subprocess
from pathlib import Path

import pytest

import support.runc as R
from conftest import NVHOOK, REPO, run
from support import serve_client
from support.serve import Serve
from support.shimenv import ENV_PATH, SHIM, gpu_env, write_config

STRACE = shutil.which("strace") or "/usr/bin/strace"
PYTHON = str(REPO / ".venv/bin/python")
OTHER = [("/dev/nvidia0", 195, 0)]      # a node runc makes, of a GPU the cgroup must refuse


@pytest.fixture
def setup(sim_host, tmp_path, sockdir):
    """(configure(mode, **kw) -> config path, socket path, start() -> Serve): the shim's
    config names the service's socket ([nvhook] socket); the service is started on it
    with that config."""
    host = sim_host("a100x8")
    specs = tmp_path / "specs"
    specs.mkdir()
    # YAML, as NVIDIA's own spec: a served create parses it with PyYAML (preloaded)
    r = run([NVHOOK, "cdi", "generate", "--driver-root", str(host), "-o", str(specs / "nvidia.yaml")])
    assert r.returncode == 0, r.stderr
    sock = sockdir / "run/hook.sock"
    served: list[Serve] = []

    def configure(mode: str, **kw) -> Path:
        return write_config(tmp_path / f"config-{mode}.toml", root=host, mode=mode, spec_dirs=[specs],
                            extra=f'socket = "{sock}"', **kw)

    def start(config: Path) -> Serve:
        s = Serve(config, sock)
        served.append(s)
        return s

    yield configure, sock, start
    for s in served:
        assert s.stop() == 0, s.log()


def served_creates(server: Serve) -> list[str]:
    """The creates the service's workers took (its -v log), as their argv."""
    return re.findall(r"request from pid \d+: ((?:\S+ )*create .*?) cwd=", server.log())


def fake_runtime(d: Path) -> Path:
    """A `runc` that prints how it was called."""
    d.mkdir(exist_ok=True)
    p = d / "runc"
    p.write_text('#!/bin/sh\necho "$0 $*"\n')
    p.chmod(0o755)
    return p


def execs(tmp_path: Path, argv: list[str], env: dict[str, str],
          cwd: Path | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
    """argv under strace: (its result, the programs it exec'd, in order, and "fsync"
    for each fsync it made)."""
    log = tmp_path / "strace.log"
    r = subprocess.run([STRACE, "-f", "-qq", "-e", "trace=execve,fsync", "-o", str(log), *argv],
                       capture_output=True, text=True, env=env, timeout=120, cwd=cwd)
    return r, [a or b for a, b in re.findall(r'execve\("([^"]+)", .*\) = 0|(fsync)\(', log.read_text())]


def bundle(tmp_path: Path, env: list[str], name: str = "b") -> Path:
    b = tmp_path / name
    (b / "rootfs").mkdir(parents=True)
    spec = {"ociVersion": "1.0.2", "process": {"args": ["true"], "env": [ENV_PATH, *env]},
            "root": {"path": "rootfs"}, "linux": {"resources": {"devices": []}}}
    (b / "config.json").write_text(json.dumps(spec))
    return b


@pytest.mark.parametrize("mode", ["legacy", "cdi"])
def test_served_create_gives_the_container_its_gpu(setup, tmp_path, monkeypatch, mode):
    configure, sock, start = setup
    cfg = configure(mode)
    server = start(cfg)
    monkeypatch.setenv("NVHOOK_CONFIG", str(cfg))
    monkeypatch.setattr(R, "RUNC", SHIM)
    with R.RuncContainer(tmp_path, env=gpu_env("1"), devices=OTHER) as c:
        c.create()
        c.start()
        assert {m: c.open_result(f"/dev/nvidia{m}") for m in range(8)} == \
            {m: {0: "EPERM", 1: "ENXIO"}.get(m, "ENOENT") for m in range(8)}
        smi = c.exec("nvidia-smi", "-L")
        assert smi.returncode == 0 and smi.stdout.count("GPU ") == 1, smi.stdout + smi.stderr
        spec = json.loads((c.bundle / "config.json").read_text())
        created = f"--root {c.state_root} create --bundle {c.bundle} {c.id}"
    assert served_creates(server) == [created], server.log()
    if mode == "legacy":
        # the prestart hook the shim added, told the service's socket, is served too
        [hook] = spec["hooks"]["prestart"]
        assert hook["args"][-3:] == ["--socket", str(sock), "prestart"]
        assert server.statuses(2) == [0, 0], server.log()
    else:
        assert "NVIDIA_VISIBLE_DEVICES=void" in spec["process"]["env"]
        assert server.statuses(1)[0] == 0, server.log()
    assert "imported after fork" not in server.log()


@pytest.mark.parametrize("mode", ["legacy", "cdi"])
def test_served_create_rewrites_as_the_exec_shim_and_starts_no_python(setup, tmp_path, mode):
    """The front execs the runtime the service names, with its own argv; the bundle is
    what the exec'd shim makes of it (the service stopped: the front execs Python).
    A relative bundle (the cwd, no --bundle) means the front's cwd."""
    configure, sock, start = setup
    fake = fake_runtime(tmp_path / "bin")
    cfg = configure(mode)
    env = {"PATH": f"{fake.parent}:/usr/sbin:/usr/bin:/sbin:/bin", "NVHOOK_CONFIG": str(cfg)}
    argv = ["--root", "/r", "create", "--pid-file", "/p", "cid"]
    server = start(cfg)
    got = {}
    for how in ("served", "exec"):
        b = bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=1"], f"b-{how}")
        r, progs = execs(tmp_path, [SHIM, *argv], env, cwd=b)
        assert r.returncode == 0, r.stderr
        assert r.stdout == f"{fake} {' '.join(argv)}\n" and r.stderr == ""
        if how == "served":
            assert progs == [SHIM, str(fake)]               # no Python: the service did it
            assert served_creates(server) == [" ".join(argv)]
            assert server.stop() == 0
        else:
            # no service: the exec'd shim, which rewrites without fsync (the runtime reads
            # the bundle a moment later; a crash takes the container anyway)
            assert progs == [SHIM, PYTHON, str(fake)]
        got[how] = json.loads((b / "config.json").read_text())
    assert got["served"] == got["exec"]
    assert got["served"] != json.loads((bundle(tmp_path, [], "plain") / "config.json").read_text())


def test_no_gpu_create_never_reaches_the_service(setup, tmp_path):
    configure, sock, start = setup
    fake = fake_runtime(tmp_path / "bin")
    cfg = configure("legacy", runtimes=False)       # the front finds runc itself
    server = start(cfg)
    env = {"PATH": f"{fake.parent}:/usr/sbin:/usr/bin:/sbin:/bin", "NVHOOK_CONFIG": str(cfg)}
    none = bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=void"])
    before = (none / "config.json").read_bytes()
    r, progs = execs(tmp_path, [SHIM, "create", "--bundle", str(none), "cid"], env)
    assert r.returncode == 0, r.stderr
    assert progs == [SHIM, str(fake)]
    assert (none / "config.json").read_bytes() == before
    # the same front and service serve a GPU create
    gpu = bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=0"], "gpu")
    r, progs = execs(tmp_path, [SHIM, "create", "--bundle", str(gpu), "cid"], env)
    assert r.returncode == 0 and progs == [SHIM, str(fake)], r.stderr
    assert served_creates(server) == [f"create --bundle {gpu} cid"]
    assert f"--bundle {none} " not in server.log()


def test_a_front_in_another_mount_namespace_is_not_served(setup, tmp_path):
    """An engine whose runtime runs in a private mount namespace (the paths its create
    names need not mean the same to the service): the service refuses the peer and
    the front execs the shim, which does the create in its own namespace."""
    configure, sock, start = setup
    fake = fake_runtime(tmp_path / "bin")
    cfg = configure("legacy")
    server = start(cfg)
    env = {"PATH": f"{fake.parent}:/usr/sbin:/usr/bin:/sbin:/bin", "NVHOOK_CONFIG": str(cfg)}
    b = bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=1"])
    r, progs = execs(tmp_path, ["unshare", "-m", "--propagation", "private", SHIM, "create",
                                "--bundle", str(b), "cid"], env)
    assert r.returncode == 0, r.stderr
    assert progs[-2:] == [PYTHON, str(fake)]
    assert len(json.loads((b / "config.json").read_text())["hooks"]["prestart"]) == 1
    assert re.search(r"refused peer pid=\d+ uid=0: in another mount namespace", server.log()), server.log()
    assert served_creates(server) == [] and server.statuses() == []


def test_shim_requests_the_service_declines(setup, tmp_path):
    """A shim request is taken only well formed, for `create`, with the peer's proof of
    its namespaces and no other fd (no state, no stdio), in a cwd the worker can enter."""
    from libinject.runtime.serve import protocol

    configure, sock, start = setup
    server = start(configure("legacy"))
    b = bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=1"])

    def encode(argv: list[str], cwd: str = "/", extra: bytes = b"") -> bytes:
        items = [b"NVSHIM1"] + [b"a" + a.encode() for a in argv]
        items += [b"c" + cwd.encode(), b"f/nonexistent/config.toml", b"x" + SHIM.encode(), b"u22"]
        return b"\0".join(items) + b"\0" + extra

    def ask(msg: bytes, fds: list[int]) -> bytes:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.settimeout(30)
            s.connect(str(sock))
            assert serve_client.hello(s)
            anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))] if fds else []
            s.sendmsg([msg], anc)
            return b"".join(iter(lambda: s.recv(16), b""))

    good = encode(["nvhook-runtime", "create", "--bundle", str(b), "cid"])
    ns = serve_client.own_ns_fds()
    other = os.open("/proc/self/ns/net", os.O_RDONLY)
    state = os.memfd_create("state")
    try:
        assert ask(good, ns)[:1] == protocol.ACCEPTED                       # (then not committed)
        assert ask(good, [])[:1] != protocol.ACCEPTED                       # no namespace proof
        assert ask(good, [other, ns[1]])[:1] != protocol.ACCEPTED           # not our mount ns
        assert ask(good, [state, *ns])[:1] != protocol.ACCEPTED             # no state for a shim
        assert ask(encode(["nvhook-runtime", "start", "cid"]), ns)[:1] != protocol.ACCEPTED
        assert ask(encode(["nvhook-runtime", "create", "cid"], "/no/such/dir"), ns)[:1] != protocol.ACCEPTED
        assert ask(good + b"ePATH=/x\0", ns)[:1] != protocol.ACCEPTED       # no env items
        assert ask(good + b"c/tmp\0", ns)[:1] != protocol.ACCEPTED          # each item once
    finally:
        for fd in (*ns, other, state):
            os.close(fd)
    assert server.log().count("declined:") == 7, server.log()     # (and 7 "declined after")
    assert "cwd /no/such/dir: No such file or directory" in server.log()
    # the one accepted was never committed: the bundle is as it was
    assert "hooks" not in json.loads((b / "config.json").read_text())


def test_parse_shim_request():
    from libinject.runtime.serve.protocol import parse_request
    from libinject.runtime.serve.shim import ShimRequest

    base = [b"NVSHIM1", b"anvhook-runtime", b"acreate", b"acid", b"c/b", b"F/etc/x.toml", b"x/f", b"u27"]

    def msg(items) -> bytes:
        return b"\0".join(items) + b"\0"

    assert parse_request(msg(base + [b"p/bin"])) == ShimRequest(
        ("nvhook-runtime", "create", "cid"), "/b", "/etc/x.toml", True, "/f", 0o27, "/bin")
    assert parse_request(msg(base[:5] + [b"frel.toml"] + base[6:])).required is False
    for bad in (base[:4] + base[5:], base[:5] + base[6:], base[:-1], base + [b"u22"],
                base[:4] + [b"crel"] + base[5:], base[:-1] + [b"u9"], base[:-1] + [b"u7777"],
                [base[0], b"anvhook-runtime", b"astate", b"acid"] + base[4:], base + [b"Ff"]):
        with pytest.raises(ValueError):
            parse_request(msg(bad))


@pytest.mark.parametrize("case", ["no config.json", "not an OCI spec", "unknown CDI device"])
def test_a_bad_create_gives_one_line_served_as_exec(setup, tmp_path, case):
    configure, sock, start = setup
    fake = fake_runtime(tmp_path / "bin")
    cfg = configure("cdi")
    env = {"PATH": f"{fake.parent}:/usr/sbin:/usr/bin:/sbin:/bin", "NVHOOK_CONFIG": str(cfg)}
    server = start(cfg)
    out = {}
    for how in ("served", "exec"):
        b = bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=0,42"], f"b-{how}")
        if case == "no config.json":
            (b / "config.json").unlink()
        elif case == "not an OCI spec":
            (b / "config.json").write_text('{"ociVersion": "1.0.2", "process": {"env": '
                                           '["NVIDIA_VISIBLE_DEVICES=0"]}}')
        before = sorted(p.name for p in b.iterdir())
        r, progs = execs(tmp_path, [SHIM, "create", "--bundle", str(b), "cid"], env)
        assert r.returncode == 1 and r.stdout == "", r.stdout + r.stderr
        assert r.stderr.startswith("nvhook: ") and r.stderr.count("\n") == 1, r.stderr
        assert str(fake) not in progs                       # the runtime never ran
        assert sorted(p.name for p in b.iterdir()) == before
        out[how] = r.stderr.replace(f"b-{how}", "b-X")
        if how == "served":
            assert PYTHON not in progs
            assert server.statuses(1) == [1], server.log()
            assert server.stop() == 0
    assert out["served"] == out["exec"]
    if case == "unknown CDI device":
        assert out["served"] == "nvhook: unresolvable CDI devices nvidia.com/gpu=42\n"


def test_the_front_asks_the_socket_the_config_names(setup, tmp_path, sim_host):
    """[nvhook] socket, relative to the config's directory as libinject.config takes it;
    a spelling the front's scan does not follow (a dotted key) is not guessed at: the
    exec'd shim does the create."""
    configure, sock, start = setup
    fake = fake_runtime(tmp_path / "bin")
    server = start(configure("legacy"))
    host = sim_host("a100x8")
    rel = sock.parent.parent / "shim.toml"          # beside run/hook.sock
    rel.write_text(f'[nvidia-container-cli]\nroot = "{host}"\n'
                   '[nvhook]  # ours\nsnapshot = false\nsocket = "run/hook.sock"   # relative\n')
    dotted = tmp_path / "dotted.toml"
    dotted.write_text(f'nvhook.snapshot = false\nnvhook.socket = "{sock}"\n')
    for cfg, served in ((rel, True), (dotted, False)):
        env = {"PATH": f"{fake.parent}:/usr/sbin:/usr/bin:/sbin:/bin", "NVHOOK_CONFIG": str(cfg)}
        b = bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=1"], f"b-{cfg.stem}")
        r, progs = execs(tmp_path, [SHIM, "create", "--bundle", str(b), "cid"], env)
        assert r.returncode == 0, r.stderr
        assert progs == ([SHIM, str(fake)] if served else [SHIM, PYTHON, str(fake)]), cfg.read_text()
        [hook] = json.loads((b / "config.json").read_text())["hooks"]["prestart"]
        assert hook["args"][-3:] == ["--socket", str(sock), "prestart"]
    assert served_creates(server) == [f"create --bundle {tmp_path / 'b-shim'} cid"]


def test_a_stopped_spare_costs_a_create_a_bounded_wait_said_in_one_line(setup, tmp_path):
    """The service's spare stopped: the front stops waiting (5 s in all), the exec'd shim
    rewrites the bundle, one line says so on stderr and in the runtime's log, and the
    runtime it execs never sees the word the front handed its Python."""
    import signal

    configure, sock, start = setup
    d = tmp_path / "bin"
    d.mkdir()
    fake = d / "runc"
    fake.write_text('#!/bin/sh\necho "${NVHOOK_SERVE_FALLBACK-unset}"\n')
    fake.chmod(0o755)
    cfg = configure("legacy")
    server = start(cfg)
    server.wait_until(lambda: len(server.spares()) == 1, "a spare worker waiting")
    [spare] = server.spares()
    os.kill(spare, signal.SIGSTOP)
    log = tmp_path / "runc.log"
    b = bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=1"])
    try:
        r = subprocess.run([SHIM, "--root", "/r", "--log", str(log), "create", "cid"], cwd=b,
                           env={"PATH": f"{d}:/usr/sbin:/usr/bin:/sbin:/bin", "NVHOOK_CONFIG": str(cfg)},
                           capture_output=True, text=True, timeout=60)
    finally:
        os.kill(spare, signal.SIGCONT)
    line = "hook service at {} did not take the start within 5 s; running it without the service"
    assert (r.returncode, r.stdout, r.stderr) == (0, "unset\n", f"nvhook: {line.format(sock)}\n")
    assert "hook service did not take the start within 5 s" in log.read_text()
    assert len(json.loads((b / "config.json").read_text())["hooks"]["prestart"]) == 1   # rewritten
    server.wait_until(lambda: "abandoned: the front gave up" in server.log(), "the request abandoned")
    assert server.statuses() == []
