"""Where an image symlink points, inside a rootfs, when it names nothing (yet).

A WSL-built image's `libcuda.so.1`, an alternatives link `/usr/bin/nvidia-smi ->
/etc/alternatives/nvidia-smi`: NVIDIA's cli mounts a driver file over what such a name
points to, made first. follow() walks the path as the kernel would with the rootfs as
"/" (absolute links from its root, ".." stopping there, at most MAX_LINKS links), one
directory at a time opened beneath the rootfs with no symlink followed (the walk
already did), and never through procfs/sysfs. The caller (libinject.apply.rootfs) makes
the path it returns with its usual checks (the rootfs's own mount, no volume).
"""
from __future__ import annotations

import errno
import os
import stat

from libinject.errors import NvhookError
from libinject.linux import native

MAX_LINKS = 40              # symlinks followed in one path (the kernel's limit)
_BENEATH = native.RESOLVE_BENEATH | native.RESOLVE_NO_SYMLINKS | native.RESOLVE_NO_MAGICLINKS


def follow(root_fd: int, path: str) -> str:
    """The container path `path` names once every symlink in it is followed inside the
    rootfs (root_fd), where its last components need not exist. Raises NvhookError."""
    todo = list(reversed(path.split("/")))
    done: list[str] = []
    links = 0
    missing = False
    while todo:
        name = todo.pop()
        if name in ("", "."):
            continue
        if name == "..":
            if missing:   # (the kernel: ENOENT; nothing to make from it)
                raise NvhookError(f"{path} in the rootfs: a link names '..' of a missing directory")
            if done:
                done.pop()
            continue
        if not missing:
            found, target = _entry(root_fd, done, name, path)
            missing = not found
            if target is not None:
                links += 1
                if links > MAX_LINKS:
                    raise NvhookError(f"{path} in the rootfs: {os.strerror(errno.ELOOP)}")
                if target.startswith("/"):
                    done = []
                todo.extend(reversed(target.split("/")))
                continue
        done.append(name)
    return "/" + "/".join(done)


def _entry(root_fd: int, parts: list[str], name: str, path: str) -> tuple[bool, str | None]:
    """(whether `name` exists in directory /parts, itself free of links; its target
    where it is a symlink)."""
    rel = "/".join(parts) or "."
    for _ in range(1000):   # (EAGAIN: a '..' walk raced with a rename somewhere)
        try:
            dfd = native.openat2(root_fd, rel, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, 0, _BENEATH)
            break
        except BlockingIOError:
            continue
        except OSError as e:
            raise NvhookError(f"{path} in the rootfs: /{rel}: {os.strerror(e.errno)}") from None
    else:
        raise NvhookError(f"{path} in the rootfs: /{rel} keeps changing")
    try:
        if native.fstatfs_type(dfd) in (native.PROC_SUPER_MAGIC, native.SYSFS_MAGIC):
            raise NvhookError(f"{path} in the rootfs leads to procfs/sysfs; refusing")
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return False, None
        if not stat.S_ISLNK(st.st_mode):
            return True, None
        return True, os.readlink(name, dir_fd=dfd)
    except OSError as e:
        raise NvhookError(f"{path} in the rootfs: {os.strerror(e.errno)}") from None
    finally:
        os.close(dfd)
