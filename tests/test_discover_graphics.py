"""Discovery of the graphics surface (libinject.discover.graphics) on hand-made roots:
where each file is looked for, what is refused, and DRM nodes by udev link or sysfs."""
from __future__ import annotations

import os
import stat
from pathlib import Path

from libinject.discover import graphics
from libinject.discover.model import Gpu

VER = "550.163.01"


def gpu(i: int, bus: str) -> Gpu:
    return Gpu(index=i, minor=i, uuid=f"GPU-{i}", name="NVIDIA GeForce RTX 4090", brand="GeForce",
               bus_id=bus, cc=(8, 9), architecture="Ada", memory_total=1)


def touch(root: Path, rel: str, text: str = "x") -> Path:
    p = root / rel.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def mknod(root: Path, rel: str, major: int, minor: int) -> None:
    p = root / rel.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(major, minor))


def test_data_files_search_order_and_paths(tmp_path):
    root = tmp_path / "r"
    touch(root, "usr/share/vulkan/icd.d/nvidia_icd.json")
    touch(root, "etc/vulkan/icd.d/nvidia_icd.json")             # etc/ comes first
    touch(root, "usr/local/share/glvnd/egl_vendor.d/10_nvidia.json")
    touch(root, "usr/share/glvnd/egl_vendor.d/10_nvidia.json")
    touch(root, f"usr/share/nvidia/nvidia-application-profiles-{VER}-rc")
    touch(root, "usr/share/nvidia/nvidia-application-profiles-1.0-rc")   # another version's
    touch(root, "etc/OpenCL/vendors/nvidia.icd")
    touch(root, f"usr/share/vulkan/icd.d/nvidia_icd.{os.uname().machine}.json")
    touch(root, "usr/share/X11/xorg.conf.d/10-nvidia.conf")
    got = {f.container_path: (f.path, f.capability, f.kind) for f in graphics.data_files(str(root), VER)}
    assert got == {
        "/etc/vulkan/icd.d/nvidia_icd.json": (f"{root}/etc/vulkan/icd.d/nvidia_icd.json", "graphics", "graphics"),
        "/usr/local/share/glvnd/egl_vendor.d/10_nvidia.json":
            (f"{root}/usr/local/share/glvnd/egl_vendor.d/10_nvidia.json", "graphics", "graphics"),
        f"/usr/share/nvidia/nvidia-application-profiles-{VER}-rc":
            (f"{root}/usr/share/nvidia/nvidia-application-profiles-{VER}-rc", "graphics", "graphics"),
        "/etc/OpenCL/vendors/nvidia.icd": (f"{root}/etc/OpenCL/vendors/nvidia.icd", "compute", "graphics"),
        f"/usr/share/vulkan/icd.d/nvidia_icd.{os.uname().machine}.json":
            (f"{root}/usr/share/vulkan/icd.d/nvidia_icd.{os.uname().machine}.json", "graphics", "graphics"),
        "/usr/share/X11/xorg.conf.d/10-nvidia.conf":
            (f"{root}/usr/share/X11/xorg.conf.d/10-nvidia.conf", "display", "graphics"),
    }


def test_links_resolve_inside_the_root_and_only_regular_files(tmp_path):
    root = tmp_path / "r"
    real = touch(root, "opt/nv/nvidia_icd.json")
    link = root / "etc/vulkan/icd.d/nvidia_icd.json"
    link.parent.mkdir(parents=True)
    link.symlink_to("/opt/nv/nvidia_icd.json")          # absolute: read as inside the root
    # a link out of the root names the root's own /etc/hostname (absent): not taken
    (root / "etc/glvnd/egl_vendor.d").mkdir(parents=True)
    (root / "etc/glvnd/egl_vendor.d/10_nvidia.json").symlink_to("/etc/hostname")
    (root / "usr/share/glvnd/egl_vendor.d/10_nvidia.json").mkdir(parents=True)   # a directory
    os.mkfifo(root / "etc/OpenCL.fifo")
    (root / "etc/OpenCL/vendors").mkdir(parents=True)
    os.rename(root / "etc/OpenCL.fifo", root / "etc/OpenCL/vendors/nvidia.icd")   # a fifo
    got = {f.container_path: f.path for f in graphics.data_files(str(root), VER)}
    assert got == {"/etc/vulkan/icd.d/nvidia_icd.json": str(real)}


def test_xorg_modules(tmp_path):
    root = tmp_path / "r"
    touch(root, "usr/lib/x86_64-linux-gnu/nvidia/xorg/nvidia_drv.so")
    touch(root, f"usr/lib/x86_64-linux-gnu/nvidia/xorg/libglxserver_nvidia.so.{VER}")
    touch(root, "usr/lib/xorg/modules/drivers/nvidia_drv.so")       # the X server's dir wins
    touch(root, "usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.1.2.3")   # another version
    got = [(f.container_path, f.capability) for f in graphics.xorg_modules(str(root), VER)]
    assert got == [("/usr/lib/xorg/modules/drivers/nvidia_drv.so", "display"),
                   (f"/usr/lib/x86_64-linux-gnu/nvidia/xorg/libglxserver_nvidia.so.{VER}", "display")]


def test_drm_nodes_by_path_then_sysfs(tmp_path):
    dev = tmp_path / "d"
    gpus = [gpu(0, "00000000:01:00.0"), gpu(1, "00000000:41:00.0"), gpu(2, "00000000:81:00.0"),
            gpu(3, "00000000:C1:00.0")]
    # GPU 0: udev links
    mknod(dev, "dev/dri/card0", 226, 0)
    mknod(dev, "dev/dri/renderD128", 226, 128)
    (dev / "dev/dri/by-path").mkdir()
    (dev / "dev/dri/by-path/pci-0000:01:00.0-card").symlink_to("../card0")
    (dev / "dev/dri/by-path/pci-0000:01:00.0-render").symlink_to("../renderD128")
    # GPU 1: no udev links, sysfs names its nodes
    mknod(dev, "dev/dri/card1", 226, 1)
    mknod(dev, "dev/dri/renderD129", 226, 129)
    for n in ("card1", "renderD129"):
        (dev / f"sys/bus/pci/devices/0000:41:00.0/drm/{n}").mkdir(parents=True)
    # GPU 2: its "card" is not a DRM device (another major) and its render link names junk
    mknod(dev, "dev/dri/card2", 195, 2)
    (dev / "dev/dri/by-path/pci-0000:81:00.0-card").symlink_to("../card2")
    (dev / "dev/dri/by-path/pci-0000:81:00.0-render").symlink_to("../../sda")
    # GPU 3: nothing
    got = [(d.bus_id, d.node.container_path, d.node.major, d.node.minor, d.by_path)
           for d in graphics.drm_nodes(str(dev), gpus)]
    assert got == [
        ("00000000:01:00.0", "/dev/dri/card0", 226, 0, "/dev/dri/by-path/pci-0000:01:00.0-card"),
        ("00000000:01:00.0", "/dev/dri/renderD128", 226, 128, "/dev/dri/by-path/pci-0000:01:00.0-render"),
        ("00000000:41:00.0", "/dev/dri/card1", 226, 1, ""),
        ("00000000:41:00.0", "/dev/dri/renderD129", 226, 129, ""),
    ]
    assert graphics.drm_nodes(str(tmp_path / "none"), gpus) == ()


def test_watch_dirs_cover_every_search_place():
    dirs = set(graphics.watch_dirs())
    for name, _ in graphics.DATA_FILES:
        for d in graphics.DATA_DIRS:
            assert f"{d}/{name.rpartition('/')[0]}" in dirs
    for d, drv, ext in graphics.XORG_DIRS:
        assert f"{d}/{drv}".rstrip("/") in dirs and f"{d}/{ext}".rstrip("/") in dirs
