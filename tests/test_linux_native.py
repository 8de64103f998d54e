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
