"""What a driver root offers: driver, GPUs, MIG devices, files and device nodes.

Read-only, for any driver root ("/", "/run/nvidia/driver", a simulated host).
Fast path: a snapshot (libinject.discover.snapshot) reused while its fingerprint of the host
still matches; otherwise the slow path asks NVML in a child process and looks the
files up, then writes a new snapshot. Heavy modules are imported only on the slow path.
"""
from __future__ import annotations

import os

from libinject.discover import snapshot as _snap
from libinject.discover.hostfiles import CONTROL_DEVICES, MPS_PIPE_DIR, find_binaries, find_firmware, find_ipcs
from libinject.discover.migminors import MIG_MINORS, mig_minors_for
from libinject.errors import NvhookError
from libinject.discover.model import Driver

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

DEFAULT_LDCACHE = "/etc/ld.so.cache"


def _watch_dirs() -> list[str]:
    from libinject.discover import graphics
    from libinject.discover import libraries as L

    return [*L.SEARCH_DIRS_64, *L.SEARCH_DIRS_32, *L.BIN_DIRS, "lib/firmware/nvidia",
            "run/nvidia-persistenced", "run/nvidia-fabricmanager", "run",
            (os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_PIPE_DIR).lstrip("/"),
            *graphics.watch_dirs()]


_WATCH: list[str] | None = None  # computed once per process


def _check_root(root: str) -> str:
    # The admin's root may be a symlink (/run/nvidia/driver often is); resolve it once
    # here, since apply opens host sources without following any symlink.
    root = os.path.realpath(root)
    try:
        os.listdir(root)
    except OSError as e:
        raise NvhookError(f"cannot read driver root {root}: {e.strerror}") from None
    return root


def _join(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def discover(root: str = "/", *, ldcache: str | None = None, dev_root: str | None = None,
             nvml_timeout: float = 10.0, user: tuple[int, int] | None = None,
             snapshot: bool = True, snapshot_dir: str | None = None,
             log: Callable[[str], None] | None = None) -> Driver:
    """Discover the driver under `root`.

    ldcache: cache path inside the root (default /etc/ld.so.cache); given explicitly,
    it must parse. dev_root: where dev/ and proc/ are read (default: root).
    user: (uid, gid) NVML runs as; None = 65534:65534 (nobody), without capabilities.
    snapshot: reuse/write a snapshot under snapshot_dir (default /run/nvhook/snapshots).
    log: gets a line when a snapshot is discarded as bad (it is then rebuilt)."""
    global _WATCH
    root = _check_root(root)
    dev_root = os.path.realpath(dev_root) if dev_root else root
    cache = _join(root, ldcache or DEFAULT_LDCACHE)
    if not snapshot:
        return _discover(root, dev_root, cache, ldcache is not None, nvml_timeout, user)
    if _WATCH is None:
        _WATCH = _watch_dirs()
    path = _snap.path_for(snapshot_dir or _snap.DEFAULT_DIR, root, dev_root, cache)
    # The fingerprint is taken before discovering: a change during discovery makes
    # the snapshot stale, never stale data current.
    key, host = _snap.probe(root, dev_root, cache, _WATCH)
    driver = _snap.load(path, key, host, log)
    if driver is None:
        driver = _discover(root, dev_root, cache, ldcache is not None, nvml_timeout, user)
        _snap.save(path, key, driver)
    return driver


# ----------------------------------------------------------------------------- slow path

def library_entries(root: str, cache: str, explicit: bool):
    """(ld.so.cache entries or search results, how they were found)."""
    from libinject.discover import ldcache as LC
    from libinject.discover import libraries as L

    reason = "no ld.so.cache"
    if os.path.exists(cache) or explicit:
        try:
            entries = LC.load(cache)
        except NvhookError as e:
            if explicit:
                raise
            reason = f"unusable ld.so.cache: {e}"
        else:
            if any(e.name.startswith("libnvidia-ml.so") for e in entries):
                return entries, f"ldcache {cache}"
            if explicit:
                raise NvhookError(f"{cache}: no NVIDIA driver libraries in this ld.so.cache")
            reason = f"no driver libraries in {cache}"
    dirs = [*L.SEARCH_DIRS_64, *L.SEARCH_DIRS_32]
    entries = LC.search(root, dirs, L.maybe_driver_library)
    found = sorted({os.path.dirname(e.path) for e in entries})
    return entries, f"search {':'.join(found) or '(nothing found)'} ({reason})"


def _nvml_path(root: str, entries) -> str | None:
    from libinject.discover import libraries as L

    for e in entries:
        if e.name == "libnvidia-ml.so.1" and e.arch in L.NATIVE_ARCHES and not e.hwcaps_subdir:
            p = L.resolve(root, e.path)
            if p and os.path.isfile(p):
                return p
    return None


def _device(host: str, container_path: str, capability: str = ""):
    import stat

    from libinject.discover.model import DeviceNode

    try:
        st = os.stat(host)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        return None
    return DeviceNode(host, container_path, os.major(st.st_rdev), os.minor(st.st_rdev), capability)


def _numbered(dirpath: str, prefix: str, container_dir: str) -> list:
    try:
        names = os.listdir(dirpath)
    except OSError:
        return []
    found = []
    for name in names:
        num = name[len(prefix):]
        if name.startswith(prefix) and num.isdigit():
            node = _device(os.path.join(dirpath, name), f"{container_dir}/{name}")
            if node:
                found.append((int(num), node))
    return [n for _, n in sorted(found)]


def _discover(root: str, dev_root: str, cache: str, explicit_cache: bool,
              timeout: float, user: tuple[int, int] | None) -> Driver:
    from libinject.discover import graphics
    from libinject.discover import libraries as L
    from libinject.discover import model
    from libinject.discover import nvml
    from libinject.discover.procfs import gpu_entry as procfs_entry
    from libinject.discover.procfs import read as read_procfs
    from libinject.discover.procfs import read_table
    from libinject.record import replace

    entries, source = library_entries(root, cache, explicit_cache)
    libpath = _nvml_path(root, entries)
    if libpath is None:
        raise NvhookError(f"NVML not found under driver root {root}: no libnvidia-ml.so.1 ({source})")
    info = nvml.query(root, libpath, timeout=timeout, user=user)

    mig_minors = mig_minors_for(read_table(os.path.join(dev_root, MIG_MINORS)) or "", info.gpus)
    gpus = []
    for g in info.gpus:
        migs = tuple(replace(
            m, gi_access_minor=mig_minors.get(f"gpu{g.minor}/gi{m.gi}/access"),
            ci_access_minor=mig_minors.get(f"gpu{g.minor}/gi{m.gi}/ci{m.ci}/access"))
            for m in g.mig_devices)
        gpus.append(replace(g, mig_devices=migs))
    info = replace(info, gpus=tuple(gpus))
    ver = info.driver_version

    libs = L.select(entries, root, ver)

    binaries = find_binaries(root)
    firmware = find_firmware(root, ver)
    ipcs = find_ipcs(root)

    dev = os.path.join(dev_root, "dev")
    control = [n for n in (_device(os.path.join(dev, name), f"/dev/{name}", cap)
                           for name, cap in CONTROL_DEVICES) if n]
    gpu_nodes = [n for n in (_device(os.path.join(dev, f"nvidia{g.minor}"), f"/dev/nvidia{g.minor}")
                             for g in info.gpus) if n]
    procfs = os.path.join(dev_root, "proc/driver/nvidia")
    if not os.path.isdir(procfs):
        procfs = ""
    # What the masked procfs copies, read now so that planning reads nothing: the MIG
    # capability files of config/monitor and of every MIG device (what a plan can pick).
    cap_keys = ["config", "monitor"]
    for g in info.gpus:
        for m in g.mig_devices:
            cap_keys += [f"gpu{g.minor}/gi{m.gi}/access", f"gpu{g.minor}/gi{m.gi}/ci{m.ci}/access"]
    host_procfs = read_procfs(procfs, cap_keys)
    gpu_procfs = {g.bus_id: name for g in info.gpus
                  if (name := procfs_entry(host_procfs.gpus, g.bus_id)) is not None}
    graphics_files, drm = graphics.discover(root, dev_root, ver, info.gpus)
    return Driver(
        root=root, dev_root=dev_root, info=info, libraries=tuple(libs),
        binaries=tuple(binaries), firmware=tuple(firmware), ipcs=tuple(ipcs),
        graphics_files=graphics_files, drm_devices=drm,
        control_devices=tuple(control), gpu_devices=tuple(gpu_nodes), mig_minors=mig_minors,
        imex_channels=tuple(_numbered(os.path.join(dev, "nvidia-caps-imex-channels"), "channel",
                                      "/dev/nvidia-caps-imex-channels")),
        cap_devices=tuple(_numbered(os.path.join(dev, "nvidia-caps"), "nvidia-cap", "/dev/nvidia-caps")),
        procfs_dir=procfs, library_source=source,
        procfs=host_procfs.files, gpu_procfs=gpu_procfs,
    )
