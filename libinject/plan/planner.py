"""The planner: (Request, Driver) -> ContainerEdits.

What goes in follows libnvidia-container's nvc_driver_mount / nvc_device_mount
(DESIGN.md §4-§5), in the order the live applier applies it:
procfs, binaries, libraries, symlinks, CUDA compat, firmware, IPC, control devices,
GPU devices, MIG capabilities (nodes, and their /proc/driver/nvidia/capabilities files
copied into the procfs edit), IMEX channels, ldconfig folders, cgroup rules.

Capability flags as upstream's options.h: utility = utility bins+libs, compute =
compute bins+libs, video = video+compute libs, graphics = graphics libs, display =
display (modeset) + graphics libs, ngx = ngx libs, compat32 = the 32-bit libraries of
those. No capability at all = no binaries, libraries or IPC (only procfs, nvidiactl,
GPU nodes and firmware), as `nvidia-container-cli configure` without flags.

The planner reads a little of the host (procfs files, the major of nvidia-caps nodes)
but writes nothing.
"""
from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from libinject.plan import procfs as _procfs
from libinject.plan import require as _require
from libinject.plan.edits import (CgroupRule, ContainerEdits, CudaCompatEdit, DeviceEdit,
                             MountEdit, SymlinkEdit)
from libinject.errors import NvhookError
from libinject.discover.model import DeviceNode, Driver, Gpu, HostFile, Library, MigDevice
from libinject.request.model import Request

DEBIAN_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/i386-linux-gnu")
RPM_LIB_DIRS = ("/usr/lib64", "/usr/lib")
BIN_DIR = "/usr/bin"
PERSISTENCED_SOCKET = "nvidia-persistenced/socket"
FABRICMANAGER_SOCKET = "nvidia-fabricmanager/socket"
NV_MAJOR = 195
CAPS_DIR = "/dev/nvidia-caps"

# Mount options, as libnvidia-container remounts each kind.
LIB_OPTS = ("ro", "nosuid", "nodev", "bind")
BIN_OPTS = ("ro", "nosuid", "nodev", "bind")
FIRMWARE_OPTS = ("ro", "nosuid", "nodev", "bind")
IPC_OPTS = ("nosuid", "nodev", "noexec", "bind")


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Selection:
    gpus: tuple[Gpu, ...]                      # full GPUs and MIG parents, selection order
    migs: tuple[tuple[Gpu, MigDevice], ...]    # selected MIG devices with their parent


# --- container lib dirs ---------------------------------------------------------------

def _exists_in_root(rootfs: str, path: str) -> bool:
    """Does `path` exist inside rootfs, resolving symlinks as if rootfs were "/"?
    (openat2 RESOLVE_IN_ROOT: an image's symlinks can never lead out of its rootfs.)"""
    from libinject.linux import native
    from libinject.apply.rootfs import openat2   # retries the EAGAIN of a racing ".." walk

    try:
        rfd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise NvhookError(f"invalid rootfs directory {rootfs}: {e.strerror}") from None
    try:
        fd = openat2(rfd, path.lstrip("/"), os.O_PATH | os.O_CLOEXEC,
                     native.RESOLVE_IN_ROOT | native.RESOLVE_NO_MAGICLINKS)
    except OSError:
        return False
    finally:
        os.close(rfd)
    os.close(fd)
    return True


def container_lib_dirs(rootfs: str) -> tuple[str, str]:
    """(lib_dir, lib32_dir) for the image's distro: Debian-like images (have
    /etc/debian_version or /usr/lib/x86_64-linux-gnu) use the multiarch dirs, others
    /usr/lib64 and /usr/lib."""
    if _exists_in_root(rootfs, "/etc/debian_version") or _exists_in_root(rootfs, DEBIAN_LIB_DIRS[0]):
        return DEBIAN_LIB_DIRS
    return RPM_LIB_DIRS


# --- selection --------------------------------------------------------------------------

def select_devices(driver: Driver, ids: str | None) -> Selection:
    """Resolve a device list ("none" = driver only)."""
    if ids is None or ids.strip().lower() in ("none", ""):
        return Selection((), ())
    from libinject.plan import select as _select

    gpus: list[Gpu] = []
    migs: list[tuple[Gpu, MigDevice]] = []
    for s in _select.select(driver.info, ids):
        if s.gpu not in gpus:
            gpus.append(s.gpu)
        if s.mig is not None and (s.gpu, s.mig) not in migs:
            migs.append((s.gpu, s.mig))
    return Selection(tuple(gpus), tuple(migs))


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
            if lib.compat32 != want32 or lib.capability not in caps:
                continue
            dst = posixpath.join(lib32_dir if want32 else lib_dir, lib.name)
            if dst in seen:
                continue
            seen.add(dst)
            out.append((lib, MountEdit(lib.path, dst, "library", LIB_OPTS)))
    return out


def _symlinks(libs: Sequence[tuple[Library, MountEdit]]) -> list[SymlinkEdit]:
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
            add("libGLX_nvidia.so.0", posixpath.join(d, "libGLX_indirect.so.0"))
            if lib.compat32:
                add("libGLX_nvidia.so.0", posixpath.join(d, "libGL.so.1"))
        elif name.startswith("libnvidia-opticalflow.so"):
            add("libnvidia-opticalflow.so.1", posixpath.join(d, "libnvidia-opticalflow.so"))
    return list(out.values())


def _rel_to_root(driver: Driver, f: HostFile) -> str:
    if f.container_path:
        return f.container_path
    rel = os.path.relpath(f.path, driver.root)
    return "/" + rel.lstrip("/")


def _ipcs(driver: Driver, request: Request, flags: Flags) -> list[MountEdit]:
    """IPC sockets and the MPS pipe directory, exactly as discovery found them on the
    host. Nothing here comes from the container: an image's CUDA_MPS_PIPE_DIRECTORY
    must never choose a host directory to mount (the pipe dir is the host's, read from
    nvhook's own environment by discovery, as nvidia-container-cli does)."""
    out: list[MountEdit] = []
    for f in driver.ipcs:
        cpath = _rel_to_root(driver, f)
        if cpath.endswith(PERSISTENCED_SOCKET):
            if not flags.utility_libs or request.no_persistenced:
                continue
        elif cpath.endswith(FABRICMANAGER_SOCKET):
            if not flags.utility_libs or request.no_fabricmanager:
                continue
        elif not flags.compute_libs:      # the MPS pipe directory
            continue
        out.append(MountEdit(f.path, cpath, "ipc", IPC_OPTS))
    return out


def _dev(node: DeviceNode, kind: str) -> DeviceEdit:
    return DeviceEdit(path=node.container_path, host_path=node.path, major=node.major,
                      minor=node.minor, kind=kind)


def _cap_node(driver: Driver, minor: int) -> DeviceEdit:
    """/dev/nvidia-caps/nvidia-cap<minor>; its (dynamic) major read from the host node."""
    cpath = f"{CAPS_DIR}/nvidia-cap{minor}"
    host = os.path.join(driver.dev_root or driver.root, cpath.lstrip("/"))
    try:
        st = os.stat(host)
    except OSError as e:
        raise NvhookError(f"missing MIG capability device {host}: {e.strerror}") from None
    return DeviceEdit(path=cpath, host_path=host, major=os.major(st.st_rdev), minor=minor, kind="mig")


def _proc_cap(driver: Driver, rel: str) -> tuple[str, str] | None:
    """A MIG capability file under /proc/driver/nvidia, as upstream's mount_procfs_mig:
    NVML in the container reads the caps minors there. Copied into the procfs tmpfs
    (its text is static: "DeviceFileMinor: N ..."), so the tmpfs can stay read-only."""
    if not driver.procfs_dir:
        return None
    host = os.path.join(driver.procfs_dir, rel)
    try:
        with open(host, encoding="utf-8", errors="surrogateescape") as f:
            return rel, f.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    except OSError as e:
        raise NvhookError(f"cannot read {host}: {e.strerror}") from None


def _gpu_node(driver: Driver, gpu: Gpu) -> DeviceEdit:
    for n in driver.gpu_devices:
        if n.minor == gpu.minor and n.major == NV_MAJOR:
            return _dev(n, "gpu")
    for n in driver.gpu_devices:
        if n.minor == gpu.minor:
            return _dev(n, "gpu")
    raise NvhookError(f"no device node for GPU {gpu.index} (/dev/nvidia{gpu.minor})")


def _mig_extra_selection(driver: Driver, ids: str | None, visible: Selection) -> list[Gpu]:
    """GPUs named by --mig-config/--mig-monitor ("all" = all visible GPUs)."""
    if not ids:
        return []
    if ids.strip().lower() == "all":
        return list(visible.gpus)
    return list(select_devices(driver, ids).gpus)


def _imex(driver: Driver, ids: str | None) -> list[DeviceEdit]:
    if not ids:
        return []
    chans = {n.minor: n for n in driver.imex_channels}
    by_id = {int(n.container_path.rsplit("channel", 1)[-1]): n for n in driver.imex_channels
             if n.container_path.rsplit("channel", 1)[-1].isdigit()}
    if ids.strip().lower() == "all":
        return [_dev(n, "imex") for n in driver.imex_channels]
    out = []
    for tok in filter(None, (t.strip() for t in ids.split(","))):
        if not tok.isdigit():
            raise NvhookError(f"invalid IMEX channel: {tok}")
        n = by_id.get(int(tok)) or chans.get(int(tok))
        if n is None:
            raise NvhookError(f"unknown IMEX channel: {tok}")
        e = _dev(n, "imex")
        if e not in out:
            out.append(e)
    return out


# --- the planner ----------------------------------------------------------------------

def plan(request: Request, driver: Driver, *, lib_dir: str = DEBIAN_LIB_DIRS[0],
         lib32_dir: str = DEBIAN_LIB_DIRS[1]) -> ContainerEdits:
    """The edits that make the requested GPUs usable in a container."""
    if request.devices is None:
        return ContainerEdits(lib_dir=lib_dir)
    flags = Flags.of(request.capabilities)
    sel = select_devices(driver, request.devices)
    if not request.disable_require:
        _require.check(request.requirements, driver.info, sel.gpus)

    config_gpus = _mig_extra_selection(driver, request.mig_config, sel)
    monitor_gpus = _mig_extra_selection(driver, request.mig_monitor, sel)
    all_gpus = list(sel.gpus) + [g for g in config_gpus + monitor_gpus if g not in sel.gpus]

    proc = _procfs.build(driver.procfs_dir, all_gpus)
    mounts: list[MountEdit] = _binaries(driver, flags)
    libs = _libraries(driver, flags, lib_dir, lib32_dir)
    mounts += [m for _, m in libs]
    symlinks = _symlinks(libs)
    compat = None
    if request.cuda_compat_mode not in ("disabled", "") and flags.compute_libs:
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

    devices: list[DeviceEdit] = []
    for n in driver.control_devices:
        if n.capability == "compute" and not flags.compute_libs:
            continue
        if n.capability == "display" and not flags.display:
            continue
        devices.append(_dev(n, "control"))
    for g in all_gpus:
        devices.append(_gpu_node(driver, g))
    extra_rules: list[CgroupRule] = []
    proc_caps: list[tuple[str, str] | None] = []
    for gpu, mig in sel.migs:
        if mig.gi_access_minor is None or mig.ci_access_minor is None:
            raise NvhookError(f"MIG device {mig.uuid}: no nvidia-caps minor for its GPU/compute instance")
        devices.append(_cap_node(driver, mig.gi_access_minor))
        devices.append(_cap_node(driver, mig.ci_access_minor))
        base = f"capabilities/gpu{gpu.minor}/mig/gi{mig.gi}"
        proc_caps += [_proc_cap(driver, f"{base}/access"), _proc_cap(driver, f"{base}/ci{mig.ci}/access")]
    for key, gpus in (("config", config_gpus), ("monitor", monitor_gpus)):
        if not gpus:
            continue
        if key not in driver.mig_minors:
            raise NvhookError(f"mig-{key} error: no MIG {key} capability on this host")
        node = _cap_node(driver, driver.mig_minors[key])
        devices.append(node)
        proc_caps.append(_proc_cap(driver, f"capabilities/mig/{key}"))
        # Creating/monitoring instances needs every MIG minor of those GPUs (upstream's
        # setup_mig_minor_cgroups): cgroup rules only, the nodes may not exist yet.
        for g in gpus:
            prefix = f"gpu{g.minor}/"
            for k, minor in sorted(driver.mig_minors.items(), key=lambda kv: kv[1]):
                if k.startswith(prefix):
                    extra_rules.append(CgroupRule(node.major, minor))
    devices += _imex(driver, request.imex_channels)
    devices = list(dict.fromkeys(devices))
    if proc_caps:
        extra = dict(c for c in proc_caps if c is not None)
        proc = replace(proc, files={**proc.files, **extra})

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
        for host, name in edits.procfs.gpu_dirs:
            lines.append(f"procfs   {edits.procfs.path}/gpus/{name} <- {host}")
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
