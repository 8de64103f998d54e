"""Which driver files a capability brings, and finding them under a driver root.

The fixed lists are nvidia-container-cli's (src/nvc_info.c), in its lookup order,
which is also the order `nvidia-container-cli list` prints. Fixed lists fall behind
new drivers, so any other lib*nvidia*.so.<driver version> is taken too (extra=True)
under the capability its name suggests.

Also the container's side: which lib dirs an image wants them in (container_lib_dirs).
"""
from __future__ import annotations

import errno
import os

from libinject.discover import ldcache
from libinject.discover import model

# (SONAME prefix, capability), in nvidia-container-cli's order:
# utility, compute, ngx, video, graphics, graphics (glvnd).
LIBRARIES: tuple[tuple[str, str], ...] = (
    ("libnvidia-ml.so", "utility"),
    ("libnvidia-cfg.so", "utility"),
    ("libnvidia-nscq.so", "utility"),
    ("libcuda.so", "compute"),
    ("libcudadebugger.so", "compute"),
    ("libnvidia-opencl.so", "compute"),
    ("libnvidia-gpucomp.so", "compute"),
    ("libnvidia-ptxjitcompiler.so", "compute"),
    ("libnvidia-fatbinaryloader.so", "compute"),
    ("libnvidia-allocator.so", "compute"),
    ("libnvidia-compiler.so", "compute"),
    ("libnvidia-pkcs11.so", "compute"),
    ("libnvidia-pkcs11-openssl3.so", "compute"),
    ("libnvidia-nvvm.so", "compute"),
    ("libnvidia-tileiras.so", "compute"),
    ("libnvidia-ngx.so", "ngx"),
    ("libvdpau_nvidia.so", "video"),
    ("libnvidia-encode.so", "video"),
    ("libnvidia-opticalflow.so", "video"),
    ("libnvcuvid.so", "video"),
    ("libnvidia-eglcore.so", "graphics"),
    ("libnvidia-glcore.so", "graphics"),
    ("libnvidia-tls.so", "graphics"),
    ("libnvidia-glsi.so", "graphics"),
    ("libnvidia-fbc.so", "graphics"),
    ("libnvidia-ifr.so", "graphics"),
    ("libnvidia-rtcore.so", "graphics"),
    ("libnvoptix.so", "graphics"),
    ("libGLX_nvidia.so", "graphics"),
    ("libEGL_nvidia.so", "graphics"),
    ("libGLESv2_nvidia.so", "graphics"),
    ("libGLESv1_CM_nvidia.so", "graphics"),
    ("libnvidia-glvkspirv.so", "graphics"),
    ("libnvidia-cbl.so", "graphics"),
    # Not in nvidia-container-cli's lists: the EGL platform libraries NVIDIA's toolkit adds
    # for graphics. They ship with the driver but carry versions of their own.
    ("libnvidia-egl-gbm.so", "graphics"),
    ("libnvidia-egl-wayland.so", "graphics"),
    ("libnvidia-egl-wayland2.so", "graphics"),
    ("libnvidia-egl-xcb.so", "graphics"),
    ("libnvidia-egl-xlib.so", "graphics"),
)
OWN_VERSION = ("libnvidia-egl-gbm.so", "libnvidia-egl-wayland.so", "libnvidia-egl-wayland2.so",
               "libnvidia-egl-xcb.so", "libnvidia-egl-xlib.so")

BINARIES: tuple[tuple[str, str], ...] = (
    ("nvidia-smi", "utility"),
    ("nvidia-debugdump", "utility"),
    ("nvidia-persistenced", "utility"),
    ("nv-fabricmanager", "utility"),
    ("nvidia-cuda-mps-control", "compute"),
    ("nvidia-cuda-mps-server", "compute"),
)

# Extras: a guess from the name (first match wins); NVIDIA's own list says the X
# server and settings GUI libraries are never needed in containers.
_EXTRA_SKIP = ("libnvidia-gtk2.so", "libnvidia-gtk3.so", "libnvidia-wfb.so", "libglx.so", "nvidia_drv.so")
_EXTRA_GUESS: tuple[tuple[str, str], ...] = (
    ("ngx", "ngx"),
    ("encode", "video"), ("cuvid", "video"), ("vdpau", "video"), ("opticalflow", "video"),
    ("egl", "graphics"), ("gl", "graphics"), ("vulkan", "graphics"), ("vk", "graphics"),
    ("rtcore", "graphics"), ("optix", "graphics"), ("fbc", "graphics"), ("ifr", "graphics"),
    ("gbm", "graphics"), ("wayland", "graphics"),
    ("cuda", "compute"), ("nvvm", "compute"), ("ptx", "compute"), ("jit", "compute"),
    ("opencl", "compute"), ("compiler", "compute"), ("fatbin", "compute"),
    ("allocator", "compute"), ("pkcs11", "compute"), ("gpucomp", "compute"),
)
EXTRA_DEFAULT = "utility"

# Library directories to search when the root has no usable ld.so.cache, in order.
SEARCH_DIRS_64 = ("usr/lib/x86_64-linux-gnu", "usr/lib64", "lib/x86_64-linux-gnu", "lib64",
                  "usr/local/nvidia/lib64", "usr/lib/aarch64-linux-gnu", "lib/aarch64-linux-gnu",
                  "usr/lib", "lib", "usr/local/lib", "usr/local/nvidia/lib",
                  "usr/lib/x86_64-linux-gnu/nvidia", "usr/lib64/nvidia", "usr/lib/nvidia")
SEARCH_DIRS_32 = ("usr/lib/i386-linux-gnu", "usr/lib32", "lib32", "lib/i386-linux-gnu",
                  "usr/local/nvidia/lib32")
# PATH inside the driver root (the hook's usual PATH, then the unpacked-driver places).
BIN_DIRS = ("usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin",
            "usr/local/nvidia/bin")

NATIVE_ARCHES = ("x86-64", "aarch64")
COMPAT32_ARCH = "i386"


def fixed_capability(soname: str) -> str | None:
    for prefix, cap in LIBRARIES:
        if soname.startswith(prefix):
            return cap
    return None


def guess_capability(name: str) -> str:
    """Capability for a lib*nvidia* library not in the fixed lists."""
    stem = name.split(".so", 1)[0].lower().removeprefix("lib").replace("nvidia", "")
    for word, cap in _EXTRA_GUESS:
        if word in stem:
            return cap
    return EXTRA_DEFAULT


def nvidia_named(name: str, tail: str = "") -> bool:
    """fnmatchcase(name, "lib*nvidia*.so*"), or with tail "lib*nvidia*.so." + tail (tail
    without wildcards). Not fnmatch: it imports re, ~8 ms of the exec'd hook's start-up."""
    if tail:
        end = len(name) - len(".so." + tail)
        return name.endswith(".so." + tail) and name.startswith("lib") and name.find("nvidia", 3, end) >= 0
    i = name.find("nvidia", 3) if name.startswith("lib") else -1
    return i >= 0 and name.find(".so", i + 6) >= 0


def maybe_driver_library(name: str) -> bool:
    """Could this file or SONAME be a driver library (cheap name filter)?"""
    return fixed_capability(name) is not None or nvidia_named(name)


def resolve(root: str, path: str, *, max_links: int = 40) -> str | None:
    """Host path of `path` (absolute, inside the root) with symlinks followed as if
    the root were "/": absolute targets and ".." never leave the root.
    None if it does not exist (or a link loop)."""
    root = root.rstrip("/") or "/"
    todo = [p for p in path.split("/") if p not in ("", ".")]
    todo.reverse()
    done: list[str] = []
    links = 0
    while todo:
        part = todo.pop()
        if part == "..":
            if done:
                done.pop()
            continue
        host = os.path.join(root, *done, part)
        try:
            target = os.readlink(host)
        except OSError as e:
            if e.errno == errno.EINVAL:     # not a link
                done.append(part)
                continue
            return None                     # ENOENT, EACCES, ENOTDIR
        links += 1
        if links > max_links:
            return None
        if target.startswith("/"):
            done = []
        todo.extend(reversed([p for p in target.split("/") if p not in ("", ".")]))
    host = os.path.join(root, *done)
    return host if os.path.lexists(host) else None


def inside(root: str, host: str) -> str:
    """"/usr/lib/..." for a host path under root."""
    root = root.rstrip("/")
    return "/" + host[len(root):].lstrip("/") if root else host


def select(entries: list[ldcache.Entry], root: str, version: str) -> list[model.Library]:
    """Driver libraries among ld.so.cache entries (or search results).

    Native arches first, then i386; within each, nvidia-container-cli's list order,
    then extras sorted by name. A fixed-list name gets at most one file per arch."""
    suffix = ".so." + version
    chosen: dict[tuple[str, str], model.Library] = {}   # (prefix or real name, arch) -> lib
    extras: dict[tuple[str, str], model.Library] = {}
    seen_real: set[tuple[str, str]] = set()
    for e in entries:
        if e.hwcaps_subdir or e.arch not in NATIVE_ARCHES + (COMPAT32_ARCH,):
            continue
        if e.flags & ldcache.FLAG_TYPE_MASK not in (1, ldcache.FLAG_ELF_LIBC6):
            continue
        cap = fixed_capability(e.name)
        if cap is None and not nvidia_named(e.name):
            continue
        real = resolve(root, e.path)
        if real is None or not os.path.isfile(real):
            continue
        name = os.path.basename(real)
        prefix = next((p for p, _ in LIBRARIES if e.name.startswith(p)), "") if cap else ""
        if not name.endswith(suffix) and not (prefix in OWN_VERSION and name.startswith(prefix + ".")):
            continue  # another driver version's leftovers
        if (real, e.arch) in seen_real:
            continue
        if cap is not None:
            if (prefix, e.arch) in chosen:
                continue
            seen_real.add((real, e.arch))
            chosen[(prefix, e.arch)] = model.Library(real, e.name, cap, e.arch)
        else:
            if fixed_capability(name) is not None or name.startswith(_EXTRA_SKIP):
                continue
            if not nvidia_named(name, version):
                continue
            seen_real.add((real, e.arch))
            extras.setdefault((name, e.arch), model.Library(real, e.name, guess_capability(name), e.arch, extra=True))
    out: list[model.Library] = []
    for arches in (NATIVE_ARCHES, (COMPAT32_ARCH,)):
        for prefix, _ in LIBRARIES:
            for arch in arches:
                if (prefix, arch) in chosen:
                    out.append(chosen[(prefix, arch)])
        out.extend(lib for key, lib in sorted(extras.items()) if key[1] in arches)
    return out


# --- the container's side: where an image wants driver libraries -------------------------

DEBIAN_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/i386-linux-gnu")
RPM_LIB_DIRS = ("/usr/lib64", "/usr/lib")


def _exists_in_root(rootfs: str, path: str) -> bool:
    """Does `path` exist inside rootfs, resolving symlinks as if rootfs were "/"?
    (openat2 RESOLVE_IN_ROOT: an image's symlinks can never lead out of its rootfs.)"""
    from libinject.apply.rootfs import openat2   # retries the EAGAIN of a racing ".." walk
    from libinject.errors import NvhookError
    from libinject.linux import native

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
    """(lib_dir, lib32_dir) for the image's distro, for the planner: Debian-like images
    (have /etc/debian_version or /usr/lib/x86_64-linux-gnu) use the multiarch dirs,
    others /usr/lib64 and /usr/lib."""
    if _exists_in_root(rootfs, "/etc/debian_version") or _exists_in_root(rootfs, DEBIAN_LIB_DIRS[0]):
        return DEBIAN_LIB_DIRS
    return RPM_LIB_DIRS
