"""Hostile or broken input through the real CLI: the OCI hook (state on stdin, the bundle's
config.json), `configure` and the CDI hooks. Each must give exactly one clear
`nvhook: ` line and a non-zero exit, never a traceback, a bare Python exception, a line
with control characters, or a hang, and must change nothing.

The hook runs with `no-cgroups` and, as the container's pid, a process in a private
mount namespace: a check that wrongly let a request through (the code before these
checks) injects nothing into the host.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from conftest import NVHOOK, run
from support import cli, hookenv

REPO = Path(__file__).resolve().parent.parent
NVHOOK_PY = str(REPO / ".venv" / "bin" / "python")

# What a clear line is not: Python's own words for a bug, or the hook's catch-all for one.
_NOT_CLEAR = re.compile(cli.NOT_CLEAR.pattern + r"|hook failed")
BIG = "1" * 5000        # past Python's 4300-digit int() limit


def one_error(r: subprocess.CompletedProcess, *expected: str) -> str:
    """The single `nvhook: ` line of a failed command (asserting it is one, and clear)."""
    return cli.one_error(r, *expected, not_clear=_NOT_CLEAR)


@pytest.fixture(scope="module")
def sandbox_pid():
    """A process in a private mount namespace, standing in for the container."""
    p = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sleep", "600"])
    ours = os.readlink("/proc/self/ns/mnt")
    deadline = time.monotonic() + 10
    while os.readlink(f"/proc/{p.pid}/ns/mnt") == ours:
        assert time.monotonic() < deadline, "unshare did not start"
        time.sleep(0.01)
    yield p.pid
    p.kill()
    p.wait()


@pytest.fixture
def hook_cfg(tmp_path, a100_host) -> Path:
    cfg = tmp_path / "etc" / "config.toml"
    cfg.parent.mkdir()
    cfg.write_text(f'[nvidia-container-cli]\nroot = "{a100_host}"\nno-cgroups = true\n'
                   "[nvhook]\nsnapshot = false\n")
    return cfg


def gpu_spec(*env: str, **top) -> dict:
    """A privileged container asking for GPU 0; env entries are added."""
    spec = {"ociVersion": "1.0.2", "root": {"path": "rootfs"},
            "process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0", *env],
                        "capabilities": {"bounding": ["CAP_SYS_ADMIN"]}},
            # the compiled front hands a config.json to Python only when it names a trigger
            "x-test": "NVIDIA_VISIBLE_DEVICES"}
    spec.update(top)
    return spec


def hook(tmp_path: Path, cfg: Path, sandbox: int, spec, state: str | None = None, **state_kw):
    """Run `nvhook prestart` on a bundle with this config.json (dict or raw text)."""
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True, exist_ok=True)
    text = spec if isinstance(spec, str) else json.dumps(spec)
    (bundle / "config.json").write_text(text)
    if state is None:
        st = {"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": sandbox,
              "bundle": str(bundle)}
        st.update(state_kw)
        state = json.dumps(st)
    r = run([NVHOOK, "--config", str(cfg), "prestart"], input=state, timeout=60)
    assert list((bundle / "rootfs").iterdir()) == [], "the hook changed the rootfs"
    return r


def _deep(n: int = 100000) -> str:
    return "[" * n + "]" * n


# --- ids and versions in the container's environment ------------------------------------

@pytest.mark.parametrize("env, expected", [
    # unicode digits: str.isdigit() and int() take them, nvidia-container-cli does not
    (["NVIDIA_VISIBLE_DEVICES=²"], "unknown device: ²"),
    (["NVIDIA_VISIBLE_DEVICES=١"], "unknown device: ١"),
    (["NVIDIA_VISIBLE_DEVICES=0:١"], "unknown device: 0:١"),
    (["NVIDIA_IMEX_CHANNELS=١"], "invalid IMEX channel: ١"),
    (["NVIDIA_MIG_CONFIG_DEVICES=²"], "mig-config error"),
    # thousands of digits: int() raises ValueError past 4300
    ([f"NVIDIA_VISIBLE_DEVICES={BIG}"], "unknown device: 1111"),
    ([f"NVIDIA_VISIBLE_DEVICES=0:{BIG}"], "unknown device: 0:1111"),
    ([f"NVIDIA_IMEX_CHANNELS={BIG}"], "IMEX channel"),
    ([f"NVIDIA_REQUIRE_CUDA=cuda>={BIG}"], "requirement error: invalid expression"),
    ([f"NVIDIA_REQUIRE_DRIVER=driver>={BIG}"], "requirement error: invalid expression"),
    ([f"NVIDIA_REQUIRE_ARCH=arch>=8.{BIG}"], "requirement error: invalid expression"),
    ([f"CUDA_VERSION={BIG}.0"], "requirement error: invalid expression"),
], ids=lambda v: v[0][:40] if isinstance(v, list) else None)
def test_hook_ids_and_versions(tmp_path, hook_cfg, sandbox_pid, env, expected):
    spec = gpu_spec(*env)
    if env[0].startswith("NVIDIA_VISIBLE_DEVICES"):
        spec["process"]["env"].remove("NVIDIA_VISIBLE_DEVICES=0")
    one_error(hook(tmp_path, hook_cfg, sandbox_pid, spec), expected)


# --- config.json: nesting, types, NUL and lone surrogates -------------------------------

def _spec_with(path: str, value) -> dict:
    spec = gpu_spec()
    *parents, last = path.split(".")
    cur = spec
    for p in parents:
        cur = cur.setdefault(p, {})
    cur[last] = value
    return spec


@pytest.mark.parametrize("path, value, expected", [
    ("process.env", {"NVIDIA_VISIBLE_DEVICES": "0"}, "process.env is an object, expected a list of strings"),
    ("process.env", "NVIDIA_VISIBLE_DEVICES=0", "process.env is a string"),
    ("process.env", 7, "process.env is a number"),
    ("process.env", [7, "NVIDIA_VISIBLE_DEVICES=0"], "process.env[0] is a number, expected a string"),
    ("annotations", ["cdi.k8s.io/x"], "annotations is a list"),
    ("annotations", {"a": 1}, "annotations.a is a number"),
    ("process.capabilities.bounding", 5, "process.capabilities.bounding is a number"),
    ("process.capabilities", "CAP_SYS_ADMIN", "process.capabilities is a string"),
    ("mounts", {"destination": "/x"}, "mounts is an object"),
    ("mounts", "/x", "mounts is a string"),
    ("mounts", [{"destination": 5, "source": "/dev/null"}], "mounts[0].destination is a number"),
    ("mounts", [{"destination": "/x", "source": ["/dev/null"]}], "mounts[0].source is a list"),
    ("mounts", [{"destination": "/x", "options": "ro"}], "mounts[0].options is a string"),
    ("root.path", 5, "root.path"),
    ("linux", "x", "linux is a string, expected an object"),
    ("linux.devices", {"path": "/dev/x"}, "linux.devices is an object"),
    ("hooks", [], "hooks is a list"),
    ("hooks", {"prestart": {"path": "/x"}}, "hooks.prestart is an object"),
    ("process.user", {"uid": 0, "gid": 0, "additionalGids": "5"}, "process.user.additionalGids is a string"),
    ("linux.netDevices", [], "linux.netDevices is a list"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None)
def test_hook_spec_wrong_types(tmp_path, hook_cfg, sandbox_pid, path, value, expected):
    r = hook(tmp_path, hook_cfg, sandbox_pid, _spec_with(path, value))
    one_error(r, "OCI spec", expected)


@pytest.mark.parametrize("text, expected", [
    ('{"ociVersion":"1.0.2","x":"NVIDIA_VISIBLE_DEVICES","deep":' + _deep() + "}", "nested more than"),
    ('{"ociVersion":"1.0.2","x":"NVIDIA_VISIBLE_DEVICES","deep":' + '{"a":' * 5000 + "1" + "}" * 5001,
     "nested more than"),
    (json.dumps(gpu_spec("NVIDIA_REQUIRE_CUDA=cuda>=1\0")), "process.env[2] contains a NUL byte"),
    (json.dumps(_spec_with("root.path", "root\0fs")), "root.path contains a NUL byte"),
    (json.dumps(gpu_spec()).replace("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=\\ud800"),
     "process.env[1] contains a lone surrogate"),
    (json.dumps(_spec_with("root.path", "rootfs\udc80")), "root.path contains a lone surrogate"),
    (json.dumps(_spec_with("annotations", {"k\0": "v"})), "a key in annotations contains a NUL byte"),
], ids=["deep-array", "deep-object", "env-nul", "root-nul", "env-surrogate", "root-surrogate", "key-nul"])
def test_hook_spec_nesting_nul_surrogates(tmp_path, hook_cfg, sandbox_pid, text, expected):
    one_error(hook(tmp_path, hook_cfg, sandbox_pid, text), "OCI spec", expected)


# --- the state on stdin ---------------------------------------------------------------

@pytest.mark.parametrize("state_kw, expected", [
    ({"pid": 10 ** 30}, "pid 1000000000000000000000000000000 is out of range"),
    ({"pid": 2 ** 31}, "is out of range"),
    ({"pid": "4242"}, "pid is not a non-negative integer"),
    ({"pid": 1.5}, "pid is not a non-negative integer"),
    ({"pid": True}, "pid is not a non-negative integer"),
    ({"bundle": 7}, "bundle missing"),
    ({"id": "c\0" + "1"}, "id contains a NUL byte"),
    ({"id": "\udc80"}, "id contains a lone surrogate"),
    ({"annotations": {"a": "b\0"}}, "annotations.a contains a NUL byte"),
], ids=["pid-huge", "pid-2^31", "pid-str", "pid-float", "pid-bool", "bundle-int", "id-nul",
        "id-surrogate", "annotation-nul"])
def test_hook_state_values(tmp_path, hook_cfg, sandbox_pid, state_kw, expected):
    one_error(hook(tmp_path, hook_cfg, sandbox_pid, gpu_spec(), **state_kw),
              "container state", expected)


def test_hook_state_bundle_nul_and_surrogate(tmp_path, hook_cfg, sandbox_pid):
    bundle = str(tmp_path / "bundle")
    one_error(hook(tmp_path, hook_cfg, sandbox_pid, gpu_spec(), bundle=bundle + "\0x"),
              "container state: bundle contains a NUL byte")
    one_error(hook(tmp_path, hook_cfg, sandbox_pid, gpu_spec(), bundle=bundle + "\ud800"),
              "container state: bundle contains a lone surrogate")


def test_hook_state_nested(tmp_path, hook_cfg, sandbox_pid):
    bundle = tmp_path / "bundle"
    state = ('{"ociVersion":"1.0.2","id":"c1","status":"creating","bundle":' + json.dumps(str(bundle))
             + ',"x":' + _deep() + "}")
    one_error(hook(tmp_path, hook_cfg, sandbox_pid, gpu_spec(), state=state),
              "container state is nested more than")


# --- FIFOs and devices where a file is expected ----------------------------------------

def test_hook_config_json_fifo_or_device(tmp_path, hook_cfg, sandbox_pid):
    """A FIFO nobody writes (the hook must not wait for a writer) or a device as config.json."""
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": sandbox_pid,
                        "bundle": str(bundle)})
    os.mkfifo(bundle / "config.json")
    t0 = time.monotonic()
    r = run([NVHOOK, "--config", str(hook_cfg), "prestart"], input=state, timeout=20)
    one_error(r, "config.json", "a fifo, not a regular file")
    assert time.monotonic() - t0 < 15
    (bundle / "config.json").unlink()
    (bundle / "config.json").symlink_to("/dev/null")
    r = run([NVHOOK, "--config", str(hook_cfg), "prestart"], input=state, timeout=20)
    one_error(r, "config.json", "a char device, not a regular file")


def test_cdi_hook_stdin_never_closed(tmp_path):
    """A stdin nobody writes to nor closes (a FIFO held open): an error within the deadline
    (libinject.request.oci_state.STATE_TIMEOUT, 10 s), not a hang."""
    fifo = tmp_path / "state"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDWR)   # a writer that never writes
    try:
        t0 = time.monotonic()
        r = run([NVHOOK, "cdi-hook", "update-ldcache", "--folder", "/x"], stdin=fd, timeout=40)
        elapsed = time.monotonic() - t0
    finally:
        os.close(fd)
    one_error(r, "container state on stdin", "no end of input")
    assert elapsed < 30


# --- configure ------------------------------------------------------------------------

@pytest.fixture
def plain_cfg(tmp_path, a100_host) -> Path:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[nvidia-container-cli]\nroot = "{a100_host}"\n[nvhook]\nsnapshot = false\n')
    return cfg


@pytest.mark.parametrize("args, expected", [
    (["--device", "²"], "unknown device: ²"),
    (["--device", "0:١"], "unknown device: 0:١"),
    (["--imex-channel", "١"], "invalid IMEX channel: ١"),
    (["--device", "0", "--mig-config", "²"], "mig-config error"),
    (["--device", BIG], "unknown device: 1111"),
    (["--device", "0:" + BIG], "unknown device: 0:1111"),
    (["--imex-channel", BIG], "IMEX channel"),
    (["--device", "0", "--require", "cuda>=" + BIG], "requirement error: invalid expression"),
    (["--device", "0", "--require", "driver>=550." + BIG], "requirement error: invalid expression"),
], ids=lambda v: " ".join(v)[:40] if isinstance(v, list) else None)
def test_configure_ids_and_versions(tmp_path, plain_cfg, args, expected):
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    r = run([NVHOOK, "--config", str(plain_cfg), "configure", "--dry-run", *args, str(rootfs)])
    one_error(r, expected)


@pytest.mark.parametrize("pid", ["١٢", "+1", " 1", "1" * 5000, str(1 << 40)])
def test_configure_pid(tmp_path, plain_cfg, pid):
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    r = run([NVHOOK, "--config", str(plain_cfg), "configure", "--dry-run", "--pid", pid, str(rootfs)])
    one_error(r, "input error: invalid pid")


@pytest.mark.parametrize("rootfs", ["/.", "/tmp/..", "//", "/./", "//.", "/tmp/../.", "LINK", "LINK/."])
def test_configure_refuses_the_host_root_however_spelled(tmp_path, plain_cfg, rootfs):
    link = tmp_path / "root-link"
    link.symlink_to("/")
    rootfs = rootfs.replace("LINK", str(link))
    # --dry-run: the code before the check changed nothing either
    r = run([NVHOOK, "--config", str(plain_cfg), "configure", "--dry-run", rootfs])
    one_error(r, "invalid rootfs directory")


# --- malformed JSON through the exec'd hook (python -I -S: `json` is never loaded) -------

def test_jsonc_syntax_errors_are_value_errors_without_json_loaded():
    """CPython's C scanner raises a syntax error as json.decoder.JSONDecodeError, looked
    up among loaded modules only: in a bare interpreter, without the fix, a SystemError."""
    from test_jsonc import BAD

    code = ("import sys; sys.path.insert(0, sys.argv[1]); from libinject import jsonc\n"
            "for t in sys.argv[2:]:\n"
            "    try: jsonc.loads(t)\n"
            "    except ValueError: print('ValueError')\n"
            "    else: print('parsed')\n")
    out = subprocess.run([NVHOOK_PY, "-I", "-S", "-c", code, str(REPO), *BAD], capture_output=True,
                         text=True, timeout=60)
    assert out.stderr == "" and out.stdout.split() == ["ValueError"] * len(BAD)


@pytest.mark.parametrize("cut", [-1, -3, -12])     # (the spec keeps the trigger the front looks for)
def test_exec_hook_truncated_state_and_spec(tmp_path, hook_cfg, sandbox_pid, cut):
    """The hook as runtimes exec it (the compiled front, Python with -I -S): a state or
    config.json cut short is one clear line, never SystemError."""
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    spec = json.dumps(gpu_spec())
    (bundle / "config.json").write_text(spec[:cut])
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "status": "creating",
                        "pid": sandbox_pid, "bundle": str(bundle)})
    front = hookenv.ensure_front()
    r = run([front, "--config", str(hook_cfg), "prestart"], input=state, timeout=60)
    one_error(r, "config.json")
    r = run([front, "--config", str(hook_cfg), "prestart"], input=state[:cut], timeout=60)
    one_error(r, "container state")
    assert list((bundle / "rootfs").iterdir()) == []
