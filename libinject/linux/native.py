"""The only module that touches cffi's ffi: thin, typed wrappers over csrc/native.c.

Every wrapper raises OSError(errno) on failure, like the os module does.
"""
from __future__ import annotations

import errno
import os

from libinject.linux._native import ffi, lib  # type: ignore[import-not-found]

# Kernel constants: the values of the C headers, compiled in by cffi (csrc/native.h
# declares each as `#define X ...`); never copied here by hand.
# mount(2), umount2(2)
MS_RDONLY: int = lib.MS_RDONLY
MS_NOSUID: int = lib.MS_NOSUID
MS_NODEV: int = lib.MS_NODEV
MS_NOEXEC: int = lib.MS_NOEXEC
MS_REMOUNT: int = lib.MS_REMOUNT
MS_BIND: int = lib.MS_BIND
MS_MOVE: int = lib.MS_MOVE
MS_REC: int = lib.MS_REC
MS_PRIVATE: int = lib.MS_PRIVATE
MS_SLAVE: int = lib.MS_SLAVE
MS_SHARED: int = lib.MS_SHARED
MNT_DETACH: int = lib.MNT_DETACH
UMOUNT_NOFOLLOW: int = lib.UMOUNT_NOFOLLOW
# setns(2), unshare(2)
CLONE_NEWNS: int = lib.CLONE_NEWNS
CLONE_NEWCGROUP: int = lib.CLONE_NEWCGROUP
CLONE_NEWUTS: int = lib.CLONE_NEWUTS
CLONE_NEWIPC: int = lib.CLONE_NEWIPC
CLONE_NEWUSER: int = lib.CLONE_NEWUSER
CLONE_NEWPID: int = lib.CLONE_NEWPID
CLONE_NEWNET: int = lib.CLONE_NEWNET
# openat2(2) resolve flags
RESOLVE_NO_XDEV: int = lib.RESOLVE_NO_XDEV
RESOLVE_NO_MAGICLINKS: int = lib.RESOLVE_NO_MAGICLINKS
RESOLVE_NO_SYMLINKS: int = lib.RESOLVE_NO_SYMLINKS
RESOLVE_BENEATH: int = lib.RESOLVE_BENEATH
RESOLVE_IN_ROOT: int = lib.RESOLVE_IN_ROOT
# *at() flags
AT_FDCWD: int = lib.AT_FDCWD
AT_EMPTY_PATH: int = lib.AT_EMPTY_PATH
AT_RECURSIVE: int = lib.AT_RECURSIVE
AT_SYMLINK_NOFOLLOW: int = lib.AT_SYMLINK_NOFOLLOW
# open_tree, move_mount, mount_setattr, fsopen/fsconfig/fsmount
OPEN_TREE_CLONE: int = lib.OPEN_TREE_CLONE
OPEN_TREE_CLOEXEC: int = lib.OPEN_TREE_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH: int = lib.MOVE_MOUNT_F_EMPTY_PATH
MOVE_MOUNT_T_EMPTY_PATH: int = lib.MOVE_MOUNT_T_EMPTY_PATH
MOUNT_ATTR_RDONLY: int = lib.MOUNT_ATTR_RDONLY
MOUNT_ATTR_NOSUID: int = lib.MOUNT_ATTR_NOSUID
MOUNT_ATTR_NODEV: int = lib.MOUNT_ATTR_NODEV
MOUNT_ATTR_NOEXEC: int = lib.MOUNT_ATTR_NOEXEC
FSOPEN_CLOEXEC: int = lib.FSOPEN_CLOEXEC
FSCONFIG_SET_FLAG: int = lib.FSCONFIG_SET_FLAG
FSCONFIG_SET_STRING: int = lib.FSCONFIG_SET_STRING
FSCONFIG_CMD_CREATE: int = lib.FSCONFIG_CMD_CREATE
FSMOUNT_CLOEXEC: int = lib.FSMOUNT_CLOEXEC
# statfs(2) f_type
PROC_SUPER_MAGIC: int = lib.PROC_SUPER_MAGIC
SYSFS_MAGIC: int = lib.SYSFS_MAGIC
TMPFS_MAGIC: int = lib.TMPFS_MAGIC
# bpf(2)
BPF_PROG_TYPE_CGROUP_DEVICE: int = lib.BPF_PROG_TYPE_CGROUP_DEVICE
BPF_CGROUP_DEVICE: int = lib.BPF_CGROUP_DEVICE
BPF_F_ALLOW_OVERRIDE: int = lib.BPF_F_ALLOW_OVERRIDE
BPF_F_ALLOW_MULTI: int = lib.BPF_F_ALLOW_MULTI
BPF_F_REPLACE: int = lib.BPF_F_REPLACE
BPF_DEVCG_DEV_BLOCK: int = lib.BPF_DEVCG_DEV_BLOCK
BPF_DEVCG_DEV_CHAR: int = lib.BPF_DEVCG_DEV_CHAR
BPF_DEVCG_ACC_MKNOD: int = lib.BPF_DEVCG_ACC_MKNOD
BPF_DEVCG_ACC_READ: int = lib.BPF_DEVCG_ACC_READ
BPF_DEVCG_ACC_WRITE: int = lib.BPF_DEVCG_ACC_WRITE
BPF_LD: int = lib.BPF_LD
BPF_LDX: int = lib.BPF_LDX
BPF_ALU: int = lib.BPF_ALU
BPF_JMP: int = lib.BPF_JMP
BPF_JMP32: int = lib.BPF_JMP32
BPF_W: int = lib.BPF_W
BPF_DW: int = lib.BPF_DW
BPF_IMM: int = lib.BPF_IMM
BPF_MEM: int = lib.BPF_MEM
BPF_K: int = lib.BPF_K
BPF_X: int = lib.BPF_X
BPF_AND: int = lib.BPF_AND
BPF_RSH: int = lib.BPF_RSH
BPF_MOV: int = lib.BPF_MOV
BPF_JNE: int = lib.BPF_JNE
BPF_CALL: int = lib.BPF_CALL
BPF_EXIT: int = lib.BPF_EXIT


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


def open_trees(paths: list[str], recursive: list[bool]) -> list[int] | None:
    """Detached clones (open_tree OPEN_TREE_CLONE, close-on-exec) of absolute host
    paths, each opened as libinject.apply.rootfs.open_host opens one (no symlink
    followed anywhere in the path), in one call; the fds in order. None when any path
    could not be opened, or is not one this call takes (relative, not UTF-8, a NUL in
    it): nothing is left open then, and the caller opens them one by one (to fail with
    what that says)."""
    packed = _pack(paths)
    if packed is None or not all(p.startswith("/") for p in paths):
        return None
    n = len(paths)
    fds = ffi.new("int[]", max(n, 1))
    done = lib.nv_open_trees(packed, n, bytes(map(bool, recursive)), fds)
    got = [fds[i] for i in range(done)]
    if done != n:
        for fd in got:
            os.close(fd)
        return None
    return got


def _pack(paths: list[str]) -> bytes | None:
    """Paths for a C call taking them NUL-terminated one after the other (None: one is
    not UTF-8, or holds a NUL)."""
    try:
        packed = b"".join([p.encode() + b"\0" for p in paths])
    except UnicodeEncodeError:
        return None
    return packed if packed.count(b"\0") == len(paths) else None


def move_mount(from_dirfd: int, from_path: str, to_dirfd: int, to_path: str, flags: int) -> None:
    _check(lib.nv_move_mount(from_dirfd, from_path.encode(), to_dirfd, to_path.encode(), flags),
           "move_mount", to_path)


def mount_setattr(dirfd: int, path: str, flags: int, attr_set: int, attr_clr: int = 0,
                  propagation: int = 0) -> None:
    _check(lib.nv_mount_setattr(dirfd, path.encode(), flags, attr_set, attr_clr, propagation),
           "mount_setattr", path)


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


def mount_id(fd: int) -> tuple[int, bool]:
    """(mount id as /proc/PID/mountinfo numbers it, whether fd is that mount's root)
    of the file fd refers to (O_PATH fds too; a symlink fd is not followed)."""
    got = _check(lib.nv_mount_id(fd), "statx")
    return got >> 1, bool(got & 1)


def birth_time(fd: int) -> int | None:
    """When the file fd refers to was made (statx STATX_BTIME, ns), or None where its
    file system does not say."""
    got = lib.nv_birth_time(fd)
    if got == -errno.ENOSYS or got == 0:    # (0: made by a tool that set none, e.g. mke2fs -d)
        return None
    return _check(got, "statx")


def address_of(buf) -> int:
    """The address of a writable buffer's memory (an mmap), for populate_write."""
    return int(ffi.cast("uintptr_t", ffi.from_buffer(buf)))


def populate_write(addr: int, length: int) -> int:
    """madvise(MADV_POPULATE_WRITE) over [addr, addr+length) of our own memory: 0, or the
    errno (EINVAL: a kernel before 5.14; ENOMEM: not mapped). Never raises: callers
    only lose a head start."""
    ret = lib.nv_populate_write(addr, length)
    return -ret if ret < 0 else 0


def join_session_keyring() -> int:
    """Join a new anonymous session keyring (keyctl KEYCTL_JOIN_SESSION_KEYRING, NULL):
    nothing keyed in the caller's session is reachable afterwards. Returns its id."""
    return _check(lib.nv_join_session_keyring(), "keyctl")


def seccomp_ldconfig() -> None:
    """Install the ldconfig sandbox's seccomp deny-list (csrc/native.c) on this thread
    and what it execs; needs no_new_privs set first."""
    _check(lib.nv_seccomp_ldconfig(), "seccomp")


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


__all__: list[str] = [n for n in dir() if not n.startswith("_")]
