"""libinject.linux.mountinfo: /proc/PID/mountinfo parsed once, for everyone."""
from __future__ import annotations

import os

from libinject.linux import mountinfo
from libinject.linux.proc import proc_fd

TEXT = """\
22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime shared:9 master:3 - cgroup cgroup rw,devices
50 23 0:33 /kube/pod\\0401 /mnt/my\\040cg\\134x rw - cgroup none\\040here rw,devices,freezer
not a mountinfo line
51 50 0:34 / /x rw - tmpfs
"""


def test_parse():
    ms = mountinfo.parse(TEXT)
    assert [m.id for m in ms] == [22, 36, 50]          # the broken lines are skipped
    proc, dev, odd = ms
    assert (proc.parent, proc.dev, proc.root, proc.mountpoint) == (1, "0:21", "/", "/proc")
    assert proc.options == {"rw", "nosuid", "nodev", "noexec", "relatime"}
    assert (proc.optional, proc.fstype, proc.source) == (("shared:12",), "proc", "proc")
    assert dev.optional == ("shared:9", "master:3") and dev.super_options == {"rw", "devices"}
    assert (odd.root, odd.mountpoint, odd.source) == ("/kube/pod 1", "/mnt/my cg\\x", "none here")
    assert odd.optional == ()


def test_read_self_and_through_a_proc_fd():
    mine = mountinfo.read()
    assert any(m.mountpoint == "/" for m in mine)
    assert any(m.mountpoint == "/proc" and m.fstype == "proc" for m in mine)
    assert mountinfo.read(os.getpid(), proc_fd=proc_fd()) == mountinfo.read(os.getpid())


def test_table_parses_lazily_by_id():
    t = mountinfo.Table(TEXT)
    assert len(t) == 4                  # lines that start with an id ("51": broken later)
    assert t._parsed == {}              # nothing parsed until asked
    assert t.get(36) == mountinfo.parse(TEXT)[1]
    assert list(t._parsed) == [36]
    assert t.get(51) is None and 51 not in t      # an id, but not a well-formed line
    assert t.get(99) is None and 99 not in t and 22 in t
    assert mountinfo.Table("").get(1) is None
    assert mountinfo.Table("x 1 0:1 / / rw - tmpfs t rw\n²1 1 0:1 / / rw - tmpfs t rw\n")._lines == {}


def test_table_of_self():
    t = mountinfo.table(proc_fd=proc_fd())
    mine = mountinfo.read()
    assert len(t) == len(mine)
    assert all(t.get(m.id) == m for m in mine)


def test_parse_only_some_fstypes():
    assert [m.id for m in mountinfo.parse(TEXT, {"cgroup"})] == [36, 50]
    assert [m.id for m in mountinfo.parse(TEXT, {"proc", "tmpfs"})] == [22]   # 51: broken
    assert [m.id for m in mountinfo.parse(TEXT, {"cgroup", "proc"})] == [22, 36, 50]  # in order
    assert mountinfo.parse(TEXT.rstrip("\n"), {"tmpfs"}) == []     # last line, no newline
    assert mountinfo.parse(TEXT, set()) == []
    # " - " can only be the separator: a path's spaces are \040
    assert mountinfo._fstype("1 2 0:1 / /a\\040-\\040b rw - ext4 /dev/x rw") == "ext4"
    mine = mountinfo.read()
    assert mountinfo.read(fstypes={"proc"}) == [m for m in mine if m.fstype == "proc"]
