"""Shared fixtures: simulated GPU hosts and busybox+glibc rootfs dirs.

Everything runs for real, as root. Fixtures clean up what they make.
"""
from __future__ import annotations

import subprocess
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
    with open("/proc/self/mountinfo") as f:
        mps = [line.split()[4] for line in f]
    return sorted(m for m in mps if not m.startswith("/tmp/") or (mine and m.startswith(mine)))


@pytest.fixture
def no_leaked_mounts(tmp_path):
    """Fails the test if it leaves a mount behind in the host's mount namespace:
    anywhere outside /tmp, or anywhere under this test's tmp_path."""
    before = host_mounts(str(tmp_path))
    yield
    assert host_mounts(str(tmp_path)) == before


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    return subprocess.run(cmd, **kw)
