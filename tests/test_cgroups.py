"""allow_devices() on real runc containers: cgroup v1 (devices.allow) and cgroup v2 (runc's
eBPF device program, in a private namespace). No driver behind major 195 here, so an
open that the cgroup lets through fails with ENXIO and one it blocks with EPERM."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from libinject.apply import bpf as bd
from libinject.linux import mountinfo
from libinject.linux import native as n
from libinject.apply.cgroups import (allow_devices, cgroup_mounts,
                                     find_cgroup_dirs, proc_cgroups, v1_hierarchy)
from libinject.plan.edits import CgroupRule
from libinject.errors import NvhookError
from support.runc import RuncContainer, RuncError

GPUS = [("/dev/nvidia0", 195, 0), ("/dev/nvidia1", 195, 1)]


def attached(c: RuncContainer) -> list[int]:
    fd = os.open(c.cgroup_dir(), os.O_RDONLY | os.O_DIRECTORY)
    try:
        return n.bpf_prog_query(fd, n.BPF_CGROUP_DEVICE)[0]
    finally:
        os.close(fd)


def attach_extra(c: RuncContainer, prog: bytes) -> None:
    """Attach one more device program next to runc's, as another runtime layer might."""
    cg = os.open(c.cgroup_dir(), os.O_RDONLY | os.O_DIRECTORY)
    pfd = n.bpf_prog_load(n.BPF_PROG_TYPE_CGROUP_DEVICE, prog)
    try:
        n.bpf_prog_attach(cg, pfd, n.BPF_CGROUP_DEVICE, n.BPF_F_ALLOW_MULTI)
    finally:
        os.close(pfd)
        os.close(cg)


@pytest.fixture(params=["v1", "v2"])
def gpu_container(request, tmp_path):
    with RuncContainer(tmp_path, mode=request.param, devices=GPUS) as c:
        c.create()
        c.start()
        yield c


def test_allow_then_undo(gpu_container):
    c = gpu_container
    assert c.open_result("/dev/nvidia0") == "EPERM"
    assert c.open_result("/dev/nvidia1") == "EPERM"
    before = attached(c)
    undo = allow_devices(c.pid, [CgroupRule(195, 1)])
    assert c.open_result("/dev/nvidia1") == "ENXIO"
    assert c.open_result("/dev/nvidia0") == "EPERM"
    assert c.open_result("/dev/null") == "OK"          # runc's own rules still hold
    if c.mode == "v1":
        assert undo.v1_dir and undo.v2_dir is None
        assert "c 195:1 rw" in (c.cgroup_dir("devices") / "devices.list").read_text()
    else:
        assert undo.v1_dir is None and undo.v2_programs == 1
        assert len(attached(c)) == 1 and attached(c) != before
    undo()
    assert c.open_result("/dev/nvidia1") == "EPERM"
    assert c.open_result("/dev/nvidia0") == "EPERM"
    assert c.open_result("/dev/null") == "OK"
    assert attached(c) == before


def test_allow_several_rules(gpu_container):
    c = gpu_container
    undo = allow_devices(c.pid, [CgroupRule(195, 0), CgroupRule(195, 1, access="r")])
    assert c.open_result("/dev/nvidia0") == "ENXIO"
    assert c.open_result("/dev/nvidia1") == "ENXIO"    # dd opens for reading
    # write access to nvidia1 was not granted
    r = c.exec("sh", "-c", "echo x > /dev/nvidia1")
    assert "Operation not permitted" in r.stderr
    undo.release()                                   # keep the change
    assert c.open_result("/dev/nvidia0") == "ENXIO"


@contextlib.contextmanager
def _v1_container_allowing(tmp_path: Path, minor: int, access: str):
    """A started cgroup v1 container whose own device rules allow c 195:minor `access`."""
    allow = [{"allow": True, "type": "c", "major": 195, "minor": minor, "access": access}]
    with RuncContainer(tmp_path, devices=GPUS, allow=allow) as c:
        c.create()
        c.start()
        yield c


def test_v1_undo_keeps_access_the_container_had(tmp_path):
    with _v1_container_allowing(tmp_path, 0, "rw") as c:
        assert c.open_result("/dev/nvidia0") == "ENXIO"
        undo = allow_devices(c.pid, [CgroupRule(195, 0), CgroupRule(1, 3)])
        assert undo.steps == []                      # nothing to add, nothing to take back
        undo()
        assert c.open_result("/dev/nvidia0") == "ENXIO"
        assert c.open_result("/dev/null") == "OK"


def test_v1_undo_takes_back_only_what_it_added(tmp_path):
    with _v1_container_allowing(tmp_path, 1, "r") as c:
        write = ["sh", "-c", "echo x > /dev/nvidia1"]
        assert "Operation not permitted" in c.exec(*write).stderr
        undo = allow_devices(c.pid, [CgroupRule(195, 1, access="rw")])
        assert "No such device or address" in c.exec(*write).stderr
        undo()
        assert "Operation not permitted" in c.exec(*write).stderr
        assert c.open_result("/dev/nvidia1") == "ENXIO"      # reading is still allowed


def test_v2_several_programs(tmp_path):
    with RuncContainer(tmp_path, mode="v2", devices=GPUS) as c:
        c.create()
        c.start()
        # a second program (a copy of runc's) also denies 195:*: both must be extended
        fd = n.bpf_prog_get_fd_by_id(attached(c)[0])
        try:
            attach_extra(c, n.bpf_prog_get_insns(fd))
        finally:
            os.close(fd)
        before = attached(c)
        assert len(before) == 2
        undo = allow_devices(c.pid, [CgroupRule(195, 1)])
        assert undo.v2_programs == 2
        assert len(attached(c)) == 2 and not set(attached(c)) & set(before)
        assert c.open_result("/dev/nvidia1") == "ENXIO"
        assert c.open_result("/dev/nvidia0") == "EPERM"
        undo()
        assert sorted(attached(c)) == sorted(before)
        assert c.open_result("/dev/nvidia1") == "EPERM"


def test_v2_many_rules(tmp_path):
    # hundreds of rules: a verifier log would overflow and fail the load (ENOSPC)
    with RuncContainer(tmp_path, mode="v2", devices=GPUS) as c:
        c.create()
        c.start()
        undo = allow_devices(c.pid, [CgroupRule(195, m) for m in range(1, 600)])
        assert c.open_result("/dev/nvidia1") == "ENXIO"
        assert c.open_result("/dev/nvidia0") == "EPERM"
        undo()
        assert c.open_result("/dev/nvidia1") == "EPERM"


def _program_with_helper_call(rules: list[bd.DevRule]) -> bytes:
    # r6 = r1; call get_current_uid_gid; r1 = r6; then a normal program. The kernel's
    # translated copy of a call cannot be loaded again.
    save = bd.insn(0xbf, 6, 1)
    call = bd.insn(0x85, imm=15)
    restore = bd.insn(0xbf, 1, 6)
    return save + call + restore + bd.program_from_rules(rules)


def test_v2_unreusable_program_needs_oci_rules(tmp_path):
    with RuncContainer(tmp_path, mode="v2", devices=GPUS) as c:
        c.create()
        c.start()
        oci = c.config["linux"]["resources"]["devices"]
        attach_extra(c, _program_with_helper_call(bd.rules_from_oci(oci) +
                                                  list(bd.DEFAULT_ALLOWED)))
        before = attached(c)
        with pytest.raises(NvhookError, match="calls helpers"):
            allow_devices(c.pid, [CgroupRule(195, 1)])
        assert attached(c) == before                 # all or nothing
        assert c.open_result("/dev/nvidia1") == "EPERM"
        undo = allow_devices(c.pid, [CgroupRule(195, 1)], oci_devices=oci)
        assert c.open_result("/dev/nvidia1") == "ENXIO"
        assert c.open_result("/dev/nvidia0") == "EPERM"
        assert c.open_result("/dev/null") == "OK"
        undo()
        assert attached(c) == before
        assert c.open_result("/dev/nvidia1") == "EPERM"


@pytest.mark.parametrize("mode", ["v1", "v2"])
def test_from_prestart_hook(tmp_path, mode):
    """As the OCI hook will: allow_devices at prestart, from the runtime's namespaces."""
    hook = tmp_path / "hook.py"
    hook.write_text(textwrap.dedent("""\
        import json, sys
        from libinject.apply.cgroups import allow_devices
        from libinject.plan.edits import CgroupRule
        pid = json.load(sys.stdin)["pid"]
        allow_devices(pid, [CgroupRule(195, 1)]).release()
        """))
    hooks = {"prestart": [{"path": sys.executable, "args": [sys.executable, "-I", str(hook)],
                           "env": [], "timeout": 20}]}
    with RuncContainer(tmp_path, mode=mode, devices=GPUS, hooks=hooks) as c:
        c.create()
        c.start()
        assert c.open_result("/dev/nvidia1") == "ENXIO"
        assert c.open_result("/dev/nvidia0") == "EPERM"


def test_bad_input_changes_nothing(gpu_container):
    c = gpu_container
    before = attached(c)
    with pytest.raises(NvhookError, match="bad cgroup rule"):
        allow_devices(c.pid, [CgroupRule(195, 1), CgroupRule(195, 0, access="x")])
    with pytest.raises(NvhookError, match="bad cgroup rule"):
        allow_devices(c.pid, [CgroupRule(195, 1, type="a")])
    assert attached(c) == before
    assert c.open_result("/dev/nvidia1") == "EPERM"
    assert allow_devices(c.pid, []).steps == []


def test_no_such_process():
    with pytest.raises(NvhookError, match="no such process"):
        allow_devices(2**22 + 7, [CgroupRule(195, 1)])


# -- our own cgroup: a private mount of the v1 devices hierarchy -------------------------
DEVICES_V1 = Path("/sys/fs/cgroup/devices")


@contextlib.contextmanager
def _restricted_v1_cgroup(name: str):
    """A new v1 devices cgroup that allows nothing but /dev/null; removed afterwards
    (its processes moved back to the root first)."""
    d = DEVICES_V1 / f"{name}-{os.getpid()}-{os.urandom(3).hex()}"
    d.mkdir()
    try:
        (d / "devices.deny").write_text("a")
        (d / "devices.allow").write_text("c 1:3 rwm")
        yield d
    finally:
        for pid in (d / "cgroup.procs").read_text().split():
            try:
                (DEVICES_V1 / "cgroup.procs").write_text(pid)
            except OSError:
                pass                      # exited meanwhile
        d.rmdir()


OWN_CGROUP_CHILD = textwrap.dedent("""\
    import errno, os, sys
    from libinject.apply.cgroups import allow_devices
    from libinject.plan.edits import CgroupRule
    cg, nodes = sys.argv[1], sys.argv[2]
    with open(cg + "/cgroup.procs", "w") as f:     # into the restricted cgroup
        f.write(str(os.getpid()))
    def probe(name):
        try:
            os.close(os.open(f"{nodes}/{name}", os.O_RDONLY))
            return "OK"
        except OSError as e:
            return errno.errorcode[e.errno]
    mounts = open("/proc/self/mountinfo").read()
    print(probe("n0"), probe("n1"))
    undo = allow_devices(int(os.readlink("/proc/self")), [CgroupRule(195, 1)])
    print(probe("n0"), probe("n1"), undo.v1_dir)
    print("same mounts" if open("/proc/self/mountinfo").read() == mounts else "mounts changed")
    undo()
    print(probe("n0"), probe("n1"))
    """)


def test_own_cgroup_v1_through_private_mount(tmp_path):
    """allow_devices on this process's own cgroup (what a createContainer hook does) goes
    through a private mount of the devices hierarchy: the rule lands in the process's
    real cgroup, and the mount table it can see is the same afterwards."""
    for name, minor in (("n0", 0), ("n1", 1)):
        os.mknod(tmp_path / name, 0o600 | 0o020000, os.makedev(195, minor))
    with _restricted_v1_cgroup("nvh-own") as cg:
        r = subprocess.run([sys.executable, "-I", "-c", OWN_CGROUP_CHILD, str(cg), str(tmp_path)],
                           capture_output=True, text=True, timeout=60)
        lines = r.stdout.splitlines()
        assert lines == ["EPERM EPERM", f"EPERM ENXIO devices cgroup /{cg.name}",
                         "same mounts", "EPERM EPERM"], r.stdout + r.stderr
        assert "195:1" not in (cg / "devices.list").read_text()   # undone


def _forged_proc(tmp_path: Path, cgroup_text: str) -> str:
    """A /proc whose "self" is this process but whose cgroup list is `cgroup_text` (what
    a /proc the container mounted could say)."""
    proc = tmp_path / "proc"
    (proc / str(os.getpid())).mkdir(parents=True)
    os.symlink(str(os.getpid()), proc / "self")
    (proc / str(os.getpid()) / "cgroup").write_text(cgroup_text)
    (proc / str(os.getpid()) / "mountinfo").write_text(Path("/proc/self/mountinfo").read_text())
    return str(proc)


def _devices_line() -> tuple[str, str]:
    """(hierarchy id, controllers) of the v1 devices hierarchy, from /proc/self/cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hid, ctrls, _ = line.split(":", 2)
        if "devices" in ctrls.split(","):
            return hid, ctrls
    raise LookupError("devices")


def test_own_cgroup_forged_path_is_refused(tmp_path):
    """A cgroup list naming another cgroup (a forged /proc) does not get that cgroup
    changed: before the first write the kernel must list this process in it."""
    hid, ctrls = _devices_line()
    with _restricted_v1_cgroup("nvh-victim") as victim:
        proc = _forged_proc(tmp_path, f"{hid}:{ctrls}:/{victim.name}\n")
        with pytest.raises(NvhookError, match=f"devices cgroup /{victim.name} does not hold "
                                              "this process"):
            allow_devices(os.getpid(), [CgroupRule(195, 1)], proc_root=proc)
        assert (victim / "devices.list").read_text() == "c 1:3 rwm\n"


@pytest.mark.parametrize("text, message", [
    ("{hid}:{ctrls}:/a\n{hid}:{ctrls}:/b\n", "names the devices hierarchy more than once"),
    ("{hid}:{ctrls}:/../elsewhere\n", "outside this cgroup namespace"),
    ("{hid}:{ctrls}:/no-such-cgroup-here\n", "cannot open devices cgroup /no-such-cgroup-here"),
    ("{hid}:{ctrls}:/../../etc\n", "outside this cgroup namespace"),
])
def test_own_cgroup_bad_lists(tmp_path, text, message):
    hid, ctrls = _devices_line()
    proc = _forged_proc(tmp_path, text.format(hid=hid, ctrls=ctrls))
    with pytest.raises(NvhookError, match=message):
        allow_devices(os.getpid(), [CgroupRule(195, 1)], proc_root=proc)


def test_own_cgroup_escape_by_dotdot_is_refused(tmp_path):
    """A path climbing out of the private mount ("/x/../..") never leaves it."""
    hid, ctrls = _devices_line()
    proc = _forged_proc(tmp_path, f"{hid}:{ctrls}:/docker/../../x\n")
    with pytest.raises(NvhookError, match="cannot open devices cgroup"):
        allow_devices(os.getpid(), [CgroupRule(195, 1)], proc_root=proc)


def test_v1_hierarchy_parse():
    text = "12:name=systemd:/s\n5:devices,freezer:/a/b\n0::/u\n"
    assert v1_hierarchy(text, "devices") == (("devices", "freezer"), "/a/b")
    assert v1_hierarchy(text, "systemd") is None
    assert v1_hierarchy(text, "name=systemd") == (("name=systemd",), "/s")
    assert v1_hierarchy("0::/u\n", "devices") is None       # pure cgroup v2


# -- the harness itself ------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["v1", "v2"])
def test_harness(tmp_path, mode):
    hook = tmp_path / "hook.sh"
    hook.write_text('#!/bin/sh\necho "$1 $HOOKVAR $(cat | head -c 1)" >> "$2"\n')
    hook.chmod(0o755)
    log = tmp_path / "hook.log"
    hooks = {"prestart": [{"path": str(hook), "args": ["hook", "prestart", str(log)],
                           "env": ["HOOKVAR=hv", "PATH=/usr/bin:/bin"]}]}
    with RuncContainer(tmp_path, mode=mode, devices=GPUS, hooks=hooks,
                       env=["PATH=/bin", "FOO=bar"]) as c:
        pid = c.create()
        assert log.read_text() == "prestart hv {\n"
        c.start()
        assert Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x001000\x00"
        assert c.exec("sh", "-c", "echo $FOO $BAZ", env=["BAZ=qux"]).stdout == "bar qux\n"
        assert c.open_result("/dev/nvidia7") == "ENOENT"
        assert c.open_result("/dev/null") == "OK"
        assert c.cgroup_dir().is_dir() and c.cgroup_dir("devices").is_dir()
        if mode == "v2":   # cgroup2 on /sys/fs/cgroup only in runc's private namespace
            assert os.readlink(f"/proc/{c.ns_pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
            assert not [m for m in mountinfo.read()
                        if m.mountpoint == "/sys/fs/cgroup" and m.fstype == "cgroup2"]
        cg, ns_pid = c.cgroup_dir(), c.ns_pid
    assert not cg.exists()
    assert not c.bundle.exists() and not c.state_root.exists()
    if ns_pid:
        assert not Path(f"/proc/{ns_pid}").exists()
    with RuncContainer(tmp_path, mode=mode,
                       args=["sh", "-c", "echo out; echo err >&2; exit 3"]) as c:
        r = c.run()
        assert (r.returncode, r.stdout, r.stderr) == (3, "out\n", "err\n")


def test_harness_reports_create_failure(tmp_path):
    hooks = {"prestart": [{"path": "/bin/sh",
                           "args": ["sh", "-c", "echo hook-broke >&2; exit 1"]}]}
    with RuncContainer(tmp_path, hooks=hooks) as c:
        with pytest.raises(RuncError, match="hook-broke"):
            c.create()
    assert not c.bundle.exists()


# -- finding the cgroup, without containers --------------------------------------------
MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
50 23 0:33 /kube/pod1 /mnt/my\\040cg rw - cgroup cgroup rw,devices,freezer
"""


def test_parse_mountinfo_and_cgroup():
    ms = cgroup_mounts(MOUNTINFO)
    assert [(m.mount_id, m.mountpoint, m.root, m.fstype) for m in ms] == [
        (36, "/sys/fs/cgroup/devices", "/", "cgroup"),
        (41, "/sys/fs/cgroup/unified", "/", "cgroup2"),
        (50, "/mnt/my cg", "/kube/pod1", "cgroup")]
    assert ms[2].controllers == {"rw", "devices", "freezer"}
    assert proc_cgroups("5:devices,freezer:/a\n0::/b\n9:name=systemd:/c\n") == {
        "devices": "/a", "freezer": "/a", "": "/b", "name=systemd": "/c"}


def _fake_proc(tmp_path: Path, cgroup: str, mounts: str) -> str:
    (tmp_path / "self").mkdir()
    (tmp_path / "self/mountinfo").write_text(mounts)
    (tmp_path / "42").mkdir()
    (tmp_path / "42/cgroup").write_text(cgroup)
    return str(tmp_path)


def test_resolve_through_mount_root(tmp_path):
    # a mount whose root is a sub-cgroup (bind mount, or a mount made in a cgroup
    # namespace) wins for paths under it: mountpoint + (path - root)
    proc = _fake_proc(tmp_path, "5:devices:/kube/pod1/ctr\n0::/kube/pod1/ctr\n", MOUNTINFO)
    assert find_cgroup_dirs(42, proc_root=proc, visible=lambda d, m: True) == (
        "/mnt/my cg/ctr", "/sys/fs/cgroup/unified/kube/pod1/ctr")
    # a covered mount is skipped for the next one that holds the path
    assert find_cgroup_dirs(42, proc_root=proc, visible=lambda d, m: m.mount_id != 50) == (
        "/sys/fs/cgroup/devices/kube/pod1/ctr", "/sys/fs/cgroup/unified/kube/pod1/ctr")


def test_resolve_outside_our_cgroup_namespace(tmp_path):
    proc = _fake_proc(tmp_path, "5:devices:/../other/ctr\n", MOUNTINFO)
    with pytest.raises(NvhookError, match="outside this cgroup namespace"):
        find_cgroup_dirs(42, proc_root=proc, visible=lambda d, m: True)


def test_devices_hierarchy_not_mounted(tmp_path):
    proc = _fake_proc(tmp_path, "5:devices:/x\n0::/x\n",
                      "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    with pytest.raises(NvhookError, match="not mounted"):
        find_cgroup_dirs(42, proc_root=proc, visible=lambda d, m: True)
    # ...but a process in the root devices cgroup has nothing to lift there
    (tmp_path / "42/cgroup").write_text("5:devices:/\n0::/x\n")
    assert find_cgroup_dirs(42, proc_root=proc, visible=lambda d, m: True) == (
        None, "/sys/fs/cgroup/x")


def test_covered_mounts_are_skipped(tmp_path):
    """In a runtime's private namespace with cgroup2 on /sys/fs/cgroup, mountinfo still
    lists the hybrid host's v1 and unified mounts underneath; only the visible one counts."""
    with RuncContainer(tmp_path, mode="v2") as c:
        c.create()
        code = ("from libinject.apply.cgroups import find_cgroup_dirs as f; "
                f"print(f({c.pid}))")
        r = subprocess.run(c.host_cmd([sys.executable, "-I", "-c", code]),
                           capture_output=True, text=True)
        assert r.stdout.strip() == f"(None, '/sys/fs/cgroup/{c.id}')", r.stderr
        assert find_cgroup_dirs(c.pid) == ("/sys/fs/cgroup/devices",
                                           f"/sys/fs/cgroup/unified/{c.id}")


# -- program encoding --------------------------------------------------------------------
def test_allow_block_falls_through_and_keeps_r1():
    block = bd.allow_block([bd.DevRule("c", 195, 1, "rw"), bd.DevRule("c", 195, None, "m")])
    ins = bd.decode(block)
    assert all(dst != 1 for code, dst, *_ in ins if code not in (0x55, 0x95))  # r1 intact
    for i, (code, dst, src, off, imm) in enumerate(ins):
        if code == 0x55:                       # every jump lands inside or right after
            assert 0 < i + 1 + off <= len(ins)
    assert bd.reusable(block + bd.insn(0xb4) + bd.insn(0x95)) is None
    assert "calls" in bd.reusable(_program_with_helper_call([]))
    # loads, with an exit appended (the verifier rejects falling off the end)
    fd = n.bpf_prog_load(n.BPF_PROG_TYPE_CGROUP_DEVICE, block + bd.insn(0xb4) + bd.insn(0x95))
    os.close(fd)
