"""libinject.linux.native's kernel constants come from the C headers (csrc/native.h's
`#define X ...`), and none is written by hand."""
from __future__ import annotations

import os
import re
from pathlib import Path

from libinject.linux import native
from libinject.linux._native import lib  # type: ignore[import-not-found]

HEADER = Path(__file__).resolve().parents[1] / "csrc/native.h"
DEFINED = re.findall(r"^#define (\w+) \.\.\.$", HEADER.read_text(), re.M)


def test_every_header_constant_is_exposed():
    assert len(DEFINED) == len(set(DEFINED)) > 50
    for name in DEFINED:
        assert getattr(native, name) == getattr(lib, name), name


def test_no_constant_of_its_own():
    # every upper-case int of the module is one of the header's
    own = [n for n, v in vars(native).items() if n.isupper() and isinstance(v, int)]
    assert sorted(own) == sorted(DEFINED)


def test_values_are_the_kernel_abi():
    # a few, against the os module where it has them, else the (stable) ABI numbers
    assert native.OPEN_TREE_CLOEXEC == os.O_CLOEXEC
    assert native.AT_SYMLINK_NOFOLLOW == 0x100 and native.AT_FDCWD == -100
    assert (native.MS_BIND, native.MS_REC, native.MS_PRIVATE) == (0x1000, 0x4000, 1 << 18)
    assert (native.MNT_DETACH, native.UMOUNT_NOFOLLOW) == (2, 8)
    assert native.CLONE_NEWNS == 0x20000 and native.CLONE_NEWPID == 0x20000000
    assert (native.RESOLVE_NO_SYMLINKS, native.RESOLVE_IN_ROOT) == (0x04, 0x10)
    assert native.MOVE_MOUNT_F_EMPTY_PATH == 4 and native.MOUNT_ATTR_NODEV == 4
    assert native.FSCONFIG_CMD_CREATE == 6 and native.PROC_SUPER_MAGIC == 0x9FA0
    assert (native.BPF_PROG_TYPE_CGROUP_DEVICE, native.BPF_CGROUP_DEVICE) == (15, 6)
    assert native.BPF_LDX | native.BPF_MEM | native.BPF_W == 0x61


def test_open_trees_opens_what_open_host_opens(tmp_path):
    """native.open_trees: the detached clone of each path that rootfs.open_host makes,
    in one call; any path it cannot take or open: None, nothing left open."""
    import stat

    from libinject.apply.rootfs import open_host

    (tmp_path / "d").mkdir()
    f = tmp_path / "d/file"
    f.write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "d")
    before = sorted(os.listdir("/proc/self/fd"))
    paths = [str(f), str(tmp_path / "d"), "/dev/null"]
    fds = native.open_trees(paths, [False, True, False])
    try:
        assert fds is not None and len(fds) == 3
        for fd, p in zip(fds, paths):
            tree, st = open_host(p)
            try:
                a, b = os.fstat(fd), os.fstat(tree)
                assert (a.st_dev, a.st_ino, a.st_mode, a.st_rdev) == (b.st_dev, b.st_ino, b.st_mode, b.st_rdev)
                assert (st.st_dev, st.st_ino) == (a.st_dev, a.st_ino)
                assert native.mount_id(fd)[1]           # the root of a mount of its own
            finally:
                os.close(tree)
        assert stat.S_ISCHR(os.fstat(fds[2]).st_mode)
    finally:
        for fd in fds or ():
            os.close(fd)
    for bad in ([str(f), str(tmp_path / "link/file")],      # a symlink on the way
                [str(f), str(tmp_path / "missing")],
                [str(f), "relative/path"],
                [str(f) + "\0x"],
                [str(f), "/proc/self/root/etc/passwd"]):    # a magic link on the way
        assert native.open_trees(bad, [False] * len(bad)) is None
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_mount_id_packs_id_and_root():
    fd = os.open("/", os.O_PATH)
    sub = os.open("/proc/self", os.O_PATH)
    try:
        mid, root = native.mount_id(fd)
        assert mid > 0 and root is True
        with open("/proc/self/fdinfo/%d" % fd) as fi:
            assert f"mnt_id:\t{mid}\n" in fi.read()
        assert native.mount_id(sub)[1] is False
    finally:
        os.close(fd)
        os.close(sub)
