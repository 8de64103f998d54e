"""The hook and the runtime shim read the same devices from the same spec: one request
builder (libinject.request.oci_spec), tested over a table of specs and settings."""
from __future__ import annotations

import pytest

from libinject import config
from libinject.request.oci_spec import request_from_spec
from libinject.runtime import shim

KIND = "nvidia.com/gpu"
PRIV = {"bounding": ["CAP_SYS_ADMIN"]}


def spec(*env: str, mounts=(), annotations=None, caps=None) -> dict:
    s: dict = {"process": {"env": ["PATH=/bin", *env]}, "mounts": list(mounts)}
    if annotations is not None:
        s["annotations"] = annotations
    if caps is not None:
        s["process"]["capabilities"] = caps
    return s


def vol(dev: str) -> dict:
    return {"source": "/dev/null", "destination": f"/var/run/nvidia-container-devices/{dev}"}


SWARM = 'swarm-resource = "DOCKER_RESOURCE_GPU"\n'
MOUNTS = "accept-nvidia-visible-devices-as-volume-mounts = true\n"
STRICT = "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n"

# (spec, config text, the GPUs both must select: None = not a GPU container)
TABLE = [
    (spec("NVIDIA_VISIBLE_DEVICES=0,1"), "", "0,1"),
    (spec("NVIDIA_VISIBLE_DEVICES=all"), "", "all"),
    (spec("NVIDIA_VISIBLE_DEVICES=0,all"), "", "all"),
    (spec("NVIDIA_VISIBLE_DEVICES=void"), "", None),
    (spec("NVIDIA_VISIBLE_DEVICES="), "", None),
    (spec(), "", None),
    (spec("NVIDIA_VISIBLE_DEVICES=none"), "", "none"),
    # swarm: its variable wins over NVIDIA_VISIBLE_DEVICES
    (spec("DOCKER_RESOURCE_GPU=GPU-abc", "NVIDIA_VISIBLE_DEVICES=0"), SWARM, "GPU-abc"),
    (spec("NVIDIA_VISIBLE_DEVICES=0"), SWARM, "0"),
    # device lists as volume mounts, only when accepted
    (spec("NVIDIA_VISIBLE_DEVICES=0", mounts=[vol("3"), vol("2")]), MOUNTS, "3,2"),
    (spec("NVIDIA_VISIBLE_DEVICES=0", mounts=[vol("3")]), "", "0"),
    # the unprivileged-envvar setting
    (spec("NVIDIA_VISIBLE_DEVICES=1"), STRICT, None),
    (spec("NVIDIA_VISIBLE_DEVICES=1", caps=PRIV), STRICT, "1"),
    # ... for CDI annotations too; volume mounts (an orchestrator's grant) are exempt
    (spec(annotations={"cdi.k8s.io/x": f"{KIND}=1"}), STRICT, None),
    (spec(annotations={"cdi.k8s.io/x": f"{KIND}=1"}, caps=PRIV), STRICT, "1"),
    (spec("NVIDIA_VISIBLE_DEVICES=0", mounts=[vol("3")]), MOUNTS + STRICT, "3"),
    (spec("NVIDIA_VISIBLE_DEVICES=0"), MOUNTS + STRICT, None),
    # legacy CUDA_VERSION images: unset means all, set means what it says
    (spec("CUDA_VERSION=10.0.130"), "", "all"),
    (spec("CUDA_VERSION=10.0.130", "NVIDIA_VISIBLE_DEVICES=2"), "", "2"),
    (spec("CUDA_VERSION=10.0.130", "NVIDIA_REQUIRE_CUDA=cuda>=10.0"), "", None),
    # CDI annotations win over the env
    (spec("NVIDIA_VISIBLE_DEVICES=0", annotations={"cdi.k8s.io/x": f"{KIND}=1,{KIND}=GPU-u"}), "",
     "1,GPU-u"),
    (spec(annotations={"other.io/x": f"{KIND}=1"}), "", None),
]


@pytest.mark.parametrize("oci,cfg_text,want", TABLE)
def test_hook_and_shim_select_the_same_devices(oci, cfg_text, want):
    cfg = config.parse(cfg_text, "/etc/nvidia-container-runtime/config.toml")
    req = request_from_spec(oci, cfg)
    assert (req.devices if req is not None else None) == want
    devices, _source = shim.requested_devices(oci, cfg)
    names = [d[len(KIND) + 1:] if d.startswith(KIND + "=") else d for d in devices]
    assert names == ([] if want in (None, "none") else want.split(","))
