"""Root's `nvhook doctor` and `nvhook sim enter` on files another user made, attacked for real.

doctor reads the CDI specs, and /var/run/cdi may be a directory a device plugin's
container (or another user) writes: a link planted there made root's doctor open a
device or a FIFO of the planter's choosing (the open alone can act: a watchdog, a
tape, a FIFO's writer let go) and then give up its whole report. `sim enter ROOT`
runs CMD as root with ROOT's programs on PATH and ROOT's dev/ over /dev: a ROOT
another user owns, or any of it, made root run that user's program and write through
that user's dev/null link.
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import NVHOOK, run
from support import hookenv

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
IN_OPEN = 0x20
STANDIN = b"root's file\n"


def _as_nobody(*argv: str) -> None:
    subprocess.run([*AS_NOBODY, *argv], check=True, capture_output=True, timeout=60)


@pytest.fixture
def shared():
    """A scratch directory nobody can reach (pytest's tmp_path is under a 0700 one)."""
    d = Path(tempfile.mkdtemp(prefix="nvhdoc", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


class OpenWatch:
    """inotify IN_OPEN on one file: whether anyone opened it since (any path to it)."""

    def __init__(self, path: Path) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0 and libc.inotify_add_watch(self.fd, os.fsencode(path), IN_OPEN) >= 0

    def opened(self) -> bool:
        try:
            return bool(os.read(self.fd, 4096))
        except BlockingIOError:
            return False
        finally:
            os.close(self.fd)


@pytest.mark.parametrize("kind", ["char-device", "fifo"])
def test_doctor_does_not_open_what_a_link_in_a_cdi_dir_names(tmp_path, shared, a100_host, kind):
    target = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(target)
    else:
        os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(1, 5))     # (what /dev/zero is)
    cdi = shared / "run-cdi"
    cdi.mkdir()
    os.chown(cdi, NOBODY, NOBODY)           # the device plugin's directory
    spec = cdi / "nvidia.yaml"
    watch = OpenWatch(target)
    _as_nobody("ln", "-s", str(target), str(spec))
    cfg = hookenv.write_config(tmp_path / "c.toml", a100_host, extra=f'socket = "{tmp_path}/none.sock"\n')
    r = run([NVHOOK, "--config", str(cfg), "--root", str(a100_host), "doctor", "--json",
             "--docker-config", str(tmp_path / "none.json"), "--containerd-config", str(tmp_path / "none.toml"),
             "--crio-drop-in", str(tmp_path / "none-crio.toml"), "--hooks-dir", str(tmp_path / "hooks.d"),
             "--cdi-spec", str(spec)], timeout=120)
    assert not watch.opened()
    assert (r.returncode, r.stderr) == (1, "")
    checks = {c["name"]: c for c in json.loads(r.stdout)}
    assert checks["driver"]["status"] == "OK"               # the rest of the report is there
    assert checks["cdi"] == {"status": "FAIL", "name": "cdi",
                             "detail": f"cannot read CDI spec {spec}: a symlink (not followed)",
                             "todo": f"remove it, then `nvhook cdi refresh --output {spec}`"}


def _standin(tmp_path: Path) -> Path:
    """Root's file in a directory only root writes (a stand-in for /etc/shadow)."""
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/shadow").write_bytes(STANDIN)
    return tmp_path / "etc/shadow"


def _plant_smi(root: Path, mark: Path) -> None:
    """nobody's nvidia-smi in ROOT's usr/bin: it leaves `mark` when it runs."""
    _as_nobody("sh", "-c", f"rm -f {root}/usr/bin/nvidia-smi && "
                           f"printf '#!/bin/sh\\ntouch {mark}\\n' > {root}/usr/bin/nvidia-smi && "
                           f"chmod 755 {root}/usr/bin/nvidia-smi")


def test_sim_enter_refuses_a_root_another_user_owns(tmp_path, shared):
    """A simulated host built for nobody and handed over (sim create needs root for the
    device nodes): nobody links its dev/null to root's file and swaps its nvidia-smi."""
    from libinject.sim.build import create_host

    root = create_host(shared / "sim", profile="t4x1")
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(root)], check=True, timeout=60)
    shadow, mark = _standin(tmp_path), tmp_path / "ran"
    _as_nobody("ln", "-sf", str(shadow), str(root / "dev/null"))
    _plant_smi(root, mark)
    r = run([NVHOOK, "sim", "enter", str(root), "--", "sh", "-c", "nvidia-smi -L; echo pwned > /dev/null"])
    assert shadow.read_bytes() == STANDIN and not mark.exists()
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == (f"nvhook: sim enter: {root}: directory {root} is owned by nobody (uid {NOBODY}); "
                        "ROOT must be root's alone (CMD runs its programs as root): build it as root\n")


def test_sim_enter_refuses_a_root_with_a_part_another_user_owns(tmp_path, shared):
    """Root's ROOT, but its usr/bin copied in with nobody's ownership kept (cp -a):
    nobody can still change what root runs there."""
    from libinject.sim.build import create_host

    root = create_host(shared / "sim", profile="t4x1")
    os.chown(root / "usr/bin", NOBODY, NOBODY)
    mark = tmp_path / "ran"
    _plant_smi(root, mark)
    r = run([NVHOOK, "sim", "enter", str(root), "--", "nvidia-smi", "-L"])
    assert not mark.exists()
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr.startswith(f"nvhook: sim enter: {root}: usr/bin is owned by nobody (uid {NOBODY}), not root")
    assert r.stderr.count("\n") == 1


def test_sim_enter_refuses_a_dev_link_out_of_dev(tmp_path, shared):
    """Root's own ROOT with dev/null -> a host file: CMD's writes to /dev/null, as root,
    would land there (links inside dev/, as dev/dri/by-path's, stay allowed)."""
    from libinject.sim.build import create_host

    root = create_host(shared / "sim", profile="t4x1")
    shadow = _standin(tmp_path)
    os.symlink(shadow, root / "dev/null")
    r = run([NVHOOK, "sim", "enter", str(root), "--", "sh", "-c", "echo pwned > /dev/null"])
    assert shadow.read_bytes() == STANDIN
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert r.stderr.startswith(f"nvhook: sim enter: {root}: dev/null is a symlink out of dev/ ({shadow})")
