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
import stat

from libinject.discover import ldcache
from libinject.discover import model

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

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
# server and settings GUI libraries are never needed in containers. Nor is
# libnvidia-sandboxutils, the host-side library nvidia-ctk asks where a GPU's files are:
# it is not in nvidia-container-cli's lists (libnvidia-container nvc_info.c).
_EXTRA_SKIP = ("libnvidia-gtk2.so", "libnvidia-gtk3.so", "libnvidia-wfb.so", "libglx.so", "nvidia_drv.so",
               "libnvidia-sandboxutils.so")
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
    fixed = _fixed(soname)
    return None if fixed is None else fixed[1]


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


def _parts(path: str) -> list[str]:
    """A path's components, reversed (a stack: the next one last)."""
    todo = [p for p in path.split("/") if p not in ("", ".")]
    todo.reverse()
    return todo


def _walk(root: str, done: list[str], todo: list[str], links: int, max_links: int) -> int | None:
    """Resolve the components `todo` (reversed) onto `done` (resolved: no links), both in
    place; the links followed in all, or None if a component does not exist (or a loop)."""
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
            done.clear()
        todo.extend(_parts(target))
    return links


def resolve(root: str, path: str, *, max_links: int = 40) -> str | None:
    """Host path of `path` (absolute, inside the root) with symlinks followed as if
    the root were "/": absolute targets and ".." never leave the root.
    None if it does not exist (or a link loop)."""
    root = root.rstrip("/") or "/"
    done: list[str] = []
    if _walk(root, done, _parts(path), 0, max_links) is None:
        return None
    host = os.path.join(root, *done)
    return host if os.path.lexists(host) else None


class Resolver:
    """resolve() for many files in few directories: each directory is walked once (the
    driver's ~50 libraries are in two or three), then only the file's own name. The
    same answers as resolve(): the walk goes on from where the directory's ended."""

    def __init__(self, root: str, max_links: int = 40) -> None:
        self.root = root.rstrip("/") or "/"
        self.max_links = max_links
        self._dirs: dict[str, tuple[list[str], int, str] | None] = {}

    def _dir(self, d: str) -> tuple[list[str], int, str] | None:
        """(components, links followed, host path) of directory `d` walked."""
        if d not in self._dirs:
            done: list[str] = []
            links = _walk(self.root, done, _parts(d), 0, self.max_links)
            self._dirs[d] = None if links is None else (done, links, os.path.join(self.root, *done))
        return self._dirs[d]

    def __call__(self, path: str) -> str | None:
        d, _, name = path.rpartition("/")
        walked = self._dir(d)
        if walked is None:
            return None
        done = list(walked[0])
        if _walk(self.root, done, _parts(name), walked[1], self.max_links) is None:
            return None
        host = os.path.join(self.root, *done)
        return host if os.path.lexists(host) else None

    def file(self, path: str) -> str | None:
        """resolve(root, path) if that is a regular file (os.path.isfile), else None.
        A library is usually a file or a link to a name beside it (libcuda.so.1 ->
        libcuda.so.<version>): one lstat, or two and a readlink, then; else resolve()."""
        d, _, name = path.rpartition("/")
        walked = self._dir(d)
        if walked is None:
            return None
        if walked[1] + 1 < self.max_links and _plain(name):
            host = f"{walked[2]}/{name}" if walked[2] != "/" else f"/{name}"
            try:
                target = os.readlink(host)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    return None     # as resolve()'s readlink
                target = ""         # not a link
            if target == "" or _plain(target):
                if target:
                    host = f"{host.rpartition('/')[0]}/{target}"
                try:
                    if stat.S_ISREG(os.lstat(host).st_mode):
                        return host     # not a link: where resolve() ends
                except OSError:
                    return None
        real = self(path)
        return real if real is not None and os.path.isfile(real) else None


def _plain(name: str) -> bool:
    """A file name that resolve() takes as one component, as it is."""
    return name not in ("", ".", "..") and "/" not in name


def inside(root: str, host: str) -> str:
    """"/usr/lib/..." for a host path under root."""
    root = root.rstrip("/")
    return "/" + host[len(root):].lstrip("/") if root else host


# prefix -> (prefix, capability). Every prefix ends in its only ".so", so a name starts
# with one iff its part up to its first ".so" is that prefix: one lookup, not 39 tests.
_BY_PREFIX = {prefix: (prefix, cap) for prefix, cap in LIBRARIES}
assert all(p.find(".so") == len(p) - 3 for p in _BY_PREFIX)


def _fixed(name: str) -> tuple[str, str] | None:
    """(fixed-list prefix, capability) of a SONAME or file name, if it has one."""
    i = name.find(".so")
    return _BY_PREFIX.get(name[:i + 3]) if i >= 0 else None


def _eligible(e: ldcache.Entry) -> tuple[str, str] | None | bool:
    """False if select() passes entry `e` over by its name and flags alone; else its
    (fixed-list prefix, capability), or None for a lib*nvidia* name not in the lists."""
    if e.hwcaps_subdir or e.arch not in NATIVE_ARCHES + (COMPAT32_ARCH,):
        return False
    if e.flags & ldcache.FLAG_TYPE_MASK not in (1, ldcache.FLAG_ELF_LIBC6):
        return False
    fixed = _fixed(e.name)
    return fixed if fixed is not None or nvidia_named(e.name) else False


def _kind(e: ldcache.Entry, fixed: tuple[str, str] | None, real: str,
          version: str) -> tuple[str, bool, tuple[str, str]] | None:
    """(capability, extra, slot) of the library select() makes of an eligible entry `e`
    (`fixed`: _eligible's) whose path resolves to the regular file `real`; the slot it
    fills: ("fixed", its prefix) or ("extra", its file name). None if it is not of this
    driver version."""
    name = real.rpartition("/")[2]
    if not name.endswith(".so." + version) and not (
            fixed is not None and fixed[0] in OWN_VERSION and name.startswith(fixed[0] + ".")):
        return None  # another driver version's leftovers
    if fixed is not None:
        return fixed[1], False, ("fixed", fixed[0])
    if _fixed(name) is not None or name.startswith(_EXTRA_SKIP) or not nvidia_named(name, version):
        return None
    return guess_capability(name), True, ("extra", name)


def select(entries: list[ldcache.Entry], root: str, version: str) -> list[model.Library]:
    """Driver libraries among ld.so.cache entries (or search results).

    Native arches first, then i386; within each, nvidia-container-cli's list order,
    then extras sorted by name. A fixed-list name gets at most one file per arch."""
    file_of = Resolver(root).file
    chosen: dict[tuple[str, str], model.Library] = {}   # (prefix, arch) -> lib
    extras: dict[tuple[str, str], model.Library] = {}   # (real name, arch) -> lib
    seen_real: set[tuple[str, str]] = set()
    for e in entries:
        fixed = _eligible(e)
        if fixed is False:
            continue
        real = file_of(e.path)
        got = _kind(e, fixed, real, version) if real is not None else None
        if got is None:
            continue
        lib = model.Library(real, e.name, got[0], e.arch, extra=got[1])
        kind, slot = got[2]
        if (lib.path, e.arch) in seen_real:
            continue
        if kind == "fixed":
            if (slot, e.arch) in chosen:
                continue
            chosen[(slot, e.arch)] = lib
        else:
            extras.setdefault((slot, e.arch), lib)
        seen_real.add((lib.path, e.arch))
    out: list[model.Library] = []
    for arches in (NATIVE_ARCHES, (COMPAT32_ARCH,)):
        for prefix, _ in LIBRARIES:
            for arch in arches:
                if (prefix, arch) in chosen:
                    out.append(chosen[(prefix, arch)])
        out.extend(lib for key, lib in sorted(extras.items()) if key[1] in arches)
    return out


def could_find(root: str, version: str, libs, entries: list[ldcache.Entry]) -> bool:
    """Whether select() could have chosen `libs` from `entries` (a snapshot's claim,
    checked on load; `entries` may be only those of the libraries' SONAMEs): each the
    very library select() makes of an entry of its SONAME and arch, no fixed-list name
    (extra: file name) twice per arch, no file twice per arch. Cheaper than selecting
    again (one resolve per library, not per entry, its directory's walk shared) and as
    safe: all a forged list can do is name driver libraries the cache (or the search)
    lists in the root, or leave some out."""
    by_name: dict[tuple[str, str], list[ldcache.Entry]] = {}
    for e in entries:
        by_name.setdefault((e.name, e.arch), []).append(e)
    file_of = Resolver(root).file
    slots, files = set(), set()
    for lib in libs:
        for e in by_name.get((lib.soname, lib.arch), ()):
            fixed = _eligible(e)
            if fixed is not False and file_of(e.path) == lib.path:
                got = _kind(e, fixed, lib.path, version)
                if got is not None and got[:2] == (lib.capability, lib.extra):
                    break
        else:
            return False
        slot, file = (got[2], lib.arch), (lib.path, lib.arch)
        if slot in slots or file in files:
            return False
        slots.add(slot)
        files.add(file)
    return True


# --- the container's side: where an image wants driver libraries -------------------------

DEBIAN_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/i386-linux-gnu")
# The multiarch dirs by the host's machine (libnvidia-container's USR_LIB_MULTIARCH_DIR
# and USR_LIB32_MULTIARCH_DIR, which it builds per architecture): an arm64 node's
# containers run arm64 images.
MULTIARCH_LIB_DIRS = {"x86_64": DEBIAN_LIB_DIRS,
                      "aarch64": ("/usr/lib/aarch64-linux-gnu", "/usr/lib/arm-linux-gnueabihf")}
RPM_LIB_DIRS = ("/usr/lib64", "/usr/lib")


def _exists_in_root(rootfs: str, path: str) -> bool:
    """Does `path` exist inside rootfs, resolving symlinks as if rootfs were "/"?
    (openat2 RESOLVE_IN_ROOT: an image's symlinks can never lead out of its rootfs.)"""
    from libinject.linux.resolve import openat2   # retries the EAGAIN of a racing ".." walk
    from libinject.errors import NvhookError
    from libinject.linux import native

    try:
        rfd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise NvhookError(f"invalid rootfs directory {rootfs}: {e.strerror}") from None
    try:
        fd = openat2(rfd, path.lstrip("/"), os.O_PATH | os.O_CLOEXEC,
                     native.RESOLVE_IN_ROOT | native.RESOLVE_NO_MAGICLINKS)
    except OSError as e:
        return e.errno == errno.ENOSYS and _exists_without_links(rfd, path)
    finally:
        os.close(rfd)
    os.close(fd)
    return True


def _exists_without_links(rfd: int, path: str) -> bool:
    """_exists_in_root where there is no openat2 (qemu-user before 9.1 running an arm64
    root; Linux before 5.6): component by component with O_NOFOLLOW, a link or ".." on
    the way counting as absent, so nothing outside the rootfs is ever looked at (an
    image's /etc/debian_version and /usr/lib/<triplet> are no links)."""
    fd = os.dup(rfd)
    try:
        for part in path.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                return False
            nfd = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nfd
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                return False
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def container_lib_dirs(rootfs: str) -> tuple[str, str]:
    """(lib_dir, lib32_dir) for the image's distro, for the planner: Debian-like images
    (have /etc/debian_version or /usr/lib/x86_64-linux-gnu) use the multiarch dirs of
    the host's machine (x86_64 where it is another), others /usr/lib64 and /usr/lib."""
    dirs = MULTIARCH_LIB_DIRS.get(os.uname().machine, DEBIAN_LIB_DIRS)
    if _exists_in_root(rootfs, "/etc/debian_version") or _exists_in_root(rootfs, dirs[0]):
        return dirs
    return RPM_LIB_DIRS
