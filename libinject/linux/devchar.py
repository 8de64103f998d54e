"""/dev/char/MAJ:MIN links for NVIDIA's device nodes (`nvhook system
create-dev-char-symlinks`, as `nvidia-ctk system create-dev-char-symlinks`).

Why: systemd re-applies a unit's DeviceAllow= rules on `systemctl daemon-reload`, naming
devices by /dev/char/MAJ:MIN; NVIDIA's nodes are made by the driver (or nvhook's
load-kmods), not udev, so they lack those links, systemd drops them from the rebuilt
device cgroup, and running containers get NVML "Unknown Error".

The links' dir, and the dirs of the nodes they name, are opened by fd, never through a
link, and must be root's alone; a name already there is left as it is.
"""
from __future__ import annotations

import os
import stat

from libinject.linux import safedir

NODE_PREFIXES = ("nvidia",)


def nodes(dev_root: str) -> list[tuple[str, int, int]]:
    """(path, major, minor) of NVIDIA's character nodes under dev_root/dev (and dev/nvidia-caps).

    A link names its node by path, and systemd resolves it to whatever device is there
    when it re-applies DeviceAllow=: so nodes are listed only in dirs reached by fd without
    a link and root's alone (anyone who could write there could swap in another device)."""
    out: list[tuple[str, int, int]] = []
    root = os.open(dev_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)   # trusted (driver root)
    try:
        dev = _open_nodedir(root, "dev", os.path.join(dev_root, "dev"))
        if dev is None:
            return out
        try:
            caps = _open_nodedir(dev, "nvidia-caps", os.path.join(dev_root, "dev/nvidia-caps"))
            for sub, dfd in (("dev", dev), ("dev/nvidia-caps", caps)):
                if dfd is None:
                    continue
                for name in sorted(os.listdir(dfd)):
                    if not name.startswith(NODE_PREFIXES):
                        continue
                    try:
                        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISCHR(st.st_mode):
                        out.append((os.path.normpath(os.path.join(dev_root, sub, name)),
                                    os.major(st.st_rdev), os.minor(st.st_rdev)))
            if caps is not None:
                os.close(caps)
        finally:
            os.close(dev)
    finally:
        os.close(root)
    return out


def _open_nodedir(parent: int, name: str, path: str) -> int | None:
    """A dir of device nodes by fd (None: there is none), never through a link, root's alone."""
    return safedir.open_root_subdir(parent, name, path, missing_ok=True,
                                    refusal="no link is made to a node there")


def _open_chardir(path: str, create: bool) -> int:
    parent, name = os.path.split(os.path.normpath(path))
    pfd = os.open(parent or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = safedir.open_root_subdir(pfd, name, path, create=create, refusal="no link is made there")
    finally:
        os.close(pfd)
    assert fd is not None
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
