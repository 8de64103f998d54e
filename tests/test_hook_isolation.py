"""CVE-2025-23266 ("NVIDIAScape") and friends: the container's LD_PRELOAD, PYTHON*
variables and a sitecustomize.py in its rootfs never run in the host's hook.

A canary library and a sitecustomize.py each create a file in a host-only directory when
they run. A positive control proves they would; the hook (prestart via runc, and
createContainer whose cwd is the rootfs) must leave no canary.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support import hookenv
from support.canary import evil_env, make_canary, plant
from support.runc import RuncContainer


@pytest.fixture
def canary(tmp_path) -> dict[str, Path]:
    return make_canary(tmp_path)


def test_canaries_work(canary):
    """Positive control: without isolation each of them runs."""
    subprocess.run(["/bin/true"], env={"LD_PRELOAD": str(canary["lib"])}, check=True, timeout=60)
    subprocess.run([sys.executable, "-c", "pass"], env={"PYTHONPATH": str(canary["pydir"])}, check=True, timeout=60)
    assert canary["out"].read_text().split() == ["preload", "sitecustomize"]


@pytest.mark.parametrize("stage, mode", [("prestart", "v1"), ("createContainer", "v2")])
def test_hook_runs_none_of_them(tmp_path, sim_host, canary, stage, mode):
    cfg = hookenv.write_config(tmp_path / "c.toml", sim_host("a100x8"), log=tmp_path / "hook.log")
    # The hook's own env (the runtime's hook entry) is hostile too: the front must not pass it on.
    entry = hookenv.hook_entry(cfg, stage, env=[f"LD_PRELOAD={canary['lib']}",
                                                f"PYTHONPATH={canary['pydir']}", "PYTHONHOME=/nonexistent"])
    with RuncContainer(tmp_path, mode=mode, args=["sh", "-c", "nvidia-smi -L"], hooks={stage: [entry]}) as c:
        plant(c.rootfs, canary)
        c.config["process"]["env"] = ["PATH=/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=1",
                                      *evil_env(canary, c.rootfs)]
        r = c.run()
    assert "GPU 0: NVIDIA" in r.stdout, r.stdout + r.stderr      # the hook did its job
    assert f"{stage}: done" in (tmp_path / "hook.log").read_text()
    assert not canary["out"].exists(), canary["out"].read_text()
