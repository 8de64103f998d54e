"""NVIDIA's Kubernetes device plugin hands GPUs to a container in one of four ways
(--device-list-strategy); nvhook must give the container exactly the GPUs it was
allocated under each, and nothing twice.

- envvar:           Envs NVIDIA_VISIBLE_DEVICES=<ids>
- volume-mounts:    Envs NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices, and a
                    Mount of /dev/null at /var/run/nvidia-container-devices/<id> per device
                    (read by the hook only with accept-nvidia-visible-devices-as-volume-mounts)
- cdi-annotations:  Annotations <prefix>nvidia-device-plugin_<response uuid> =
                    "nvidia.com/gpu=<id>", prefix "cdi.k8s.io/" (default) or another one
                    (the GPU operator uses "nvidia.cdi.k8s.io/", so that containerd leaves
                    them to the NVIDIA runtime)
- cdi-cri:          CDIDevices in the CRI response: containerd resolves them against
                    /etc/cdi itself and applies the edits to the OCI spec; the spec-level
                    edits set NVIDIA_VISIBLE_DEVICES=void so that a hook sees no request.

Each case builds the config.json containerd would build from the kubelet's request (the
image's env first, the response's env over it, the response's mounts as rbind mounts,
the default capabilities of an unprivileged container) and checks what nvhook makes of
it: the request (libinject.request.oci_spec), the plan's GPU nodes and cgroup rules on
the simulated a100x8 host, and for envvar, volume-mounts, cdi-annotations and cdi-cri a
real runc container whose `nvidia-smi -L` lists only the allocated GPU.
The allocated GPU is GPU 1 throughout, named by UUID (the plugin's default
--device-id-strategy).
"""
from __future__ import annotations

import copy
import re
import uuid

import pytest

from libinject import config as cfgmod
from libinject.apply import cdi
from libinject.apply.spec import apply_cdi
from libinject.plan import planner
from libinject.request.oci_spec import request_from_spec, requested_devices
from support.hookenv import PROBE, assert_only_gpu1, ensure_front, gpu_container, write_config

KIND = "nvidia.com/gpu"
DEVICES_ROOT = "/var/run/nvidia-container-devices"
MOUNTS_CFG = "accept-nvidia-visible-devices-as-volume-mounts = true\n"
STRICT_CFG = "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n"
NVIDIA_PREFIX_CFG = '[nvidia-container-runtime.modes.cdi]\nannotation-prefixes = ["nvidia.cdi.k8s.io/"]\n'
# What a CUDA base image sets (ENV in its Dockerfile): every GPU unless told otherwise.
IMAGE_ENV = ["PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
# containerd's default capabilities for a container that is not privileged.
DEFAULT_CAPS = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
                "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
                "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"]
GPU_NODE = re.compile(r"/dev/nvidia[0-9]+")


def cfg(text: str = ""):
    return cfgmod.parse(text, "/etc/nvidia-container-runtime/config.toml")


# ---------------------------------------------------------------- what the plugin answers

def allocate(strategy: str, ids: list[str], prefix: str = "cdi.k8s.io/") -> dict:
    """The plugin's ContainerAllocateResponse for `ids` (its getAllocateResponse)."""
    resp: dict = {"envs": {}, "mounts": [], "annotations": {}, "cdi_devices": []}
    if strategy == "envvar":
        resp["envs"]["NVIDIA_VISIBLE_DEVICES"] = ",".join(ids)
    elif strategy == "volume-mounts":
        resp["envs"]["NVIDIA_VISIBLE_DEVICES"] = DEVICES_ROOT
        resp["mounts"] = [{"host_path": "/dev/null", "container_path": f"{DEVICES_ROOT}/{i}"} for i in ids]
    elif strategy == "cdi-annotations":
        # cdiapi.UpdateAnnotations(.., "nvidia-device-plugin", <response uuid>, devices)
        key = f"{prefix}nvidia-device-plugin_{uuid.uuid4()}"
        resp["annotations"][key] = ",".join(f"{KIND}={i}" for i in ids)
    elif strategy == "cdi-cri":
        resp["cdi_devices"] = [f"{KIND}={i}" for i in ids]
    else:
        raise ValueError(strategy)
    return resp


# ---------------------------------------------------------------- what containerd builds

def containerd_spec(resp: dict, image_env=IMAGE_ENV, cdi_spec: dict | None = None) -> dict:
    """config.json as containerd's CRI plugin builds it for an unprivileged container
    given the plugin's response: image env, then the response's env replacing same
    names; kubelet's mounts and the response's as rbind mounts; annotations passed
    through; the response's CDI devices resolved against cdi_spec and applied."""
    env = list(image_env)
    for k, v in resp["envs"].items():
        env = [e for e in env if not e.startswith(k + "=")] + [f"{k}={v}"]
    env += ["HOSTNAME=gpu-pod", "KUBERNETES_SERVICE_HOST=10.96.0.1", "KUBERNETES_SERVICE_PORT=443"]
    caps = list(DEFAULT_CAPS)
    spec = {
        "ociVersion": "1.1.0",
        "process": {"user": {"uid": 0, "gid": 0}, "args": ["sleep", "infinity"], "env": env, "cwd": "/",
                    "capabilities": {k: list(caps) for k in ("bounding", "effective", "permitted")},
                    "noNewPrivileges": False},
        "root": {"path": "rootfs"},
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/etc/hosts", "type": "bind",
             "source": "/var/lib/kubelet/pods/p/etc-hosts", "options": ["rbind", "rprivate", "rw"]},
            {"destination": "/dev/termination-log", "type": "bind",
             "source": "/var/lib/kubelet/pods/p/containers/c/0", "options": ["rbind", "rprivate", "rw"]},
            *({"destination": m["container_path"], "type": "bind", "source": m["host_path"],
               "options": ["rbind", "rprivate", "rw"]} for m in resp["mounts"]),
        ],
        "annotations": {"io.kubernetes.cri.container-type": "container",
                        "io.kubernetes.cri.sandbox-id": "0" * 64, **resp["annotations"]},
        "linux": {"resources": {"devices": [{"allow": False, "access": "rwm"}]},
                  "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")]},
    }
    if resp["cdi_devices"]:
        assert cdi_spec is not None, "cdi-cri needs the node's CDI spec"
        apply_cdi(spec, cdi_edits(cdi_spec, resp["cdi_devices"]))
    return spec


def cdi_edits(cdi_spec: dict, names: list[str]) -> list[dict]:
    """The edits containerd applies for CDI device names: the spec's, then each device's."""
    by_name = {f"{cdi_spec['kind']}={d['name']}": d["containerEdits"] for d in cdi_spec["devices"]}
    return [cdi_spec.get("containerEdits") or {}, *(by_name[n] for n in names)]


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def driver(a100_host):
    from libinject.discover.driver import discover

    return discover(str(a100_host), snapshot=False)


@pytest.fixture(scope="module")
def cdi_spec(driver):
    """The node's /etc/cdi spec as `nvhook cdi generate` writes it (index and uuid names)."""
    return cdi.generate(driver, hook=cdi.HookOptions(path=ensure_front()))


def planned_gpu_nodes(spec: dict, config, driver) -> tuple[list[str], list[int]]:
    """(GPU device nodes, GPU minors the cgroup allows) of nvhook's plan for the spec."""
    req = request_from_spec(spec, config)
    assert req is not None, "nvhook sees no GPU request"
    edits = planner.plan(req, driver)
    nodes = [d.path for d in edits.device_nodes if GPU_NODE.fullmatch(d.path)]
    minors = sorted(r.minor for r in edits.cgroup_rules if r.major == 195 and r.minor is not None and r.minor < 128)
    return nodes, minors


def spec_gpu_nodes(spec: dict) -> tuple[list[str], list[int]]:
    """(GPU device nodes, GPU minors allowed) already in an OCI spec."""
    nodes = [d["path"] for d in spec["linux"].get("devices", []) if GPU_NODE.fullmatch(d["path"])]
    minors = sorted(r["minor"] for r in spec["linux"]["resources"]["devices"]
                    if r.get("allow") and r.get("major") == 195 and r.get("minor") is not None
                    and r["minor"] < 128)
    return nodes, minors


# ---------------------------------------------------------------- envvar

def test_envvar_request(gpu_uuids):
    spec = containerd_spec(allocate("envvar", [gpu_uuids[1]]))
    assert requested_devices(spec, cfg()) == ((gpu_uuids[1],), "env")


def test_envvar_plan_gives_only_gpu1(gpu_uuids, driver):
    spec = containerd_spec(allocate("envvar", [gpu_uuids[1]]))
    assert planned_gpu_nodes(spec, cfg(), driver) == (["/dev/nvidia1"], [1])


def test_envvar_runc_container_sees_only_gpu1(tmp_path, hook_config, gpu_uuids):
    resp = allocate("envvar", [gpu_uuids[1]])
    env = [f"{k}={v}" for k, v in resp["envs"].items()]
    with gpu_container(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=all", *env], PROBE) as c:
        r = c.run()
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)


def test_envvar_ignored_when_unprivileged_envvar_not_accepted(gpu_uuids):
    # Why the volume-mounts strategy exists: a cluster that refuses container-chosen env.
    spec = containerd_spec(allocate("envvar", [gpu_uuids[1]]))
    assert request_from_spec(spec, cfg(STRICT_CFG)) is None


# ---------------------------------------------------------------- volume-mounts

def test_volume_mounts_request(gpu_uuids):
    spec = containerd_spec(allocate("volume-mounts", [gpu_uuids[1]]))
    assert requested_devices(spec, cfg(MOUNTS_CFG)) == ((gpu_uuids[1],), "mounts")


def test_volume_mounts_plan_gives_only_gpu1(gpu_uuids, driver):
    spec = containerd_spec(allocate("volume-mounts", [gpu_uuids[1]]))
    assert planned_gpu_nodes(spec, cfg(MOUNTS_CFG), driver) == (["/dev/nvidia1"], [1])


def test_volume_mounts_honoured_when_unprivileged_envvar_not_accepted(gpu_uuids, driver):
    spec = containerd_spec(allocate("volume-mounts", [gpu_uuids[1]]))
    assert planned_gpu_nodes(spec, cfg(MOUNTS_CFG + STRICT_CFG), driver) == (["/dev/nvidia1"], [1])


def test_volume_mounts_two_gpus(gpu_uuids, driver):
    spec = containerd_spec(allocate("volume-mounts", [gpu_uuids[3], gpu_uuids[1]]))
    assert planned_gpu_nodes(spec, cfg(MOUNTS_CFG), driver) == (["/dev/nvidia3", "/dev/nvidia1"], [1, 3])


def test_volume_mounts_runc_container_sees_only_gpu1(tmp_path, a100_host, gpu_uuids):
    config = write_config(tmp_path / "config.toml", a100_host, top=MOUNTS_CFG + STRICT_CFG)
    resp = allocate("volume-mounts", [gpu_uuids[1]])
    env = [f"{k}={v}" for k, v in resp["envs"].items()]
    with gpu_container(tmp_path, config, ["NVIDIA_VISIBLE_DEVICES=all", *env], PROBE) as c:
        c.config["mounts"] += [{"destination": m["container_path"], "type": "bind", "source": m["host_path"],
                                "options": ["rbind", "rprivate", "rw"]} for m in resp["mounts"]]
        r = c.run()
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)


# ---------------------------------------------------------------- cdi-annotations

@pytest.mark.parametrize("prefix,text", [("cdi.k8s.io/", ""), ("nvidia.cdi.k8s.io/", NVIDIA_PREFIX_CFG)])
def test_cdi_annotations_request(gpu_uuids, prefix, text):
    spec = containerd_spec(allocate("cdi-annotations", [gpu_uuids[1]], prefix))
    assert requested_devices(spec, cfg(text)) == ((f"{KIND}={gpu_uuids[1]}",), "annotations")


@pytest.mark.parametrize("prefix,text", [("cdi.k8s.io/", ""), ("nvidia.cdi.k8s.io/", NVIDIA_PREFIX_CFG)])
def test_cdi_annotations_plan_gives_only_gpu1(gpu_uuids, driver, prefix, text):
    # The image's NVIDIA_VISIBLE_DEVICES=all is still in the env: the annotations win.
    spec = containerd_spec(allocate("cdi-annotations", [gpu_uuids[1]], prefix))
    assert planned_gpu_nodes(spec, cfg(text), driver) == (["/dev/nvidia1"], [1])


def test_cdi_annotations_runc_container_sees_only_gpu1(tmp_path, a100_host, gpu_uuids):
    config = write_config(tmp_path / "config.toml", a100_host, extra=NVIDIA_PREFIX_CFG)
    resp = allocate("cdi-annotations", [gpu_uuids[1]], "nvidia.cdi.k8s.io/")
    with gpu_container(tmp_path, config, ["NVIDIA_VISIBLE_DEVICES=all"], PROBE) as c:
        c.config["annotations"] = {**c.config.get("annotations", {}), **resp["annotations"]}
        r = c.run()
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)


# ---------------------------------------------------------------- cdi-cri

def test_cdi_cri_spec_already_has_gpu1_only(gpu_uuids, cdi_spec):
    spec = containerd_spec(allocate("cdi-cri", [gpu_uuids[1]]), cdi_spec=cdi_spec)
    assert spec_gpu_nodes(spec) == (["/dev/nvidia1"], [1])


def test_cdi_cri_spec_sets_visible_devices_void(gpu_uuids, cdi_spec):
    spec = containerd_spec(allocate("cdi-cri", [gpu_uuids[1]]), cdi_spec=cdi_spec)
    assert [e for e in spec["process"]["env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")] == \
        ["NVIDIA_VISIBLE_DEVICES=void"]


@pytest.mark.parametrize("text", ["", MOUNTS_CFG, NVIDIA_PREFIX_CFG])
def test_cdi_cri_nvhook_adds_nothing(gpu_uuids, cdi_spec, text):
    # The CUDA image asked for all GPUs; the CDI edits already did the work: no request.
    spec = containerd_spec(allocate("cdi-cri", [gpu_uuids[1]]), cdi_spec=cdi_spec)
    assert request_from_spec(spec, cfg(text)) is None


def test_cdi_cri_runc_container_sees_only_gpu1(tmp_path, hook_config, gpu_uuids, cdi_spec):
    # containerd's CDI edits and nvhook's prestart hook in the same spec (hooks.d or the
    # shim in legacy mode add it to every container): GPU 1 once, nothing else.
    names = allocate("cdi-cri", [gpu_uuids[1]])["cdi_devices"]
    with gpu_container(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=all"], PROBE) as c:
        apply_cdi(c.config, copy.deepcopy(cdi_edits(cdi_spec, names)))
        r = c.run()
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)


def test_cdi_cri_hook_does_nothing(tmp_path, hook_config, gpu_uuids, cdi_spec):
    # NVIDIA_VISIBLE_DEVICES=void: the hook's front sees no request and exits without
    # starting Python, so the hook's log (debug level) is never even opened.
    names = allocate("cdi-cri", [gpu_uuids[1]])["cdi_devices"]
    with gpu_container(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=all"], "echo ran") as c:
        apply_cdi(c.config, copy.deepcopy(cdi_edits(cdi_spec, names)))
        r = c.run()
    assert ("ran" in r.stdout, (tmp_path / "hook.log").exists()) == (True, False), r.stderr


def test_without_cdi_edits_the_same_container_runs_the_hook(tmp_path, hook_config):
    # The contrast to the test above: the hook does run (and logs) for the image's "all".
    with gpu_container(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=all"], "echo ran") as c:
        c.run()
    assert "prestart: done" in (tmp_path / "hook.log").read_text()
