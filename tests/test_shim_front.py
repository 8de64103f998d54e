"""The runtime shim's compiled front (csrc/shimfront.c): every runc command but `create`
goes straight to the low-level runtime, unchanged, without starting Python."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO
from support.shimenv import SHIM

RUNC = shutil.which("runc") or "/usr/sbin/runc"
STRACE = shutil.which("strace") or "/usr/bin/strace"


def _execs(tmp_path: Path, argv: list[str], env: dict[str, str],
           cwd: Path | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run argv under strace; (its result, the programs it exec'd, in order)."""
    log = tmp_path / "strace.log"
    r = subprocess.run([STRACE, "-f", "-qq", "-e", "trace=execve", "-o", str(log), *argv],
                       capture_output=True, text=True, env=env, timeout=120, cwd=cwd)
    progs = re.findall(r'execve\("([^"]+)", .*\) = 0', log.read_text())
    return r, progs


def _fake_runtime(d: Path, name: str) -> Path:
    d.mkdir(exist_ok=True)
    p = d / name
    p.write_text('#!/bin/sh\necho "$0 $*"\n')
    p.chmod(0o755)
    return p


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    # no config.toml: NVIDIA's defaults (runtimes docker-runc, runc, crun)
    return {"PATH": f"{tmp_path / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin", "XDG_CONFIG_HOME": str(tmp_path)}


def test_pass_through_execs_the_runtime_directly(tmp_path, env):
    state = tmp_path / "state"
    r, progs = _execs(tmp_path, [SHIM, "--root", str(state), "--log-format=json", "list"], env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == subprocess.run([RUNC, "--root", str(state), "list"], capture_output=True,
                                      text=True, timeout=60).stdout
    assert progs == [SHIM, RUNC]                       # no Python in between


def test_arguments_reach_the_runtime_unchanged(tmp_path, env):
    fake = _fake_runtime(tmp_path / "bin", "runc")
    argv = ["--root", "/r", "-log", "/l", "--log-format", "json", "kill", "--all", "cid", "KILL"]
    r, progs = _execs(tmp_path, [SHIM, *argv], env)
    assert r.stdout == f"{fake} {' '.join(argv)}\n"
    assert progs == [SHIM, str(fake)]


def test_create_and_undecidable_cases_go_to_python(tmp_path, env):
    _fake_runtime(tmp_path / "bin", "runc")
    python = str(REPO / ".venv/bin/python")
    for argv in (["--root", "/r", "create", "--bundle", str(tmp_path / "nope"), "cid"],
                 ["--debug", "state", "cid"], ["--version"]):     # (no config.json: Python says so)
        _, progs = _execs(tmp_path, [SHIM, *argv], env)
        assert progs[:2] == [SHIM, python], argv
    # a config naming its own runtimes (or a log level) is Python's to read
    conf = tmp_path / "nvidia-container-runtime"
    conf.mkdir()
    for text in ('[nvidia-container-runtime]\nruntimes = ["crun"]\n',
                 '[nvidia-container-runtime]\nlog-level = "debug"\n'):
        (conf / "config.toml").write_text(text)
        _, progs = _execs(tmp_path, [SHIM, "state", "cid"], env)
        assert progs[:2] == [SHIM, python], text
    (conf / "config.toml").write_text('#runtimes = ["crun"]\n[nvidia-container-runtime]\nmode = "cdi"\n')
    _, progs = _execs(tmp_path, [SHIM, "state", "cid"], env)
    assert progs == [SHIM, str(tmp_path / "bin/runc")]


def _bundle(tmp_path: Path, env_entries: list[str], annotations: dict | None = None) -> Path:
    import json

    b = tmp_path / f"bundle{len(list(tmp_path.glob('bundle*')))}"
    b.mkdir()
    spec = {"ociVersion": "1.0.2", "process": {"args": ["true"], "env": ["PATH=/bin", *env_entries]},
            "root": {"path": "rootfs"}}
    if annotations:
        spec["annotations"] = annotations
    (b / "config.json").write_text(json.dumps(spec))
    return b


def test_create_of_a_container_that_wants_no_gpu_skips_python(tmp_path, env):
    """`create` (Docker and containerd call it once per container, GPU or not): a spec
    without any GPU trigger goes to the runtime as runc would get it, as the hook front
    decides (csrc/gpuscan.h); any trigger still goes to Python."""
    fake = _fake_runtime(tmp_path / "bin", "runc")
    python = str(REPO / ".venv/bin/python")
    none = _bundle(tmp_path, ["HOME=/root", "NVIDIA_VISIBLE_DEVICES=void"])
    for argv in (["create", "--bundle", str(none), "cid"], ["--root", "/r", "create", "-b", str(none), "cid"],
                 ["create", f"--bundle={none}", "--pid-file", "/p", "cid"], ["create", f"--b={none}", "cid"],
                 ["create", "--pid-file", "--bundle", "-bundle", str(none), "cid"]):
        r, progs = _execs(tmp_path, [SHIM, *argv], env)
        assert progs == [SHIM, str(fake)], argv
        assert r.stdout == f"{fake} {' '.join(argv)}\n"
    _, progs = _execs(tmp_path, [SHIM, "create", "cid"], env, cwd=none)     # no --bundle: the cwd
    assert progs == [SHIM, str(fake)]
    for gpu in (_bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=0"]), _bundle(tmp_path, ["CUDA_VERSION=12.4"]),
                _bundle(tmp_path, [], {"cdi.k8s.io/x": "nvidia.com/gpu=0"})):
        _, progs = _execs(tmp_path, [SHIM, "create", "--bundle", str(gpu), "cid"], env)
        assert progs[:2] == [SHIM, python], gpu
        # the bundle as runc's flag parsing finds it, however spelled (not the cwd's)
        _, progs = _execs(tmp_path, [SHIM, "create", f"--b={gpu}", "cid"], env, cwd=none)
        assert progs[:2] == [SHIM, python], gpu
    # a config that lets other variables ask for GPUs: every create is Python's
    conf = tmp_path / "nvidia-container-runtime"
    conf.mkdir()
    (conf / "config.toml").write_text('swarm-resource = "DOCKER_RESOURCE_GPU"\n')
    _, progs = _execs(tmp_path, [SHIM, "create", "--bundle", str(none), "cid"], env)
    assert progs[:2] == [SHIM, python]


def test_never_execs_itself(tmp_path, env):
    """A `runc` on PATH that is the shim (a symlink) is skipped, as Python's find_runtime does."""
    (tmp_path / "bin").mkdir()
    os.symlink(SHIM, tmp_path / "bin/runc")
    fake = _fake_runtime(tmp_path / "bin", "crun")
    env["PATH"] = str(tmp_path / "bin")
    r, progs = _execs(tmp_path, [SHIM, "state", "cid"], env)
    assert r.stdout == f"{fake} state cid\n"
    assert progs == [SHIM, str(fake)]


def test_python_shim_never_picks_the_front(tmp_path):
    """On `create` the Python shim picks the runtime: a `runc` that is the compiled front
    (a symlink or a hard link) would exec the front again, in a loop."""
    from libinject.errors import NvhookError
    from libinject.runtime.shim import find_runtime

    d = tmp_path / "bin"
    d.mkdir()
    os.symlink(SHIM, d / "runc")
    os.link(SHIM, d / "docker-runc")
    fake = _fake_runtime(d, "crun")
    rel = tmp_path / "rel"
    _fake_runtime(rel, "runc")
    assert find_runtime(["docker-runc", "runc", "crun"], path=f"rel:{d}") == str(fake)
    with pytest.raises(NvhookError, match="no low-level runtime found"):
        find_runtime(["docker-runc", "runc", "./rel/runc"], path=str(d))
