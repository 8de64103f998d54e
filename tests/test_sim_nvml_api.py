"""The simulated NVML and sandboxutils export what NVIDIA's own tools call.

NVIDIA's nvidia-ctk (toolkit 1.20) failed on a simulated host with "undefined symbol:
nvSandboxUtilsInit" (the sandboxutils library was a stub), "undefined symbol:
nvmlDeviceGetIndex" (any --device-id) and, on the MIG profile, "undefined symbol:
nvmlDeviceGetAttributes": go-nvlib names a MIG device's profile from GetAttributes and the
GPU/compute instance profile calls (go-nvlib pkg/nvlib/device/mig_device.go GetProfile).
Here: every NVML function nvidia-ml-py binds is a defined symbol of the mock; the MIG
instance calls give go-nvlib's profile names for what `nvhook info` lists; their structs
and return codes are NVML's; and libnvidia-sandboxutils answers nvSandboxUtils*
(nvidia-container-toolkit internal/nvsandboxutils/nvsandboxutils.h).
"""
from __future__ import annotations

import ctypes
import json
import re
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from libinject.sim.profile import list_profiles

HERE = Path(__file__).resolve().parent
PROBE = HERE / "support/nvmlprobe.py"
LIBDIR = "usr/lib/x86_64-linux-gnu"
SANDBOX_ENTRY_POINTS = ("nvSandboxUtilsInit", "nvSandboxUtilsShutdown", "nvSandboxUtilsGetDriverVersion",
                        "nvSandboxUtilsGetGpuResource", "nvSandboxUtilsGetFileContent")


def pynvml_functions() -> set[str]:
    """The NVML functions nvidia-ml-py binds: its _nvmlGetFunctionPointer("...") names."""
    text = Path(pynvml.__file__).read_text()
    return set(re.findall(r'_nvmlGetFunctionPointer\("(nvml\w+)"\)', text))


def defined_symbols(lib: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in out.stdout.splitlines() if " T " in line}


def test_pynvml_list_is_read():
    # the check below means something only if the list is NVML's whole API
    names = pynvml_functions()
    assert len(names) > 300 and {"nvmlDeviceGetCount_v2", "nvmlDeviceGetIndex", "nvmlDeviceGetAttributes_v2"} <= names


def test_no_pynvml_function_is_undefined_in_the_mock(sim_host):
    lib = sim_host("a100x8") / LIBDIR / "libnvidia-ml.so.1"
    missing = sorted(pynvml_functions() - defined_symbols(lib))
    assert missing == []


def test_go_nvml_mig_calls_and_the_v1_names_are_exported(sim_host):
    # go-nvml resolves the unversioned (v1) names too
    have = defined_symbols(sim_host("a100x8") / LIBDIR / "libnvidia-ml.so.1")
    assert {"nvmlDeviceGetAttributes", "nvmlComputeInstanceGetInfo",
            "nvmlDeviceGetGpuInstancePossiblePlacements", "nvmlDeviceGetIndex"} <= have


def test_sandboxutils_exports_its_entry_points(sim_host):
    lib = sim_host("a100x8") / LIBDIR / "libnvidia-sandboxutils.so.1"
    assert set(SANDBOX_ENTRY_POINTS) <= defined_symbols(lib)


def probe(lib: Path) -> dict:
    r = subprocess.run([sys.executable, str(PROBE), str(lib)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def nvhook_info(root: Path) -> dict:
    r = subprocess.run([str(HERE.parent / ".venv/bin/nvhook"), "--root", str(root), "info", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def expected(info: dict) -> dict:
    # bus ids: NVML prints hex digits upper case, nvhook lower case: the same address
    return {"driver_version": info["driver_version"],
            "gpus": [{"index": g["index"], "minor": g["minor"], "uuid": g["uuid"], "name": g["name"],
                      "bus_id": g["bus_id"].upper(),
                      "mig": [{"uuid": m["uuid"], "gi": m["gi"], "ci": m["ci"], "profile": m["name"]}
                              for m in g.get("mig_devices", [])]}
                     for g in info["gpus"]]}


@pytest.mark.parametrize("profile", list_profiles())
def test_go_nvlib_view_matches_nvhook_info(sim_host, profile):
    """Indexes (nvmlDeviceGetIndex), and each MIG device's profile as go-nvlib derives it
    from GetAttributes, GetGpuInstanceById/GetInfo, GetComputeInstanceById/GetInfo,
    GetGpuInstanceProfileInfo and GetComputeInstanceProfileInfo, equal nvhook info's."""
    root = sim_host(profile)
    seen = probe(root / LIBDIR / "libnvidia-ml.so.1")
    assert seen == expected(nvhook_info(root))
    if profile == "h100x8-mig":   # the MIG profile really exercises the instance calls
        assert {m["profile"] for g in seen["gpus"] for m in g["mig"]} >= {"3g.40gb", "1g.10gb"}


# ---------------------------------------------------------------- structs and codes, in-process

class Placement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


@pytest.fixture(scope="module")
def nvml(sim_host):
    """The h100x8-mig mock loaded here (its own copy: NVML state is per library)."""
    lib = ctypes.CDLL(str(sim_host("h100x8-mig") / LIBDIR / "libnvidia-ml.so.1"))
    assert lib.nvmlInit_v2() == 0
    yield lib
    lib.nvmlShutdown()


def handle(lib, index: int) -> ctypes.c_void_p:
    h = ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(h)) == 0
    return h


def test_gpu_instance_placements_are_nvidias_and_instances_sit_on_them(nvml):
    gpu0 = handle(nvml, 0)   # two 3g.40gb instances (gi 1, 2)
    info = pynvml.c_nvmlGpuInstanceProfileInfo_t()
    assert nvml.nvmlDeviceGetGpuInstanceProfileInfo(gpu0, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
                                                    ctypes.byref(info)) == 0
    assert (info.id, info.sliceCount, info.instanceCount) == (9, 3, 2)   # nvidia-smi mig -lgip on H100
    count = ctypes.c_uint(0)
    assert nvml.nvmlDeviceGetGpuInstancePossiblePlacements_v2(gpu0, info.id, None, ctypes.byref(count)) == 0
    places = (Placement * count.value)()
    assert nvml.nvmlDeviceGetGpuInstancePossiblePlacements_v2(gpu0, info.id, places, ctypes.byref(count)) == 0
    assert [(p.start, p.size) for p in places] == [(0, 4), (4, 4)]
    # both placements are taken by the two instances: none left
    left = ctypes.c_uint(9)
    assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu0, info.id, ctypes.byref(left)) == 0
    assert left.value == 0
    gis = (ctypes.c_void_p * 2)()
    n = ctypes.c_uint(2)
    assert nvml.nvmlDeviceGetGpuInstances(gpu0, info.id, gis, ctypes.byref(n)) == 0
    starts = []
    for gi in gis[:n.value]:
        gi_info = pynvml.c_nvmlGpuInstanceInfo_t()
        assert nvml.nvmlGpuInstanceGetInfo(ctypes.c_void_p(gi), ctypes.byref(gi_info)) == 0
        assert gi_info.profileId == 9 and gi_info.placement.size == 4
        starts.append(gi_info.placement.start)
    assert sorted(starts) == [0, 4]


def test_versioned_structs_are_checked(nvml):
    gpu0 = handle(nvml, 0)
    v2 = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
    assert nvml.nvmlDeviceGetGpuInstanceProfileInfoV(gpu0, 0, ctypes.byref(v2)) == 0
    assert v2.name == "MIG 1g.10gb" and v2.version == pynvml.nvmlGpuInstanceProfileInfo_v2
    v2.version = 1
    assert nvml.nvmlDeviceGetGpuInstanceProfileInfoV(gpu0, 0, ctypes.byref(v2)) == \
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH


def test_return_codes(nvml, sim_host):
    gpu0, gpu3 = handle(nvml, 0), handle(nvml, 3)   # GPU 3: MIG mode, no instances
    out = ctypes.c_void_p()
    attrs = pynvml.c_nvmlDeviceAttributes()
    # profile index past NVML's list: INVALID_ARGUMENT; one this board lacks: NOT_SUPPORTED
    info = pynvml.c_nvmlGpuInstanceProfileInfo_t()
    assert nvml.nvmlDeviceGetGpuInstanceProfileInfo(gpu0, 99, ctypes.byref(info)) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert nvml.nvmlDeviceGetGpuInstanceProfileInfo(gpu0, pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE,
                                                    ctypes.byref(info)) == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert nvml.nvmlDeviceGetGpuInstanceById(gpu3, 1, ctypes.byref(out)) == pynvml.NVML_ERROR_NOT_FOUND
    # attributes are a MIG device's; a whole GPU's are NOT_SUPPORTED
    assert nvml.nvmlDeviceGetAttributes_v2(gpu0, ctypes.byref(attrs)) == pynvml.NVML_ERROR_NOT_SUPPORTED
    mig = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu0, 0, ctypes.byref(mig)) == 0
    assert nvml.nvmlDeviceGetAttributes_v2(mig, ctypes.byref(attrs)) == 0
    assert (attrs.gpuInstanceSliceCount, attrs.computeInstanceSliceCount, attrs.memorySizeMB) == (3, 3, 40448)
    idx = ctypes.c_uint(99)
    assert nvml.nvmlDeviceGetIndex(gpu3, ctypes.byref(idx)) == 0 and idx.value == 3
    # a function the simulated host cannot answer exists and says so
    speed = ctypes.c_uint()
    assert nvml.nvmlDeviceGetFanSpeed(gpu0, ctypes.byref(speed)) == pynvml.NVML_ERROR_NOT_SUPPORTED
    # creating instances: the simulated host is a picture of a configured machine
    assert nvml.nvmlDeviceCreateGpuInstance(gpu3, 19, ctypes.byref(out)) == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_calls_before_init_are_uninitialized(sim_host, tmp_path):
    # a separate copy of the library: the module fixture's one is initialised
    code = ("import ctypes,sys; l=ctypes.CDLL(sys.argv[1]); c=ctypes.c_uint();"
            "print(l.nvmlDeviceGetFanSpeed(None, ctypes.byref(c)), l.nvmlDeviceGetGpuInstanceById(None, 0, None))")
    r = subprocess.run([sys.executable, "-c", code, str(sim_host("h100x8-mig") / LIBDIR / "libnvidia-ml.so.1")],
                       capture_output=True, text=True, timeout=30)
    assert r.stdout.split() == [str(pynvml.NVML_ERROR_UNINITIALIZED)] * 2


# ---------------------------------------------------------------- sandboxutils

class InitInput(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("type", ctypes.c_int), ("value", ctypes.c_char * 256)]


class FileInfo(ctypes.Structure):
    pass


FileInfo._fields_ = [("next", ctypes.POINTER(FileInfo)), ("fileType", ctypes.c_int), ("fileSubType", ctypes.c_int),
                     ("module", ctypes.c_int), ("flags", ctypes.c_int), ("filePath", ctypes.c_char_p)]


class GpuRes(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("inputType", ctypes.c_int), ("input", ctypes.c_char * 256),
                ("files", ctypes.POINTER(FileInfo))]


SANDBOX_SCRIPT = r"""
import ctypes, json, sys
sys.path.insert(0, sys.argv[3])
from test_sim_nvml_api import InitInput, GpuRes
root, uuids = sys.argv[1], sys.argv[2].split(",")
lib = ctypes.CDLL(root + "/usr/lib/x86_64-linux-gnu/libnvidia-sandboxutils.so.1")
out = {"bad_version": lib.nvSandboxUtilsInit(ctypes.byref(InitInput(2, 1, root.encode())))}
out["init"] = lib.nvSandboxUtilsInit(ctypes.byref(InitInput(1, 1, root.encode())))
buf = ctypes.create_string_buffer(80)
out["version_rc"] = lib.nvSandboxUtilsGetDriverVersion(buf, 80)
out["version"] = buf.value.decode()
out["gpus"] = {}
for u in uuids:
    req = GpuRes(1, 1 if u.startswith("MIG-") else 0, u.encode(), None)
    rc = lib.nvSandboxUtilsGetGpuResource(ctypes.byref(req))
    files, f = [], req.files
    while f:
        files.append([f.contents.fileType, f.contents.fileSubType, f.contents.module, f.contents.filePath.decode()])
        f = f.contents.next
    out["gpus"][u] = [rc, files]
out["unknown"] = lib.nvSandboxUtilsGetGpuResource(ctypes.byref(GpuRes(1, 0, b"GPU-nope", None)))
size = ctypes.c_uint(256)
content = ctypes.create_string_buffer(256)
out["content_rc"] = lib.nvSandboxUtilsGetFileContent(b"/proc/driver/nvidia/version", content, ctypes.byref(size))
out["content"] = content.value.decode()
small = ctypes.c_uint(4)
out["small"] = [lib.nvSandboxUtilsGetFileContent(b"/proc/driver/nvidia/version", content, ctypes.byref(small)), small.value]
out["shutdown"] = lib.nvSandboxUtilsShutdown()
print(json.dumps(out))
"""


def test_sandboxutils_answers_for_gpus_and_mig_devices(sim_host):
    root = sim_host("h100x8-mig")
    info = nvhook_info(root)
    gpu0 = info["gpus"][0]
    mig = gpu0["mig_devices"][0]
    r = subprocess.run([sys.executable, "-c", SANDBOX_SCRIPT, str(root), f"{gpu0['uuid']},{mig['uuid']}", str(HERE)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["bad_version"] == 5                       # NVSANDBOXUTILS_ERROR_VERSION_NOT_SUPPORTED
    assert (out["init"], out["version_rc"], out["version"]) == (0, 0, info["driver_version"])
    bus = gpu0["bus_id"][4:].lower()                     # 00000000:18:00.0 -> 0000:18:00.0
    # (fileType, fileSubType, module, path): NV_DEV/NV_DEV_NVIDIA/NV_GPU, NV_PROC/..._GPUS_PCIBUSID;
    # paths under the root Init named, where the files are (nvidia-ctk's spec points there)
    assert out["gpus"][gpu0["uuid"]] == [0, [[0, 0, 0, f"{root}/dev/nvidia0"],
                                             [1, 11, 0, f"{root}/proc/driver/nvidia/gpus/{bus}"]]]
    rc, files = out["gpus"][mig["uuid"]]
    assert rc == 0
    caps = [f[3] for f in files if f[1] == 10]           # NV_DEV_NVIDIA_CAPS_NVIDIA_CAP
    assert caps == [f"{root}/dev/nvidia-caps/nvidia-cap{mig['gi_access_minor']}",
                    f"{root}/dev/nvidia-caps/nvidia-cap{mig['ci_access_minor']}"]
    assert all(f[2] == 1 for f in files if f[1] == 10)   # NV_MIG
    assert out["unknown"] == 3                           # NVSANDBOXUTILS_ERROR_INVALID_ARG
    assert out["content_rc"] == 0 and out["content"].startswith("NVRM version:")
    assert out["small"][0] == 4 and out["small"][1] == len(out["content"]) + 1   # INSUFFICIENT_SIZE, needed size
    assert out["shutdown"] == 0
