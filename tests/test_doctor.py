"""`nvhook doctor` on a simulated node: a set-up that works passes; each broken one
(service down, an engine's config naming another install, a stale CDI spec, no NVML
under the driver root, not root) is named on its own line with what to do."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import NVHOOK, run
from support import hookenv
from support.serve import Serve
from support.shimenv import SHIM


@pytest.fixture
def node(tmp_path, a100_host, sockdir):
    """(config, the engine paths' arguments, run doctor) for a node set up with this install."""
    sock = sockdir / "hook.sock"
    cfg = hookenv.write_config(tmp_path / "c.toml", a100_host, extra=f'socket = "{sock}"\n')
    spec = tmp_path / "cdi/nvidia.yaml"
    daemon = tmp_path / "docker/daemon.json"
    args = ["--docker-config", str(daemon), "--containerd-config", str(tmp_path / "none.toml"),
            "--crio-drop-in", str(tmp_path / "none-crio.toml"), "--hooks-dir", str(tmp_path / "hooks.d"),
            "--cdi-spec", str(spec)]
    for setup in (["setup", "docker", "--config", str(daemon), "--hook-dir", str(tmp_path / "bin")],
                  ["setup", "podman", "--config", str(spec)]):
        (tmp_path / "bin").mkdir(exist_ok=True)
        r = run([NVHOOK, "--config", str(cfg), "--root", str(a100_host), *setup, "--backup-dir",
                 str(tmp_path / "store")])
        assert r.returncode == 0, r.stderr

    def doctor(*extra: str, root: Path = a100_host) -> tuple[int, dict[str, dict]]:
        r = run([NVHOOK, "--config", str(cfg), "--root", str(root), "doctor", "--json", *args, *extra])
        assert r.stderr == "", r.stderr
        return r.returncode, {c["name"]: c for c in json.loads(r.stdout)}

    return cfg, sock, spec, daemon, doctor


def test_a_node_set_up_with_this_install_passes(node):
    cfg, sock, spec, daemon, doctor = node
    s = Serve(cfg, sock)
    try:
        code, checks = doctor()
    finally:
        assert s.stop() == 0
    assert code == 0
    assert {n: c["status"] for n, c in checks.items()} == {
        "driver": "OK", "nvhook-hook": "OK", "nvhook-runtime": "OK", "service": "OK", "docker": "OK",
        "cdi": "OK", "cgroups": "OK", "kernel": "OK"}
    assert checks["docker"]["detail"] == f"{daemon} runs {SHIM}"


def test_the_service_down_is_a_warning(node):
    cfg, sock, spec, daemon, doctor = node
    code, checks = doctor()
    assert code == 0
    assert (checks["service"]["status"], checks["service"]["todo"]) == ("WARN", "`nvhook setup service`")


def test_an_engine_config_naming_another_install_fails(node):
    cfg, sock, spec, daemon, doctor = node
    doc = json.loads(daemon.read_text())
    doc["runtimes"]["nvidia"]["path"] = "/opt/other/bin/nvhook-runtime"
    daemon.write_text(json.dumps(doc))
    code, checks = doctor()
    assert code == 1
    assert checks["docker"] == {"status": "FAIL", "name": "docker", "todo": "`nvhook setup docker`",
                                "detail": f"{daemon} runs /opt/other/bin/nvhook-runtime, not this "
                                          f"install's {SHIM}"}


def test_a_stale_cdi_spec_is_a_warning(node, sim_host):
    """A valid spec made for another host (another driver, other GPUs): stale."""
    cfg, sock, spec, daemon, doctor = node
    r = run([NVHOOK, "--config", str(cfg), "--root", str(sim_host("t4x1")), "cdi", "generate", "-o", str(spec)])
    assert r.returncode == 0, r.stderr
    code, checks = doctor()
    assert (code, checks["cdi"]["status"]) == (0, "WARN")
    assert "valid but stale" in checks["cdi"]["detail"] and "cdi refresh" in checks["cdi"]["todo"]


def test_no_nvml_under_the_driver_root_fails(node, tmp_path):
    cfg, sock, spec, daemon, doctor = node
    empty = tmp_path / "empty-root"
    empty.mkdir()
    code, checks = doctor(root=empty)
    assert code == 1 and checks["driver"]["status"] == "FAIL"
    assert "NVML not found under driver root" in checks["driver"]["detail"]


def test_not_root_is_one_line(tmp_path):
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", NVHOOK, "doctor"],
                       capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr.startswith("nvhook: doctor needs root") and r.stderr.count("\n") == 1


@pytest.mark.parametrize("engine, text", [
    ("containerd", 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
                   'BinaryName = "/opt/other/bin/nvhook-runtime"\n'),
    ("crio", '[crio.runtime.runtimes.nvidia]\nruntime_path = "/opt/other/bin/nvhook-runtime"\n'),
])
def test_a_toml_engine_config_naming_another_install_fails(node, tmp_path, engine, text):
    cfg, sock, spec, daemon, doctor = node
    (tmp_path / ("none.toml" if engine == "containerd" else "none-crio.toml")).write_text(text)
    code, checks = doctor()
    assert code == 1 and checks[engine]["status"] == "FAIL"
    assert checks[engine]["detail"].endswith(f"runs /opt/other/bin/nvhook-runtime, not this install's {SHIM}")
