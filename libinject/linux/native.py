"""The only module that touches cffi's ffi: thin, typed wrappers over csrc/native.c.

Every wrapper raises OSError(errno) on failure, like the os module does.
"""
from __future__ import annotations

import os
from typing import Sequence

from libinject.linux._native import ffi, lib  # type: ignore[import-not-found]

# mount(2) flags
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_MOVE = 0x2000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_SLAVE = 1 << 19
MS_SHARED = 1 << 20
MNT_DETACH = 0x2
# setns/unshare
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
# openat2 resolve flags
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10
# open_tree / move_mount / mount_setattr
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
AT_SYMLINK_NOFOLLOW = 0x100
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOVE_MOUNT_T_EMPTY_PATH = 0x40
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8
# bpf
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
BPF_F_ALLOW_OVERRIDE = 1
BPF_F_ALLOW_MULTI = 2
BPF_F_REPLACE = 4


def _check(ret: int, what: str, path: str | None = None) -> int:
    if ret < 0:
        err = -ret
        if path is not None:
            raise OSError(err, f"{what}: {os.strerror(err)}", path)
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def _c(s: str | None):
    return ffi.NULL if s is None else s.encode()


def mount(source: str | None, target: str, fstype: str | None = None, flags: int = 0,
          data: str | None = None) -> None:
    _check(lib.nv_mount(_c(source), target.encode(), _c(fstype), flags, _c(data)), "mount", target)


def umount2(target: str, flags: int = 0) -> None:
    _check(lib.nv_umount2(target.encode(), flags), "umount2", target)


def setns(fd: int, nstype: int = 0) -> None:
    _check(lib.nv_setns(fd, nstype), "setns")


def unshare(flags: int) -> None:
    _check(lib.nv_unshare(flags), "unshare")


def pivot_root(new_root: str, put_old: str) -> None:
    _check(lib.nv_pivot_root(new_root.encode(), put_old.encode()), "pivot_root", new_root)


def openat2(dirfd: int, path: str, flags: int, mode: int = 0, resolve: int = 0) -> int:
    return _check(lib.nv_openat2(dirfd, path.encode(), flags, mode, resolve), "openat2", path)


def open_tree(dirfd: int, path: str, flags: int) -> int:
    return _check(lib.nv_open_tree(dirfd, path.encode(), flags), "open_tree", path)


def move_mount(from_dirfd: int, from_path: str, to_dirfd: int, to_path: str, flags: int) -> None:
    _check(lib.nv_move_mount(from_dirfd, from_path.encode(), to_dirfd, to_path.encode(), flags),
           "move_mount", to_path)


def mount_setattr(dirfd: int, path: str, flags: int, attr_set: int, attr_clr: int = 0,
                  propagation: int = 0) -> None:
    _check(lib.nv_mount_setattr(dirfd, path.encode(), flags, attr_set, attr_clr, propagation),
           "mount_setattr", path)


# fsopen / fsconfig / fsmount (new mount API) and statfs magic numbers
FSOPEN_CLOEXEC = 0x1
FSCONFIG_SET_FLAG = 0
FSCONFIG_SET_STRING = 1
FSCONFIG_CMD_CREATE = 6
FSMOUNT_CLOEXEC = 0x1
PROC_SUPER_MAGIC = 0x9FA0
SYSFS_MAGIC = 0x62656572
TMPFS_MAGIC = 0x01021994


def fsopen(fsname: str, flags: int = FSOPEN_CLOEXEC) -> int:
    return _check(lib.nv_fsopen(fsname.encode(), flags), "fsopen", fsname)


def fsconfig(fd: int, cmd: int, key: str | None = None, value: str | None = None,
             aux: int = 0) -> None:
    _check(lib.nv_fsconfig(fd, cmd, _c(key), _c(value), aux), "fsconfig", key)


def fsmount(fd: int, flags: int = FSMOUNT_CLOEXEC, attr_flags: int = 0) -> int:
    return _check(lib.nv_fsmount(fd, flags, attr_flags), "fsmount")


def fstatfs_type(fd: int) -> int:
    """statfs(2) f_type of the filesystem holding fd (works on O_PATH fds)."""
    return _check(lib.nv_fstatfs_type(fd), "fstatfs")


def bpf_prog_load(prog_type: int, insns: bytes, license: str = "GPL") -> int:
    """Load a program from raw 8-byte instructions; the verifier log is in the error."""
    buf = ffi.new("char[]", insns)
    lic = ffi.new("char[]", license.encode())
    # No log on the first try: a log that overflows fails the load itself (ENOSPC),
    # which happens for programs of a few hundred device rules.
    r = lib.nv_bpf_prog_load(prog_type, buf, len(insns) // 8, lic, ffi.NULL, 0)
    if r >= 0:
        return r
    log = ffi.new("char[]", 65536)
    r2 = lib.nv_bpf_prog_load(prog_type, buf, len(insns) // 8, lic, log, 65536)
    if r2 >= 0:
        os.close(r2)
    # the verifier's complaint is the last line before its "processed N insns" summary
    msg = [ln for ln in ffi.string(log).decode(errors="replace").strip().splitlines()
           if not ln.startswith("processed ")]
    tail = f" ({msg[-1]})" if msg else ""
    raise OSError(-r, f"bpf prog load: {os.strerror(-r)}{tail}")


def bpf_prog_attach(target_fd: int, prog_fd: int, attach_type: int, flags: int = 0,
                    replace_fd: int = 0) -> None:
    _check(lib.nv_bpf_prog_attach(target_fd, prog_fd, attach_type, flags, replace_fd),
           "bpf prog attach")


def bpf_prog_detach(target_fd: int, prog_fd: int, attach_type: int) -> None:
    _check(lib.nv_bpf_prog_detach(target_fd, prog_fd, attach_type), "bpf prog detach")


def bpf_prog_query(target_fd: int, attach_type: int, max_progs: int = 64) -> tuple[list[int], int]:
    """Program ids attached to a cgroup, and the attach flags."""
    ids = ffi.new("unsigned int[]", max_progs)
    cnt = ffi.new("unsigned int *", max_progs)
    flags = ffi.new("unsigned int *", 0)
    _check(lib.nv_bpf_prog_query(target_fd, attach_type, ids, cnt, flags), "bpf prog query")
    return [ids[i] for i in range(cnt[0])], flags[0]


def bpf_prog_get_fd_by_id(prog_id: int) -> int:
    return _check(lib.nv_bpf_prog_get_fd_by_id(prog_id), "bpf prog get fd")


def bpf_prog_get_insns(prog_fd: int, capacity: int = 1 << 16) -> bytes:
    buf = ffi.new("char[]", capacity)
    n = _check(lib.nv_bpf_prog_get_insns(prog_fd, buf, capacity), "bpf prog info")
    if n > capacity:
        return bpf_prog_get_insns(prog_fd, n)
    return bytes(ffi.buffer(buf, n))


__all__: Sequence[str] = [n for n in dir() if not n.startswith("_")]
