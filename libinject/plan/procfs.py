"""The masked /proc/driver/nvidia a container sees (libnvidia-container's mount_procfs).

A tmpfs over <rootfs>/proc/driver/nvidia holds copies of the host's `params`,
`version` and `registry` (missing ones skipped, as upstream does), with
`ModifyDeviceFiles: 1` turned into 0 so the driver inside never recreates /dev
nodes; plus the `gpus/<busid>` directories of the selected GPUs only.
"""
from __future__ import annotations

import os
from typing import Iterable

from libinject.plan.edits import ProcfsEdit
from libinject.errors import NvhookError
from libinject.discover.model import Gpu

PROC_DRIVER = "/proc/driver/nvidia"
FILES = ("params", "version", "registry")


def mask_params(text: str) -> str:
    """Prevent NVRM from adjusting device nodes inside the container."""
    return text.replace("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0", 1)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise NvhookError(f"cannot read {path}: {e.strerror}") from None


def gpu_dir(procfs_dir: str, gpu: Gpu) -> tuple[str, str]:
    """(host dir, name under gpus/) of a GPU; like upstream, try the 32-bit PCI domain
    form first ("00000000:07:00.0"), then the 16-bit one ("0000:07:00.0")."""
    for name in (gpu.bus_id.lower(), gpu.procfs_name):
        host = os.path.join(procfs_dir, "gpus", name)
        if os.path.isdir(host):
            return host, name
    raise NvhookError(f"GPU {gpu.index} ({gpu.bus_id}): {procfs_dir}/gpus/{gpu.procfs_name} not found")


def cap_files(procfs_dir: str, rels: Iterable[str]) -> dict[str, str]:
    """MIG capability files ("capabilities/mig/config", ".../gi1/access") by their path
    under procfs_dir, as upstream's mount_procfs_mig: NVML in the container reads the caps
    minors there. Copied into the tmpfs (their text is static: "DeviceFileMinor: N ..."),
    so it can stay read-only. Missing ones are skipped."""
    out: dict[str, str] = {}
    if not procfs_dir:
        return out
    for rel in rels:
        host = os.path.join(procfs_dir, rel)
        try:
            with open(host, encoding="utf-8", errors="surrogateescape") as f:
                out[rel] = f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            continue
        except OSError as e:
            raise NvhookError(f"cannot read {host}: {e.strerror}") from None
    return out


def build(procfs_dir: str, gpus: Iterable[Gpu]) -> ProcfsEdit:
    """The ProcfsEdit for the given host procfs dir and selected (parent) GPUs."""
    files: dict[str, str] = {}
    if procfs_dir:
        for name in FILES:
            text = _read(os.path.join(procfs_dir, name))
            if text is None:
                continue
            files[name] = mask_params(text) if name == "params" else text
    dirs: list[tuple[str, str]] = []
    for gpu in dict.fromkeys(gpus):
        if procfs_dir:
            d = gpu_dir(procfs_dir, gpu)
            if d not in dirs:
                dirs.append(d)
    return ProcfsEdit(path=PROC_DRIVER, files=files, gpu_dirs=tuple(dirs))
