"""ContainerEdits: what the planner decides, as pure data.

One plan, three appliers: live (libinject.apply.live: hook and configure), OCI spec
(runtime shim) and CDI (cdi generate). Container paths are absolute paths inside the
container; host paths are absolute on the host. Serialisable with to_dict/from_dict
(used by --dry-run --json and the snapshot cache).

Mount kinds, in the order the live applier applies them (libinject/apply/live.py):
    binary, library, firmware, ipc, graphics, procfs-gpu; devdir (a live /dev directory,
    /dev/nvidia-caps for MIG config/monitor) with the device nodes
Device nodes: control devices first, then per-GPU, DRM, then MIG capabilities and IMEX.
"""
from __future__ import annotations

from libinject.record import asdict, field, fields, record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MOUNT_KINDS = ("binary", "library", "firmware", "ipc", "graphics", "devdir", "runtime-library")
# A library the runtime mounts itself (a CDI spec's mount): the live applier never mounts
# it, it reads its ELF header for the ld.so.cache merge, from its host source (an older
# spec's `cdi-hook --library HOST::CONTAINER`) or, with no host_path, where the runtime
# mounted it in the container (libinject.request.cdi_hook.runtime_libraries).
RUNTIME_LIBRARY = "runtime-library"


@record(frozen=True)
class DeviceEdit:
    path: str                 # container path, "/dev/nvidia1"
    host_path: str            # node on the host to bind-mount
    major: int
    minor: int
    kind: str = "gpu"         # "control" | "gpu" | "drm" | "mig" | "imex"
    type: str = "c"
    permissions: str = "rw"   # cgroup access
    file_mode: int = 0o666


@record(frozen=True)
class MountEdit:
    host_path: str
    container_path: str
    kind: str                                  # one of MOUNT_KINDS
    options: tuple[str, ...] = ("ro", "nosuid", "nodev", "bind")


@record(frozen=True)
class SymlinkEdit:
    target: str               # link contents, e.g. "libcuda.so.1"
    link: str                 # container path of the link


@record(frozen=True)
class ProcfsEdit:
    """tmpfs over `path` holding `files`, plus the selected GPUs' directories and live
    host directories (MIG config/monitor: the whole `capabilities`, so instances made
    after the start are seen, as NVIDIA's mount_procfs_mig does)."""
    path: str = "/proc/driver/nvidia"
    files: dict[str, str] = field(default_factory=dict)          # name -> contents
    gpu_dirs: tuple[tuple[str, str], ...] = ()                   # (host dir, name under gpus/)
    live_dirs: tuple[tuple[str, str], ...] = ()                  # (host dir, path under `path`)
    # MIG devices' capability files (capabilities/gpu<N>/mig/gi<G>/[ci<C>/]access), bound
    # read-only as NVIDIA's mount_procfs_mig binds them: (host file, path under `path`)
    bound_files: tuple[tuple[str, str], ...] = ()

    def binds(self) -> list[tuple[str, str]]:
        """(host dir, path under `path`) of every directory bound into the tmpfs."""
        return [(h, f"gpus/{name}") for h, name in self.gpu_dirs] + list(self.live_dirs)

    def all_binds(self) -> list[tuple[str, str, bool]]:
        """(host path, path under `path`, is a directory) of every bind into the tmpfs:
        the directories, then the files."""
        return [(h, rel, True) for h, rel in self.binds()] + [(h, rel, False) for h, rel in self.bound_files]


@record(frozen=True)
class CgroupRule:
    major: int
    minor: int
    type: str = "c"
    access: str = "rw"


@record(frozen=True)
class HookEdit:
    stage: str                # "createContainer", ...
    path: str
    args: tuple[str, ...]
    env: tuple[str, ...] = ()


@record(frozen=True)
class CudaCompatEdit:
    """Use the image's CUDA forward-compat libs when newer than the driver."""
    mode: str                 # "mount" | "ldconfig"
    driver_major: int
    container_dir: str = "/usr/local/cuda/compat"


@record(frozen=True)
class ContainerEdits:
    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceEdit, ...] = ()
    mounts: tuple[MountEdit, ...] = ()
    symlinks: tuple[SymlinkEdit, ...] = ()
    procfs: ProcfsEdit | None = None
    ldconfig_folders: tuple[str, ...] = ()
    cgroup_rules: tuple[CgroupRule, ...] = ()
    hooks: tuple[HookEdit, ...] = ()
    cuda_compat: CudaCompatEdit | None = None
    lib_dir: str = "/usr/lib/x86_64-linux-gnu"   # where libraries go in this container

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ContainerEdits":
        def tup(t, items):
            return tuple(t(**_tuplify(t, i)) for i in items)

        return cls(
            env=tuple(d.get("env", ())),
            device_nodes=tup(DeviceEdit, d.get("device_nodes", ())),
            mounts=tup(MountEdit, d.get("mounts", ())),
            symlinks=tup(SymlinkEdit, d.get("symlinks", ())),
            procfs=ProcfsEdit(**_tuplify(ProcfsEdit, d["procfs"])) if d.get("procfs") else None,
            ldconfig_folders=tuple(d.get("ldconfig_folders", ())),
            cgroup_rules=tup(CgroupRule, d.get("cgroup_rules", ())),
            hooks=tup(HookEdit, d.get("hooks", ())),
            cuda_compat=CudaCompatEdit(**d["cuda_compat"]) if d.get("cuda_compat") else None,
            lib_dir=d.get("lib_dir", cls.lib_dir),
        )


def _tuplify(t: type, d: dict[str, Any]) -> dict[str, Any]:
    """JSON lists back to the tuples the frozen records hold."""
    out = dict(d)
    for f in fields(t):
        if f.name in out and isinstance(out[f.name], list):
            out[f.name] = tuple(tuple(x) if isinstance(x, list) else x for x in out[f.name])
    return out
