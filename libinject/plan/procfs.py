"""The masked /proc/driver/nvidia a container sees (libnvidia-container's mount_procfs).

A tmpfs over <rootfs>/proc/driver/nvidia holds copies of the host's `params`,
`version` and `registry` (missing ones skipped, as upstream does), with
`ModifyDeviceFiles: 1` turned into 0 so the driver inside never recreates /dev
nodes; plus the `gpus/<busid>` directories of the selected GPUs only.

Pure: the texts and which gpus/ dirs exist come from discovery (Driver.procfs,
Driver.gpu_procfs, read by libinject.discover.procfs); nothing here touches the host.
"""
from __future__ import annotations

import posixpath

from libinject.discover.model import Driver, Gpu
from libinject.discover.procfs import FILES
from libinject.errors import NvhookError
from libinject.plan.edits import ProcfsEdit

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable, Mapping

PROC_DRIVER = "/proc/driver/nvidia"


def mask_params(text: str) -> str:
    """Prevent NVRM from adjusting device nodes inside the container."""
    return text.replace("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0", 1)


def masked_files(texts: Mapping[str, str]) -> dict[str, str]:
    """params (masked), version and registry out of texts read from the host."""
    return {name: mask_params(texts[name]) if name == "params" else texts[name]
            for name in FILES if name in texts}


def gpu_dir(driver: Driver, gpu: Gpu) -> tuple[str, str]:
    """(host dir, name under gpus/) of a GPU, as discovery found it."""
    name = driver.gpu_procfs.get(gpu.bus_id)
    if name is None:
        raise NvhookError(f"GPU {gpu.index} ({gpu.bus_id}): "
                          f"{driver.procfs_dir}/gpus/{gpu.procfs_name} not found")
    return posixpath.join(driver.procfs_dir, "gpus", name), name


def cap_files(driver: Driver, rels: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """MIG capability files (".../gi1/access", ".../gi1/ci0/access") as (host file, path
    under procfs_dir), bound as upstream's mount_procfs_mig binds them: NVML in the
    container reads the caps minors there. Ones discovery did not find are skipped."""
    if not driver.procfs_dir:
        return ()
    return tuple((posixpath.join(driver.procfs_dir, rel), rel) for rel in dict.fromkeys(rels)
                 if rel in driver.procfs)


def build(driver: Driver, gpus: Iterable[Gpu]) -> ProcfsEdit:
    """The ProcfsEdit for the driver's procfs and the selected (parent) GPUs."""
    if not driver.procfs_dir:
        return ProcfsEdit(path=PROC_DRIVER)
    dirs: list[tuple[str, str]] = []
    for gpu in dict.fromkeys(gpus):
        d = gpu_dir(driver, gpu)
        if d not in dirs:
            dirs.append(d)
    return ProcfsEdit(path=PROC_DRIVER, files=masked_files(driver.procfs), gpu_dirs=tuple(dirs))
