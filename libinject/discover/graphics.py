"""What makes the graphics libraries usable: the files the loaders read and the DRM nodes.

Found under the driver root as NVIDIA's toolkit finds them (internal/discover/graphics.go):
- data files (the EGL vendor and external-platform files, Vulkan ICD and layer
  manifests, the OpenCL ICD, application profiles, OptiX data, xorg.conf.d snippets): the
  first of etc/, usr/local/share/, usr/share/ that has the name, mounted at that path;
- the X driver modules: in the X server's module dirs (the .run installer's layout) or
  the driver's nvidia/xorg dir (distribution packages), mounted at the same path;
- each GPU's DRM nodes (/dev/dri/cardN, renderDN): udev's by-path links
  (dev/dri/by-path/pci-<bus>-card|render), else sysfs (sys/bus/pci/devices/<bus>/drm/),
  both under the dev root; only char devices of the DRM major are taken.
A file is taken only if it resolves, inside the root, to a regular file; the container
path is the name searched for (where loaders look), the host path what it resolves to.
"""
from __future__ import annotations

import os
import stat

from libinject.constants import GLXSERVER
from libinject.discover import model
from libinject.discover.libraries import resolve

DRM_MAJOR = 226
DATA_DIRS = ("etc", "usr/local/share", "usr/share")
# (name under a data dir, capability); {ver}: the driver version, {arch}: the machine
DATA_FILES: tuple[tuple[str, str], ...] = (
    ("glvnd/egl_vendor.d/10_nvidia.json", "graphics"),
    ("egl/egl_external_platform.d/09_nvidia_wayland2.json", "graphics"),
    ("egl/egl_external_platform.d/10_nvidia_wayland.json", "graphics"),
    ("egl/egl_external_platform.d/15_nvidia_gbm.json", "graphics"),
    ("egl/egl_external_platform.d/20_nvidia_xcb.json", "graphics"),
    ("egl/egl_external_platform.d/20_nvidia_xlib.json", "graphics"),
    ("vulkan/icd.d/nvidia_icd.json", "graphics"),
    ("vulkan/icd.d/nvidia_icd.{arch}.json", "graphics"),
    ("vulkan/icd.d/nvidia_layers.json", "graphics"),
    ("vulkan/implicit_layer.d/nvidia_layers.json", "graphics"),
    ("nvidia/nvoptix.bin", "graphics"),
    ("nvidia/nvidia-application-profiles-{ver}-rc", "graphics"),
    ("nvidia/nvidia-application-profiles-{ver}-key-documentation", "graphics"),
    ("OpenCL/vendors/nvidia.icd", "compute"),          # NVIDIA's toolkit 1.20: with compute
    ("X11/xorg.conf.d/10-nvidia.conf", "display"),
    ("X11/xorg.conf.d/nvidia-drm-outputclass.conf", "display"),
)
# X module dirs: (dir, drivers subdir, extensions subdir)
XORG_DIRS = (("usr/lib/xorg/modules", "drivers/", "extensions/"),
             ("usr/lib64/xorg/modules", "drivers/", "extensions/"),
             ("usr/lib/x86_64-linux-gnu/nvidia/xorg", "", ""),
             ("usr/lib64/nvidia/xorg", "", ""),
             ("usr/lib/nvidia/xorg", "", ""))


def watch_dirs() -> list[str]:
    """Directories whose change can change what data_files() and xorg_modules() find
    (the snapshot's fingerprint stats them)."""
    subdirs = dict.fromkeys(name.rpartition("/")[0] for name, _ in DATA_FILES)
    out = [f"{d}/{s}" for d in DATA_DIRS for s in subdirs]
    for d, drv, ext in XORG_DIRS:
        out += list(dict.fromkeys(f"{d}/{s}".rstrip("/") for s in (drv, ext)))
    return out


def _file(root: str, path: str) -> str | None:
    """Host path of `path` (inside the root) if it resolves to a regular file there."""
    real = resolve(root, path)
    try:
        return real if real is not None and stat.S_ISREG(os.stat(real).st_mode) else None
    except OSError:
        return None


def data_files(root: str, version: str) -> list[model.HostFile]:
    arch = os.uname().machine
    out = []
    for name, cap in DATA_FILES:
        name = name.format(ver=version, arch=arch)
        for d in DATA_DIRS:
            cpath = f"/{d}/{name}"
            host = _file(root, cpath)
            if host is not None:
                out.append(model.HostFile(host, cpath, cap, "graphics"))
                break
    return out


def xorg_modules(root: str, version: str) -> list[model.HostFile]:
    """nvidia_drv.so and libglxserver_nvidia.so.<version>, the first found of each."""
    out = []
    for pick in (1, 2):
        name = "nvidia_drv.so" if pick == 1 else f"{GLXSERVER}.{version}"
        for entry in XORG_DIRS:
            cpath = f"/{entry[0]}/{entry[pick]}{name}"
            host = _file(root, cpath)
            if host is not None:
                out.append(model.HostFile(host, cpath, "display", "graphics"))
                break
    return out


def _node(dev_root: str, name: str) -> model.DeviceNode | None:
    path = os.path.join(dev_root, "dev/dri", name)
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode) or os.major(st.st_rdev) != DRM_MAJOR:
        return None
    return model.DeviceNode(path, f"/dev/dri/{name}", DRM_MAJOR, os.minor(st.st_rdev), "graphics")


def _drm_name(name: str, prefix: str) -> bool:
    num = name[len(prefix):]
    return name.startswith(prefix) and num.isascii() and num.isdigit()


def drm_nodes(dev_root: str, gpus) -> tuple[model.DrmNode, ...]:
    """Each GPU's card and render node (GPU order, card first)."""
    out = []
    for g in gpus:
        domain, rest = g.bus_id.split(":", 1)
        bus = f"{int(domain, 16):04x}:{rest.lower()}"
        sysfs: list[str] | None = None
        for kind, prefix in (("card", "card"), ("render", "renderD")):
            link = f"/dev/dri/by-path/pci-{bus}-{kind}"
            try:
                name = os.readlink(os.path.join(dev_root, link.lstrip("/"))).rpartition("/")[2]
            except OSError:
                name = ""
            by_path = link if _drm_name(name, prefix) else ""
            if not by_path:
                if sysfs is None:
                    try:
                        sysfs = sorted(os.listdir(os.path.join(dev_root, f"sys/bus/pci/devices/{bus}/drm")))
                    except OSError:
                        sysfs = []
                name = next((n for n in sysfs if _drm_name(n, prefix)), "")
            node = _node(dev_root, name) if name else None
            if node is not None:
                out.append(model.DrmNode(g.bus_id, node, by_path))
    return tuple(out)


def _names(version: str) -> dict[str, str]:
    """Every container path discovery may give a graphics file -> its capability."""
    arch = os.uname().machine
    out = {f"/{d}/{name.format(ver=version, arch=arch)}": cap for name, cap in DATA_FILES for d in DATA_DIRS}
    for d, drv, ext in XORG_DIRS:
        out[f"/{d}/{drv}nvidia_drv.so"] = "display"
        out[f"/{d}/{ext}{GLXSERVER}.{version}"] = "display"
    return out


def could_find(root: str, version: str, files) -> bool:
    """Whether discovery could have found `files` under root (a snapshot's claim, checked
    on load): each at a name it looks for, with that name's capability, and its host path
    what that name resolves to in the root now, a regular file; no name twice. Cheaper than
    finding them again (one resolve per file, not per place searched) and as safe: all a
    forged list can do is name the root's own graphics files, or leave some out."""
    names = _names(version)
    seen = set()
    for f in files:
        if (f.kind != "graphics" or names.get(f.container_path) != f.capability
                or f.container_path in seen or _file(root, f.container_path) != f.path):
            return False
        seen.add(f.container_path)
    return True


def discover(root: str, dev_root: str, version: str, gpus) -> tuple[tuple[model.HostFile, ...],
                                                                    tuple[model.DrmNode, ...]]:
    """(graphics files, DRM nodes) of a driver root."""
    files = data_files(root, version) + xorg_modules(root, version)
    return tuple(files), drm_nodes(dev_root, gpus)
