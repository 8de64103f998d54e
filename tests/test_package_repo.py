"""nvhook from its signed apt repository (`make repo`: packaging/build_repo.py), served on
127.0.0.1, the way NVIDIA's toolkit is installed: fresh Debian 11, 12 and 13 roots
(mmdebstrap: systemd and runc, no Python, no compiler, no other source) get the key and
the list, `apt-get update`, `apt-get install nvhook`; the CLI, the hook's front and the
simulated GPU (prebuilt: no compiler there) run. Debian 12 and 13 are then booted with
systemd-nspawn: the service is up, doctor passes, runc's GPU container is served, and
`apt-get upgrade` to a later release published to the same repository runs under a
stream of GPU container starts, none of which fails.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from support import nspawn, packaging
from support.hookenv import gpu_uuids as sim_uuids

REPO = Path(__file__).resolve().parent.parent
VERSION = packaging.VERSION
NEXT = packaging.NEXT_VERSION
HOOK_ALT = "/usr/bin/nvidia-container-runtime-hook"
SUITES = ("bullseye", "bookworm", "trixie")
BOOTED = ("bookworm", "trixie")


def _chroot_ok(root: Path, *argv: str, timeout: float = 600) -> str:
    """argv chrooted into root, with a /proc of its own there (the fronts find themselves
    through /proc/self/exe), as a node's shell has."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive"}
    r = subprocess.run(["unshare", "-m", "-p", "-f", "--propagation", "private", "sh", "-c",
                        'mount --bind "$0" "$0" && mount -t proc proc "$0/proc" && exec chroot "$0" "$@"',
                        str(root), *argv],
                       capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, f"{argv}: {r.stdout[-2000:]}{r.stderr[-2000:]}"
    return r.stdout


@pytest.fixture(scope="module", params=SUITES)
def installed(request, tmp_path_factory, debian_root, package_repo):
    """(suite, a root with nvhook installed from the repository, apt-get install's output)."""
    suite = request.param
    base = tmp_path_factory.mktemp(f"apt-{suite}")
    root = debian_root(suite, base / "root")
    # This node's only source is nvhook's repository.
    (root / "etc/apt/sources.list").write_text("")
    for f in (root / "etc/apt/sources.list.d").iterdir():
        f.unlink()
    packaging.add_apt_repo(root, package_repo)
    _chroot_ok(root, "apt-get", "update")
    out = _chroot_ok(root, "apt-get", "install", "-y", "nvhook")
    return suite, root, out


def test_apt_installs_it_and_it_runs_without_a_compiler(installed):
    suite, root, _out = installed
    assert not (root / "usr/bin/gcc").exists() and not (root / "usr/bin/python3").exists()
    assert _chroot_ok(root, "nvhook", "--version") == f"nvhook {VERSION}\n"
    assert _chroot_ok(root, "nvhook-hook", "--version") == f"nvhook {VERSION}\n"
    _chroot_ok(root, "nvhook", "sim", "create", "/tmp/gpuhost", "--profile", "a100x8")
    info = _chroot_ok(root, "nvhook", "--root", "/tmp/gpuhost", "info")
    assert "NVRM version:   550.163.01" in info, info
    assert len(re.findall(r"GPU-[0-9a-f-]{36}", info)) == 8, info
    status = _chroot_ok(root, "dpkg-query", "-W", "-f", "${Status} ${Version}", "nvhook")
    assert status == f"install ok installed {VERSION}"


@pytest.fixture(scope="module")
def booted(installed, a100_host, tmp_path_factory):
    suite, root, _out = installed
    for bound in ("sim", "bundle"):
        (root / bound).mkdir()
    cfg = root / "etc/nvidia-container-runtime/config.toml"
    cfg.write_text(cfg.read_text().replace('#root = "/run/nvidia/driver"', 'root = "/sim"'))
    bundle = tmp_path_factory.mktemp(f"bundle-{suite}")
    subprocess.run([str(REPO / ".venv/bin/nvhook"), "sim", "rootfs", str(bundle / "rootfs")], check=True,
                   capture_output=True, timeout=300)
    r = subprocess.run(["runc", "spec", "--bundle", str(bundle)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"].update(terminal=False, args=["sh", "-c", "nvidia-smi -L"],
                           env=spec["process"]["env"] + ["NVIDIA_VISIBLE_DEVICES=1"])
    spec["root"]["readonly"] = False
    spec["hooks"] = {"prestart": [{"path": HOOK_ALT, "args": ["nvidia-container-runtime-hook", "prestart"],
                                   "timeout": 60}]}
    (bundle / "config.json").write_text(json.dumps(spec))
    machine = nspawn.Machine(root, binds=[(a100_host, "/sim"), (bundle, "/bundle")])
    try:
        yield suite, root, machine
    finally:
        machine.stop()


@pytest.mark.parametrize("installed", BOOTED, indirect=True)
def test_booted_the_service_is_up_doctor_passes_and_a_container_is_served(booted, a100_host):
    _suite, _root, machine = booted
    assert machine.run("systemctl", "is-active", "nvhook-serve.service").stdout == "active\n"
    r = machine.run("nvhook", "doctor")
    assert r.returncode == 0 and all(ln.startswith("OK ") for ln in r.stdout.splitlines()), r.stdout + r.stderr
    r = machine.run("runc", "run", "--bundle", "/bundle", "first")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.findall(r"UUID: (GPU-[0-9a-f-]+)", r.stdout) == [sim_uuids(a100_host)[1]], r.stdout
    journal = machine.journal_has("nvhook-serve.service", r"request from pid \d+: status 0 in ")
    assert re.search(r"request from pid \d+: status 0 in ", journal), journal


STREAM = """i=0
while [ ! -e /run/stop-stream ]; do
    i=$((i+1))
    if runc run --bundle /bundle "s$i" > /run/stream.out 2>&1 && grep -q 'UUID: GPU-' /run/stream.out; then
        echo "ok $i"
    else
        echo "FAIL $i"; cat /run/stream.out
    fi
done
"""


def _oks(log: Path) -> int:
    return len(re.findall(r"^ok \d+$", log.read_text(), re.M))


def _wait_oks(log: Path, n: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while _oks(log) < n:
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"the stream made no progress: {log.read_text()[-2000:]}"
        time.sleep(0.2)


@pytest.mark.parametrize("installed", BOOTED, indirect=True)
def test_apt_get_upgrade_under_a_stream_of_gpu_starts(booted, package_repo, next_deb_package, rpm_package,
                                                      deb_package, tmp_path):
    _suite, root, machine = booted
    package_repo.publish(deb_package, next_deb_package, rpm_package)
    try:
        _upgrade_under_a_stream(root, machine, tmp_path / "stream.log")
    finally:
        package_repo.publish(deb_package, rpm_package)     # as it was, for the next suite


def _upgrade_under_a_stream(root: Path, machine: nspawn.Machine, log: Path) -> None:
    stream = machine.popen("sh", "-c", STREAM, log=log)
    try:
        _wait_oks(log, 1, stream)
        r = machine.run("apt-get", "update", timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        r = machine.run("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "upgrade", "-y", timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        done = _oks(log)
        _wait_oks(log, done + 2, stream)      # starts after the upgrade too
    finally:
        machine.run("touch", "/run/stop-stream")
        stream.wait(120)
    text = log.read_text()
    assert "FAIL" not in text, text[-3000:]
    assert machine.run("nvhook", "--version").stdout == f"nvhook {NEXT}\n"
    assert machine.run("systemctl", "is-active", "nvhook-serve.service").stdout == "active\n"
    pid = machine.run("systemctl", "show", "-P", "MainPID", "nvhook-serve.service").stdout.strip()
    assert machine.run("readlink", f"/proc/{pid}/exe").stdout.strip() == f"/usr/lib/nvhook/{NEXT}/bin/python3.11"
    assert sorted(os.listdir(root / "usr/lib/nvhook")) == sorted([NEXT, "bin", "current"])


# ---------------------------------------------------------------- the repository itself

def test_the_apt_repository_is_signed_by_its_key(package_repo, tmp_path):
    deb = package_repo.dir / "deb"
    for sig, data in (("InRelease", None), ("Release.gpg", "Release")):
        argv = ["gpgv", "--keyring", str(package_repo.dir / "nvhook.gpg"), str(deb / sig)]
        r = subprocess.run(argv + ([str(deb / data)] if data else []), capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    forged = tmp_path / "Release"
    forged.write_text((deb / "Release").read_text().replace("Origin: nvhook", "Origin: other"))
    r = subprocess.run(["gpgv", "--keyring", str(package_repo.dir / "nvhook.gpg"), str(deb / "Release.gpg"),
                        str(forged)], capture_output=True, text=True)
    assert r.returncode != 0


def test_only_the_public_key_is_published_and_the_secret_stays_closed(package_repo):
    for name in ("nvhook.gpg", "gpgkey"):
        r = subprocess.run(["gpg", "--list-packets", str(package_repo.dir / name)], capture_output=True, text=True)
        kinds = re.findall(r"^:(\w[\w ]*?) packet:", r.stdout, re.M)
        assert "public key" in kinds and not [k for k in kinds if "secret" in k], (name, kinds)
    home = package_repo.key
    assert os.stat(home).st_mode & 0o777 == 0o700
    keys = list((home / "private-keys-v1.d").iterdir())
    assert keys and all(os.stat(k).st_mode & 0o077 == 0 and os.stat(k).st_uid == os.geteuid() for k in keys)
    assert not list(package_repo.dir.rglob("*.key")) and not list(package_repo.dir.rglob("private-keys*"))


def test_a_key_dir_others_can_write_is_refused(tmp_path, deb_package):
    """The signing key's GNUPGHOME: a directory another user owns or can write would let
    them put their key in (or read ours); the builder refuses it and writes nothing."""
    for mode, owner in ((0o777, 0), (0o700, 1000)):
        home = tmp_path / f"key-{mode:o}-{owner}"
        home.mkdir()
        os.chmod(home, mode)
        os.chown(home, owner, owner)
        out = tmp_path / f"repo-{mode:o}-{owner}"
        r = subprocess.run([str(REPO / ".venv/bin/python"), str(REPO / "packaging/build_repo.py"), str(out),
                            str(deb_package), "--gnupghome", str(home)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and r.stderr.startswith(f"nvhook: {home}: the signing key's directory must be")
        assert len(r.stderr.splitlines()) == 1 and not out.exists() and list(home.iterdir()) == []


def test_a_key_dir_another_user_could_swap_is_refused(tmp_path):
    """The key dir in a directory another user can write (not sticky): gpg is handed a path,
    so between the builder's checks and gpg's use they can move it aside and put there a link
    to another 0700 directory of the builder's (here the builder's own keyring): the
    repository would be signed with, and would publish, that key. The race is won on
    purpose: a gpg first on PATH lets the other user (nobody) move before gpg runs."""
    shared = Path(tempfile.mkdtemp(prefix="nvhkey", dir="/tmp"))
    personal = tmp_path / "personal"
    personal.mkdir(mode=0o700)
    try:
        shared.chmod(0o777)
        subprocess.run(["gpg", "--homedir", str(personal), "--batch", "--quiet", "--passphrase", "",
                        "--quick-gen-key", "builder's own <me@localhost>", "ed25519", "sign", "0"],
                       check=True, capture_output=True, timeout=120)
        pkg = tmp_path / "pkg"
        (pkg / "DEBIAN").mkdir(parents=True)
        (pkg / "DEBIAN/control").write_text("Package: tiny\nVersion: 1\nArchitecture: all\n"
                                            "Maintainer: t <t@localhost>\nDescription: t\n")
        subprocess.run(["dpkg-deb", "-Zgzip", "--build", str(pkg), str(tmp_path / "tiny.deb")], check=True,
                       capture_output=True, timeout=60)
        bindir, moved = tmp_path / "bin", tmp_path / "moved"
        bindir.mkdir()
        (bindir / "gpg").write_text(
            f"#!/bin/sh\nif [ ! -e {moved} ]; then : > {moved}\n"
            f"  setpriv --reuid=65534 --regid=65534 --clear-groups sh -c "
            f"'mv {shared}/key {shared}/old && ln -s {personal} {shared}/key'\nfi\n"
            f"exec {shutil.which('gpg')} \"$@\"\n")
        (bindir / "gpg").chmod(0o755)
        out = tmp_path / "repo"
        r = subprocess.run([str(REPO / ".venv/bin/python"), str(REPO / "packaging/build_repo.py"), str(out),
                            str(tmp_path / "tiny.deb"), "--gnupghome", str(shared / "key")],
                           capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"})
        assert not (out / "nvhook.gpg").exists()       # no key published, no Release signed
        assert r.returncode == 1 and r.stderr == (
            f"nvhook: {shared}: above the signing key's directory, owned by uid 0 with mode 777: "
            "another user could swap the key directory there\n"), r.stderr
        assert not moved.exists() and os.listdir(shared) == []
    finally:
        for home in (personal, shared / "key"):
            subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True)
        shutil.rmtree(shared, ignore_errors=True)


def test_sim_create_without_a_compiler_or_prebuilt_objects_says_so_in_one_line(tmp_path):
    """A checkout carries no prebuilt objects (only packages do): with no gcc on PATH and an
    empty cache, sim create names what it needs in one line and leaves nothing."""
    env = {"PATH": str(tmp_path / "nothing"), "NVHOOK_SIM_CACHE": str(tmp_path / "cache")}
    r = subprocess.run([str(REPO / ".venv/bin/nvhook"), "sim", "create", str(tmp_path / "host")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("nvhook: simulated GPU: ") and "needs gcc (apt-get install gcc libc6-dev)" in r.stderr
    assert len(r.stderr.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
