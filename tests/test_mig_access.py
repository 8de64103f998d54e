"""A MIG device's access files in the container (issue 31): bound read-only from the
host's /proc/driver/nvidia/capabilities, as NVIDIA's mount_procfs_mig binds them (not
copies), whether the hook or a CDI spec's cdi-hook gives the device (configure and the
shim apply the same edits through the same code). Old code: copies in the tmpfs, no
mount at those paths."""
from __future__ import annotations

import json

import pytest

from conftest import NVHOOK, run
from support import hookenv
from support.runc import RuncContainer

# the mount points under capabilities/ and the files' text
PROBE = ("grep -o ' /proc/driver/nvidia/capabilities[^ ]*' /proc/self/mountinfo | sort; "
         "cat /proc/driver/nvidia/capabilities/gpu0/mig/gi{gi}/access")


@pytest.fixture(scope="module")
def mig0(sim_host):
    from libinject.discover.driver import discover

    host = sim_host("h100x8-mig")
    return host, discover(str(host), snapshot=False).info.gpus[0].mig_devices[0]


def check(out: str, host, m) -> None:
    gi = f"/proc/driver/nvidia/capabilities/gpu0/mig/gi{m.gi}"
    lines = out.split()
    assert [ln for ln in lines if ln.startswith("/proc/")] == [f"{gi}/access", f"{gi}/ci{m.ci}/access"], out
    text = (host / f"proc/driver/nvidia/capabilities/gpu0/mig/gi{m.gi}/access").read_text()
    assert out.endswith(text), out


def test_the_hook_binds_a_mig_devices_access_files(tmp_path, mig0):
    host, m = mig0
    cfg = hookenv.write_config(tmp_path / "c.toml", host, log=tmp_path / "hook.log")
    with hookenv.gpu_container(tmp_path, cfg, ["NVIDIA_VISIBLE_DEVICES=0:0"], PROBE.format(gi=m.gi)) as c:
        r = c.run()
    assert r.returncode == 0, r.stdout + r.stderr
    check(r.stdout, host, m)


def test_a_cdi_spec_binds_a_mig_devices_access_files(tmp_path, mig0):
    from libinject.apply import cdi
    from libinject.apply.spec import apply_cdi

    host, m = mig0
    d = tmp_path / "cdi"
    d.mkdir()
    r = run([NVHOOK, "cdi", "generate", "--driver-root", str(host), "--hook-path", hookenv.ensure_front(),
             "--hook-socket", "none", "-o", str(d / "nvidia.json")], timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads((d / "nvidia.json").read_text())["kind"] == "nvidia.com/gpu"
    edits, missing = cdi.scan([str(d)]).resolve([f"nvidia.com/gpu={m.uuid}"])
    assert not missing
    c = RuncContainer(tmp_path / "c", args=["sh", "-c", PROBE.format(gi=m.gi)], env=["PATH=/usr/bin:/bin"])
    apply_cdi(c.config, edits)
    with c:
        r = c.run()
    assert r.returncode == 0, r.stdout + r.stderr
    check(r.stdout, host, m)


def test_a_cdi_mig_manager_sees_instances_made_after_it_started(tmp_path, fresh_sim_host):
    """nvidia.com/mig-caps=config beside a GPU from CDI: the live capabilities dir is bound
    (as the hook does for NVIDIA_MIG_CONFIG_DEVICES), so a MIG device created after the
    start shows in the container. Old code: a copy of mig/config only."""
    from libinject.apply import cdi
    from libinject.apply.spec import apply_cdi

    host = fresh_sim_host("h100x8-mig")
    d = tmp_path / "cdi"
    d.mkdir()
    r = run([NVHOOK, "cdi", "generate", "--driver-root", str(host), "--hook-path", hookenv.ensure_front(),
             "--hook-socket", "none", "--mode", "gpu,mig-caps", "-o", str(d / "nvidia.json")], timeout=120)
    assert r.returncode == 0, r.stderr
    edits, missing = cdi.scan([str(d)]).resolve(["nvidia.com/gpu=4", "nvidia.com/mig-caps=config"])
    assert not missing
    c = RuncContainer(tmp_path / "c", args=["sleep", "1000"], env=["PATH=/usr/bin:/bin"])
    apply_cdi(c.config, edits)
    ls = "ls /proc/driver/nvidia/capabilities/gpu3/mig 2>&1; cat /proc/driver/nvidia/capabilities/mig/config"
    with c:
        c.create()
        c.start()
        before = c.exec("sh", "-c", ls)
        made = run([NVHOOK, "sim", "mig", str(host), "--gpu", "3", "--create", "1g.10gb"], timeout=60)
        assert made.returncode == 0, made.stderr
        after = c.exec("sh", "-c", ls)
    assert "gi1" not in before.stdout.split() and "DeviceFileMinor: 1" in before.stdout, before.stdout
    assert "gi1" in after.stdout.split(), after.stdout


def test_configure_binds_a_mig_devices_access_files(tmp_path, mig0, rootfs):
    """`nvhook configure` (in a private mount namespace here) binds them into the rootfs."""
    import subprocess

    host, m = mig0
    gi = f"{rootfs}/proc/driver/nvidia/capabilities/gpu0/mig/gi{m.gi}"
    script = (f'"$1" --root "$2" configure --device 0:0 --utility "$3" && '
              f"awk '{{print $5}}' /proc/self/mountinfo | grep /capabilities/ | sort; cat {gi}/access")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", NVHOOK, str(host),
                        str(rootfs)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:2] == [f"{gi}/access", f"{gi}/ci{m.ci}/access"], r.stdout
    assert r.stdout.endswith((host / f"proc/driver/nvidia/capabilities/gpu0/mig/gi{m.gi}/access").read_text())
