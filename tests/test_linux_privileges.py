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


# -- limit_capabilities: only the drops still to do, the same end state ------------------

def _bounding(path: str = "/proc/thread-self/status") -> dict[str, int]:
    with open(path) as f:
        return {k: int(v, 16) for k, v in (line.rstrip("\n").split(":\t", 1) for line in f
                                           if line.startswith("Cap"))}


def _mask(caps) -> int:
    return sum(1 << c for c in caps)


def _counting_prctl():
    """Wraps _prctl.prctl (in this child only): the list its PR_CAPBSET_DROP calls go to."""
    import _prctl

    drops: list[int] = []
    real = _prctl.prctl

    def prctl(option, *args):
        if option == _prctl.PR_CAPBSET_DROP:
            drops.append(args[0])
        return real(option, *args)

    _prctl.prctl = prctl
    return drops


def _limit_twice():
    import _prctl

    wide = {_prctl.CAP_SYS_ADMIN, _prctl.CAP_CHOWN, _prctl.CAP_SETPCAP, _prctl.CAP_SYS_PTRACE}
    narrow = wide - {_prctl.CAP_SYS_PTRACE}
    drops = _counting_prctl()
    before = _bounding()["CapBnd"]
    privileges.limit_capabilities(wide)          # the served worker's set-up
    first = (len(drops), bin(before & ~_mask(wide)).count("1"))
    drops.clear()
    privileges.limit_capabilities(narrow)        # the applier's, in the same process
    second = list(drops)
    drops.clear()
    privileges.limit_capabilities(narrow)        # nothing left to drop
    return first, second, list(drops), _bounding(), _mask(narrow), _prctl.CAP_SYS_PTRACE


def test_limit_capabilities_again_drops_only_what_is_left():
    """A second limit_capabilities() in the same thread (a served worker limits itself
    at set-up, the applier again) makes one prctl per capability still in the bounding
    set, not one per capability; the sets end the same as after a single call."""
    first, second, third, caps, want, ptrace = _in_child(_limit_twice)
    assert first[0] == first[1]     # one drop per capability the bounding set still had
    assert (second, third) == ([ptrace], [])
    assert caps["CapBnd"] == caps["CapEff"] == caps["CapPrm"] == want
    assert caps["CapInh"] == caps["CapAmb"] == 0


def _limit_in_thread_then_here():
    import threading

    import _prctl

    keep = {_prctl.CAP_SYS_ADMIN, _prctl.CAP_SETPCAP}
    t = threading.Thread(target=privileges.limit_capabilities, args=(keep,))
    t.start()
    t.join()
    here_before = _bounding()["CapBnd"]           # another thread's drops are not ours
    drops = _counting_prctl()
    privileges.limit_capabilities(keep)
    return here_before, (len(drops), bin(here_before & ~_mask(keep)).count("1")), \
        _bounding()["CapBnd"], _mask(keep)


def test_another_thread_drops_for_itself():
    """The bounding set is per thread: what one thread dropped is not taken as dropped
    in another (it reads its own from the kernel and drops what it still has)."""
    before, (drops, had), after, want = _in_child(_limit_in_thread_then_here)
    assert before != want and after == want
    assert drops == had > 0


def _limit_then_fork():
    import _prctl

    keep = {_prctl.CAP_SYS_ADMIN, _prctl.CAP_SETPCAP}
    privileges.limit_capabilities(keep)

    def in_fork():
        drops = _counting_prctl()
        privileges.limit_capabilities(keep)
        return len(drops), _bounding()["CapBnd"], _mask(keep)

    return _in_child(in_fork)


def test_a_fork_drops_again_once():
    """A fork inherits its parent's bounding set, as the kernel reports: nothing left to
    drop, and the set is still what was kept."""
    drops, caps, want = _in_child(_limit_then_fork)
    assert drops == 0 and caps == want
