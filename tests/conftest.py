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
