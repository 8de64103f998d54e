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


# ---------------------------------------------------------------- IMEX channel requests

def imex(*env: str, privileged: bool = False, config: str = "", mounts=()) -> str | None:
    s = spec("NVIDIA_VISIBLE_DEVICES=0", *env, privileged=privileged)
    s["mounts"] = [{"source": "/dev/null", "destination": d, "type": "bind"} for d in mounts]
    return request_from_spec(s, config_mod.parse(config, "test.toml")).imex_channels


def test_imex_from_an_unprivileged_container_follows_the_envvar_rule():
    """NVIDIA (internal/config/image/cuda_image.go, ImexChannelRequests): NVIDIA_IMEX_CHANNELS
    is taken from an unprivileged container when accept-nvidia-visible-devices-envvar-when-
    unprivileged is on (the default), and ignored (not an error) when it is off."""
    assert imex("NVIDIA_IMEX_CHANNELS=0,3") == "0,3"
    assert imex("NVIDIA_IMEX_CHANNELS=0", privileged=True) == "0"
    # off: the GPU comes by a volume mount (an orchestrator's grant), the channel request
    # in the environment is ignored
    off = ("accept-nvidia-visible-devices-envvar-when-unprivileged = false\n"
           "accept-nvidia-visible-devices-as-volume-mounts = true\n")
    grant = ["/var/run/nvidia-container-devices/0"]
    assert imex("NVIDIA_IMEX_CHANNELS=0", config=off, mounts=grant) is None
    assert imex("NVIDIA_IMEX_CHANNELS=0", config=off, mounts=grant, privileged=True) == "0"


def test_imex_all_from_the_environment_asks_for_nothing():
    """NVIDIA (cuda_image.go, imexChannelsFromEnvVar): a lone "all" is no request."""
    assert imex("NVIDIA_IMEX_CHANNELS=all", privileged=True) is None


def test_imex_volume_mount_is_a_channel_request_not_a_device():
    """NVIDIA (cuda_image.go, imexChannelsFromMounts): /dev/null at
    /var/run/nvidia-container-devices/imex/<id> asks for IMEX channel <id>, ahead of the
    environment, when device lists as volume mounts are accepted; it is not device
    "imex/<id>"."""
    on = "accept-nvidia-visible-devices-as-volume-mounts = true"
    root = "/var/run/nvidia-container-devices"
    s = spec("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_IMEX_CHANNELS=5")
    s["mounts"] = [{"source": "/dev/null", "destination": f"{root}/0", "type": "bind"},
                   {"source": "/dev/null", "destination": f"{root}/imex/0", "type": "bind"}]
    r = request_from_spec(s, config_mod.parse(on, "test.toml"))
    assert (r.devices, r.imex_channels) == ("0", "0")
    # not accepted: the mounts are nothing, the environment is read
    r = request_from_spec(s, config_mod.parse("", "test.toml"))
    assert (r.devices, r.imex_channels) == ("all", "5")


def test_imex_channel_listed_by_id(sim_host):
    """NVIDIA (libnvidia-container cli/list.c): `list --imex-channel=0` prints
    /dev/nvidia-caps-imex-channels/channel0 (the path of each channel id given) besides
    everything else, where nvhook used to fail with "unknown IMEX channel: 0"."""
    r = run([NVHOOK, "--root", str(sim_host("a100x8")), "list", "--imex-channel=0"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert "/dev/nvidia-caps-imex-channels/channel0" in r.stdout.splitlines()


# ---------------------------------------------------------------- libraries

def test_sandboxutils_is_not_a_container_library(sim_host):
    """NVIDIA (libnvidia-container nvc_info.c, the utility/compute/... library lists) never
    lists libnvidia-sandboxutils: it is the host-side library nvidia-ctk asks where a GPU's
    files are. nvhook's rule for newer drivers' lib*nvidia*.so.<version> skips it too."""
    root = sim_host("a100x8")
    assert list((root / "usr/lib/x86_64-linux-gnu").glob("libnvidia-sandboxutils.so.*"))   # the host has it
    r = run([NVHOOK, "--root", str(root), "list", "--libraries"], timeout=60)
    assert r.returncode == 0 and "libnvidia-ml.so." in r.stdout
    assert "sandboxutils" not in r.stdout


# ---------------------------------------------------------------- CDI development links

def test_cdi_spec_makes_the_development_links_tools_dlopen(sim_host, tmp_path):
    """NVIDIA: nvidia-ctk cdi generate's create-symlinks hook makes libnvidia-ml.so,
    libnvidia-encode.so and libnvcuvid.so (pkg/nvcdi, the driver's "dev" symlinks), the
    unversioned names tools dlopen. nvhook's one CDI hook makes them, pointing at the
    SONAME as ldconfig's links do; the hook and `configure` get them from the same plan."""
    out = tmp_path / "nvidia.json"
    r = run([NVHOOK, "--root", str(sim_host("a100x8")), "cdi", "generate", "--format", "json", "--output", str(out)],
            timeout=120)
    assert r.returncode == 0, r.stderr
    args = [a for hook in json.loads(out.read_text())["containerEdits"]["hooks"] for a in hook["args"]]
    d = "/usr/lib/x86_64-linux-gnu"
    for lib in ("libnvidia-ml", "libnvidia-encode", "libnvcuvid"):
        assert f"{lib}.so.1::{d}/{lib}.so" in args, lib
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc/debian_version").write_text("12.0\n")
    r = configure(sim_host("a100x8"), rootfs, "--utility", "--video")
    links = {(s["link"], s["target"]) for s in json.loads(r.stdout)["symlinks"]}
    assert (f"{d}/libnvidia-ml.so", "libnvidia-ml.so.1") in links, links


# ---------------------------------------------------------------- OpenCL ICD, i386 links

def test_opencl_icd_comes_with_compute_not_video_alone(sim_host, tmp_path):
    """NVIDIA's toolkit gives /etc/OpenCL/vendors/nvidia.icd with the compute capability;
    video brings the compute libraries (libnvcuvid needs libcuda), not the ICD."""
    root = sim_host("a100x8")

    def icd(*caps: str) -> bool:
        r = configure(root, tmp_path, *caps)
        assert r.returncode == 0, r.stderr
        return any(m["container_path"] == "/etc/OpenCL/vendors/nvidia.icd" for m in json.loads(r.stdout)["mounts"])

    assert (icd("--video"), icd("--compute"), icd("--video", "--compute")) == (False, True, True)
