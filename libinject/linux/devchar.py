"""/dev/char/MAJ:MIN links for NVIDIA's device nodes (`nvhook system
create-dev-char-symlinks`, as `nvidia-ctk system create-dev-char-symlinks`).

Why: systemd re-applies a unit's DeviceAllow= rules on `systemctl daemon-reload`, naming
devices by /dev/char/MAJ:MIN; NVIDIA's nodes are made by the driver (or nvhook's
load-kmods), not udev, so they lack those links, systemd drops them from the rebuilt
device cgroup, and running containers get NVML "Unknown Error".

The links' dir is opened by fd, never through a link, and must be root's alone; a name
already there is left as it is.
"""
from __future__ import annotations

import os
import stat

from libinject.errors import NvhookError

NODE_PREFIXES = ("nvidia",)


def nodes(dev_root: str) -> list[tuple[str, int, int]]:
    """(path, major, minor) of NVIDIA's character nodes under dev_root/dev (and dev/nvidia-caps)."""
    out: list[tuple[str, int, int]] = []
    for sub in ("dev", "dev/nvidia-caps"):
        d = os.path.join(dev_root, sub)
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            if not name.startswith(NODE_PREFIXES):
                continue
            path = os.path.join(d, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode):
                out.append((os.path.normpath(path), os.major(st.st_rdev), os.minor(st.st_rdev)))
    return out


def _open_chardir(path: str, create: bool) -> int:
    parent, name = os.path.split(os.path.normpath(path))
    pfd = os.open(parent or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd = os.open(name, flags, dir_fd=pfd)
        except FileNotFoundError:
            if not create:
                raise NvhookError(f"{path}: no such directory") from None
            os.mkdir(name, 0o755, dir_fd=pfd)
            fd = os.open(name, flags, dir_fd=pfd)
        except OSError as e:
            raise NvhookError(f"{path}: not a directory (a link is not followed): {e.strerror}") from None
    finally:
        os.close(pfd)
    st = os.fstat(fd)
    if st.st_uid != 0 or st.st_mode & 0o022:
        os.close(fd)
        raise NvhookError(f"{path}: owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}: "
                          "not root's alone, no link is made there")
    return fd


def create_links(node_list: list[tuple[str, int, int]], dev_char: str = "/dev/char",
                 dry_run: bool = False) -> list[tuple[str, str]]:
    """Make dev_char/MAJ:MIN -> node for each node lacking one; (link, target) made."""
    todo = []
    if dry_run:
        for node, major, minor in node_list:
            link = os.path.join(dev_char, f"{major}:{minor}")
            if not os.path.lexists(link):
                todo.append((link, node))
        return todo
    fd = _open_chardir(dev_char, create=True)
    try:
        for node, major, minor in node_list:
            name = f"{major}:{minor}"
            try:
                os.symlink(node, name, dir_fd=fd)
            except FileExistsError:
                continue
            todo.append((os.path.join(dev_char, name), node))
    finally:
        os.close(fd)
    return todo
