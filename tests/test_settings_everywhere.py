"""Every command reads the same settings the same way: config.toml (one parser, one
config -> discovery options), the user setting, log paths."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import NVHOOK, run


def _config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _one_error_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode != 0
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nvhook: "), r.stderr
    return lines[0]


def test_configure_reads_config_toml(sim_host, rootfs, tmp_path):
    """root and snapshot-dir come from config.toml when no flag gives them (the old
    configure read no config at all: it discovered "/", which has no driver here)."""
    host = sim_host("a100x8")
    snaps = tmp_path / "snaps"
    cfg = _config(tmp_path / "config.toml",
                  f'[nvidia-container-cli]\nroot = "{host}"\n[nvhook]\nsnapshot-dir = "{snaps}"\n')
    r = run([NVHOOK, "--config", str(cfg), "configure", "--dry-run", "--json", "--device=1",
             "--utility", str(rootfs)])
    assert r.returncode == 0, r.stderr
    edits = json.loads(r.stdout)
    nodes = {d["path"]: d["host_path"] for d in edits["device_nodes"]}
    assert nodes["/dev/nvidia1"] == f"{host}/dev/nvidia1"
    assert "/dev/nvidia0" not in nodes
    assert [p.name for p in snaps.iterdir()] != []


def test_missing_explicit_config_is_an_error(rootfs):
    for cmd in (["configure", "--dry-run", "--device=0", str(rootfs)], ["info"], ["list"],
                ["cdi", "generate"]):
        r = run([NVHOOK, "--config", "/nonexistent.toml", *cmd])
        assert _one_error_line(r) == "nvhook: config file /nonexistent.toml not found", cmd


@pytest.mark.parametrize("cmd", [["info"], ["list"], ["cdi", "generate"],
                                 ["configure", "--dry-run", "--device=0", "ROOTFS"]])
def test_root_video_user_works_everywhere(sim_host, rootfs, tmp_path, cmd):
    """NVIDIA's documented `user = "root:video"`: names, not only numbers, in every command."""
    host = sim_host("a100x8")
    cfg = _config(tmp_path / "config.toml", f'[nvidia-container-cli]\nroot = "{host}"\n'
                                           f'user = "root:video"\n[nvhook]\nsnapshot = false\n')
    argv = [str(rootfs) if a == "ROOTFS" else a for a in cmd]
    r = run([NVHOOK, "--config", str(cfg), *argv])
    assert r.returncode == 0, r.stderr
    bad = _config(tmp_path / "bad.toml", f'[nvidia-container-cli]\nroot = "{host}"\n'
                                         f'user = "nosuchuser:video"\n')
    line = _one_error_line(run([NVHOOK, "--config", str(bad), *argv]))
    assert "unknown user or group 'nosuchuser:video'" in line


def test_user_parser():
    from libinject.errors import NvhookError
    from libinject.request.user import parse_user

    assert parse_user("root:video") == (0, 44)
    assert parse_user("0") == (0, 0)
    assert parse_user("1000:1001") == (1000, 1001)
    assert parse_user("") is None and parse_user(None) is None
    for bad in ("²", "1:²", "-1", "99999999999", "root:nosuchgroup", ":", "a\0b"):
        with pytest.raises(NvhookError):
            parse_user(bad)


def test_cdi_generate_uses_configured_snapshot_dir(sim_host, tmp_path):
    host = sim_host("t4x1")
    snaps = tmp_path / "snaps"
    cfg = _config(tmp_path / "config.toml",
                  f'[nvidia-container-cli]\nroot = "{host}"\n[nvhook]\nsnapshot-dir = "{snaps}"\n')
    r = run([NVHOOK, "--config", str(cfg), "cdi", "generate"])
    assert r.returncode == 0, r.stderr
    assert len(list(snaps.glob("driver-*.json"))) == 1


def test_relative_log_paths_are_taken_from_the_config_dir(tmp_path):
    """The hook runs with "/" as its cwd: a relative log-file used to land at the host's /."""
    from libinject import config

    d = tmp_path / "etc"
    d.mkdir()
    cfg = _config(d / "config.toml", '[nvidia-container-cli]\ndebug = "cli.log"\n'
                                     '[nvidia-container-runtime]\ndebug = "logs/runtime.log"\n'
                                     '[nvhook]\nsnapshot-dir = "snaps"\n')
    c = config.load(str(cfg))
    assert c.log_file() == f"{d}/cli.log"
    assert c.runtime.debug == f"{d}/logs/runtime.log"
    assert c.nvhook.snapshot_dir == f"{d}/snaps"
    assert config.parse('[nvhook]\nlog-file = "/abs.log"\n', str(cfg)).log_file() == "/abs.log"


def test_hook_writes_a_relative_log_beside_its_config(sim_host, tmp_path):
    d = tmp_path / "etc"
    d.mkdir()
    cfg = _config(d / "config.toml", f'[nvidia-container-cli]\nroot = "{sim_host("t4x1")}"\n'
                                     '[nvhook]\nsnapshot = false\nlog-file = "hook.log"\n')
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2", "root": {"path": "rootfs"},
        "process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=9"]}}))
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 1,
                        "bundle": str(bundle)})
    r = run([NVHOOK, "--config", str(cfg), "prestart"], input=state, cwd=str(bundle))
    assert _one_error_line(r) == "nvhook: unknown device: 9"
    assert "prestart: unknown device: 9" in (d / "hook.log").read_text()
    assert not Path("/hook.log").exists()
    # A relative --debug in the hook entry is refused (there is no directory to take it from).
    r = run([NVHOOK, "--debug", "rel.log", "--config", str(cfg), "prestart"], input=state,
            cwd=str(bundle))
    assert _one_error_line(r) == "nvhook: --debug rel.log: the hook's log file must be an absolute path"
    assert not (bundle / "rel.log").exists()
