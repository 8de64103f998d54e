"""Shared fixtures: simulated GPU hosts and busybox+glibc rootfs dirs.

Everything runs for real, as root. Fixtures clean up what they make.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NVHOOK = str(REPO / ".venv/bin/nvhook")
# The reference specs (CDI, OCI, OCI hooks) in shared/ beside the checkout, as CI has it;
# a clone elsewhere on a developer's machine falls back to the workplace's copy.
SPECS = next((p for p in (REPO.parent / "shared/specs", Path("/work/shared/specs"))
              if p.is_dir()), REPO.parent / "shared/specs")


@pytest.fixture(scope="session")
def sim_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("simhosts")


@pytest.fixture(scope="session")
def sim_host(sim_cache):
    """sim_host(profile) -> Path of a shared, read-only-by-convention simulated host.
    Tests that change a host must use fresh_sim_host instead."""
    from libinject.sim.build import create_host

    made: dict[str, Path] = {}

    def get(profile: str = "a100x8") -> Path:
        if profile not in made:
            made[profile] = create_host(sim_cache / profile, profile=profile)
        return made[profile]

    return get


@pytest.fixture(scope="session")
def geforce2_host(sim_cache) -> Path:
    """A shared simulated host with two GeForce GPUs and the graphics surface
    (support.simhost.TWO_GEFORCE)."""
    import json

    from libinject.sim.build import create_host
    from support.simhost import TWO_GEFORCE

    profile = sim_cache / "geforce2.json"
    profile.write_text(json.dumps(TWO_GEFORCE))
    return create_host(sim_cache / "geforce2", profile_file=profile)


@pytest.fixture(scope="session")
def a100_host(sim_host) -> Path:
    """The shared a100x8 simulated host the hook tests run containers on."""
    return sim_host("a100x8")


@pytest.fixture(scope="session")
def gpu_uuids(a100_host) -> list[str]:
    """a100_host's GPU UUIDs, in index order."""
    from support import hookenv

    return hookenv.gpu_uuids(a100_host)


@pytest.fixture
def hook_config(tmp_path, a100_host) -> Path:
    """The hook's config.toml for a100_host, logging (debug) to tmp_path/hook.log."""
    from support import hookenv

    return hookenv.write_config(tmp_path / "config.toml", a100_host, log=tmp_path / "hook.log")


@pytest.fixture
def fresh_sim_host(tmp_path):
    """fresh_sim_host(profile) -> Path of a simulated host this test may modify."""
    from libinject.sim.build import create_host

    def make(profile: str = "a100x8", name: str = "host") -> Path:
        return create_host(tmp_path / name, profile=profile)

    return make


@pytest.fixture
def rootfs(tmp_path) -> Path:
    """A fresh busybox+glibc rootfs (Debian layout)."""
    from libinject.sim.rootfs import build_rootfs

    return build_rootfs(tmp_path / "rootfs")


def host_mounts(mine: str = "") -> list[str]:
    """The host mount table's mount points, less other tests' scratch mounts under /tmp
    (tests of other modules may run concurrently), but keeping any under `mine`."""
    from libinject.linux import mountinfo

    mps = [m.mountpoint for m in mountinfo.read()]
    return sorted(m for m in mps if not m.startswith("/tmp/") or (mine and m.startswith(mine)))


@pytest.fixture
def no_leaked_mounts(tmp_path):
    """Fails the test if it leaves a mount behind in the host's mount namespace:
    anywhere outside /tmp, or anywhere under this test's tmp_path."""
    before = host_mounts(str(tmp_path))
    yield
    assert host_mounts(str(tmp_path)) == before


RUN_TIMEOUT = 300


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """subprocess.run, text output captured; a command still running after `timeout`
    (default RUN_TIMEOUT s) is killed and fails the test (subprocess.TimeoutExpired)."""
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", RUN_TIMEOUT)
    return subprocess.run(cmd, **kw)


@pytest.fixture
def sockdir():
    # Short: sun_path holds 108 bytes, pytest's tmp_path can be longer.
    d = Path(tempfile.mkdtemp(prefix="nvs", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def server(hook_config, sockdir):
    from support.serve import Serve

    s = Serve(hook_config, sockdir / "run/hook.sock")
    yield s
    assert s.stop() == 0, s.log()
    assert not s.sock.exists()          # it removed its socket on the way out


# ---------------------------------------------------------------- packages and node roots
# Built once per session and shared: each package (make deb / make rpm), the served
# repository, and one pristine Debian root per release (tests copy it).

@pytest.fixture(scope="session")
def deb_package(tmp_path_factory) -> Path:
    """`make deb`: nvhook_<VERSION>_amd64.deb."""
    from support import packaging

    out = tmp_path_factory.mktemp("deb")
    [deb] = packaging.build("build_deb.py", str(out))
    assert deb == str(out / f"nvhook_{packaging.VERSION}_amd64.deb")
    return Path(deb)


@pytest.fixture(scope="session")
def next_deb_package(tmp_path_factory) -> Path:
    """The same tree as a later release (packaging.NEXT_VERSION), for upgrades."""
    from support import packaging

    out = tmp_path_factory.mktemp("deb-next")
    [deb] = packaging.build("build_deb.py", str(out), "--version", packaging.NEXT_VERSION)
    return Path(deb)


@pytest.fixture(scope="session")
def rpm_package(tmp_path_factory, deb_package) -> Path:
    """`make rpm`: the .deb's payload as nvhook-<VERSION>-1.x86_64.rpm."""
    from support import packaging

    out = tmp_path_factory.mktemp("rpm")
    [rpm] = packaging.build("build_rpm.py", str(out), "--from-deb", str(deb_package))
    assert rpm == str(out / f"nvhook-{packaging.VERSION}-1.x86_64.rpm")
    return Path(rpm)


@pytest.fixture(scope="session")
def package_repo(tmp_path_factory, deb_package, rpm_package):
    """`make repo` of this release's packages, served on 127.0.0.1."""
    from support import packaging

    repo = packaging.Repo(tmp_path_factory.mktemp("pkgrepo"))
    repo.publish(deb_package, rpm_package)
    yield repo
    repo.close()


@pytest.fixture(scope="session")
def debian_root(tmp_path_factory):
    """debian_root(suite, dest) copies a pristine root of that Debian release (mmdebstrap,
    made once per session: minbase with systemd and runc, what a GPU node has) to dest."""
    from support import nspawn

    made: dict[str, Path] = {}

    def copy(suite: str, dest: Path) -> Path:
        if suite not in made:
            made[suite] = nspawn.debootstrap(tmp_path_factory.mktemp(f"debian-{suite}") / "root",
                                             packages=nspawn.NODE_PACKAGES, suite=suite)
        subprocess.run(["cp", "-a", "--reflink=auto", str(made[suite]), str(dest)], check=True, timeout=600)
        return dest

    return copy
