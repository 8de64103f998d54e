"""The CDI hook's plan: its request (libinject.request.cdi_hook, the entry's flags) and
what discovery read of the host's /proc/driver/nvidia (libinject.discover.procfs) made
into ContainerEdits, for the live applier as the prestart hook's plan is: the procfs
mask of exactly the devices the container was given, the symlinks, the ld cache folders
with the libraries the runtime mounted there, CUDA forward compat."""
from __future__ import annotations

import os

from libinject.discover.procfs import cap_rel
from libinject.errors import NvhookError
from libinject.plan import procfs
from libinject.plan.compat import consumer_model
from libinject.plan.edits import RUNTIME_LIBRARY, CudaCompatEdit, MountEdit, ProcfsEdit, SymlinkEdit

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable

    from libinject.discover.procfs import HostProcfs


def links(values: Iterable[str]) -> tuple[SymlinkEdit, ...]:
    """--link TARGET::LINK values."""
    out = []
    for v in values:
        target, sep, link = v.partition("::")
        if not sep or not target or not link or not link.startswith("/"):
            raise NvhookError(f"invalid --link {v!r}: expected TARGET::/container/path")
        out.append(SymlinkEdit(target=target, link=link))
    return tuple(out)


def libraries(values: Iterable[str]) -> tuple[MountEdit, ...]:
    """--library HOST::CONTAINER values (older specs) as MountEdits of the runtime's
    (never mounted by us: their host sources are read for the ld cache merge)."""
    out = []
    for v in values:
        host, sep, path = v.partition("::")
        if not sep or not host.startswith("/") or not path.startswith("/"):
            raise NvhookError(f"invalid --library {v!r}: expected /host/path::/container/path")
        out.append(MountEdit(host_path=host, container_path=path, kind=RUNTIME_LIBRARY))
    return tuple(out)


def runtime_library_mounts(paths: Iterable[str]) -> tuple[MountEdit, ...]:
    """The runtime's library mounts by container path alone (read where it mounted them)."""
    return tuple(MountEdit(host_path="", container_path=p, kind=RUNTIME_LIBRARY) for p in paths)


def cuda_compat(major: str, models: Iterable[str] = ()) -> CudaCompatEdit | None:
    """--cuda-compat-driver-major N: the image's forward-compat libcuda first in its ld
    cache where newer than driver N (the hook's "ldconfig" cuda-compat mode); None where
    not asked, or where one of the container's GPUs (`models`) is a consumer card, on
    which CUDA would fail with 804 (libinject.plan.compat)."""
    if not major:
        return None
    if not major.isdigit() or len(major) > 6:
        raise NvhookError(f"invalid --cuda-compat-driver-major {major!r}: expected the driver's major version")
    if any(consumer_model(m) for m in models):
        return None
    return CudaCompatEdit(mode="ldconfig", driver_major=int(major))


def procfs_mask(procfs_dir: str, host: HostProcfs, keys: list[str], gpu_minors: set) -> ProcfsEdit:
    """The /proc/driver/nvidia mask for the container's GPUs (gpu_minors) and MIG
    capability files (keys), made as the planner makes it (libinject.plan.procfs)."""
    gpu_dirs = tuple((os.path.join(procfs_dir, "gpus", name), name)
                     for name, minor in host.gpus.items() if minor is not None and minor in gpu_minors)
    files = procfs.masked_files(host.files)
    if any(k in ("config", "monitor") for k in keys):
        # a MIG manager (nvidia.com/mig-caps): the live capabilities dir, as the planner
        # gives NVIDIA_MIG_CONFIG_DEVICES, so instances made after the start show
        live = ((os.path.join(procfs_dir, "capabilities"), "capabilities"),)
        return ProcfsEdit(path=procfs.PROC_DRIVER, files=files, gpu_dirs=gpu_dirs, live_dirs=live)
    bound = tuple((os.path.join(procfs_dir, rel), rel) for rel in map(cap_rel, keys) if rel in host.files)
    return ProcfsEdit(path=procfs.PROC_DRIVER, files=files, gpu_dirs=gpu_dirs, bound_files=bound)
