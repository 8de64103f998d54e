"""The arm64 package (`make deb ARCH=arm64`: packaging/build_deb.py --arch arm64, cross-built
from Debian 12's arm64 packages, packaging/arch.py) installed with dpkg in a fresh Debian 12
arm64 root (mmdebstrap --architectures=arm64, minbase: no Python, no compiler) and run there:
every program in that root is an aarch64 ELF, which this x86-64 machine runs through
binfmt_misc and qemu-user-static (registered with the F flag: the emulator is opened when it
is registered, so a chroot needs no copy of it). What runs is the package's own aarch64
Python, glibc and libraries, its static fronts and the simulated GPU's prebuilt aarch64
objects (no gcc in the root).

Not run here: a container start (runc or an engine under emulation), systemd booting the
root, the .rpm on an aarch64 root (README: what was and was not run on arm64).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import packaging

VERSION = packaging.VERSION
LIBDIR = f"/usr/lib/nvhook/{VERSION}"
BINFMT = Path("/proc/sys/fs/binfmt_misc")
EM_AARCH64 = 183
ELF_MAGIC = b"\x7fELF"


def _machine(path: Path) -> int:
    """e_machine of an ELF file."""
    head = path.read_bytes()[:20]
    assert head[:4] == ELF_MAGIC, path
    return int.from_bytes(head[18:20], "little")


@pytest.fixture(scope="module")
def binfmt():
    """aarch64 programs run through qemu-user-static: binfmt_misc mounted (a VM or a fresh
    boot may not have it; binfmt-support's service would) and qemu-aarch64 enabled."""
    if not (BINFMT / "register").exists():
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], check=True, timeout=30)
    if not (BINFMT / "qemu-aarch64").exists():
        subprocess.run(["update-binfmts", "--enable", "qemu-aarch64"], check=True, timeout=30)
    entry = (BINFMT / "qemu-aarch64").read_text().splitlines()
    assert entry[0] == "enabled" and any(ln.startswith("flags:") and "F" in ln for ln in entry), entry


@pytest.fixture(scope="module")
def arm64_deb(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("deb-arm64")
    [deb] = packaging.build("build_deb.py", str(out), "--arch", "arm64")
    assert deb == str(out / f"nvhook_{VERSION}_arm64.deb")
    return Path(deb)


@pytest.fixture(scope="module")
def root(tmp_path_factory, binfmt, arm64_deb) -> Path:
    """A fresh Debian 12 arm64 root with the package installed by its own (aarch64) dpkg."""
    root = tmp_path_factory.mktemp("arm64") / "root"
    r = subprocess.run(["mmdebstrap", "--quiet", "--variant=minbase", "--architectures=arm64", "bookworm",
                        str(root)], capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:]
    (root / "tmp" / arm64_deb.name).write_bytes(arm64_deb.read_bytes())
    r = _chroot(root, "dpkg", "-i", f"/tmp/{arm64_deb.name}")
    assert r.returncode == 0, r.stdout + r.stderr
    return root


def _chroot(root: Path, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """argv in the root, in a mount namespace of its own with the root a mount point (the
    NVML query child makes its mounts private), /proc and /dev."""
    script = ('mount --bind "$1" "$1" && mount -t proc proc "$1/proc" && mount --bind /dev "$1/dev" && '
              'root=$1 && shift && exec chroot "$root" "$@"')
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(root), *argv],
                          capture_output=True, text=True, timeout=timeout, env=env)


def _ok(root: Path, *argv: str) -> str:
    r = _chroot(root, *argv)
    assert r.returncode == 0, f"{argv}: {r.stderr}"
    assert not r.stderr, r.stderr
    return r.stdout


def test_the_package_is_arm64_and_its_programs_aarch64(arm64_deb, root):
    r = subprocess.run(["dpkg-deb", "-f", str(arm64_deb), "Architecture"], capture_output=True, text=True, check=True)
    assert r.stdout == "arm64\n"
    assert _ok(root, "dpkg", "--print-architecture") == "arm64\n"
    assert _ok(root, "dpkg-query", "-W", "-f", "${Status} ${Architecture}", "nvhook") == "install ok installed arm64"
    installed = root / LIBDIR.lstrip("/")
    site = installed / "lib/python3.11/site-packages"
    elves = [installed / "bin/nvhook-hook", installed / "bin/nvhook-runtime", installed / "bin/python3.11",
             installed / "lib/ld-linux-aarch64.so.1", installed / "lib/libc.so.6",
             *site.glob("libinject/linux/_native*.so"), *site.glob("_prctl*.so"), *site.glob("_cffi_backend*.so")]
    prebuilt = sorted((site / "libinject/sim/prebuilt").iterdir())
    assert len(elves) == 8 and prebuilt
    assert {p.name: _machine(p) for p in elves + prebuilt} == {p.name: EM_AARCH64 for p in elves + prebuilt}
    assert all(p.name.split("-", 1)[1].startswith("aarch64-") for p in prebuilt), prebuilt


def test_it_runs_under_emulation_in_the_root(root):
    assert _ok(root, "uname", "-m") == "aarch64\n"      # qemu's: the root's programs are emulated
    assert _ok(root, "nvhook", "--version") == f"nvhook {VERSION}\n"
    assert _ok(root, "nvhook-hook", "--version") == f"nvhook {VERSION}\n"


@pytest.fixture(scope="module")
def sim(root) -> str:
    """`nvhook sim create` in the root, which has no compiler: the package's prebuilt objects."""
    assert not (root / "usr/bin/gcc").exists() and not (root / "usr/bin/cc").exists()
    assert _ok(root, "nvhook", "sim", "create", "/sim") == "/sim\n"
    return "/sim"


def test_sim_create_makes_an_aarch64_driver_root(root, sim):
    host = root / sim.lstrip("/")
    nvml = host / "usr/lib/aarch64-linux-gnu/libnvidia-ml.so.550.163.01"
    assert _machine(nvml) == EM_AARCH64 and _machine(host / "usr/bin/nvidia-smi") == EM_AARCH64
    assert not (host / "usr/lib/x86_64-linux-gnu").exists()
    assert (host / "proc/driver/nvidia/version").read_text().startswith(
        "NVRM version: NVIDIA UNIX aarch64 Kernel Module  550.163.01")


def test_info_lists_the_simulated_gpus(root, sim):
    out = _ok(root, "nvhook", "--root", sim, "info")
    lines = out.splitlines()
    assert lines[:2] == ["NVRM version:   550.163.01", "CUDA version:   12.4"]
    assert [ln for ln in lines if ln.startswith("Device Index:")] == [f"Device Index:   {i}" for i in range(8)]
    assert lines.count("Model:          NVIDIA A100-SXM4-80GB") == 8


def test_configure_dry_run_plans_the_arm64_library_dir(root, sim):
    ctr = root / "ctr"
    (ctr / "etc").mkdir(parents=True)
    (ctr / "etc/debian_version").write_text("12.0\n")
    out = _ok(root, "nvhook", "--root", sim, "configure", "--dry-run", "--compute", "--utility",
              "--device", "0", "/ctr")
    lib = "/usr/lib/aarch64-linux-gnu/libcuda.so.550.163.01"
    assert f"library  {lib} <- {sim}{lib} [ro,nosuid,nodev,bind]" in out.splitlines(), out
    assert "x86_64" not in out
    assert sorted(os.listdir(ctr)) == ["etc"]      # a dry run changes nothing


def _build_deb_fails(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    r = subprocess.run([sys.executable, str(packaging.REPO / "packaging/build_deb.py"), str(tmp_path), *args],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 1 and r.stdout == "" and list(tmp_path.iterdir()) == []
    return r.stderr


def test_an_unknown_arch_is_one_line(tmp_path):
    assert _build_deb_fails(tmp_path, "--arch", "sparc") == "nvhook: --arch must be one of amd64, arm64: 'sparc'\n"


def test_a_missing_cross_tool_is_named_with_its_package(tmp_path):
    """Without the cross tools on PATH (an empty one), the build names their packages."""
    empty = tmp_path / "bin"
    empty.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    err = _build_deb_fails(out, "--arch", "arm64", env=dict(os.environ, PATH=str(empty)))
    assert err == ("nvhook: building for arm64 needs binutils-aarch64-linux-gnu, clang, mmdebstrap "
                   "(apt-get install binutils-aarch64-linux-gnu clang mmdebstrap)\n")
