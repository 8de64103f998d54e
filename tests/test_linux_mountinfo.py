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
