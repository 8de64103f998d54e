"""nvhook against NVIDIA's own answers on the simulated hosts (issue 31): the CDI spec of
`nvidia-ctk cdi generate` (gpu mode; --mode imex on the IMEX host) and the paths of
`nvidia-container-cli list` and `info [--csv]`, recorded by scripts/nvidia-parity from NVIDIA's binaries
(tests/data/nvidia/). Every difference left is a README row, applied to NVIDIA's side
in tests/support/nvidia_parity.py; what remains must be equal."""
from __future__ import annotations

import json

import pytest

from conftest import NVHOOK, run
from support.nvidia_parity import (IMEX_PROFILE, PROFILES, cdi_view, expected, list_view,
                                   nvhook_cdi_without_rows, nvidia_cdi_as_nvhook, nvidia_list_as_nvhook)


@pytest.fixture(scope="module")
def host(sim_host, sim_cache):
    from libinject.sim.build import create_host

    made = {}

    def get(profile: str):
        if profile == "imex":
            if "imex" not in made:
                made["imex"] = create_host(sim_cache / "parity-imex", profile_file=IMEX_PROFILE)
            return made["imex"]
        return sim_host(profile)

    return get


def nvhook_cdi(root, tmp_path, *args: str) -> dict:
    out = tmp_path / "spec.json"
    r = run([NVHOOK, "--root", str(root), "cdi", "generate", "--format", "json", "--output", str(out), *args],
            timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())


@pytest.mark.parametrize("profile", PROFILES)
def test_cdi_spec_is_nvidia_ctks(host, tmp_path, profile):
    """Same devices under the same names (a GPU in MIG mode is none of them, its MIG
    devices are, by index and UUID), the same nodes from the same host paths, mounts,
    links and environment as nvidia-ctk's spec."""
    root = host(profile)
    theirs = nvidia_cdi_as_nvhook(cdi_view(json.loads(expected(profile, "cdi.json", str(root)))), str(root))
    ours = nvhook_cdi_without_rows(cdi_view(nvhook_cdi(root, tmp_path)))
    assert list(ours["devices"]) and sorted(ours["devices"]) == sorted(theirs["devices"])
    for name, dev in theirs["devices"].items():
        assert ours["devices"][name] == dev, name
    for key in ("kind", "env", "nodes", "mounts", "links"):
        assert ours[key] == theirs[key], key


def test_cdi_imex_spec_is_nvidia_ctks(host, tmp_path):
    root = host("imex")
    theirs = nvidia_cdi_as_nvhook(cdi_view(json.loads(expected("imex", "cdi-imex.json", str(root)))), str(root),
                                  imex=True)
    ours = cdi_view(nvhook_cdi(root, tmp_path, "--mode", "imex"))
    assert sorted(theirs["devices"]) == ["0", "1", "2", "3", "all"]
    assert ours == theirs


@pytest.mark.parametrize("profile", PROFILES)
def test_list_is_nvidia_container_clis(host, profile):
    """The paths and their order, as nvidia-container-cli list (IMEX host:
    --imex-channel=0, everything plus the channel)."""
    root = host(profile)
    args = ["--imex-channel=0"] if profile == "imex" else []
    r = run([NVHOOK, "--root", str(root), "list", *args], timeout=60)
    assert r.returncode == 0, r.stderr
    theirs = nvidia_list_as_nvhook(list_view(expected(profile, "list.txt", str(root)), str(root)), str(root))
    assert list_view(r.stdout, str(root)) == theirs


@pytest.mark.parametrize("profile", PROFILES)
def test_info_is_nvidia_container_clis(host, profile):
    """`info` and `info --csv`, byte for byte (no row of differences applies)."""
    root = host(profile)
    for args, name in (([], "info.txt"), (["--csv"], "info.csv")):
        r = run([NVHOOK, "--root", str(root), "info", *args], timeout=60)
        assert (r.returncode, r.stderr) == (0, "")
        assert r.stdout == expected(profile, name, str(root)), name
