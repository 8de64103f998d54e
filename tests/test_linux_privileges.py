"""libinject.linux.privileges: drop_all() leaves nothing (the NVML child's privileges)."""
from __future__ import annotations

import os
import pickle

from libinject.linux import privileges
from libinject.linux.child import Child, collect


def _in_child(fn, *args):
    """fn(*args) in a forked child (what it drops stays dropped there); its result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.write(w, pickle.dumps(fn(*args)))
        finally:
            os._exit(0)
    os.close(w)
    with Child(pid) as c:
        code, (data,) = collect(c, [r], 30)
    os.close(r)
    assert code == 0
    return pickle.loads(data)


def _status_after(user):
    privileges.drop_all(user)
    with open("/proc/self/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def test_drop_all_as_root():
    st = _in_child(_status_after, None)
    for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(st[k], 16) == 0, k
    assert st["NoNewPrivs"].strip() == "1"
    assert st["Uid"].split()[:3] == ["0", "0", "0"]


def test_drop_all_to_a_user():
    st = _in_child(_status_after, (65534, 65534))
    assert st["Uid"].split()[:3] == ["65534"] * 3 and st["Gid"].split()[:3] == ["65534"] * 3
    assert st["Groups"].strip() == ""
    for k in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(st[k], 16) == 0, k
    assert st["NoNewPrivs"].strip() == "1"


def test_cap_last_cap_is_the_kernels():
    with open("/proc/sys/kernel/cap_last_cap") as f:
        assert privileges.cap_last_cap() == int(f.read())
