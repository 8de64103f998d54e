"""What an NVML client sees, the way NVIDIA's go-nvml users ask (nvidia-container-toolkit
through go-nvlib): run as a script, it loads NVML (argv[1], a library path; default the
name "libnvidia-ml.so.1" as the dynamic loader finds it), and prints JSON: the driver
version and each GPU (index from nvmlDeviceGetIndex, minor, uuid, name, bus id) with its
MIG devices, each named as go-nvlib names a MIG profile (pkg/nvlib/device/mig_device.go
GetProfile, mig_profile.go NewMigProfile / getMigMemorySizeGB): the GI profile whose info
id is the GPU instance's profileId, the CI profile whose id is the compute instance's,
and the memory of nvmlDeviceGetAttributes against the parent's total. Run in a child:
NVML's state is per process."""
from __future__ import annotations

import ctypes
import json
import math
import sys

import pynvml as N

# NVML_GPU_INSTANCE_PROFILE_* -> compute slices (go-nvlib NewMigProfile), "+me" ones.
GI_SLICES = {0: 1, 7: 1, 9: 1, 1: 2, 8: 2, 2: 3, 3: 4, 6: 6, 4: 7, 5: 8}
GI_MEDIA = {7, 8}
CI_SLICES = {0: 1, 7: 1, 1: 2, 2: 3, 3: 4, 6: 6, 4: 7, 5: 8}


def mig_gb(total_bytes: int, mig_mib: int) -> int:
    frac = math.ceil(mig_mib * 1024 * 1024 / total_bytes * 8) / 8
    return round(frac * ((total_bytes + (1 << 30) - 1) >> 30))


def mig_profile(parent, mig) -> str:
    total = N.nvmlDeviceGetMemoryInfo(parent).total
    attrs = N.nvmlDeviceGetAttributes(mig)
    gi = N.nvmlDeviceGetGpuInstanceById(parent, N.nvmlDeviceGetGpuInstanceId(mig))
    ci = N.nvmlGpuInstanceGetComputeInstanceById(gi, N.nvmlDeviceGetComputeInstanceId(mig))
    gi_info, ci_info = N.nvmlGpuInstanceGetInfo(gi), N.nvmlComputeInstanceGetInfo(ci)
    for i in range(N.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            gp = N.nvmlDeviceGetGpuInstanceProfileInfo(parent, i, version=1)
        except (N.NVMLError_NotSupported, N.NVMLError_InvalidArgument):
            continue
        if gp.id != gi_info.profileId:
            continue
        for j in range(N.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            for k in range(N.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT):
                try:
                    cp = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, j, k, version=1)
                except (N.NVMLError_NotSupported, N.NVMLError_InvalidArgument):
                    continue
                if cp.id != ci_info.profileId:
                    continue
                g, c = GI_SLICES[i], CI_SLICES[j]
                head = f"{g}g" if c == g else f"{c}c.{g}g"
                return f"{head}.{mig_gb(total, attrs.memorySizeMB)}gb" + ("+me" if i in GI_MEDIA else "")
    raise SystemExit(f"no matching profile IDs found for {N.nvmlDeviceGetUUID(mig)}")


def probe() -> dict:
    gpus = []
    for i in range(N.nvmlDeviceGetCount()):
        d = N.nvmlDeviceGetHandleByIndex(i)
        gpu = {"index": N.nvmlDeviceGetIndex(d), "minor": N.nvmlDeviceGetMinorNumber(d),
               "uuid": N.nvmlDeviceGetUUID(d), "name": N.nvmlDeviceGetName(d),
               "bus_id": N.nvmlDeviceGetPciInfo(d).busId, "mig": []}
        try:
            current, _ = N.nvmlDeviceGetMigMode(d)
        except N.NVMLError_NotSupported:
            current = 0
        if current:
            for j in range(N.nvmlDeviceGetMaxMigDeviceCount(d)):
                try:
                    m = N.nvmlDeviceGetMigDeviceHandleByIndex(d, j)
                except N.NVMLError_NotFound:
                    continue
                gpu["mig"].append({"uuid": N.nvmlDeviceGetUUID(m), "gi": N.nvmlDeviceGetGpuInstanceId(m),
                                   "ci": N.nvmlDeviceGetComputeInstanceId(m), "profile": mig_profile(d, m)})
        gpus.append(gpu)
    return {"driver_version": N.nvmlSystemGetDriverVersion(), "gpus": gpus}


def main() -> None:
    if len(sys.argv) > 1:
        N.nvmlLib = ctypes.CDLL(sys.argv[1])   # pynvml loads this one instead of searching
    N.nvmlInit()
    try:
        print(json.dumps(probe()))
    finally:
        N.nvmlShutdown()


if __name__ == "__main__":
    main()
