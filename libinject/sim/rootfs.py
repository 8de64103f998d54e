"""A minimal container rootfs without an image registry:
static busybox, the host's glibc, an ld.so.conf that includes ld.so.conf.d, and on
request the host's Vulkan loader (as a Vulkan base image has it).

Used by `nvhook sim rootfs`, `make demo` and the tests.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from libinject.errors import NvhookError
from libinject.sim import machine

BUSYBOX = "/bin/busybox"
# glibc's libraries a root gets from the host's /lib/<triplet>, besides its ELF loader
GLIBC_LIBS = ("libc.so.6", "libm.so.6", "libpthread.so.0",
              "libdl.so.2", "librt.so.1", "libresolv.so.2")
VULKAN_LOADER = "/usr/lib/{triplet}/libvulkan.so.1"   # Debian's libvulkan1
APPLETS = ("sh", "ls", "cat", "echo", "true", "false", "sleep", "mkdir", "readlink", "stat",
           "test", "grep", "head", "wc", "env", "id", "mount", "chroot", "find", "ln", "rm", "dd")


def build_rootfs(dest: str | os.PathLike[str], *, lib_layout: str = "debian", vulkan: bool = False) -> Path:
    """Build a busybox+glibc rootfs at dest (must not exist or be empty).

    lib_layout "debian" puts glibc in /lib/x86_64-linux-gnu (the host machine's multiarch
    dir: /lib/aarch64-linux-gnu on an arm64 host; with /usr/lib/x86_64-linux-gnu
    present); "rpm" puts it in /lib64 and /usr/lib64 (a Fedora-like image).
    vulkan: also copy the host's Vulkan loader (libvulkan.so.1's real file and its SONAME
    link) into /usr/lib/x86_64-linux-gnu (/usr/lib64 for "rpm"); it reads the driver's
    Vulkan files (usr/share/vulkan) that nvhook injects with the graphics capability.
    """
    mach = machine.native()
    vulkan_loader = VULKAN_LOADER.format(triplet=mach.triplet)
    root = Path(dest)
    if not Path(BUSYBOX).is_file():
        raise NvhookError(f"{BUSYBOX} not found: install busybox-static")
    if vulkan and not Path(vulkan_loader).is_file():
        raise NvhookError(f"{vulkan_loader} not found: install libvulkan1")
    root.mkdir(parents=True, exist_ok=True)
    for d in ("bin", "sbin", "etc/ld.so.conf.d", "proc", "sys", "dev", "tmp", "run", "root",
              "usr/bin", "usr/local/bin", "var/run"):
        (root / d).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "tmp", 0o1777)
    shutil.copy2(BUSYBOX, root / "bin/busybox")
    for a in APPLETS:
        link = root / "bin" / a
        if not link.exists():
            link.symlink_to("busybox")
    if lib_layout == "debian":
        libdir = root / "lib" / mach.triplet
        usr_libdir = root / "usr/lib" / mach.triplet
        conf_dirs = [f"/lib/{mach.triplet}", f"/usr/lib/{mach.triplet}"]
    elif lib_layout == "rpm":
        libdir = root / "lib64"
        usr_libdir = root / "usr/lib64"
        conf_dirs = ["/lib64", "/usr/lib64"]
    else:
        raise NvhookError(f"unknown lib layout {lib_layout!r}")
    usr_libdir.mkdir(parents=True, exist_ok=True)
    libdir.mkdir(parents=True, exist_ok=True)
    for lib in (mach.loader, *GLIBC_LIBS):
        shutil.copy2(os.path.realpath(f"/lib/{mach.triplet}/{lib}"), libdir / lib)
    if vulkan:
        real = os.path.realpath(vulkan_loader)      # libvulkan.so.1.3.239
        shutil.copy2(real, usr_libdir / os.path.basename(real))
        link = usr_libdir / "libvulkan.so.1"
        if not link.is_symlink():
            link.symlink_to(os.path.basename(real))
    loader = root / mach.loader_link     # where programs' PT_INTERP names it
    if not loader.exists() and not loader.is_symlink():
        loader.parent.mkdir(exist_ok=True)
        loader.symlink_to("/" + str((libdir / mach.loader).relative_to(root)))
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "etc/ld.so.conf.d/libc.conf").write_text("\n".join(conf_dirs) + "\n")
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")
    (root / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\n")
    return root
