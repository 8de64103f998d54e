"""What discovery finds on a host: the driver, its GPUs and its files.

Pure data (frozen records, JSON-friendly via libinject.record.asdict); produced by
libinject.discover.driver, consumed by the planner and by `nvhook list/info`.
All host paths are absolute paths on the host, i.e. already prefixed with the
driver root (e.g. "/sim/usr/lib/x86_64-linux-gnu/libcuda.so.550.163.01").
"""
from __future__ import annotations

from libinject.record import field, record


@record(frozen=True)
class MigDevice:
    index: int            # position under its parent (nvmlDeviceGetMigDeviceHandleByIndex)
    uuid: str             # "MIG-..."
    gi: int               # GPU instance id
    ci: int               # compute instance id
    name: str             # profile name as nvidia-smi prints it, e.g. "3g.40gb"
    memory_total: int     # bytes
    gi_access_minor: int | None = None   # nvidia-caps minor of gpu<N>/gi<G>/access
    ci_access_minor: int | None = None   # nvidia-caps minor of gpu<N>/gi<G>/ci<C>/access


@record(frozen=True)
class Gpu:
    index: int            # NVML index
    minor: int            # /dev/nvidia<minor>
    uuid: str             # "GPU-..."
    name: str             # "NVIDIA A100-SXM4-80GB"
    brand: str            # NVML brand name as nvidia-container-cli prints it ("Nvidia", "Tesla", "GeForce", ...)
    bus_id: str           # NVML format "00000000:07:00.0"
    cc: tuple[int, int]   # CUDA compute capability
    architecture: str     # "Ampere", "Hopper", "Turing", ...
    memory_total: int     # bytes
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()
    mig_capable: bool = False   # NVML answers the MIG mode query (nvidia-container-cli: mig-config/monitor need it)

    @property
    def procfs_name(self) -> str:
        """Directory name under /proc/driver/nvidia/gpus: "0000:07:00.0"."""
        domain, rest = self.bus_id.split(":", 1)
        return f"{int(domain, 16):04x}:{rest.lower()}"


@record(frozen=True)
class DriverInfo:
    driver_version: str   # "550.163.01"
    cuda_version: str     # "12.4"
    gpus: tuple[Gpu, ...] = ()


@record(frozen=True)
class Library:
    path: str             # host path of the real file, ends in the driver version
    soname: str | None    # "libcuda.so.1" (from the ldcache entry / ELF DT_SONAME)
    capability: str       # which capability injects it
    arch: str = "x86-64"  # "x86-64" | "i386" | "aarch64"
    extra: bool = False   # not in NVIDIA's fixed lists: matched lib*nvidia*.so.<version>

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def compat32(self) -> bool:
        return self.arch == "i386"


@record(frozen=True)
class HostFile:
    """A binary, firmware file, IPC socket/directory or graphics file on the host."""
    path: str             # host path
    container_path: str   # where it goes in the container, e.g. "/usr/bin/nvidia-smi"
    capability: str       # "utility" | "compute" | ... ("" for always)
    kind: str             # "binary" | "firmware" | "ipc" | "graphics" (ICD/vendor files, X modules)


@record(frozen=True)
class DeviceNode:
    path: str             # host path of the node (under the dev root)
    container_path: str   # "/dev/nvidiactl"
    major: int
    minor: int
    capability: str = ""  # "" = always (nvidiactl), "compute" (uvm), "display" (modeset)


@record(frozen=True)
class DrmNode:
    """A GPU's DRM node (/dev/dri/cardN or renderDN), matched to the GPU by PCI bus id."""
    bus_id: str           # Gpu.bus_id of its GPU (NVML format)
    node: DeviceNode      # container path /dev/dri/<name>, capability "graphics"
    by_path: str = ""     # "/dev/dri/by-path/pci-<bus>-card|render" when the host has that link


@record(frozen=True)
class Driver:
    """Everything discovery found under one driver root."""
    root: str                                  # driver root ("/", "/run/nvidia/driver", a sim dir)
    dev_root: str                              # where dev/ and proc/ are read (default: root)
    info: DriverInfo
    libraries: tuple[Library, ...] = ()
    binaries: tuple[HostFile, ...] = ()
    firmware: tuple[HostFile, ...] = ()
    ipcs: tuple[HostFile, ...] = ()
    graphics_files: tuple[HostFile, ...] = ()      # ICD/vendor files, app profiles, X modules and conf
    control_devices: tuple[DeviceNode, ...] = ()   # nvidiactl, nvidia-uvm(-tools), nvidia-modeset
    gpu_devices: tuple[DeviceNode, ...] = ()       # /dev/nvidia<minor>, in GPU index order
    mig_minors: dict[str, int] = field(default_factory=dict)  # "gpu0/gi1/ci0/access" -> minor; "config", "monitor"
    imex_channels: tuple[DeviceNode, ...] = ()
    cap_devices: tuple[DeviceNode, ...] = ()       # /dev/nvidia-caps/nvidia-cap<N> present on the host, by minor
    drm_devices: tuple[DrmNode, ...] = ()          # each GPU's DRM nodes, in GPU order (card, then render)
    procfs_dir: str = ""                           # host path of proc/driver/nvidia
    library_source: str = ""                       # "ldcache <path>" or "search <dirs>": how libraries were found
    # What the masked /proc/driver/nvidia is made of, read by discovery so the planner
    # does no I/O (libinject.discover.procfs): path under procfs_dir -> text, for
    # params/version/registry and the MIG capability files of config, monitor and each
    # MIG device (missing files absent) ...
    procfs: dict[str, str] = field(default_factory=dict)
    # ... and each GPU's existing gpus/ dir: Gpu.bus_id -> name under gpus/ (no dir: absent).
    gpu_procfs: dict[str, str] = field(default_factory=dict)
