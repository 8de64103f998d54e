"""The live applier for real: hand-made host + ContainerEdits applied to a busybox
rootfs in a private mount namespace (standalone, as `nvhook configure` under
`unshare -m`), and to another process's mount namespace (--pid)."""
from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from libinject.plan.edits import CudaCompatEdit, DeviceEdit, MountEdit
from libinject.errors import NvhookError
from libinject.record import replace
from support.applyenv import (HOST_LDCONFIG, LIBDIR, elf, in_ns, make_host, mountinfo, new_mounts,
                              snapshot, try_apply)


def _planned(edits) -> list[str]:
    """Container mount points in DESIGN.md §5 order."""
    order = ["/proc/driver/nvidia"]
    for kind in ("binary", "library", "firmware", "ipc"):
        order += [m.container_path for m in edits.mounts if m.kind == kind]
    order += [d.path for d in edits.device_nodes if d.kind == "control"]
    order += [d.path for d in edits.device_nodes if d.kind == "gpu"]
    order += [f"/proc/driver/nvidia/gpus/{n}" for _, n in edits.procfs.gpu_dirs]
    return order


def _apply_and_look(rootfs, edits, **kw):
    from libinject.apply.live import apply
    before = mountinfo()
    t = time.monotonic()
    returned = apply(edits, str(rootfs), **kw)
    took = time.monotonic() - t
    mnts = new_mounts(before, mountinfo())
    lib = rootfs / LIBDIR.lstrip("/")
    try:
        (lib / "libnvidia-ml.so.550.54.14").write_text("x")
        wrote = "wrote"
    except OSError as e:
        wrote = e.errno
    devs = {p: (stat.S_ISCHR(st.st_mode), os.major(st.st_rdev), os.minor(st.st_rdev))
            for p in ("nvidiactl", "nvidia0", "nvidia3")
            for st in [os.stat(rootfs / "dev" / p)]}
    proc = rootfs / "proc/driver/nvidia"
    return dict(mounts=mnts, returned=returned, took=took, wrote=wrote, devs=devs,
                params=(proc / "params").read_text(), procdir=sorted(os.listdir(proc)),
                gpus=sorted(os.listdir(proc / "gpus")),
                info=(proc / "gpus/0000:01:00.0/information").read_text(),
                smi=(rootfs / "usr/bin/nvidia-smi").read_text(),
                link=os.readlink(lib / "libnvidia-ml.so.1"))


@pytest.mark.parametrize("worker", [True, False], ids=["worker", "in-process"])
def test_apply_standalone_exact_mounts(rootfs, tmp_path, worker, no_leaked_mounts):
    edits = make_host(tmp_path / "host")
    r = in_ns(_apply_and_look, rootfs, edits, **({} if worker else {"worker": False}))
    planned = _planned(edits)
    got = [m.mountpoint[len(str(rootfs)):] for m in r["mounts"]]
    assert sorted(got) == sorted(planned)      # exactly these (mountinfo lists by creation)
    assert r["returned"] == planned            # attached in this order
    by = {m.mountpoint[len(str(rootfs)):]: m for m in r["mounts"]}
    proc = by["/proc/driver/nvidia"]
    assert proc.fstype == "tmpfs" and {"ro", "nosuid", "nodev", "noexec"} <= proc.options
    for m in edits.mounts:
        opts = by[m.container_path].options
        if m.kind == "ipc":
            assert {"rw", "nosuid", "nodev", "noexec"} <= opts
        else:
            assert {"ro", "nosuid", "nodev"} <= opts and "noexec" not in opts
        assert by[m.container_path].root == m.host_path
    for d in edits.device_nodes:
        opts = by[d.path].options
        # read-only, as nvidia-container-cli binds device nodes (nvc_mount.c mount_device)
        assert {"ro", "nosuid", "noexec"} <= opts and "nodev" not in opts
    for _, n in edits.procfs.gpu_dirs:
        assert {"ro", "nosuid", "nodev", "noexec"} <= by[f"/proc/driver/nvidia/gpus/{n}"].options
    assert r["wrote"] == errno.EROFS           # read-only really is read-only
    assert r["devs"] == {"nvidiactl": (True, 195, 255), "nvidia0": (True, 195, 0),
                         "nvidia3": (True, 195, 3)}
    assert r["params"] == "ModifyDeviceFiles: 0\n"
    assert r["procdir"] == ["gpus", "params", "registry", "version"]
    assert r["gpus"] == [n for _, n in edits.procfs.gpu_dirs]
    assert r["info"] == "Model: sim gpu 1\n"
    assert r["smi"].startswith("#!/bin/sh")
    assert r["link"] == "libnvidia-ml.so.550.54.14"
    cache = subprocess.run([HOST_LDCONFIG, "-p", "-C", str(rootfs / "etc/ld.so.cache")],
                           capture_output=True, text=True).stdout
    assert f"libnvidia-ml.so.1 (libc6,x86-64) => {LIBDIR}/libnvidia-ml.so.1" in cache
    print(f"apply: {len(planned)} mounts + ldconfig in {r['took'] * 1000:.1f} ms")


def _check_untouched(rootfs, edits, before, **kw):
    err, mnts = in_ns(try_apply, rootfs, edits, **kw)
    assert err is not None
    assert mnts == []
    assert snapshot(rootfs, dir_mtimes=False) == before
    return err


@pytest.mark.parametrize("worker", [True, False], ids=["worker", "in-process"])
def test_failure_half_way_leaves_nothing(rootfs, tmp_path, worker, no_leaked_mounts):
    """/dev/nvidia2 is a directory in the image: fails at the per-GPU devices, after
    procfs, binaries, libraries, symlinks, firmware, IPC and control devices."""
    edits = make_host(tmp_path / "host")
    (rootfs / "dev/nvidia2").mkdir()
    before = snapshot(rootfs, dir_mtimes=False)
    err = _check_untouched(rootfs, edits, before, **({} if worker else {"worker": False}))
    assert err == "mount target /dev/nvidia2 in the rootfs is a directory, expected a regular file"


@pytest.mark.parametrize("worker", [True, False], ids=["worker", "in-process"])
def test_failure_in_ldconfig_rolls_back(rootfs, tmp_path, worker, no_leaked_mounts):
    edits = make_host(tmp_path / "host")
    before = snapshot(rootfs, dir_mtimes=False)
    false = shutil.which("false")
    err = _check_untouched(rootfs, edits, before, ldconfig=f"@{false}",
                           **({} if worker else {"worker": False}))
    assert err.startswith("ldconfig failed: exit status 1")


def test_missing_source_or_wrong_device(rootfs, tmp_path, no_leaked_mounts):
    edits = make_host(tmp_path / "host")
    before = snapshot(rootfs, dir_mtimes=False)
    bad = replace(edits, mounts=edits.mounts + (
        MountEdit(str(tmp_path / "host/nope.so.1"), f"{LIBDIR}/nope.so.1", "library"),))
    err = _check_untouched(rootfs, bad, before)
    assert err == f"cannot open library {tmp_path}/host/nope.so.1: No such file or directory"
    bad = replace(edits, device_nodes=edits.device_nodes + (
        DeviceEdit("/dev/nvidia7", str(tmp_path / "host/dev/nvidia1"), 195, 7),))
    err = _check_untouched(rootfs, bad, before)
    assert err == f"device {tmp_path}/host/dev/nvidia1 is 195:1, expected 195:7"
    bad = replace(edits, device_nodes=(
        DeviceEdit("/dev/nvidia0", str(tmp_path / "host/usr/bin/nvidia-smi"), 195, 0),))
    err = _check_untouched(rootfs, bad, before)
    assert "is not a char device" in err
    bad = replace(edits, mounts=(
        MountEdit(str(tmp_path / "host/dev"), "/usr/lib/x", "library"),))
    err = _check_untouched(rootfs, bad, before)
    assert "source is a directory, expected file" in err


# -- --pid: another process's mount namespace ----------------------------------------
@contextmanager
def _namespace(mounts: str, ready: Path):
    """A process (yielded) in its own private mount namespace, once the shell commands
    `mounts` have run there; killed afterwards."""
    p = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c",
                          f"{mounts} && touch {ready} && exec sleep 60"])
    try:
        deadline = time.monotonic() + 10
        while not ready.exists():
            assert p.poll() is None, f"container setup failed (exit status {p.returncode})"
            assert time.monotonic() < deadline, "container not ready within 10 s"
            time.sleep(0.02)
        yield p
    finally:
        p.kill()
        p.wait(timeout=10)


@pytest.fixture
def container(rootfs, tmp_path):
    """A process in its own private mount namespace whose <rootfs>/dev is a tmpfs only
    it sees (as runc's containers at prestart) and where the host dir is hidden."""
    host = tmp_path / "host"
    host.mkdir()
    with _namespace(f"mount -t tmpfs tmpfs {rootfs}/dev && mount -t tmpfs tmpfs {host}",
                    tmp_path / "ready") as p:
        yield p.pid


def test_apply_into_other_namespace(rootfs, tmp_path, container, no_leaked_mounts):
    from libinject.apply.live import apply
    edits = make_host(tmp_path / "host_src")
    # the container cannot see host_src at all: sources are opened on the host first
    subprocess.run(["nsenter", "-t", str(container), "-m", "mount", "-t", "tmpfs", "tmpfs",
                    str(tmp_path / "host_src")], check=True)
    before_ns = mountinfo(container)
    mounted = apply(edits, str(rootfs), pid=container)
    assert mounted == _planned(edits)
    mnts = new_mounts(before_ns, mountinfo(container))
    assert sorted(m.mountpoint[len(str(rootfs)):] for m in mnts) == sorted(_planned(edits))
    # device targets were made in the container's /dev tmpfs, not in the host's rootfs
    assert os.listdir(rootfs / "dev") == []
    out = subprocess.run(["nsenter", "-t", str(container), "-m", "sh", "-c",
                          f"ls {rootfs}/dev; cat {rootfs}/proc/driver/nvidia/params"],
                         capture_output=True, text=True).stdout.split()
    assert {"nvidiactl", "nvidia0", "nvidia3", "nvidia-uvm"} <= set(out)
    assert "ModifyDeviceFiles:" in out


def test_cgroup_rules_via_parent(rootfs, tmp_path, container, monkeypatch, no_leaked_mounts):
    import libinject.apply.cgroups as cg
    from libinject.apply.live import apply
    edits = make_host(tmp_path / "host_src")
    calls, undone = [], []

    class Undo:
        v1_dir = v2_dir = None     # nothing written: no systemd scope to tell

        def undo(self):
            undone.append(True)

    def ok(pid, rules):
        calls.append((pid, tuple(rules)))
        return Undo()

    def boom(pid, rules):
        raise NvhookError("no devices controller")

    monkeypatch.setattr(cg, "allow_devices", boom)
    before_ns = mountinfo(container)
    with pytest.raises(NvhookError, match="^cgroup device rules: no devices controller$"):
        apply(edits, str(rootfs), pid=container)
    assert new_mounts(before_ns, mountinfo(container)) == []    # rolled back
    assert subprocess.run(["nsenter", "-t", str(container), "-m", "ls", f"{rootfs}/dev"],
                          capture_output=True, text=True).stdout == ""
    monkeypatch.setattr(cg, "allow_devices", ok)
    apply(edits, str(rootfs), pid=container, no_cgroups=True)
    assert calls == []
    mnt_ok = apply(edits, str(rootfs), pid=container)
    assert calls == [(container, edits.cgroup_rules)] and undone == [] and mnt_ok


def _oneshot_into(rootfs, edits, pid, **kw):
    """apply(worker=False) as a one-shot caller does, reporting what it did to this
    process: namespace and cwd back as they were, capabilities limited."""
    from libinject.apply.live import apply
    os.chdir("/tmp")
    ns = os.stat("/proc/self/ns/mnt").st_ino
    try:
        mounted = apply(edits, str(rootfs), pid=pid, worker=False, **kw)
        err = None
    except NvhookError as e:
        mounted, err = None, str(e)
    caps = {ln.split(":")[0]: int(ln.split()[1], 16) for ln in open("/proc/self/status")
            if ln.startswith(("CapBnd", "CapPrm"))}
    return dict(mounted=mounted, err=err, ns_back=os.stat("/proc/self/ns/mnt").st_ino == ns,
                cwd=os.getcwd(), caps=caps, umask=os.umask(0o022))


def test_in_process_into_other_namespace(rootfs, tmp_path, container, no_leaked_mounts):
    edits = make_host(tmp_path / "host_src")
    subprocess.run(["nsenter", "-t", str(container), "-m", "mount", "-t", "tmpfs", "tmpfs",
                    str(tmp_path / "host_src")], check=True)
    before_ns = mountinfo(container)
    r = in_ns(_oneshot_into, rootfs, edits, container)
    assert r["err"] is None and r["mounted"] == _planned(edits)
    assert r["ns_back"] and r["cwd"] == "/tmp" and r["umask"] == 0o022
    # the worker's capability set: no CAP_SYS_MODULE (16), CAP_SYS_ADMIN (21) kept
    assert r["caps"]["CapPrm"] == r["caps"]["CapBnd"]
    assert not r["caps"]["CapBnd"] & (1 << 16) and r["caps"]["CapBnd"] & (1 << 21)
    mnts = new_mounts(before_ns, mountinfo(container))
    assert sorted(m.mountpoint[len(str(rootfs)):] for m in mnts) == sorted(_planned(edits))
    assert os.listdir(rootfs / "dev") == []       # made in the container's /dev tmpfs


def _count_mountinfo_reads(rootfs, edits, pid):
    """apply(worker=False) into pid's namespace, counting the readings of mountinfo."""
    from libinject.apply.live import apply
    from libinject.linux import mountinfo as mi
    reads = []
    real = mi.read_text

    def counted(*a, **kw):
        reads.append(a)
        return real(*a, **kw)
    mi.read_text = counted
    mounted = apply(edits, str(rootfs), pid=pid, worker=False, no_cgroups=True)
    return mounted, len(reads)


def test_one_mountinfo_reading_per_apply(rootfs, tmp_path, no_leaked_mounts):
    """As at runc's prestart: the container's /dev a tmpfs and its /proc a procfs
    (without /proc/driver/nvidia: a tmpfs covers /proc/driver first). Every target's
    mount and its propagation is checked, from one reading of mountinfo (it took 3:
    each mount of ours, the procfs tmpfs and the gpus/ entries bound in it, was read
    again for its propagation, which attach() now knows)."""
    edits = make_host(tmp_path / "host_src")
    with _namespace(f"mount -t tmpfs tmpfs {rootfs}/dev && mount -t proc proc {rootfs}/proc",
                    tmp_path / "ready") as p:
        before_ns = mountinfo(p.pid)
        mounted, reads = in_ns(_count_mountinfo_reads, rootfs, edits, p.pid)
        assert mounted == ["/proc/driver"] + _planned(edits)
        got = [m.mountpoint[len(str(rootfs)):] for m in new_mounts(before_ns, mountinfo(p.pid))]
        assert sorted(got) == sorted(mounted)
        assert reads == 1


def test_in_process_cgroup_failure_rolls_back(rootfs, tmp_path, container, monkeypatch,
                                              no_leaked_mounts):
    """The cgroup step runs back in our namespace; its failure undoes the mounts in
    the container's (umount2 only detaches mounts of the caller's namespace)."""
    import libinject.apply.cgroups as cg
    edits = make_host(tmp_path / "host_src")
    seen = []

    def boom(pid, rules):
        seen.append(os.stat("/proc/self/ns/mnt").st_ino)
        raise NvhookError("no devices controller")

    monkeypatch.setattr(cg, "allow_devices", boom)
    before_ns = mountinfo(container)
    r = in_ns(_oneshot_into, rootfs, edits, container)
    assert r["err"] == "cgroup device rules: no devices controller"
    assert r["ns_back"] and r["cwd"] == "/tmp"
    assert new_mounts(before_ns, mountinfo(container)) == []
    assert subprocess.run(["nsenter", "-t", str(container), "-m", "ls", f"{rootfs}/dev"],
                          capture_output=True, text=True).stdout == ""


def test_in_process_cgroup_v2_with_limited_caps(tmp_path, no_leaked_mounts):
    """The cgroup step of apply(worker=False) runs with the worker's capabilities
    (CAP_SYS_ADMIN, no CAP_BPF/CAP_NET_ADMIN): enough for runc's eBPF program."""
    from support.runc import RuncContainer
    edits = make_host(tmp_path / "drv", ngpu=2)
    with RuncContainer(tmp_path, mode="v2", devices=[("/dev/nvidia0", 195, 0),
                                                     ("/dev/nvidia1", 195, 1)]) as c:
        c.create()
        c.start()
        assert c.open_result("/dev/nvidia1") == "EPERM"
        r = in_ns(_oneshot_into, c.rootfs, edits, c.pid)
        assert r["err"] is None and r["ns_back"]
        assert not r["caps"]["CapBnd"] & ((1 << 39) | (1 << 12))
        assert c.open_result("/dev/nvidia1") == "ENXIO"


def test_bad_pid(rootfs, tmp_path):
    from libinject.apply.live import apply
    with pytest.raises(NvhookError, match="container process 999999999"):
        apply(make_host(tmp_path / "h"), str(rootfs), pid=999999999)


# -- CUDA forward compat -------------------------------------------------------------
def _compat_image(rootfs, tmp_path):
    host_secret = tmp_path / "secret.so"
    host_secret.write_text("host file")
    (rootfs / "usr/local/cuda-12.6/compat").mkdir(parents=True)
    (rootfs / "usr/local/cuda").symlink_to("cuda-12.6")      # as CUDA images do: followed
    c = rootfs / "usr/local/cuda-12.6/compat"
    elf(c / "libcuda.so.560.35.03", "libcuda.so.1")
    (c / "libnvidia-ptxjitcompiler.so.560.35.03").write_text("ptx")
    (c / "libcuda.so.1").symlink_to("libcuda.so.560.35.03")
    (c / "libcuda.so.999.1.1").symlink_to(str(host_secret))   # newer, but a symlink: ignored
    (c / "libnvidia-nvvm.so.999.1.1").symlink_to(str(host_secret))
    return c


def _compat_apply(rootfs, edits):
    from libinject.apply.live import apply
    before = mountinfo()
    apply(edits, str(rootfs))
    return [(m.mountpoint[len(str(rootfs)):], m.root, m.options) for m in new_mounts(before, mountinfo())]


def test_cuda_compat_mount_only_newer_regular_files(rootfs, tmp_path, no_leaked_mounts):
    _compat_image(rootfs, tmp_path)
    from libinject.plan.edits import ContainerEdits
    edits = ContainerEdits(cuda_compat=CudaCompatEdit("mount", 550))
    got = in_ns(_compat_apply, rootfs, edits)
    assert [g[0] for g in got] == [f"{LIBDIR}/libcuda.so.560.35.03",
                                   f"{LIBDIR}/libnvidia-ptxjitcompiler.so.560.35.03"]
    assert all({"ro", "nosuid", "nodev"} <= g[2] for g in got)
    assert got[0][1].endswith("/usr/local/cuda-12.6/compat/libcuda.so.560.35.03")
    # not newer than the driver: nothing
    assert in_ns(_compat_apply, rootfs, ContainerEdits(cuda_compat=CudaCompatEdit("mount", 560))) == []


def test_cuda_compat_ldconfig_mode(rootfs, tmp_path, no_leaked_mounts):
    _compat_image(rootfs, tmp_path)
    from libinject.plan.edits import ContainerEdits
    edits = ContainerEdits(cuda_compat=CudaCompatEdit("ldconfig", 550))
    assert in_ns(_compat_apply, rootfs, edits) == []
    cache = subprocess.run([HOST_LDCONFIG, "-p", "-C", str(rootfs / "etc/ld.so.cache")],
                           capture_output=True, text=True).stdout
    assert "libcuda.so.1 (libc6,x86-64) => /usr/local/cuda/compat/libcuda.so.1" in cache


# -- a real runc container (after it pivoted: --pid on a running container) ----------
@pytest.mark.parametrize("worker", [True, False], ids=["worker", "in-process"])
@pytest.mark.parametrize("cgroups", [False, True], ids=["no-cgroups", "cgroups"])
def test_apply_into_running_runc_container(tmp_path, cgroups, worker, no_leaked_mounts):
    from libinject.apply.live import apply
    from support.runc import RuncContainer
    edits = make_host(tmp_path / "drv", ngpu=2)
    with RuncContainer(tmp_path, mode="v1") as c:
        c.create()
        c.start()
        if worker:
            mounted = apply(edits, str(c.rootfs), pid=c.pid, no_cgroups=not cgroups)
        else:   # in a one-shot process: it drops its capabilities for good
            r = in_ns(_oneshot_into, c.rootfs, edits, c.pid, no_cgroups=not cgroups)
            assert r["err"] is None and r["ns_back"]
            mounted = r["mounted"]
        assert mounted == ["/proc/driver"] + _planned(edits)
        out = c.exec("sh", "-c", "ls /dev; cat /proc/driver/nvidia/params; "
                     "ls /proc/driver/nvidia/gpus; cat /proc/self/mountinfo").stdout
        assert "nvidia0" in out and "nvidiactl" in out
        assert "ModifyDeviceFiles: 0" in out and "0000:01:00.0" in out
        assert " /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.14 ro,nosuid,nodev" in out
        assert c.open_result("/dev/nvidia1") == ("ENXIO" if cgroups else "EPERM")
        # the container's own /proc is real procfs: /proc/driver/nvidia was made on a
        # tmpfs over /proc/driver (simulated host without the nvidia module)
        assert c.exec("ls", "/proc/driver/nvidia").stdout.split() == [
            "gpus", "params", "registry", "version"]
