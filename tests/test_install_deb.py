"""nvhook's Debian package (`make deb`: packaging/build_deb.py), installed into a fresh
Debian 12 root (mmdebstrap) and booted there with systemd-nspawn, as a node would: its
postinst (run in a chroot, as an image build runs it) enables the warm service, so the
root's own systemd starts it at boot; `nvhook doctor` passes on a simulated GPU root; a
GPU container started through runc with the `nvidia-container-runtime-hook` alternative
sees exactly its GPU and is served (the service's journal says so); an upgrade restarts
the service on the new files; `dpkg --purge` leaves the root's file list as it was.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from support import nspawn, packaging
from support.hookenv import gpu_uuids as sim_uuids

REPO = Path(__file__).resolve().parent.parent
VERSION = __import__("libinject").__version__
HOOK_ALT = "/usr/bin/nvidia-container-runtime-hook"
FRONT = "/usr/lib/nvhook/bin/nvhook-hook"


@pytest.fixture(scope="module")
def deb(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("deb")
    deb = out / f"nvhook_{VERSION}_amd64.deb"
    assert packaging.build("build_deb.py", str(out)) == [str(deb)]
    return deb


@pytest.fixture(scope="module")
def node(tmp_path_factory, deb, a100_host):
    """(root, its file list before the install, the machine booted after the install)."""
    base = tmp_path_factory.mktemp("node")
    root = nspawn.debootstrap(base / "root")
    for bound in ("sim", "bundle"):
        (root / bound).mkdir()
    # One boot before the install: what a first boot makes is in the "before" list too.
    nspawn.Machine(root).stop()
    before = nspawn.file_list(root)
    shutil.copy(deb, root / "root" / deb.name)
    r = nspawn.chroot(root, "dpkg", "-i", f"/root/{deb.name}")
    assert r.returncode == 0, r.stdout + r.stderr
    (root / "root" / deb.name).unlink()
    # The administrator's one edit: the driver root (here the simulated host, bound at /sim).
    cfg = root / "etc/nvidia-container-runtime/config.toml"
    cfg.write_text(cfg.read_text().replace('#root = "/run/nvidia/driver"', 'root = "/sim"'))
    bundle = base / "bundle"
    subprocess.run([str(REPO / ".venv/bin/nvhook"), "sim", "rootfs", str(bundle / "rootfs")], check=True,
                   capture_output=True, timeout=300)
    machine = nspawn.Machine(root, binds=[(a100_host, "/sim"), (bundle, "/bundle")])
    try:
        yield root, before, machine, bundle
    finally:
        machine.stop()


def test_the_package_holds_the_install_and_its_scripts(deb):
    info = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True).stdout
    assert f"Version: {VERSION}\n" in info and "Architecture: amd64\n" in info
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    names = {ln.split()[5].lstrip(".") for ln in listing.splitlines()}
    for want in (FRONT, "/usr/lib/nvhook/bin/nvhook-runtime", "/usr/lib/nvhook/bin/nvhook",
                 "/usr/lib/systemd/system/nvhook-serve.service", "/usr/lib/systemd/system/nvhook-cdi-refresh.service",
                 "/usr/share/nvhook/config.toml", "/usr/bin/nvhook"):
        assert want in names, want
    # Nothing of the machine that built it: every owner root, no staging path in a unit.
    assert all(" root/root " in ln for ln in listing.splitlines())
    assert not any("/etc/nvidia-container-runtime/config.toml" == n for n in names)   # postinst's, not a file


def test_postinst_in_a_chroot_enables_the_service_and_installs_the_config(node):
    root, _before, _machine, _bundle = node
    wants = root / "etc/systemd/system/multi-user.target.wants"
    assert (wants / "nvhook-serve.service").is_symlink() and (wants / "nvhook-cdi-refresh.service").is_symlink()
    assert (root / "etc/alternatives/nvidia-container-runtime-hook").readlink() == Path(FRONT)
    unit = (root / "usr/lib/systemd/system/nvhook-serve.service").read_text()
    assert f"ExecStart={FRONT} serve\n" in unit
    text = (root / "etc/nvidia-container-runtime/config.toml").read_text()
    assert 'log-file = "/var/log/nvhook/hook.log"' in text


def test_the_service_is_up_after_boot_and_doctor_passes(node):
    _root, _before, machine, _bundle = node
    assert machine.run("systemctl", "is-active", "nvhook-serve.service").stdout == "active\n"
    r = machine.run("nvhook", "doctor")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines and all(ln.startswith("OK ") for ln in lines), r.stdout
    assert any(ln.startswith("OK   service:") and "GPU containers are served" in ln for ln in lines), r.stdout
    assert any(ln.startswith("OK   driver:") and "8 GPU(s) under /sim" in ln for ln in lines), r.stdout


def _bundle_config(bundle: Path, args: list[str], env: list[str]) -> None:
    r = subprocess.run(["runc", "spec", "--bundle", str(bundle)], capture_output=True, text=True)
    if r.returncode != 0 and "exists" not in r.stderr:
        raise AssertionError(r.stderr)
    cfg = json.loads((bundle / "config.json").read_text())
    cfg["process"].update(terminal=False, args=args, env=cfg["process"]["env"] + env)
    cfg["root"]["readonly"] = False
    cfg["hooks"] = {"prestart": [{"path": HOOK_ALT, "args": ["nvidia-container-runtime-hook", "prestart"],
                                  "timeout": 60}]}
    (bundle / "config.json").write_text(json.dumps(cfg))


def test_a_gpu_container_through_runc_is_served(node, a100_host):
    _root, _before, machine, bundle = node
    uuids = sim_uuids(a100_host)
    _bundle_config(bundle, ["sh", "-c", "nvidia-smi -L"], ["NVIDIA_VISIBLE_DEVICES=1"])
    r = machine.run("runc", "run", "--bundle", "/bundle", "gpu1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.findall(r"UUID: (GPU-[0-9a-f-]+)", r.stdout) == [uuids[1]], r.stdout
    journal = machine.run("journalctl", "-u", "nvhook-serve.service", "--no-pager", "-o", "cat").stdout
    assert re.search(r"request from pid \d+: status 0 in ", journal), journal
    log = machine.run("cat", "/var/log/nvhook/hook.log").stdout
    assert "gpu1: prestart: done" in log, log


def test_an_upgrade_restarts_the_service_on_the_new_files(node, deb):
    root, _before, machine, _bundle = node
    pid = machine.run("systemctl", "show", "-P", "MainPID", "nvhook-serve.service").stdout.strip()
    shutil.copy(deb, root / "root" / deb.name)
    try:
        r = machine.run("dpkg", "-i", f"/root/{deb.name}", timeout=300)
    finally:
        (root / "root" / deb.name).unlink()
    assert r.returncode == 0, r.stdout + r.stderr
    assert machine.run("systemctl", "is-active", "nvhook-serve.service").stdout == "active\n"
    assert machine.run("systemctl", "show", "-P", "MainPID", "nvhook-serve.service").stdout.strip() not in ("0", pid)
    # the config the administrator edited is left as it is
    assert 'root = "/sim"' in (root / "etc/nvidia-container-runtime/config.toml").read_text()


def test_purge_leaves_the_root_as_before(node):
    """Last in this file: it stops the machine."""
    root, before, machine, _bundle = node
    machine.stop()
    r = nspawn.chroot(root, "dpkg", "--purge", "nvhook")
    assert r.returncode == 0, r.stdout + r.stderr
    after = nspawn.file_list(root)
    assert ({k: v for k, v in after.items() if before.get(k) != v},
            {k: v for k, v in before.items() if after.get(k) != v}) == ({}, {})
