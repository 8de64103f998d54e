"""csrc/hookfront.c: decides before Python starts, and hands over cleanly when it cannot.

A front built against a fake "python" (a script recording argv, env, cwd and stdin) shows
what it would run; the real front then shows the whole hook's answers.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from support import hookenv

FAKE_PY = """#!/bin/sh
d=$(dirname "$0")
printf '%s\\n' "$@" > "$d/argv"
env > "$d/env"
pwd > "$d/cwd"
cat > "$d/stdin"
"""


@pytest.fixture(scope="module")
def fake_front(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("front")
    py = d / "python"
    py.write_text(FAKE_PY)
    py.chmod(0o755)
    subprocess.run(["cc", "-O2", "-static", f'-DNVHOOK_PYTHON="{py}"', "-o", str(d / "nvhook-hook"),
                    str(hookenv.FRONT_SRC)], check=True, timeout=120)
    return d


def _bundle(tmp_path: Path, env=(), mounts=(), annotations=None) -> Path:
    b = tmp_path / "bundle"
    b.mkdir(exist_ok=True)
    spec = {"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin", *env], "args": ["sh"]},
            "root": {"path": "rootfs"}, "mounts": list(mounts)}
    if annotations is not None:
        spec["annotations"] = annotations
    (b / "config.json").write_text(json.dumps(spec, indent=1))
    return b


def _state(bundle, **kw) -> bytes:
    st = {"ociVersion": "1.0.2-dev", "id": "c1", "status": "creating", "pid": 1234, "bundle": str(bundle)}
    st.update(kw)
    return json.dumps(st).encode()


def _run(front_dir: Path, state: bytes, *args: str, env=None, cwd="/") -> tuple[int, bool]:
    for f in ("argv", "env", "cwd", "stdin"):
        (front_dir / f).unlink(missing_ok=True)
    r = subprocess.run([str(front_dir / "nvhook-hook"), *args], input=state, capture_output=True,
                       env=env if env is not None else {"PATH": "/bin"}, cwd=cwd, timeout=60)
    return r.returncode, (front_dir / "argv").exists()


@pytest.mark.parametrize("env, mounts, annotations, python", [
    ((), (), None, False),
    (("NVIDIA_VISIBLE_DEVICES=void",), (), None, False),
    (("NVIDIA_VISIBLE_DEVICES=",), (), None, False),
    (("NVIDIA_DRIVER_CAPABILITIES=all", "NVIDIA_REQUIRE_CUDA=cuda>=12"), (), None, False),
    (("NVIDIA_VISIBLE_DEVICES=0",), (), None, True),
    (("NVIDIA_VISIBLE_DEVICES=none",), (), None, True),
    (("NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_VISIBLE_DEVICES=1"), (), None, True),
    (("NVIDIA_VISIBLE_DEVICES=voidx",), (), None, True),
    (("CUDA_VERSION=12.0",), (), None, True),
    (("NVIDIA_VISIBLE_DEVICES=void", "CUDA_VERSION=12.0"), (), None, True),
    ((), ({"destination": "/var/run/nvidia-container-devices/0", "source": "/dev/null"},), None, True),
    ((), (), {"cdi.k8s.io/x": "nvidia.com/gpu=0"}, True),
    ((), (), {"other": "NVIDIA_VISIBLE_DEVICES is mentioned"}, True),   # conservative
])
def test_filter(tmp_path, fake_front, env, mounts, annotations, python):
    b = _bundle(tmp_path, env, mounts, annotations)
    rc, ran = _run(fake_front, _state(b), "prestart")
    assert rc == 0 and ran is python


def test_handover(tmp_path, fake_front):
    b = _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=0", "LD_PRELOAD=/evil.so"])
    state = _state(b)
    env = {"PATH": "/x", "LD_PRELOAD": "/evil.so", "PYTHONPATH": "/evil", "PYTHONHOME": "/evil",
           "NVHOOK_CONFIG": "/cfg.toml", "XDG_CONFIG_HOME": "/xdg", "HOME": "/root"}
    rc, ran = _run(fake_front, state, "--config", "/c.toml", "prestart", env=env, cwd=str(tmp_path))
    assert rc == 0 and ran
    argv = (fake_front / "argv").read_text().splitlines()
    assert argv[:2] == ["-I", "-c"] and argv[-3:] == ["--config", "/c.toml", "prestart"]
    assert "nvhook.cli" in argv[2]
    seen = dict(l.split("=", 1) for l in (fake_front / "env").read_text().splitlines() if "=" in l)
    seen.pop("PWD", None), seen.pop("SHLVL", None), seen.pop("_", None)  # set by the fake's shell
    # Nothing of the hook's own environment goes on: it may be the container's
    # (runc's createContainer hooks without an env of their own), config paths included.
    assert seen == {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "NVHOOK_HOOK_CWD": str(tmp_path)}
    assert (fake_front / "cwd").read_text().strip() == "/"
    assert (fake_front / "stdin").read_bytes() == state


def test_relative_bundle(tmp_path, fake_front):
    _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=0"])
    assert _run(fake_front, _state("bundle"), "prestart", cwd=str(tmp_path)) == (0, True)
    _bundle(tmp_path)
    assert _run(fake_front, _state("bundle"), "prestart", cwd=str(tmp_path)) == (0, False)


@pytest.mark.parametrize("state", [
    b"not json", b"", b'{"bundle": 5}', b'{"ociVersion":"1","bundle":"/a","annotations":{"bundle":"/b"}}',
    b'{"bundle":"/a\\/b"}', b'{"bundlePath":"/nonexistent"}',
])
def test_unclear_state_goes_to_python(tmp_path, fake_front, state):
    assert _run(fake_front, state, "prestart") == (0, True)


def test_missing_config_json_goes_to_python(tmp_path, fake_front):
    assert _run(fake_front, _state(tmp_path / "nope"), "prestart") == (0, True)


def test_noop_stages_and_other_commands(tmp_path, fake_front):
    b = _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=0"])
    assert _run(fake_front, _state(b), "poststart") == (0, False)
    assert _run(fake_front, _state(b), "poststop") == (0, False)
    assert _run(fake_front, b"", "hooks", "print") == (0, True)


def test_config_that_widens_the_triggers(tmp_path, fake_front):
    b = _bundle(tmp_path, ["DOCKER_RESOURCE_GPU=1"])
    cfg = tmp_path / "c.toml"
    cfg.write_text('#swarm-resource = "DOCKER_RESOURCE_GPU"\n')
    assert _run(fake_front, _state(b), "--config", str(cfg), "prestart") == (0, False)
    cfg.write_text('swarm-resource = "DOCKER_RESOURCE_GPU"\n')
    assert _run(fake_front, _state(b), "--config", str(cfg), "prestart") == (0, True)
    assert _run(fake_front, _state(b), f"--config={cfg}", "prestart") == (0, True)
    # the environment never names the config (it may be the container's)
    assert _run(fake_front, _state(b), "prestart", env={"NVHOOK_CONFIG": str(cfg)}) == (0, False)
    xdg = tmp_path / "xdg/nvidia-container-runtime"
    xdg.mkdir(parents=True)
    (xdg / "config.toml").write_text('[nvidia-container-runtime.modes.cdi]\nannotation-prefixes = ["x/"]\n')
    assert _run(fake_front, _state(b), "prestart", env={"XDG_CONFIG_HOME": str(tmp_path / "xdg")}) == (0, False)
    # a FIFO as the config is not waited on: Python reports it
    os.mkfifo(tmp_path / "fifo.toml")
    assert _run(fake_front, _state(b), "--config", str(tmp_path / "fifo.toml"), "prestart") == (0, True)
    # an explicit config that is missing: Python reports it
    assert _run(fake_front, _state(b), "--config", str(tmp_path / "none.toml"), "prestart") == (0, True)


def test_big_state_goes_to_python_and_is_rejected(tmp_path):
    front = hookenv.ensure_front()
    b = _bundle(tmp_path)
    big = _state(b, annotations={"x": "y" * (1 << 20)})
    r = subprocess.run([front, "prestart"], input=big, capture_output=True, env={}, timeout=60)
    assert r.returncode == 1 and b"larger than" in r.stderr


def test_real_front(tmp_path):
    """With the real Python: the same answers through the whole hook."""
    front = hookenv.ensure_front()
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[nvhook]\nlog-file = "{tmp_path}/log"\nlog-level = "debug"\n')

    def hook(*env, stage="prestart"):
        b = _bundle(tmp_path, env)
        return subprocess.run([front, "--config", str(cfg), stage], input=_state(b).decode(), capture_output=True,
                              text=True, env={}, timeout=60)

    r = hook()
    assert (r.returncode, r.stderr) == (0, "")
    assert not (tmp_path / "log").exists()          # decided in the front: Python never ran
    r = hook("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=bogus")
    assert r.returncode == 1
    assert r.stderr.startswith("nvhook: unsupported capabilities found") and r.stderr.count("\n") == 1
    assert "ERROR" in (tmp_path / "log").read_text()
    r = hook("NVIDIA_VISIBLE_DEVICES=0", stage="poststop")
    assert (r.returncode, r.stderr) == (0, "")
    r = hook("NVIDIA_VISIBLE_DEVICES=void", "CUDA_VERSION=12.0")   # Python decides: not a GPU container
    assert (r.returncode, r.stderr) == (0, "")
    assert "not a GPU container" in (tmp_path / "log").read_text()


def test_every_gpu_request_reaches_python(tmp_path, fake_front):
    """Cross-check with the pure request builder: whatever it calls a GPU container, the
    front must hand to Python (it may hand over more, never fewer)."""
    from libinject import config as config_mod
    from libinject.request.oci_spec import wants_gpu

    cases = [
        ["NVIDIA_VISIBLE_DEVICES=all"], ["NVIDIA_VISIBLE_DEVICES= 0 "], ["NVIDIA_VISIBLE_DEVICES=none"],
        ["CUDA_VERSION=11.0"], ["CUDA_VERSION=11.0", "NVIDIA_VISIBLE_DEVICES=2"],
        ["NVIDIA_VISIBLE_DEVICES=0,void"], ["NVIDIA_VISIBLE_DEVICES=void"], [],
        ["NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_VISIBLE_DEVICES=1"],
        ["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_VISIBLE_DEVICES="],
    ]
    cfg = config_mod.Config()
    for env in cases:
        b = _bundle(tmp_path, env)
        spec = json.loads((b / "config.json").read_text())
        _, ran = _run(fake_front, _state(b), "prestart")
        if wants_gpu(spec, cfg):
            assert ran, env


def _has_interpreter(path: str) -> bool:
    """Does the ELF file at path ask for a dynamic loader (a PT_INTERP program header)?"""
    import struct

    with open(path, "rb") as f:
        elf = f.read()
    assert elf[:4] == b"\x7fELF" and elf[4] == 2          # ELF64
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    return any(struct.unpack_from("<I", elf, phoff + i * phentsize)[0] == 3 for i in range(phnum))


def test_fronts_are_static():
    """No dynamic loader runs in the fronts, so LD_PRELOAD and LD_LIBRARY_PATH in their
    environment (the container's, for a createContainer hook) load nothing."""
    from support.shimenv import SHIM

    for front in (hookenv.ensure_front(), SHIM):
        assert not _has_interpreter(front), front
    assert _has_interpreter("/bin/sh")                   # the check itself sees one
