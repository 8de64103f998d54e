"""The hook under real runtimes on a simulated a100x8 host: runc (cgroup v1 and v2), crun,
podman (--hooks-dir) and containerd (ctr run --config).

A container with NVIDIA_VISIBLE_DEVICES=1 sees only GPU 1 in the simulated nvidia-smi, can
open /dev/nvidia1 (ENXIO: the cgroup lets it through) but not /dev/nvidia0 (EPERM);
`void` leaves it untouched; an unknown device or an unsatisfied requirement fails the
create with nvhook's message.
"""
from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from support import hookenv
from support.hookenv import ENV, PROBE, assert_only_gpu1, gpu_container
from support.podman import Podman, state_dir
from support.runc import RuncContainer, RuncError

UNTOUCHED = "ls /dev; grep -c nvidia /proc/self/mountinfo; test -e /usr/bin/nvidia-smi && echo HAS-SMI; true"


def assert_untouched(out: str) -> None:
    assert not re.search(r"^nvidia(ctl|-uvm|[1-9])", out, re.M), out   # nothing injected in /dev
    assert re.search(r"^0$", out, re.M), out               # no nvidia mounts
    assert "HAS-SMI" not in out


# -- runc ---------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["v1", "v2"])
def test_runc_gpu1(tmp_path, hook_config, gpu_uuids, mode):
    with gpu_container(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE, mode) as c:
        r = c.run()
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)
    log = (tmp_path / "hook.log").read_text()
    assert "prestart: configuring" in log and "prestart: done" in log


@pytest.mark.parametrize("mode", ["v1", "v2"])
def test_runc_void_untouched(tmp_path, hook_config, mode):
    with gpu_container(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=void"], UNTOUCHED, mode) as c:
        r = c.run()
    assert r.returncode == 0, r.stderr
    assert_untouched(r.stdout)


def test_runc_by_uuid_and_all_caps(tmp_path, hook_config, gpu_uuids):
    env = [f"NVIDIA_VISIBLE_DEVICES={gpu_uuids[1]}", "NVIDIA_DRIVER_CAPABILITIES=all"]
    with gpu_container(tmp_path, hook_config, env, PROBE) as c:
        r = c.run()
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)


@pytest.mark.parametrize("env, message", [
    (["NVIDIA_VISIBLE_DEVICES=9"], "nvhook: unknown device: 9"),
    (["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_REQUIRE_CUDA=cuda>=99.0"],
     "unsatisfied condition: cuda>=99.0, please update your driver"),
    (["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=compute,warp"],
     "nvhook: unsupported capabilities found in NVIDIA_DRIVER_CAPABILITIES=compute,warp"),
    (["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_MIG_CONFIG_DEVICES=all"],
     "nvhook: cannot set NVIDIA_MIG_CONFIG_DEVICES in non privileged container"),
])
def test_runc_create_fails_with_our_message(tmp_path, hook_config, env, message):
    with gpu_container(tmp_path, hook_config, env, "sleep 100") as c:
        with pytest.raises(RuncError) as e:
            c.create()
        rootfs = str(c.rootfs)
    assert message in str(e.value)
    assert hookenv.mounts_naming(rootfs) == []


def test_runc_legacy_cuda_image_gets_all_gpus(tmp_path, hook_config, gpu_uuids):
    with gpu_container(tmp_path, hook_config, ["CUDA_VERSION=12.2.0"], "nvidia-smi -L") as c:
        r = c.run()
    assert re.findall(r"UUID: (GPU-[0-9a-f-]+)", r.stdout) == gpu_uuids, r.stdout + r.stderr
    with gpu_container(tmp_path, hook_config, ["CUDA_VERSION=12.5.0"], "true") as c:
        with pytest.raises(RuncError, match=r"unsatisfied condition: cuda>=12\.5"):
            c.create()


def test_runc_cdi_annotation(tmp_path, hook_config, gpu_uuids):
    with gpu_container(tmp_path, hook_config, [], PROBE) as c:
        c.config["annotations"] = {"cdi.k8s.io/gpus": "nvidia.com/gpu=1"}
        r = c.run()
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)


def test_runc_poststart_poststop_do_nothing(tmp_path, hook_config):
    hooks = {s: [hookenv.hook_entry(hook_config, s)] for s in ("poststart", "poststop")}
    with RuncContainer(tmp_path, args=["sh", "-c", UNTOUCHED], env=ENV + ["NVIDIA_VISIBLE_DEVICES=1"],
                       hooks=hooks) as c:
        r = c.run()
    assert r.returncode == 0, r.stderr
    assert_untouched(r.stdout)


# -- crun ---------------------------------------------------------------------------------

def _crun(tmp_path, hook_config, env, args, annotations=None):
    with gpu_container(tmp_path, hook_config, env, args) as c:   # the bundle; crun runs it
        c.config["annotations"] = dict(annotations or {})
        c.write_config()
        return hookenv.crun_run(c.bundle, c.id, tmp_path / "crun-state")


def test_crun_gpu1(tmp_path, hook_config, gpu_uuids):
    r = _crun(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE)
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)
    assert "status=created" in (tmp_path / "hook.log").read_text()   # crun's prestart status


def test_crun_void_and_errors(tmp_path, hook_config):
    r = _crun(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=void"], UNTOUCHED)
    assert r.returncode == 0, r.stderr
    assert_untouched(r.stdout)
    # crun drops a hook's stderr unless run.oci.hooks.stderr names a file for it
    err = tmp_path / "hook.stderr"
    r = _crun(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=9"], "true",
              {"run.oci.hooks.stderr": str(err)})
    assert r.returncode != 0 and "error executing hook" in r.stderr
    assert err.read_text() == "nvhook: unknown device: 9\n"
    assert "ERROR" in (tmp_path / "hook.log").read_text()


def test_crun_create_container_stage(tmp_path, hook_config, gpu_uuids):
    # crun (cgroup v1 only here) runs createContainer hooks in the container's namespaces
    # too, pid 0 in the state: the v1 devices cgroup is reached as under runc (below)
    with gpu_container(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE, "v1",
                       "createContainer") as c:
        c.write_config()
        r = hookenv.crun_run(c.bundle, c.id, tmp_path / "crun-state")
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)
    assert "createContainer: done" in (tmp_path / "hook.log").read_text()


# -- podman -------------------------------------------------------------------------------

PODMAN_PROBE = ("nvidia-smi -L; mknod /dev/n0 c 195 0; mknod /dev/n1 c 195 1; for d in /dev/n0 /dev/n1; do "
                "dd if=$d of=/dev/null bs=1 count=0 2>&1 | grep -o \"can't open.*\" || echo \"$d: OK\"; done")


@pytest.fixture
def podman():
    with state_dir() as state:
        p = Podman(state)
        yield p
        p.cleanup()


@pytest.fixture
def hooks_dir(tmp_path, hook_config) -> Path:
    from libinject.runtime import hooksd as hookinstall

    d = tmp_path / "hooks.d"
    hookinstall.install(str(d), "always", hookenv.ensure_front(), str(hook_config))
    return d


def test_podman_hooks_dir(tmp_path, podman, hooks_dir, rootfs, gpu_uuids):
    r = podman.run(rootfs, ["sh", "-c", PODMAN_PROBE], hooks_dir=hooks_dir, env=["NVIDIA_VISIBLE_DEVICES=1"])
    out = r.stdout + r.stderr
    assert re.findall(r"UUID: (GPU-[0-9a-f-]+)", out) == [gpu_uuids[1]], out
    assert "can't open '/dev/n0': Operation not permitted" in out, out
    assert "can't open '/dev/n1': No such device or address" in out, out
    # the throw-away overlay kept the rootfs itself clean
    assert not (rootfs / "usr/bin/nvidia-smi").exists()


def test_podman_void_and_error(podman, hooks_dir, rootfs):
    r = podman.run(rootfs, ["sh", "-c", UNTOUCHED], hooks_dir=hooks_dir, env=["NVIDIA_VISIBLE_DEVICES=void"])
    assert r.returncode == 0, r.stderr
    assert_untouched(r.stdout)
    r = podman.run(rootfs, ["true"], hooks_dir=hooks_dir, env=["NVIDIA_VISIBLE_DEVICES=9"])
    assert r.returncode != 0 and "nvhook: unknown device: 9" in r.stderr


def test_podman_annotation_gated_hook(tmp_path, podman, hook_config, rootfs, gpu_uuids):
    from libinject.runtime import hooksd as hookinstall

    d = tmp_path / "hooks-annotated.d"
    hookinstall.install(str(d), "annotation", hookenv.ensure_front(), str(hook_config))
    # no annotation: the hook is not even injected, whatever the env says
    r = podman.run(rootfs, ["sh", "-c", UNTOUCHED], hooks_dir=d, env=["NVIDIA_VISIBLE_DEVICES=1"])
    assert r.returncode == 0, r.stderr
    assert_untouched(r.stdout)
    assert not (tmp_path / "hook.log").exists()
    r = podman.run(rootfs, ["nvidia-smi", "-L"], hooks_dir=d, annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=1"})
    assert re.findall(r"UUID: (GPU-[0-9a-f-]+)", r.stdout) == [gpu_uuids[1]], r.stdout + r.stderr


# -- containerd ---------------------------------------------------------------------------

def test_containerd_ctr_run_config(tmp_path, hook_config, gpu_uuids):
    ctrd = hookenv.Containerd(tmp_path / "containerd")
    try:
        with gpu_container(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE) as c:
            r = ctrd.run(c.config, "gpu1")
        assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)
        with gpu_container(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=void"], UNTOUCHED) as c:
            r = ctrd.run(c.config, "void")
        assert r.returncode == 0, r.stderr
        assert_untouched(r.stdout)
        with gpu_container(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=9"], "true") as c:
            r = ctrd.run(c.config, "bad")
        assert r.returncode != 0 and "nvhook: unknown device: 9" in r.stderr
    finally:
        ctrd.stop()


def test_runc_create_container_stage_v2(tmp_path, hook_config, gpu_uuids):
    # createContainer runs inside the container's namespaces (runc: pid 1 in the state);
    # the hook stands in its own pid. (cgroup v1: test_runc_create_container_stage_v1.)
    with gpu_container(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE, "v2", "createContainer") as c:
        r = c.run()
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)
    assert "createContainer: done" in (tmp_path / "hook.log").read_text()


# -- createContainer on cgroup v1 ----------------------------------------------------------
# There the hook sees the container's mounts (runc's read-only binds of its own cgroup dirs
# under <rootfs>/sys/fs/cgroup, and whatever the spec mounts over them); it reaches its
# cgroup through a private, detached mount of the devices hierarchy instead
# (libinject.apply.cgroups, "Our own cgroup").

CGROUP_NS = {"type": "cgroup"}


@pytest.mark.parametrize("cgroupns", [False, True], ids=["host-cgroupns", "own-cgroupns"])
def test_runc_create_container_stage_v1(tmp_path, hook_config, gpu_uuids, cgroupns):
    with gpu_container(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE, "v1",
                       "createContainer") as c:
        if cgroupns:   # /proc/self/cgroup and the private mount's root are then both "/"
            c.config["linux"]["namespaces"].append(CGROUP_NS)
        r = c.run()
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)
    assert "createContainer: done" in (tmp_path / "hook.log").read_text()


def _fake_cgroup_files(d: Path) -> dict[str, str]:
    """A writable stand-in for a devices cgroup dir: an empty devices.allow and a
    devices.list claiming every device is allowed already (so a hook believing it would
    write nothing). Returns the files' contents, to check them afterwards."""
    files = {"devices.allow": "", "devices.deny": "", "devices.list": "a *:* rwm\n",
             "cgroup.procs": "1\n", "tasks": "1\n"}
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text)
    return files


@pytest.mark.parametrize("how", ["tree", "devices.allow", "devices.list"])
def test_runc_create_container_v1_hostile_cgroup_mounts(tmp_path, hook_config, gpu_uuids, how):
    """A spec that mounts a fake, writable cgroup over the container's devices cgroup --
    the whole /sys/fs/cgroup/devices ("tree"), or one file bound over runc's read-only
    bind of the real cgroup dir, which stays visible around it -- does not redirect the
    hook: the real cgroup is changed, the fakes are not. The mountinfo walk the hook used
    before fell for both files: it wrote the rules into a fake devices.allow, and took a
    fake devices.list's "a *:* rwm" at its word and wrote nothing; either way the
    container was left without its GPU."""
    fake = tmp_path / "fake-cgroup"
    files = _fake_cgroup_files(fake)
    if how == "tree":
        mounts = [{"destination": "/sys/fs/cgroup/devices", "type": "bind",
                   "source": str(fake), "options": ["rbind", "rw"]}]
    else:
        mounts = [{"destination": f"/sys/fs/cgroup/devices/{how}", "type": "bind",
                   "source": str(fake / how), "options": ["bind", "rw"]}]
    with gpu_container(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE, "v1",
                       "createContainer") as c:
        c.config["mounts"] += mounts           # after runc's own cgroup mount
        r = c.run()
    out = r.stdout + r.stderr
    assert {n: (fake / n).read_text() for n in files} == files, out   # the fakes unchanged
    assert_only_gpu1(out, gpu_uuids)           # and the real cgroup was


# -- mounts the spec puts in the rootfs: the container's own, or a host's ----------------
# What the container sees of /run/nvidia-persistenced, then GPU 1 as PROBE checks it.
SOCKET_PROBE = "ls -l /run/nvidia-persistenced/socket 2>&1 | cut -c1; " + PROBE


def test_runc_tmpfs_on_run(tmp_path, hook_config, gpu_uuids):
    """A tmpfs the spec mounts at /run (docker --tmpfs /run, ctr run's defaults, podman
    --read-only): the container's own, so the persistenced socket is mounted there and
    GPU 1 works (old code: `cannot create /run/nvidia-persistenced ...: refusing`)."""
    with gpu_container(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=1"], SOCKET_PROBE) as c:
        c.config["mounts"].append({"destination": "/run", "type": "tmpfs", "source": "tmpfs",
                                   "options": ["nosuid", "nodev", "mode=755"]})
        r = c.run()
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)
    assert r.stdout.splitlines()[0] == "s", r.stdout      # the socket, in the container's tmpfs


@pytest.mark.parametrize("host_fs", ["dir", "tmpfs"])
def test_runc_host_volume_on_run(tmp_path, hook_config, gpu_uuids, host_fs):
    """A host directory bound at /run (a volume), or a host *tmpfs* (the host's own /run
    given as a volume: a memory file system, but its superblock is mounted in the
    hook's namespace, so not the container's): nothing is written into it; the optional
    persistenced socket is skipped (a log line) and GPU 1 works."""
    vol = tmp_path / "hostrun"
    vol.mkdir()
    if host_fs == "tmpfs":
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(vol)], check=True)
    try:
        (vol / "keep").write_text("the host's\n")
        with gpu_container(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=1"], SOCKET_PROBE) as c:
            c.config["mounts"].append({"destination": "/run", "type": "bind", "source": str(vol),
                                       "options": ["rbind", "rw"]})
            r = c.run()
        assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)
        assert r.stdout.splitlines()[0] == "l", r.stdout      # ls: cannot access...: skipped
        assert sorted(p.name for p in vol.iterdir()) == ["keep"]
        assert "skipped /run/nvidia-persistenced/socket: " in (tmp_path / "hook.log").read_text()
    finally:
        if host_fs == "tmpfs":
            subprocess.run(["umount", "-l", str(vol)], check=True)


def test_runc_tmpfs_on_proc_driver(tmp_path, hook_config, gpu_uuids):
    """A tmpfs the spec mounts at /proc/driver (how a driver-less host, or another tool,
    prepares it: `--tmpfs /proc/driver`): the procfs mask is made in it (old code:
    refusing)."""
    with gpu_container(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=1"],
                       "ls /proc/driver/nvidia/gpus; " + PROBE) as c:
        c.config["mounts"].append({"destination": "/proc/driver", "type": "tmpfs",
                                   "source": "tmpfs", "options": ["nosuid", "nodev"]})
        r = c.run()
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)
    assert len(r.stdout.splitlines()[0].split()) == 1, r.stdout    # GPU 1's bus dir only


def test_podman_read_only_hooks_dir(tmp_path, podman, hooks_dir, rootfs, gpu_uuids):
    """`podman run --read-only` with the hooks.d hook (podman adds tmpfs on /run, /tmp,
    /var/tmp): the container starts with GPU 1 (old code: refusing /run)."""
    r = podman.run(rootfs, ["sh", "-c", PODMAN_PROBE], hooks_dir=hooks_dir,
                   env=["NVIDIA_VISIBLE_DEVICES=1"], extra=["--read-only"])
    out = r.stdout + r.stderr
    assert re.findall(r"UUID: (GPU-[0-9a-f-]+)", out) == [gpu_uuids[1]], out
    assert "can't open '/dev/n1': No such device or address" in out, out





def test_podman_hooks_dir_with_a_socket_is_served(tmp_path, podman, hook_config, rootfs, gpu_uuids, sockdir):
    """`nvhook hooks install --socket P`: the hooks.d hook tries the service at P, which
    serves podman's container (old code: no such option; the hook only tried the
    default socket)."""
    from conftest import NVHOOK, run
    from support.serve import Serve

    s = Serve(hook_config, sockdir / "hook.sock")
    try:
        d = tmp_path / "hooks-served.d"
        r = run([NVHOOK, "hooks", "install", "--dir", str(d), "--hook-config", str(hook_config),
                 "--hook-path", hookenv.ensure_front(), "--socket", str(s.sock)])
        assert r.returncode == 0, r.stderr
        r = podman.run(rootfs, ["sh", "-c", PODMAN_PROBE], hooks_dir=d, env=["NVIDIA_VISIBLE_DEVICES=1"])
        out = r.stdout + r.stderr
        assert re.findall(r"UUID: (GPU-[0-9a-f-]+)", out) == [gpu_uuids[1]], out
        assert s.statuses(1) == [0], s.log()
    finally:
        assert s.stop() == 0


# -- a MIG manager in a container (NVIDIA_MIG_CONFIG_DEVICES=all) ------------------------
MIG_LS = "ls /proc/driver/nvidia/capabilities/gpu0/mig; ls /dev/nvidia-caps"


def test_runc_mig_manager_sees_instances_made_after_it_started(tmp_path, fresh_sim_host):
    """As NVIDIA's nvc_mig_config_global_caps_mount: a privileged container with
    NVIDIA_MIG_CONFIG_DEVICES=all gets the live /proc/driver/nvidia/capabilities and
    /dev/nvidia-caps, so a GPU instance the MIG manager creates after its start (made
    here on the simulated host: its access file and cap node) shows in the container.
    Old code: copies of the files and two nodes, so the new instance never showed."""
    from libinject.sim.build import gi_minor

    host = fresh_sim_host("h100x8-mig")
    cfg = hookenv.write_config(tmp_path / "c.toml", host, log=tmp_path / "hook.log")
    env = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_MIG_CONFIG_DEVICES=all"]
    with gpu_container(tmp_path, cfg, env, "sleep 1000") as c:
        c.config["process"]["args"] = ["sleep", "1000"]
        c.config["process"]["capabilities"]["bounding"].append("CAP_SYS_ADMIN")
        c.create()
        c.start()
        before = c.exec("sh", "-c", MIG_LS)
        assert before.returncode == 0, before.stderr
        assert "gi6" not in before.stdout.split() and "config" not in before.stdout.split()
        minor = gi_minor(0, 6)
        gi = host / "proc/driver/nvidia/capabilities/gpu0/mig/gi6"
        gi.mkdir(parents=True)
        (gi / "access").write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
        caps_major = os.major(os.stat(host / "dev/nvidia-caps/nvidia-cap1").st_rdev)
        os.mknod(host / f"dev/nvidia-caps/nvidia-cap{minor}", 0o444 | stat.S_IFCHR, os.makedev(caps_major, minor))
        after = c.exec("sh", "-c", MIG_LS)
    names = after.stdout.split()
    assert "gi6" in names and f"nvidia-cap{minor}" in names and "nvidia-cap1" in names, after.stdout
