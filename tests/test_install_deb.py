"""nvhook's Debian package (`make deb`: packaging/build_deb.py), installed into a fresh
Debian 12 root (mmdebstrap: no Python, no compiler) and booted there with systemd-nspawn,
as a node would: its
postinst (run in a chroot, as an image build runs it) enables the warm service, so the
root's own systemd starts it at boot; `nvhook doctor` passes on a simulated GPU root; a
GPU container started through runc with the `nvidia-container-runtime-hook` alternative
sees exactly its GPU and is served (the service's journal says so); an upgrade to a later
release restarts the service on the new files; `dpkg --purge` leaves the root's file list
as it was. The log dir's set-up and purge, against what another principal planted there
(issue 32), run in a chroot of another copy of the root.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from support import nspawn, packaging
from support.hookenv import gpu_uuids as sim_uuids

REPO = Path(__file__).resolve().parent.parent
VERSION = packaging.VERSION
HOOK_ALT = "/usr/bin/nvidia-container-runtime-hook"
FRONT = "/usr/lib/nvhook/current/bin/nvhook-hook"


@pytest.fixture(scope="module")
def deb(deb_package) -> Path:
    return deb_package


@pytest.fixture(scope="module")
def node(tmp_path_factory, deb, a100_host, debian_root):
    """(root, its file list before the install, the machine booted after the install)."""
    base = tmp_path_factory.mktemp("node")
    root = debian_root("bookworm", base / "root")
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
    tree = f"/usr/lib/nvhook/{VERSION}"
    for want in (f"{tree}/bin/nvhook-hook", f"{tree}/bin/nvhook-runtime", f"{tree}/bin/nvhook",
                 f"{tree}/bin/python3.11", f"{tree}/lib/ld-linux-x86-64.so.2", "/usr/lib/nvhook/current",
                 "/usr/lib/systemd/system/nvhook-serve.service", "/usr/lib/systemd/system/nvhook-cdi-refresh.service",
                 "/usr/share/nvhook/config.toml", "/usr/bin/nvhook", "/usr/share/doc/nvhook/copyright",
                 "/usr/lib/udev/rules.d/71-nvhook-dev-char.rules", "/usr/lib/systemd/system/nvhook-dev-char.service"):
        assert want in names, want
    assert f"./usr/lib/nvhook/current -> {VERSION}\n" in listing
    # Nothing of the machine that built it: every owner root, no staging path in a unit.
    assert all(" root/root " in ln for ln in listing.splitlines())
    assert not any("/etc/nvidia-container-runtime/config.toml" == n for n in names)   # postinst's, not a file
    # It needs nothing of the node's userland: no distribution Python, no libc of a version.
    assert "Depends:" not in info and "Pre-Depends:" not in info


def test_the_package_has_md5sums_of_every_file(deb, tmp_path):
    subprocess.run(["dpkg-deb", "-R", str(deb), str(tmp_path / "x")], check=True, timeout=300)
    sums = (tmp_path / "x/DEBIAN/md5sums").read_text().splitlines()
    files = {str(p.relative_to(tmp_path / "x")) for p in (tmp_path / "x").rglob("*")
             if p.is_file() and not p.is_symlink() and "DEBIAN" not in p.parts}
    assert {ln.split("  ", 1)[1] for ln in sums} == files
    r = subprocess.run(["md5sum", "--quiet", "-c", str(tmp_path / "x/DEBIAN/md5sums")], cwd=tmp_path / "x",
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_postinst_in_a_chroot_enables_the_service_and_installs_the_config(node):
    root, _before, _machine, _bundle = node
    wants = root / "etc/systemd/system/multi-user.target.wants"
    assert (wants / "nvhook-serve.service").is_symlink() and (wants / "nvhook-cdi-refresh.service").is_symlink()
    assert (wants / "nvhook-dev-char.service").is_symlink()
    assert (root / "etc/alternatives/nvidia-container-runtime-hook").readlink() == Path(FRONT)
    unit = (root / "usr/lib/systemd/system/nvhook-serve.service").read_text()
    assert f"ExecStart={FRONT} serve\n" in unit
    text = (root / "etc/nvidia-container-runtime/config.toml").read_text()
    assert 'log-file = "/var/log/nvhook/hook.log"' in text


def test_the_service_is_up_after_boot_and_doctor_passes(node):
    _root, _before, machine, _bundle = node
    assert machine.run("systemctl", "is-active", "nvhook-serve.service").stdout == "active\n"
    # the boot's /dev/char run (oneshot) succeeded: no driver there, nothing to link
    r = machine.run("systemctl", "show", "-p", "Result", "nvhook-dev-char.service")
    assert r.stdout == "Result=success\n", r.stdout + r.stderr
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
    journal = machine.journal_has("nvhook-serve.service", r"request from pid \d+: status 0 in ")
    assert re.search(r"request from pid \d+: status 0 in ", journal), journal
    log = machine.run("cat", "/var/log/nvhook/hook.log").stdout
    assert "gpu1: prestart: done" in log, log


def test_an_upgrade_restarts_the_service_on_the_new_files(node, next_deb_package):
    root, _before, machine, _bundle = node
    deb = next_deb_package
    pid = machine.run("systemctl", "show", "-P", "MainPID", "nvhook-serve.service").stdout.strip()
    shutil.copy(deb, root / "root" / deb.name)
    try:
        r = machine.run("dpkg", "-i", f"/root/{deb.name}", timeout=300)
    finally:
        (root / "root" / deb.name).unlink()
    assert r.returncode == 0, r.stdout + r.stderr
    assert machine.run("systemctl", "is-active", "nvhook-serve.service").stdout == "active\n"
    new_pid = machine.run("systemctl", "show", "-P", "MainPID", "nvhook-serve.service").stdout.strip()
    assert new_pid not in ("0", pid)
    exe = machine.run("readlink", f"/proc/{new_pid}/exe").stdout.strip()
    assert exe == f"/usr/lib/nvhook/{packaging.NEXT_VERSION}/bin/python3.11"
    assert machine.run("nvhook", "--version").stdout == f"nvhook {packaging.NEXT_VERSION}\n"
    assert not (root / f"usr/lib/nvhook/{VERSION}").exists()   # the old release's tree is gone
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


# ---------------------------------------------------------------- the log dir (issue 32)
# postinst makes /var/log/nvhook, which every start then writes as root. Where /var/log is
# writable by others (Ubuntu: root:syslog 0775; a log shipper given the host's /var/log),
# what is there already may be someone else's.

@pytest.fixture(scope="module")
def chroot_root(tmp_path_factory, debian_root):
    return debian_root("bookworm", tmp_path_factory.mktemp("logdir") / "root")


def _install(root: Path, deb: Path) -> subprocess.CompletedProcess[str]:
    shutil.copy(deb, root / "root" / deb.name)
    try:
        return nspawn.chroot(root, "dpkg", "-i", f"/root/{deb.name}")
    finally:
        (root / "root" / deb.name).unlink()


def _purge(root: Path) -> None:
    r = nspawn.chroot(root, "dpkg", "--purge", "nvhook")
    assert r.returncode == 0, r.stdout + r.stderr


def _aside(root: Path) -> list[Path]:
    return sorted((root / "var/log").glob("nvhook.untrusted.*"))


def _clean(root: Path, *paths: Path) -> None:
    """The root as it was, whatever the test left (so each test starts from a clean one)."""
    nspawn.chroot(root, "dpkg", "--purge", "nvhook")
    for p in [*_aside(root), *paths, root / "var/log/nvhook", root / "var/lib/nvhook"]:
        if p.is_symlink() or p.is_file():
            p.unlink()
        elif p.exists():
            shutil.rmtree(p)


def test_postinst_does_not_follow_a_planted_log_dir_link(chroot_root, deb):
    root = chroot_root
    target = root / "srv/victim"
    target.mkdir(parents=True)
    os.chmod(target, 0o755)
    (root / "var/log/nvhook").symlink_to("/srv/victim")
    try:
        r = _install(root, deb)
        assert r.returncode == 0, r.stdout + r.stderr
        assert os.stat(target).st_mode & 0o7777 == 0o755          # the link's target untouched
        log = root / "var/log/nvhook"
        st = os.lstat(log)
        assert not log.is_symlink() and st.st_uid == 0 and st.st_mode & 0o7777 == 0o750
        [aside] = _aside(root)
        assert os.readlink(aside) == "/srv/victim"
        assert "nvhook: /var/log/nvhook was not a directory only root can write" in r.stderr
        assert f"moved to /var/log/{aside.name}" in r.stderr
        _purge(root)
        assert not log.exists() and target.is_dir()
    finally:
        _clean(root, target)


def test_postinst_does_not_adopt_another_users_log_dir(chroot_root, deb):
    root = chroot_root
    log = root / "var/log/nvhook"
    log.mkdir()
    os.chown(log, 1000, 1000)
    (log / "hook.log").write_text("theirs\n")
    try:
        r = _install(root, deb)
        assert r.returncode == 0, r.stdout + r.stderr
        st = os.lstat(log)
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (0, 0, 0o750)
        assert list(log.iterdir()) == []
        [aside] = _aside(root)
        assert (aside / "hook.log").read_text() == "theirs\n" and os.stat(aside).st_uid == 1000
        _purge(root)
        assert not log.exists() and (aside / "hook.log").exists()   # theirs is left to them
    finally:
        _clean(root, log)


def test_purge_leaves_a_log_dir_the_package_did_not_make(chroot_root, deb):
    root = chroot_root
    log = root / "var/log/nvhook"
    log.mkdir(mode=0o700)
    (log / "admin.log").write_text("the administrator's\n")
    try:
        r = _install(root, deb)
        assert r.returncode == 0, r.stdout + r.stderr
        assert _aside(root) == [] and (log / "admin.log").exists()   # root's own dir: kept as it is
        assert os.stat(log).st_mode & 0o7777 == 0o700
        _purge(root)
        assert (log / "admin.log").read_text() == "the administrator's\n"
    finally:
        _clean(root, log)
