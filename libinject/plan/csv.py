"""The runtime shim's csv mode: host files listed in host-files-for-container.d.

NVIDIA's csv mode (Tegra/Jetson, where there is no NVML) reads every *.csv file in
the mount-spec dir ([nvidia-container-runtime] modes.csv.mount-spec-path); each line
is `KIND, PATH` with KIND one of
    dev  a device node        -> device node (bind of the host node) + cgroup rule
    lib  a library            -> read-only bind mount at the same path
    sym  a symlink            -> the same symlink in the container (its host target)
    dir  a directory          -> read-only bind mount at the same path
PATH is a host path under the driver root and the same path in the container. Blank
lines and `#` comments are skipped; a missing file is skipped (as NVIDIA does); an
unknown kind is an error. The result is planner-style ContainerEdits, applied to the
OCI spec like any other edits (libinject.apply.spec), with the library dirs handed to
the update-ldcache hook.
"""
from __future__ import annotations

import os
import posixpath
import stat

from libinject.plan.edits import ContainerEdits, DeviceEdit, MountEdit, SymlinkEdit
from libinject.errors import NvhookError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable

KINDS = ("dev", "lib", "sym", "dir")
RO = ("ro", "nosuid", "nodev", "bind")
DIR_RO = ("ro", "nosuid", "nodev", "rbind")


def parse(text: str, source: str = "<csv>") -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        kind, sep, path = line.partition(",")
        kind, path = kind.strip().lower(), path.strip()
        if not sep or kind not in KINDS:
            raise NvhookError(f"{source}:{n}: expected 'dev|lib|sym|dir, PATH', got {raw.strip()!r}")
        if not posixpath.isabs(path):
            raise NvhookError(f"{source}:{n}: {path!r} is not an absolute path")
        out.append((kind, posixpath.normpath(path)))
    return out


def read_dir(spec_dir: str) -> list[tuple[str, str]]:
    """Entries of every *.csv in spec_dir, files in name order."""
    try:
        names = sorted(n for n in os.listdir(spec_dir) if n.endswith(".csv"))
    except FileNotFoundError:
        raise NvhookError(f"csv mode: mount spec dir {spec_dir} does not exist") from None
    except OSError as e:
        raise NvhookError(f"csv mode: {spec_dir}: {e.strerror}") from None
    out: list[tuple[str, str]] = []
    for n in names:
        path = os.path.join(spec_dir, n)
        try:
            with open(path, encoding="utf-8") as f:
                out += parse(f.read(), path)
        except OSError as e:
            raise NvhookError(f"csv mode: {path}: {e.strerror}") from None
    return out


def edits(entries: Iterable[tuple[str, str]], root: str = "/",
          lib_dirs_ldconfig: bool = True) -> ContainerEdits:
    """ContainerEdits for csv entries; host paths are `root` + PATH."""
    devices: list[DeviceEdit] = []
    mounts: list[MountEdit] = []
    links: list[SymlinkEdit] = []
    folders: list[str] = []
    for kind, path in dict.fromkeys(entries):
        host = os.path.join(root, path.lstrip("/"))
        try:
            st = os.lstat(host)
        except FileNotFoundError:
            continue          # as NVIDIA: entries for other board variants are skipped
        except OSError as e:
            raise NvhookError(f"csv mode: {host}: {e.strerror}") from None
        if kind == "dev":
            if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
                raise NvhookError(f"csv mode: {host} is not a device node")
            devices.append(DeviceEdit(path=path, host_path=host, major=os.major(st.st_rdev),
                                      minor=os.minor(st.st_rdev), kind="control",
                                      type="b" if stat.S_ISBLK(st.st_mode) else "c"))
        elif kind == "sym":
            if not stat.S_ISLNK(st.st_mode):
                raise NvhookError(f"csv mode: {host} is not a symlink")
            links.append(SymlinkEdit(target=os.readlink(host), link=path))
        elif kind == "lib":
            if stat.S_ISLNK(st.st_mode):
                # a library listed by its link name: mount the file, recreate the link
                real = os.path.realpath(host)
                rel = "/" + os.path.relpath(real, root).lstrip("/") if root != "/" else real
                links.append(SymlinkEdit(target=os.readlink(host), link=path))
                mounts.append(MountEdit(real, rel, "library", RO))
                d = posixpath.dirname(rel)
            else:
                mounts.append(MountEdit(host, path, "library", RO))
                d = posixpath.dirname(path)
            if ".so" in posixpath.basename(path) and d not in folders:
                folders.append(d)
        else:  # dir
            if not stat.S_ISDIR(st.st_mode):
                raise NvhookError(f"csv mode: {host} is not a directory")
            mounts.append(MountEdit(host, path, "binary", DIR_RO))
    mounts = list(dict.fromkeys(mounts))
    from libinject.plan.edits import CgroupRule

    return ContainerEdits(
        device_nodes=tuple(devices), mounts=tuple(mounts), symlinks=tuple(dict.fromkeys(links)),
        ldconfig_folders=tuple(folders) if lib_dirs_ldconfig else (),
        cgroup_rules=tuple(CgroupRule(d.major, d.minor, d.type, d.permissions) for d in devices))
