"""`nvhook system create-dev-char-symlinks` (as nvidia-ctk's) on a simulated host: the
/dev/char/MAJ:MIN links systemd resolves DeviceAllow= through on daemon-reload."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
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


NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


@pytest.fixture
def reachable_h100():
    """An h100x8-mig host another user can reach (pytest's tmp_path is under a 0700 dir)."""
    from libinject.sim.build import create_host

    d = Path(tempfile.mkdtemp(prefix="nvhdevchar", dir="/tmp"))
    d.chmod(0o755)
    yield create_host(d / "host", profile="h100x8-mig")
    shutil.rmtree(d, ignore_errors=True)


def test_no_link_names_a_node_in_a_dir_another_user_can_swap(tmp_path, reachable_h100):
    """A /dev/char link names its node by path and systemd resolves it to whatever is there:
    another user who owns dev/nvidia-caps would, after the run, swap a cap node for a link
    to a device of their choosing (here /dev/null), and daemon-reload would let every GPU
    container open that. Refused: no link into a dir that is not root's alone."""
    host = reachable_h100
    caps = host / "dev/nvidia-caps"
    os.chown(caps, NOBODY, NOBODY)
    char = tmp_path / "char"
    r = _run("--driver-root", str(host), "--dev-char-path", str(char))
    # the other user's move, after the run (the links are made by then, if at all)
    for name in os.listdir(caps):
        subprocess.run([*AS_NOBODY, "ln", "-sfn", "/dev/null", str(caps / name)], check=True, timeout=60)
    null = os.stat("/dev/null").st_rdev
    reach = [n for n in os.listdir(char) if os.stat(char / n).st_rdev == null] if char.exists() else []
    assert reach == []
    assert r.returncode == 1 and r.stderr == (f"nvhook: {caps}: owned by uid {NOBODY} with mode 755: "
                                              "not root's alone, no link is made to a node there\n"), r.stderr


def test_a_node_dir_planted_as_a_link_is_not_followed(tmp_path, fresh_sim_host):
    host = fresh_sim_host("h100x8-mig", name="devchar-capslink")
    caps = host / "dev/nvidia-caps"
    caps.rename(host / "caps-elsewhere")
    caps.symlink_to(host / "caps-elsewhere")
    char = tmp_path / "char"
    r = _run("--driver-root", str(host), "--dev-char-path", str(char))
    assert r.returncode == 1
    assert r.stderr == f"nvhook: {caps}: not a directory (a link is not followed): Not a directory\n"
    assert not char.exists() or os.listdir(char) == []


def test_the_udev_rules_command_as_root_on_planted_entries(tmp_path, t4_host):
    """The packaged rule's very command line (as udev runs it: root, no --driver-root, the
    host's /dev/char), in a private mount namespace whose /dev, /dev/char and /proc/driver are
    the simulated host's: a planted /dev/char entry is left alone, a link planted at a node's
    name refuses the run, and nothing is made through it."""
    rule = (Path(__file__).resolve().parent.parent / "packaging/udev/71-nvhook-dev-char.rules").read_text()
    [cmd] = [ln.split('RUN+="', 1)[1].rstrip('"') for ln in rule.splitlines() if "RUN+=" in ln]
    argv = cmd.split()
    assert argv[0] == "/usr/bin/nvhook"
    argv[0] = str(Path(sys.executable).parent / "nvhook")
    char = tmp_path / "char"
    char.mkdir()
    (char / "195:0").symlink_to("/dev/null")                  # planted: left as it is
    victim = tmp_path / "victim"
    (t4_host / "dev/nvidia-uvm-tools").unlink()
    (t4_host / "dev/nvidia-uvm-tools").symlink_to(victim)     # planted at a node's name
    (t4_host / "dev/char").mkdir()                            # the mount point
    script = (f"mount --bind {t4_host}/dev /dev && mount --bind {char} /dev/char && "
              f"mount --bind {t4_host}/proc/driver /proc/driver && "
              f"mount --bind {t4_host}/proc/devices /proc/devices && exec {' '.join(argv)}")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stderr == (f"nvhook: load-kmods: /dev/nvidia-uvm-tools: exists and is not character device "
                        f"{_uvm(t4_host)}:1; not replaced\n"), r.stderr
    assert not os.path.lexists(victim) and os.readlink(char / "195:0") == "/dev/null"
    assert sorted(os.listdir(char)) == ["195:0"]


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
