"""nvhook as pip installs it: a wheel built from this tree (setup.py compiles both static
fronts into its scripts), installed into a fresh venv at another path, runs a GPU
container through runc with that venv's own front. Its fronts find the Python beside
them, so the environment moved or copied whole runs its own code (strace: nothing of
another tree is opened); a checkout's front (`make venv`, paths baked in) moved or copied
refuses with one line and runs no Python; run as root, a front refuses an interpreter or
site-packages that others than root can write.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from support import hookenv
from support.hookenv import PROBE, assert_only_gpu1, gpu_container

REPO = Path(__file__).resolve().parent.parent
VENV_PY = REPO / ".venv/bin/python"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of this tree, built from a copy of its tracked files (no build dirs left
    in the checkout), without build isolation (the venv has setuptools, wheel, cffi)."""
    base = tmp_path_factory.mktemp("wheel")
    src, dist = base / "src", base / "dist"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for rel in files.decode().split("\0"):
        if rel and (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    r = subprocess.run([str(VENV_PY), "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(dist), str(src)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    [whl] = dist.glob("nvhook-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv (Debian's python3) with the wheel and its dependencies installed."""
    v = tmp_path_factory.mktemp("site") / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(v)], check=True, timeout=300)
    r = subprocess.run([str(v / "bin/pip"), "install", "-q", str(wheel)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return v


def test_the_wheel_carries_both_fronts(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    scripts = sorted(n.rsplit("/", 1)[1] for n in names if ".data/scripts/" in n)
    assert scripts == ["nvhook-hook", "nvhook-runtime"]
    assert any(n.startswith("libinject/linux/_native") for n in names)


def test_versions(venv):
    from libinject import __version__

    for argv in ([venv / "bin/nvhook", "--version"], [venv / "bin/nvhook-hook", "--version"]):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert (r.returncode, r.stdout) == (0, f"nvhook {__version__}\n"), r.stderr
    r = subprocess.run([venv / "bin/nvhook-runtime", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith(f"nvhook-runtime version {__version__}\n\nrunc version ")


def test_installed_front_runs_a_gpu_container(venv, tmp_path, hook_config, gpu_uuids):
    with gpu_container(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE,
                       front=str(venv / "bin/nvhook-hook")) as c:
        r = c.run()
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)


def _opened(tmp_path: Path, argv: list[str]) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run argv under strace: (its result, every path it and its children execve'd or
    opened)."""
    log = tmp_path / "strace.log"
    r = subprocess.run(["strace", "-f", "-qq", "-e", "trace=execve,openat,open", "-o", str(log), *argv],
                       capture_output=True, text=True, timeout=120)
    paths = [os.path.normpath(p) for p in
             re.findall(r'(?:execve|openat|open)\((?:AT_FDCWD, )?"([^"]+)"', log.read_text())]
    return r, paths


@pytest.mark.parametrize("how", ["moved", "copied"])
def test_an_environment_moved_or_copied_runs_its_own_code(venv, tmp_path, how):
    other = tmp_path / "elsewhere"
    shutil.copytree(venv, other, symlinks=True)
    if how == "moved":          # (its original gone: nothing of it can have run)
        shutil.move(str(venv), str(tmp_path / "gone"))
    try:
        r, paths = _opened(tmp_path, [str(other / "bin/nvhook-hook"), "--version"])
        assert r.returncode == 0 and r.stdout.startswith("nvhook "), r.stderr
        ours = [p for p in paths if p.endswith((".py", ".pyc", ".so")) and "site-packages" in p]
        assert any(p.startswith(f"{other}/lib/") and "/libinject/" in p for p in ours), ours
        assert not [p for p in paths if p.startswith(str(venv)) or str(REPO) in p], paths
    finally:
        if how == "moved":
            shutil.move(str(tmp_path / "gone"), str(venv))


@pytest.mark.parametrize("how", ["moved", "copied"])
def test_a_checkout_front_moved_or_copied_refuses(tmp_path, how):
    """This checkout's front has its venv's paths baked in: anywhere else it refuses with
    one line and runs no Python (old code: a copy ran the original tree's code; a moved
    one a traceback)."""
    src = Path(hookenv.ensure_front())
    bindir = tmp_path / "bin"
    bindir.mkdir()
    front = bindir / "nvhook-hook"
    shutil.copy2(src, front)
    r, paths = _opened(tmp_path, [str(front), "--version"])
    assert r.returncode == 1 and r.stdout == "", r
    assert r.stderr == (f"nvhook: this front was built for the install in {src.parent}, not "
                        f"{bindir} where it is: rebuild it there (make venv) or reinstall\n")
    assert [p for p in paths if "python" in p] == [], paths


def test_a_front_refuses_a_site_packages_others_can_write(venv, tmp_path):
    """Run as root, a front runs Python only from paths root alone can write: a
    site-packages made writable by everyone (any user could plant code that root runs)
    is one line and no Python."""
    other = tmp_path / "lax"
    shutil.copytree(venv, other, symlinks=True)
    [site] = other.glob("lib/python3.*/site-packages")
    os.chmod(site, 0o777)
    r, paths = _opened(tmp_path, [str(other / "bin/nvhook-hook"), "--version"])
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == f"nvhook: refusing to run Python from {site}: writable by others than root\n"
    assert [p for p in paths if p.endswith("/python") or "python3" in p.rsplit("/", 1)[-1]] == []


def test_the_installed_package_sets_up_its_service_unit(venv, tmp_path):
    """`nvhook setup service` from the wheel's install: the unit template is package data
    (old code: read from the checkout's contrib/, absent in a wheel), its ExecStart runs
    that install's front."""
    units = tmp_path / "units"
    units.mkdir()
    r = subprocess.run([venv / "bin/nvhook", "setup", "service", "--unit-dir", str(units), "--no-start",
                        "--backup-dir", str(tmp_path / "store")], capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    unit = (units / "nvhook-serve.service").read_text().splitlines()
    assert f"ExecStart={venv}/bin/nvhook-hook serve" in unit
