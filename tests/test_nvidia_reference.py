"""Where NVIDIA's stack is the reference (issue 23), nvhook answers as it does; each test
names NVIDIA's behaviour and the source file it comes from (libnvidia-container 1.17,
nvidia-container-toolkit 1.20). Deliberate differences are in README's table instead."""
from __future__ import annotations

import json
import subprocess

import pytest

from conftest import NVHOOK, run
from libinject import config as config_mod
from libinject.request.oci_spec import request_from_spec


def spec(*env: str, privileged: bool = False) -> dict:
    return {"ociVersion": "1.0.2", "root": {"path": "rootfs"},
            "process": {"env": ["PATH=/bin", *env],
                        "capabilities": {"bounding": ["CAP_CHOWN"] + (["CAP_SYS_ADMIN"] if privileged else [])}},
            "mounts": []}


def configure(root, rootfs, *flags: str) -> subprocess.CompletedProcess:
    return run([NVHOOK, "--root", str(root), "configure", "--dry-run", "--json", "--device", "0", *flags,
                str(rootfs)], timeout=60)


# ---------------------------------------------------------------- /dev/nvidia-modeset

def test_display_without_a_modeset_node_fails(sim_host, tmp_path):
    """NVIDIA: nvc_info.c lookup_devices always lists /dev/nvidia-modeset (195:254) without
    looking for it, and `configure --display` mounts it, which fails where the node does
    not exist. nvhook fails the same request with one line naming the node."""
    root = sim_host("t4x1")                     # no nvidia-modeset module: no node
    assert not (root / "dev/nvidia-modeset").exists()
    r = configure(root, tmp_path, "--display")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == (f"nvhook: display capability: {root}/dev/nvidia-modeset: no such device node "
                        "(the nvidia-modeset module is not loaded)\n")
    # graphics alone does not need it
    assert configure(root, tmp_path, "--graphics").returncode == 0


def test_display_with_the_node_injects_it(sim_host, tmp_path):
    r = configure(sim_host("rtx4090x1"), tmp_path, "--display")
    assert r.returncode == 0, r.stderr
    nodes = {d["path"]: (d["major"], d["minor"]) for d in json.loads(r.stdout)["device_nodes"]}
    assert nodes["/dev/nvidia-modeset"] == (195, 254)


@pytest.mark.parametrize("caps, required", [("display", True), ("graphics,display", True), ("all", False),
                                            ("graphics", False), ("", False)])
def test_display_named_in_the_environment_requires_the_node(caps, required):
    """NVIDIA_DRIVER_CAPABILITIES naming display is --display to nvidia-container-cli
    (toolkit internal/config/image/capabilities.go), so the node is required. Through "all"
    nvhook takes display where the node exists (README: differences)."""
    env = ["NVIDIA_VISIBLE_DEVICES=0"] + ([f"NVIDIA_DRIVER_CAPABILITIES={caps}"] if caps else [])
    r = request_from_spec(spec(*env), config_mod.parse("", "test.toml"))
    assert r.modeset_required is required
