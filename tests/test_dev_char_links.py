"""`nvhook system create-dev-char-symlinks` (as nvidia-ctk's) on a simulated host: the
/dev/char/MAJ:MIN links systemd resolves DeviceAllow= through on daemon-reload."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from libinject.linux import devnodes

CMD = [sys.executable, "-m", "nvhook", "system", "create-dev-char-symlinks"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CMD, *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def t4_host(fresh_sim_host) -> Path:
    return fresh_sim_host("t4x1", name="devchar-host")


def _uvm(host: Path) -> int:
    return devnodes.char_majors((host / "proc/devices").read_text())["nvidia-uvm"]


def test_links_every_nvidia_node(tmp_path, t4_host):
    char = tmp_path / "char"
    r = _run("--driver-root", str(t4_host), "--dev-char-path", str(char))
    assert r.returncode == 0, r.stderr
    uvm = _uvm(t4_host)
    assert {n: os.readlink(char / n) for n in os.listdir(char)} == {
        "195:0": f"{t4_host}/dev/nvidia0", "195:255": f"{t4_host}/dev/nvidiactl",
        f"{uvm}:0": f"{t4_host}/dev/nvidia-uvm", f"{uvm}:1": f"{t4_host}/dev/nvidia-uvm-tools"}
    again = _run("--driver-root", str(t4_host), "--dev-char-path", str(char))
    assert again.returncode == 0 and again.stdout == "", again.stdout + again.stderr


def test_create_all_makes_missing_nodes_then_links(tmp_path, t4_host):
    (t4_host / "dev/nvidia-uvm").unlink()
    char = tmp_path / "char"
    dry = _run("--driver-root", str(t4_host), "--dev-char-path", str(char), "--create-all", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"would create {t4_host}/dev/nvidia-uvm ({_uvm(t4_host)}:0)" in dry.stdout
    assert not os.path.lexists(t4_host / "dev/nvidia-uvm") and not os.path.lexists(char)
    r = _run("--driver-root", str(t4_host), "--dev-char-path", str(char), "--create-all")
    assert r.returncode == 0, r.stderr
    assert os.readlink(char / f"{_uvm(t4_host)}:0") == f"{t4_host}/dev/nvidia-uvm"
    assert os.stat(t4_host / "dev/nvidia-uvm").st_rdev == os.makedev(_uvm(t4_host), 0)


def test_existing_entry_is_left_alone(tmp_path, t4_host):
    char = tmp_path / "char"
    char.mkdir()
    (char / "195:0").symlink_to("/dev/null")
    assert _run("--driver-root", str(t4_host), "--dev-char-path", str(char)).returncode == 0
    assert os.readlink(char / "195:0") == "/dev/null"


def test_links_dir_planted_as_link_is_not_followed(tmp_path, t4_host):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "char").symlink_to(elsewhere)
    r = _run("--driver-root", str(t4_host), "--dev-char-path", str(tmp_path / "char"))
    assert r.returncode == 1
    assert r.stderr == f"nvhook: {tmp_path}/char: not a directory (a link is not followed): Not a directory\n"
    assert os.listdir(elsewhere) == []


def test_links_dir_writable_by_another_user_is_refused(tmp_path, t4_host):
    char = tmp_path / "char"
    char.mkdir()
    os.chown(char, 1000, 1000)
    r = _run("--driver-root", str(t4_host), "--dev-char-path", str(char))
    assert r.returncode == 1
    assert f"nvhook: {char}: owned by uid 1000" in r.stderr
    assert os.listdir(char) == []


def test_packaged_rule_and_unit_run_this_command():
    top = Path(__file__).resolve().parent.parent / "packaging"
    rule = (top / "udev/71-nvhook-dev-char.rules").read_text()
    unit = (top / "systemd/nvhook-dev-char.service").read_text()
    want = "/usr/bin/nvhook system create-dev-char-symlinks --create-all"
    assert f'RUN+="{want}"' in rule
    assert "ExecStart=/usr/bin/nvhook system create-dev-char-symlinks --load-kernel-modules --create-all\n" in unit


def test_watch_links_a_node_that_appears_later(tmp_path, t4_host):
    import stat
    import time

    node = t4_host / "dev/nvidia-uvm-tools"
    rdev = os.stat(node).st_rdev
    node.unlink()
    char = tmp_path / "char"
    p = subprocess.Popen([*CMD, "--watch", "--driver-root", str(t4_host), "--dev-char-path", str(char)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        link = char / f"{os.major(rdev)}:{os.minor(rdev)}"
        first = char / "195:255"
        deadline = time.monotonic() + 60
        while not os.path.lexists(first) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert os.path.lexists(first) and not os.path.lexists(link)
        os.mknod(node, stat.S_IFCHR | 0o666, rdev)
        while not os.path.lexists(link) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert os.readlink(link) == str(node)
    finally:
        p.terminate()
        p.wait(timeout=30)
