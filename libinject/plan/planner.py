"""The planner: (Request, Driver) -> ContainerEdits.

What goes in follows libnvidia-container's nvc_driver_mount / nvc_device_mount, in
the order the live applier applies it:
procfs, binaries, libraries, symlinks, CUDA compat, firmware, IPC, graphics files,
control devices, GPU devices, their DRM nodes, MIG capabilities (nodes, and their
/proc/driver/nvidia/capabilities files bound in the procfs edit), IMEX channels,
ldconfig folders, cgroup rules.

Graphics and display, beyond upstream's libraries (as NVIDIA's toolkit and Apptainer
add them, libinject.discover.graphics): the loaders' ICD and vendor files, application
profiles (graphics), the OpenCL ICD (compute), the X modules and xorg.conf.d files
(display), each selected GPU's /dev/dri card and render nodes with their by-path links
(graphics or display), and the links loaders expect (gbm/nvidia-drm_gbm.so,
libnvidia-vulkan-producer.so, libglxserver_nvidia.so).

Capability flags as upstream's options.h: utility = utility bins+libs, compute =
compute bins+libs, video = video+compute libs, graphics = graphics libs, display =
display (modeset) + graphics libs, ngx = ngx libs, compat32 = the 32-bit libraries of
those. No capability at all = no binaries, libraries or IPC (only procfs, nvidiactl,
GPU nodes and firmware), as `nvidia-container-cli configure` without flags.

What gets selected (GPUs, MIG devices, MIG config/monitor, IMEX channels) is
libinject.plan.select's answer, the one `nvhook list` shows. This module does no I/O:
host facts come from discovery (the Driver, including the masked procfs's texts and
gpus/ dirs), container facts from the caller (lib_dir, lib32_dir:
libinject.discover.libraries.container_lib_dirs).
"""
from __future__ import annotations

import os
import posixpath

from libinject.constants import CAPS_DIR, FABRICMANAGER_SOCKET, GLXSERVER, NVIDIA_MAJOR, PERSISTENCED_SOCKET
from libinject.discover.libraries import DEBIAN_LIB_DIRS
from libinject.plan import compat as _compat
from libinject.plan import procfs as _procfs
from libinject.plan import require as _require
from libinject.plan import select as _select
from libinject.plan.edits import (CgroupRule, ContainerEdits, CudaCompatEdit, DeviceEdit,
                             MountEdit, SymlinkEdit)
from libinject.errors import NvhookError
from libinject.discover.model import DeviceNode, Driver, Gpu, HostFile, Library
from libinject.record import record, replace
from libinject.request.model import Request

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable, Mapping, Sequence

BIN_DIR = "/usr/bin"

# Mount options, as libnvidia-container remounts each kind.
LIB_OPTS = ("ro", "nosuid", "nodev", "bind")
BIN_OPTS = ("ro", "nosuid", "nodev", "bind")
FIRMWARE_OPTS = ("ro", "nosuid", "nodev", "bind")
IPC_OPTS = ("nosuid", "nodev", "noexec", "bind")
DEVDIR_OPTS = ("ro", "nosuid", "noexec", "bind")     # (device nodes in it must open: no nodev)
GRAPHICS_OPTS = ("ro", "nosuid", "nodev", "bind")
ALLOCATOR = "libnvidia-allocator.so"


@record(frozen=True)
class Flags:
    """Container option flags derived from the capabilities (options.h)."""
    utility_bins: bool
    utility_libs: bool
    compute_bins: bool
    compute_libs: bool
    video_libs: bool
    graphics_libs: bool
    display: bool
    ngx_libs: bool
    compat32: bool

    @classmethod
    def of(cls, caps: Iterable[str]) -> "Flags":
        c = set(caps)
        if "all" in c:
            c = {"utility", "compute", "video", "graphics", "display", "ngx", "compat32"}
        return cls(
            utility_bins="utility" in c, utility_libs="utility" in c,
            compute_bins="compute" in c, compute_libs=bool(c & {"compute", "video"}),
            video_libs="video" in c, graphics_libs=bool(c & {"graphics", "display"}),
            display="display" in c, ngx_libs="ngx" in c, compat32="compat32" in c,
        )

    def library_caps(self) -> set[str]:
        out = set()
        for cap, on in (("utility", self.utility_libs), ("compute", self.compute_libs),
                        ("video", self.video_libs), ("graphics", self.graphics_libs),
                        ("display", self.display), ("ngx", self.ngx_libs)):
            if on:
                out.add(cap)
        return out

    def binary_caps(self) -> set[str]:
        return {c for c, on in (("utility", self.utility_bins), ("compute", self.compute_bins)) if on}


# --- pieces ------------------------------------------------------------------------------

def _binaries(driver: Driver, flags: Flags) -> list[MountEdit]:
    caps = flags.binary_caps()
    out = []
    for b in driver.binaries:
        if b.capability in caps:
            out.append(MountEdit(b.path, posixpath.join(BIN_DIR, posixpath.basename(b.path)),
                                 "binary", BIN_OPTS))
    return out


def _libraries(driver: Driver, flags: Flags, lib_dir: str, lib32_dir: str) -> list[tuple[Library, MountEdit]]:
    caps = flags.library_caps()
    out: list[tuple[Library, MountEdit]] = []
    seen: set[str] = set()
    # 64-bit first, then 32-bit, as upstream mounts libs then libs32.
    for want32 in (False, True):
        if want32 and not flags.compat32:
            break
        for lib in driver.libraries:
            if lib.compat32 != want32:
                continue
            # gbm's backend (gbm/nvidia-drm_gbm.so) is libnvidia-allocator: graphics needs it too
            if lib.capability not in caps and not (flags.graphics_libs and lib.name.startswith(ALLOCATOR)):
                continue
            dst = posixpath.join(lib32_dir if want32 else lib_dir, lib.name)
            if dst in seen:
                continue
            seen.add(dst)
            out.append((lib, MountEdit(lib.path, dst, "library", LIB_OPTS)))
    return out


_DEV_LINKS = {"libnvidia-ml": "libnvidia-ml.so", "libnvidia-encode": "libnvidia-encode.so",
              "libnvcuvid": "libnvcuvid.so"}


def _symlinks(libs: Sequence[tuple[Library, MountEdit]], graphics: bool = False) -> list[SymlinkEdit]:
    out: dict[str, SymlinkEdit] = {}
    mounted = {m.container_path for _, m in libs}

    def add(target: str, link: str) -> None:
        if link not in out and link not in mounted and posixpath.basename(link) != target:
            out[link] = SymlinkEdit(target=target, link=link)

    for lib, m in libs:
        d, name = posixpath.split(m.container_path)
        if lib.soname and lib.soname != name:
            add(name, posixpath.join(d, lib.soname))
    # The links upstream adds by hand (symlink_libraries in nvc_mount.c).
    for lib, m in libs:
        d, name = posixpath.split(m.container_path)
        if name.startswith("libcuda.so"):
            add("libcuda.so.1", posixpath.join(d, "libcuda.so"))
        elif name.startswith("libGLX_nvidia.so"):
            # (no libGL.so.1, 32-bit either: the image's GLVND provides it, as upstream)
            add("libGLX_nvidia.so.0", posixpath.join(d, "libGLX_indirect.so.0"))
        elif name.startswith("libnvidia-opticalflow.so"):
            add("libnvidia-opticalflow.so.1", posixpath.join(d, "libnvidia-opticalflow.so"))
        # The development links NVIDIA's CDI specs add (nvcdi: libnvidia-ml, -encode,
        # libnvcuvid): tools dlopen the unversioned names.
        elif (dev := _DEV_LINKS.get(name.split(".so", 1)[0])) and lib.soname:
            add(lib.soname, posixpath.join(d, dev))
        # The links NVIDIA's toolkit adds for graphics (internal/discover/graphics.go).
        elif name.startswith(ALLOCATOR) and graphics and not lib.compat32 and lib.soname:
            add(f"../{lib.soname}", posixpath.join(d, "gbm/nvidia-drm_gbm.so"))
        elif name.startswith("libnvidia-vulkan-producer.so."):
            add(name, posixpath.join(d, "libnvidia-vulkan-producer.so"))
    return list(out.values())


def _graphics(driver: Driver, flags: Flags) -> tuple[list[MountEdit], list[SymlinkEdit]]:
    """The graphics files the flags ask for, and the X server's link to its GLX module."""
    # The OpenCL ICD with compute asked for, not with the compute libraries video brings
    # (NVIDIA's toolkit: with the compute capability).
    caps = {c for c, on in (("graphics", flags.graphics_libs), ("display", flags.display),
                            ("compute", flags.compute_bins)) if on}
    mounts, links = [], []
    for f in driver.graphics_files:
        if f.capability not in caps:
            continue
        mounts.append(MountEdit(f.path, f.container_path, "graphics", GRAPHICS_OPTS))
        d, name = posixpath.split(f.container_path)
        if name.startswith(GLXSERVER + "."):
            links.append(SymlinkEdit(target=name, link=posixpath.join(d, GLXSERVER)))
    return mounts, links


def _drm(driver: Driver, gpus: Sequence[Gpu]) -> tuple[list[DeviceEdit], list[SymlinkEdit]]:
    """The selected GPUs' DRM nodes, and their by-path links where the host has them."""
    buses = {g.bus_id for g in gpus}
    nodes, links = [], []
    for d in driver.drm_devices:
        if d.bus_id in buses:
            nodes.append(_dev(d.node, "drm"))
            if d.by_path:
                target = posixpath.relpath(d.node.container_path, posixpath.dirname(d.by_path))
                links.append(SymlinkEdit(target=target, link=d.by_path))
    return nodes, links


def _rel_to_root(driver: Driver, f: HostFile) -> str:
    if f.container_path:
        return f.container_path
    rel = os.path.relpath(f.path, driver.root)
    return "/" + rel.lstrip("/")


def ipc_socket(path: str) -> str | None:
    """Which driver socket an IPC path is (PERSISTENCED_SOCKET, FABRICMANAGER_SOCKET), or
    None (the MPS pipe directory). Matched on the last two components: discovery resolves
    the driver root's symlinks, so /run may read as /var/run."""
    tail = path.rsplit("/", 2)[-2:]
    for sock in (PERSISTENCED_SOCKET, FABRICMANAGER_SOCKET):
        if sock.rsplit("/", 2)[-2:] == tail:
            return sock
    return None


def _ipcs(driver: Driver, request: Request, flags: Flags) -> list[MountEdit]:
    """IPC sockets and the MPS pipe directory, exactly as discovery found them on the
    host. Nothing here comes from the container: an image's CUDA_MPS_PIPE_DIRECTORY
    must never choose a host directory to mount (the pipe dir is the host's, read from
    nvhook's own environment by discovery, as nvidia-container-cli does)."""
    out: list[MountEdit] = []
    for f in driver.ipcs:
        cpath = _rel_to_root(driver, f)
        sock = ipc_socket(cpath)
        if sock == PERSISTENCED_SOCKET:
            if not flags.utility_libs or request.no_persistenced:
                continue
        elif sock == FABRICMANAGER_SOCKET:
            if not flags.utility_libs or request.no_fabricmanager:
                continue
        elif not flags.compute_libs:      # the MPS pipe directory
            continue
        out.append(MountEdit(f.path, cpath, "ipc", IPC_OPTS))
    return out


def _dev(node: DeviceNode, kind: str) -> DeviceEdit:
    return DeviceEdit(path=node.container_path, host_path=node.path, major=node.major,
                      minor=node.minor, kind=kind)


def _cap_node(driver: Driver, caps: Mapping[int, DeviceNode], minor: int) -> DeviceEdit:
    """/dev/nvidia-caps/nvidia-cap<minor> as discovery found it (its major is dynamic)."""
    node = caps.get(minor)
    if node is None:
        host = os.path.join(driver.dev_root or driver.root, CAPS_DIR.lstrip("/"), f"nvidia-cap{minor}")
        raise NvhookError(f"missing MIG capability device {host}")
    return _dev(node, "mig")


def _gpu_node(driver: Driver, gpu: Gpu) -> DeviceEdit:
    for n in driver.gpu_devices:
        if n.minor == gpu.minor and n.major == NVIDIA_MAJOR:
            return _dev(n, "gpu")
    for n in driver.gpu_devices:
        if n.minor == gpu.minor:
            return _dev(n, "gpu")
    raise NvhookError(f"no device node for GPU {gpu.index} (/dev/nvidia{gpu.minor})")


# --- the planner ----------------------------------------------------------------------

def plan(request: Request, driver: Driver, *, lib_dir: str = DEBIAN_LIB_DIRS[0],
         lib32_dir: str = DEBIAN_LIB_DIRS[1]) -> ContainerEdits:
    """The edits that make the requested GPUs usable in a container."""
    if request.devices is None:
        return ContainerEdits(lib_dir=lib_dir)
    flags = Flags.of(request.capabilities)
    # Selection errors (devices, then mig-config, mig-monitor) come before requirement
    # errors, as in configure.c.
    sel = _select.resolve(driver, request.devices, mig_config=request.mig_config,
                          mig_monitor=request.mig_monitor, imex=request.imex_channels)
    if not request.disable_require:
        _require.check(request.requirements, driver.info, sel.gpus)

    proc = _procfs.build(driver, sel.gpus)
    mounts: list[MountEdit] = _binaries(driver, flags)
    libs = _libraries(driver, flags, lib_dir, lib32_dir)
    mounts += [m for _, m in libs]
    symlinks = _symlinks(libs, flags.graphics_libs)
    compat = None
    if (request.cuda_compat_mode not in ("disabled", "") and flags.compute_libs
            and not _compat.consumer(sel.gpus)):
        if request.cuda_compat_mode not in ("mount", "ldconfig"):
            raise NvhookError(f"invalid cuda-compat-mode: {request.cuda_compat_mode}")
        try:
            major = int(driver.info.driver_version.split(".", 1)[0])
        except ValueError:
            raise NvhookError(f"invalid driver version: {driver.info.driver_version}") from None
        compat = CudaCompatEdit(mode=request.cuda_compat_mode, driver_major=major)
    if not request.no_gsp_firmware:
        mounts += [MountEdit(f.path, _rel_to_root(driver, f), "firmware", FIRMWARE_OPTS)
                   for f in driver.firmware]
    mounts += _ipcs(driver, request, flags)
    graphics, graphics_links = _graphics(driver, flags)
    mounts += graphics
    symlinks += graphics_links

    devices: list[DeviceEdit] = []
    for n in driver.control_devices:
        if n.capability == "compute" and not flags.compute_libs:
            continue
        if n.capability == "display" and not flags.display:
            continue
        devices.append(_dev(n, "control"))
    if request.modeset_required and not any(n.capability == "display" for n in driver.control_devices):
        # as nvidia-container-cli, whose mount of /dev/nvidia-modeset fails ("stat failed")
        raise NvhookError(f"display capability: {driver.dev_root.rstrip('/')}/dev/nvidia-modeset: "
                          "no such device node (the nvidia-modeset module is not loaded)")
    for g in sel.gpus:
        devices.append(_gpu_node(driver, g))
    if flags.graphics_libs:
        drm, drm_links = _drm(driver, sel.whole_gpus)
        devices += drm
        symlinks += drm_links
    caps = {n.minor: n for n in driver.cap_devices}
    extra_rules: list[CgroupRule] = []
    proc_caps: list[str] = []       # files under /proc/driver/nvidia to copy into the tmpfs
    for gpu, mig in sel.mig_access:
        if mig.gi_access_minor is None or mig.ci_access_minor is None:
            raise NvhookError(f"MIG device {mig.uuid}: no nvidia-caps minor for its GPU/compute instance")
        devices.append(_cap_node(driver, caps, mig.gi_access_minor))
        devices.append(_cap_node(driver, caps, mig.ci_access_minor))
        base = f"capabilities/gpu{gpu.minor}/mig/gi{mig.gi}"
        proc_caps += [f"{base}/access", f"{base}/ci{mig.ci}/access"]
    live_caps = False
    for key, gpus in sel.mig_caps:
        if key not in driver.mig_minors:
            raise NvhookError(f"mig-{key} error: no MIG {key} capability on this host")
        node = _cap_node(driver, caps, driver.mig_minors[key])
        devices.append(node)
        # A MIG manager creates instances after it started: as NVIDIA's
        # nvc_mig_{config,monitor}_global_caps_mount, the live capabilities directory
        # and the whole /dev/nvidia-caps (the node above comes through it).
        if not live_caps:
            live_caps = True
            mounts.append(MountEdit(posixpath.dirname(node.host_path), CAPS_DIR, "devdir", DEVDIR_OPTS))
            if driver.procfs_dir:
                proc = replace(proc, live_dirs=((posixpath.join(driver.procfs_dir, "capabilities"),
                                                 "capabilities"),))
        # Creating/monitoring instances needs every MIG minor of those GPUs (upstream's
        # setup_mig_minor_cgroups): cgroup rules only, the nodes may not exist yet.
        for g in gpus:
            extra_rules += [CgroupRule(node.major, minor) for _, minor in _select.mig_minors_of(driver, g)]
    devices += [_dev(n, "imex") for n in sel.imex]
    devices = list(dict.fromkeys(devices))
    if proc_caps and not live_caps:     # (the live capabilities dir shows them all)
        proc = replace(proc, bound_files=_procfs.cap_files(driver, proc_caps))

    folders = [lib_dir] + ([lib32_dir] if flags.compat32 else [])
    rules: list[CgroupRule] = []
    if not request.no_cgroups:
        for d in devices:
            r = CgroupRule(d.major, d.minor, d.type, d.permissions)
            if r not in rules:
                rules.append(r)
        for r in extra_rules:
            if r not in rules:
                rules.append(r)
    return ContainerEdits(
        env=(),
        device_nodes=() if request.no_devbind else tuple(devices),
        mounts=tuple(mounts),
        symlinks=tuple(symlinks),
        procfs=proc,
        ldconfig_folders=tuple(folders),
        cgroup_rules=tuple(rules),
        hooks=(),
        cuda_compat=compat,
        lib_dir=lib_dir,
    )


def describe(edits: ContainerEdits) -> str:
    """A readable plan for --dry-run."""
    lines: list[str] = []
    if edits.procfs is not None:
        lines.append(f"procfs   tmpfs {edits.procfs.path} ({', '.join(edits.procfs.files) or 'no files'})")
        for host, rel, _ in edits.procfs.all_binds():
            lines.append(f"procfs   {edits.procfs.path}/{rel} <- {host}")
    for m in edits.mounts:
        lines.append(f"{m.kind:<8} {m.container_path} <- {m.host_path} [{','.join(m.options)}]")
    for s in edits.symlinks:
        lines.append(f"symlink  {s.link} -> {s.target}")
    if edits.cuda_compat is not None:
        c = edits.cuda_compat
        lines.append(f"compat   {c.container_dir} (mode {c.mode}, driver major {c.driver_major})")
    for d in edits.device_nodes:
        lines.append(f"device   {d.path} <- {d.host_path} ({d.type} {d.major}:{d.minor}, {d.kind})")
    for f in edits.ldconfig_folders:
        lines.append(f"ldconfig {f}")
    for r in edits.cgroup_rules:
        lines.append(f"cgroup   {r.type} {r.major}:{r.minor} {r.access}")
    for e in edits.env:
        lines.append(f"env      {e}")
    return "\n".join(lines)
