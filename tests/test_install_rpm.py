"""nvhook's rpm (`make rpm`: packaging/build_rpm.py, the .deb's payload): it requires no
distribution Python (nothing but /bin/sh for its scriptlets); installed with `rpm --root`
into a fresh root its scriptlets run (the alternative, the default config, the log dir,
the units enabled) and the install runs; its repository's metadata and the package verify
against the repository's key; an erase takes back what the scriptlets did but the
administrator's config. Its %post against a log dir a second user planted (issue 32).

The fresh root is a Debian one (mmdebstrap; this machine builds no RHEL root): its rpm
database is empty, so /bin/sh, which the root has, is in no rpm's provides (--nodeps).
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from support import nspawn, packaging

VERSION = packaging.VERSION
FRONT = "/usr/lib/nvhook/current/bin/nvhook-hook"


def _rpm(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["rpm", "--root", str(root), *args], capture_output=True, text=True, timeout=600)


def test_it_requires_no_distribution_python(rpm_package):
    reqs = subprocess.run(["rpm", "-qp", "--requires", str(rpm_package)], capture_output=True, text=True,
                          check=True).stdout.split("\n")
    assert {r for r in reqs if r and not r.startswith("rpmlib(")} == {"/bin/sh"}, reqs


@pytest.fixture(scope="module")
def rpm_root(tmp_path_factory, debian_root, rpm_package, package_repo):
    root = debian_root("bookworm", tmp_path_factory.mktemp("rpmroot") / "root")
    r = _rpm(root, "--import", str(package_repo.dir / "gpgkey"))
    assert r.returncode == 0, r.stderr
    r = _rpm(root, "-i", "--nodeps", str(package_repo.dir / "rpm" / rpm_package.name))
    assert r.returncode == 0, r.stdout + r.stderr
    return root


def test_its_scriptlets_ran_in_the_root(rpm_root):
    root = rpm_root
    assert (root / "etc/alternatives/nvidia-container-runtime-hook").readlink() == Path(FRONT)
    wants = root / "etc/systemd/system/multi-user.target.wants"
    assert (wants / "nvhook-serve.service").is_symlink() and (wants / "nvhook-cdi-refresh.service").is_symlink()
    assert 'log-file = "/var/log/nvhook/hook.log"' in (root / "etc/nvidia-container-runtime/config.toml").read_text()
    st = (root / "var/log/nvhook").lstat()
    assert (st.st_uid, st.st_mode & 0o7777) == (0, 0o750)
    r = nspawn.chroot(root, "nvhook", "--version")
    assert r.stdout == f"nvhook {VERSION}\n", r.stderr


def test_the_repository_and_the_package_verify_against_its_key(rpm_root, package_repo, tmp_path):
    rpmdir = package_repo.dir / "rpm"
    r = subprocess.run(["gpgv", "--keyring", str(package_repo.dir / "nvhook.gpg"),
                        str(rpmdir / "repodata/repomd.xml.asc"), str(rpmdir / "repodata/repomd.xml")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    forged = tmp_path / "repomd.xml"
    forged.write_bytes((rpmdir / "repodata/repomd.xml").read_bytes().replace(b"<revision>", b"<revision>1"))
    r = subprocess.run(["gpgv", "--keyring", str(package_repo.dir / "nvhook.gpg"),
                        str(rpmdir / "repodata/repomd.xml.asc"), str(forged)], capture_output=True, text=True)
    assert r.returncode != 0
    [rpm] = rpmdir.glob("*.rpm")
    r = _rpm(rpm_root, "-K", str(rpm))
    assert r.returncode == 0 and r.stdout.rstrip().endswith("digests signatures OK"), r.stdout + r.stderr


def test_an_erase_takes_back_what_the_scriptlets_did(rpm_root):
    root = rpm_root
    r = _rpm(root, "-e", "nvhook")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (root / "usr/lib/nvhook").exists() and not (root / "usr/bin/nvhook").exists()
    assert not (root / "etc/alternatives/nvidia-container-runtime-hook").exists()
    assert not (root / "etc/systemd/system/multi-user.target.wants/nvhook-serve.service").is_symlink()
    assert (root / "etc/nvidia-container-runtime/config.toml").is_file()   # the administrator's, kept


# ------------------------------------------------- the scriptlets against a planted log dir
# %post is the .deb's postinst: it makes /var/log/nvhook, which every start then writes as
# root, and /var/lib/nvhook (keys, its marks). Here /var/log is Ubuntu's (root:syslog 0775;
# a log shipper's group) and /var/lib as open (standing in for a container given the host's
# /var/lib), the planter a real second user of that group (nobody:nogroup) working inside
# the root, and the install the real `rpm --root` (its scriptlets chrooted into the root).

@pytest.fixture(scope="module")
def planted_root(tmp_path_factory, debian_root, package_repo):
    root = debian_root("bookworm", tmp_path_factory.mktemp("rpmplant") / "root")
    for d in ("var/log", "var/lib"):
        os.chown(root / d, 0, 65534)
        os.chmod(root / d, 0o775)
    return root


def _as_nobody(root: Path, script: str) -> None:
    r = subprocess.run(["chroot", "--userspec=65534:65534", str(root), "sh", "-ec", script],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def _aside(root: Path, under: str = "var/log") -> list[Path]:
    return sorted((root / under).glob("nvhook.untrusted.*"))


def _install(root: Path, package_repo, rpm_package) -> subprocess.CompletedProcess[str]:
    return _rpm(root, "-i", "--nodeps", str(package_repo.dir / "rpm" / rpm_package.name))


def _clean(root: Path) -> None:
    _rpm(root, "-e", "nvhook")
    for p in [*_aside(root), *_aside(root, "var/lib"), root / "var/log/nvhook", root / "var/lib/nvhook", root / "srv/victim",
              root / "etc/nvidia-container-runtime/config.toml"]:
        if p.is_symlink() or p.is_file():
            p.unlink()
        elif p.exists():
            shutil.rmtree(p)


def test_post_does_not_follow_a_log_dir_link_another_user_planted(planted_root, package_repo, rpm_package):
    root = planted_root
    victim = root / "srv/victim"
    victim.mkdir()
    os.chmod(victim, 0o755)
    _as_nobody(root, "ln -s /srv/victim /var/log/nvhook")
    try:
        r = _install(root, package_repo, rpm_package)
        assert r.returncode == 0, r.stdout + r.stderr
        assert os.stat(victim).st_mode & 0o7777 == 0o755 and list(victim.iterdir()) == []
        log = root / "var/log/nvhook"
        st = os.lstat(log)
        assert stat.S_ISDIR(st.st_mode) and (st.st_uid, st.st_mode & 0o7777) == (0, 0o750)
        [aside] = _aside(root)
        assert os.readlink(aside) == "/srv/victim" and os.lstat(aside).st_uid == 65534
        assert "nvhook: /var/log/nvhook was not a directory only root can write" in r.stderr, r.stderr
    finally:
        _clean(root)


def test_post_does_not_adopt_a_log_dir_another_user_made(planted_root, package_repo, rpm_package):
    root = planted_root
    _as_nobody(root, "mkdir -m 0777 /var/log/nvhook; echo theirs > /var/log/nvhook/hook.log")
    log = root / "var/log/nvhook"
    try:
        r = _install(root, package_repo, rpm_package)
        assert r.returncode == 0, r.stdout + r.stderr
        st = os.lstat(log)
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (0, 0, 0o750) and list(log.iterdir()) == []
        [aside] = _aside(root)
        assert (aside / "hook.log").read_text() == "theirs\n" and os.stat(aside).st_uid == 65534
    finally:
        _clean(root)


def test_post_does_not_follow_a_state_dir_link_another_user_planted(planted_root, package_repo, rpm_package):
    """/var/lib/nvhook a link to a root-only dir: the old `install -d` chmod'ed it open and
    the package's marks were written into it."""
    root = planted_root
    victim = root / "srv/victim"
    victim.mkdir(mode=0o700)
    _as_nobody(root, "ln -s /srv/victim /var/lib/nvhook")
    try:
        r = _install(root, package_repo, rpm_package)
        assert r.returncode == 0, r.stdout + r.stderr
        assert os.stat(victim).st_mode & 0o7777 == 0o700 and list(victim.iterdir()) == []
        st = os.lstat(root / "var/lib/nvhook")
        assert stat.S_ISDIR(st.st_mode) and (st.st_uid, st.st_mode & 0o7777) == (0, 0o755)
        assert (root / "var/lib/nvhook/package-config").is_file()
        [aside] = _aside(root, "var/lib")
        assert os.readlink(aside) == "/srv/victim" and os.lstat(aside).st_uid == 65534
        assert "nvhook: /var/lib/nvhook was not a directory only root can write" in r.stderr, r.stderr
    finally:
        _clean(root)
