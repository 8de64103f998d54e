"""`systemctl daemon-reload` and running GPU containers (issue 30): systemd as PID 1 of a
Debian 12 root booted with systemd-nspawn, nvhook's .deb installed there (the hook served
by nvhook-serve.service, the simulated host bound at /sim), runc 1.1 with its systemd
cgroup driver (--systemd-cgroup: the container in a transient runc-<id>.scope whose
device rules systemd rebuilds from DeviceAllow= on a reload). On cgroup v2 (a unified
machine) and on cgroup v1 (this host's hybrid layout: the v1 devices controller).

No driver behind major 195 here: an open the cgroup lets through fails with ENXIO, one it
blocks with EPERM. The attacks: a hostile container (runc's cgroupfs driver, its spec
choosing the cgroup path) must not get nvhook to grant a device to another unit, neither
by a path whose last part names that unit nor by joining that unit's cgroup.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from support import nspawn

REPO = Path(__file__).resolve().parent.parent
HOOK = {"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["nvidia-container-runtime-hook", "prestart"],
        "timeout": 60}
VERDICT = {"No such device or address": "ENXIO", "Operation not permitted": "EPERM"}


@pytest.fixture(scope="module")
def node_root(tmp_path_factory, deb_package, debian_root):
    """A Debian 12 root with nvhook's package (its driver root: /sim) and a container rootfs."""
    base = tmp_path_factory.mktemp("reload")
    root = debian_root("bookworm", base / "root")
    for bound in ("sim", "bundles"):
        (root / bound).mkdir()
    (root / "root" / deb_package.name).write_bytes(deb_package.read_bytes())
    r = nspawn.chroot(root, "dpkg", "-i", f"/root/{deb_package.name}")
    assert r.returncode == 0, r.stdout + r.stderr
    (root / "root" / deb_package.name).unlink()
    cfg = root / "etc/nvidia-container-runtime/config.toml"
    cfg.write_text(cfg.read_text().replace('#root = "/run/nvidia/driver"', 'root = "/sim"'))
    subprocess.run([str(REPO / ".venv/bin/nvhook"), "sim", "rootfs", str(base / "rootfs")], check=True,
                   capture_output=True, timeout=300)
    (base / "bundles").mkdir()
    return root, base


@pytest.fixture(scope="module", params=["v2", "v1"])
def machine(request, node_root, a100_host):
    root, base = node_root
    m = nspawn.Machine(root, binds=[(a100_host, "/sim"), (base / "bundles", "/bundles")],
                       syscalls="bpf @keyring", cgroup=request.param)
    try:
        m.run("truncate", "-s", "0", "/var/log/nvhook/hook.log")     # this boot's lines only
        yield m
    finally:
        # the containers go before the machine, as on a node (runc's own clean-up)
        in_unit(m, "sh", "-c", "runc --systemd-cgroup delete -f gpu victim; runc delete -f evil1 evil2")
        m.stop()
        subprocess.run(["rm", "-rf", str(base / "bundles")], check=True)
        (base / "bundles").mkdir()


def in_unit(m: nspawn.Machine, *argv: str) -> subprocess.CompletedProcess[str]:
    """argv as a transient service of the machine's systemd: in its cgroup namespace, as
    a node's runtime runs (runc's v1 paths come from /proc/1/cgroup)."""
    return m.run("systemd-run", "--quiet", "--wait", "--pipe", "--collect", "--", *argv)


def start(m: nspawn.Machine, name: str, *, systemd: bool, cgroups_path: str, gpu: str | None,
          binds: dict[str, str]) -> None:
    """A detached runc container `name` (sleep), binds: container path -> machine node."""
    bundle = m.root.parent / "bundles" / name       # (node_root's base: bundles bound at /bundles)
    bundle.mkdir()
    subprocess.run(["cp", "-a", str(m.root.parent / "rootfs"), str(bundle / "rootfs")], check=True)
    subprocess.run(["runc", "spec", "--bundle", str(bundle)], check=True, capture_output=True)
    cfg = json.loads((bundle / "config.json").read_text())
    cfg["process"].update(terminal=False, args=["sleep", "3600"])
    if gpu is not None:
        cfg["process"]["env"].append(f"NVIDIA_VISIBLE_DEVICES={gpu}")
        cfg["hooks"] = {"prestart": [HOOK]}
    cfg["root"]["readonly"] = False
    cfg["linux"]["cgroupsPath"] = cgroups_path
    cfg["mounts"] += [{"destination": d, "type": "bind", "source": s, "options": ["bind"]} for d, s in binds.items()]
    (bundle / "config.json").write_text(json.dumps(cfg))
    runc = "runc --systemd-cgroup" if systemd else "runc"
    r = in_unit(m, "sh", "-c", f"{runc} run -d --bundle /bundles/{name} {name} </dev/null >/dev/null 2>/run/{name}.err;"
                f" rc=$?; cat /run/{name}.err; exit $rc")
    assert r.returncode == 0, r.stdout + r.stderr


def verdicts(m: nspawn.Machine, name: str, *paths: str) -> dict[str, str]:
    """What opening each path inside container `name` gives."""
    probe = "; ".join(f"dd if={p} of=/dev/null count=1 2>&1 | head -1" for p in paths)
    r = in_unit(m, "runc", "exec", name, "sh", "-c", probe)
    assert r.returncode == 0, r.stdout + r.stderr
    out = {}
    for p, line in zip(paths, r.stdout.splitlines()):
        out[p] = next((v for k, v in VERDICT.items() if k in line), line)
    return out


def device_allow(m: nspawn.Machine, unit: str) -> list[str]:
    """unit's DeviceAllow= entries, sorted (a reload reorders them)."""
    r = m.run("systemctl", "show", "-p", "DeviceAllow", unit)
    assert r.returncode == 0, r.stderr
    return sorted(ln.removeprefix("DeviceAllow=") for ln in r.stdout.splitlines())


def reload(m: nspawn.Machine) -> None:
    r = m.run("systemctl", "daemon-reload")
    assert r.returncode == 0, r.stderr


def hook_log(m: nspawn.Machine, name: str) -> str:
    text = m.run("cat", "/var/log/nvhook/hook.log").stdout
    return "\n".join(ln for ln in text.splitlines() if f" {name}: " in ln)


def test_the_gpu_stays_across_a_daemon_reload(machine):
    m = machine
    start(m, "gpu", systemd=True, cgroups_path="system.slice:runc:gpu", gpu="1",
          binds={"/dev/other0": "/sim/dev/nvidia0"})
    paths = ("/dev/nvidia1", "/dev/nvidiactl", "/dev/other0")
    want = {"/dev/nvidia1": "ENXIO", "/dev/nvidiactl": "ENXIO", "/dev/other0": "EPERM"}
    assert verdicts(m, "gpu", *paths) == want
    reload(m)
    assert verdicts(m, "gpu", *paths) == want          # (before nvhook told systemd: all EPERM)
    allow = device_allow(m, "runc-gpu.scope")
    assert "/dev/char/195:1 rw" in allow and "/dev/char/195:255 rw" in allow, allow
    assert not any(a.startswith("/dev/char/195:0 ") for a in allow), allow
    assert "systemd: runc-gpu.scope DeviceAllow= /dev/char/195:255 /dev/char/235:0 /dev/char/235:1 " \
           "/dev/char/195:1 (kept across daemon-reload)" in hook_log(m, "gpu")


@pytest.fixture(scope="module")
def victim(machine):
    """A container without GPUs in runc-victim.scope, the GPU node bound at /dev/other1."""
    start(machine, "victim", systemd=True, cgroups_path="system.slice:runc:victim", gpu=None,
          binds={"/dev/other1": "/sim/dev/nvidia1"})
    assert verdicts(machine, "victim", "/dev/other1") == {"/dev/other1": "EPERM"}
    allow = device_allow(machine, "runc-victim.scope")
    assert not any(a.startswith("/dev/char/195:") for a in allow), allow
    return allow


def test_a_path_naming_another_units_scope_gets_it_nothing(machine, victim):
    m = machine
    # The hostile spec's cgroup ends in the victim's unit name, elsewhere in the tree.
    start(m, "evil1", systemd=False, cgroups_path="/evil.slice/runc-victim.scope", gpu="1", binds={})
    assert verdicts(m, "evil1", "/dev/nvidia1") == {"/dev/nvidia1": "ENXIO"}    # its own grant holds
    assert device_allow(m, "runc-victim.scope") == victim       # nothing of major 195 added
    # (systemd has no unit for that path: runc made it, not systemd)
    assert re.search(r"systemd: runc-victim.scope not told of the devices: systemd has pid \d+ in no unit$",
                     hook_log(m, "evil1"), re.M), hook_log(m, "evil1")
    reload(m)
    assert verdicts(m, "victim", "/dev/other1") == {"/dev/other1": "EPERM"}


def test_joining_another_units_cgroup_gets_that_unit_nothing(machine, victim):
    m = machine
    # The hostile spec's cgroup is the victim's own: the device rule nvhook writes there
    # reaches the victim too (as with NVIDIA's hook), until systemd next rebuilds it;
    # the victim's unit is not told, so that rebuild takes it away again.
    start(m, "evil2", systemd=False, cgroups_path="/system.slice/runc-victim.scope", gpu="1", binds={})
    assert device_allow(m, "runc-victim.scope") == victim       # nothing of major 195 added
    assert re.search(r"systemd: runc-victim.scope not told of the devices: \S+ also holds process \d+",
                     hook_log(m, "evil2")), hook_log(m, "evil2")
    reload(m)
    assert verdicts(m, "victim", "/dev/other1") == {"/dev/other1": "EPERM"}
