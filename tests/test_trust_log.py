"""The hook's and the shim's log files, attacked for real (libinject.log, libinject.linux.safedir).

Root appends to them on every container start. Each test is an attack that worked when
the file was opened by path: another user (nobody, or a log shipper's container running
as nobody with the host's log directory mounted) plants a link or a directory of theirs
where root's line goes, and a tenant's start then appended a line with the tenant's
values to a file of the attacker's choosing (here a stand-in for /etc/ld.so.preload).
A planted path is refused with one `nvhook:` line and the start goes on.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import NVHOOK, run
from support import hookenv
from support.runc import RuncContainer
from support.shimenv import SHIM

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
PRELOAD = b"/usr/lib/x86_64-linux-gnu/libkeep.so\n"


def _as_nobody(*argv: str) -> None:
    subprocess.run([*AS_NOBODY, *argv], check=True, capture_output=True, timeout=60)


@pytest.fixture
def shared(tmp_path):
    """A scratch directory nobody can reach (pytest's tmp_path is under a 0700 one)."""
    d = Path(tempfile.mkdtemp(prefix="nvhlog", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _preload(tmp_path: Path) -> Path:
    """A stand-in for /etc/ld.so.preload: root's file in a directory only root writes."""
    etc = tmp_path / "etc"
    etc.mkdir(mode=0o755)
    (etc / "ld.so.preload").write_bytes(PRELOAD)
    return etc / "ld.so.preload"


def _shared_log_dir(path: Path) -> Path:
    """A log directory as Ubuntu's /var/log is: root:syslog 0775 (here the group is
    nogroup, nobody's: a log shipper running in that group can write it)."""
    path.mkdir(parents=True)
    os.chown(path, 0, NOBODY)
    path.chmod(0o775)
    return path


def _bundle(tmp_path: Path, env: list[str]) -> tuple[Path, str]:
    """A bundle whose container asks for env, and the hook's state for it."""
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": {"env": ["PATH=/bin", *env]}}))
    state = json.dumps({"ociVersion": "1.0.2", "id": "tenant1", "status": "creating", "pid": 1,
                        "bundle": str(bundle)})
    return bundle, state


def test_a_log_shippers_container_cannot_point_the_hook_log_at_etc(tmp_path, a100_host):
    """A log shipper's container (nobody, in the log directory's group) with the host's log
    directory mounted plants hook.log -> ld.so.preload; a tenant's GPU start then appended
    its lines, its NVIDIA_VISIBLE_DEVICES value included, to ld.so.preload."""
    preload = _preload(tmp_path)
    logs = _shared_log_dir(tmp_path / "host/var/log")
    shipper = RuncContainer(tmp_path / "shipper", args=["ln", "-s", str(preload), "/var/log/hook.log"])
    shipper.config["process"]["user"] = {"uid": NOBODY, "gid": NOBODY}
    shipper.config["process"]["capabilities"] = {}
    shipper.config["process"]["noNewPrivileges"] = True
    shipper.config["mounts"].append({"destination": "/var/log", "type": "bind", "source": str(logs),
                                     "options": ["rbind", "rw"]})
    with shipper:
        r = shipper.run()
    assert r.returncode == 0, r.stderr
    planted = logs / "hook.log"
    assert planted.is_symlink() and planted.lstat().st_uid == NOBODY

    cfg = hookenv.write_config(tmp_path / "config.toml", a100_host, log=planted)
    with hookenv.gpu_container(tmp_path / "tenant", cfg, ["NVIDIA_VISIBLE_DEVICES=1"], "true") as c:
        r = c.run()
    assert r.returncode == 0, r.stderr          # the start goes on without its log
    assert preload.read_bytes() == PRELOAD
    assert os.readlink(planted) == str(preload)

    # The same start by hand: its stderr has the one line saying why nothing was logged.
    bundle, state = _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=/opt/t/libpwn.so"])
    r = run([NVHOOK, "--config", str(cfg), "prestart"], input=state, cwd=str(bundle))
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        f"nvhook: log file {planted}: directory {logs} is writable by group nogroup (gid {NOBODY}); "
        "not logging there",
        "nvhook: unknown device: /opt/t/libpwn.so"]
    assert preload.read_bytes() == PRELOAD


@pytest.mark.parametrize("plant", ["own-dir", "link-dir"])
def test_a_writer_of_var_log_cannot_swap_the_nvhook_directory(shared, a100_host, plant):
    """The package's layout: /var/log/nvhook (root's, 0755) in a /var/log its group may write.
    That group cannot write in nvhook/, but can put its own directory, or a link to root's
    /etc, in its place; root's next line then went there."""
    etc = shared / "etc"
    etc.mkdir()
    var_log = _shared_log_dir(shared / "var/log")
    (var_log / "nvhook").mkdir(mode=0o755)
    log = var_log / "nvhook/hook.log"
    bundle, state = _bundle(shared, ["NVIDIA_VISIBLE_DEVICES=9"])
    cfg = hookenv.write_config(shared / "config.toml", a100_host, log=log)
    r = run([NVHOOK, "--config", str(cfg), "prestart"], input=state, cwd=str(bundle))
    assert (r.returncode, r.stderr) == (1, "nvhook: unknown device: 9\n")
    assert log.read_text().endswith("ERROR tenant1: prestart: unknown device: 9\n")

    _as_nobody("mv", str(var_log / "nvhook"), str(var_log / "old"))
    if plant == "own-dir":
        _as_nobody("mkdir", "-m", "0777", str(var_log / "nvhook"))
        why = f"directory {var_log}/nvhook is owned by nobody (uid {NOBODY})"
    else:
        _as_nobody("ln", "-s", str(etc), str(var_log / "nvhook"))
        why = f"{var_log}/nvhook is a symlink owned by nobody (uid {NOBODY})"
    r = run([NVHOOK, "--config", str(cfg), "prestart"], input=state, cwd=str(bundle))
    assert os.listdir(etc) == [] and not (var_log / "nvhook/hook.log").exists()
    assert (r.returncode, r.stderr.splitlines()) == (
        1, [f"nvhook: log file {log}: {why}; not logging there", "nvhook: unknown device: 9"])


def test_the_shims_debug_log_is_not_followed(tmp_path, shared):
    """[nvidia-container-runtime] debug: the shim's own log, written as root on every call."""
    preload = _preload(tmp_path)
    logs = _shared_log_dir(shared / "logs")
    _as_nobody("ln", "-s", str(preload), str(logs / "runtime.log"))
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[nvidia-container-runtime]\ndebug = "{logs}/runtime.log"\nlog-level = "debug"\n'
                   f'runtimes = ["{shutil.which("runc")}"]\n')
    r = run([SHIM, "--root", str(tmp_path / "runc"), "--log", str(tmp_path / "runc.log"), "state", "none"],
            env={"PATH": "/usr/bin:/bin", "NVHOOK_CONFIG": str(cfg)})
    assert preload.read_bytes() == PRELOAD
    assert f"nvhook: log file {logs}/runtime.log: directory {logs} is writable by group nogroup" in r.stderr
    # the engine's own log (runc's --log) still has the shim's line
    assert "nvhook-runtime: exec " in (tmp_path / "runc.log").read_text()


def test_container_values_cannot_forge_or_hide_log_lines(tmp_path, a100_host):
    """NVIDIA_VISIBLE_DEVICES with CR, ESC and a newline: a line that, shown on a
    terminal or read by a line-based shipper, hid itself and forged another."""
    log = tmp_path / "logs/hook.log"
    log.parent.mkdir()
    cfg = hookenv.write_config(tmp_path / "config.toml", a100_host, log=log)
    evil = "1\r\x1b[2K\x1b[1A2026-11-29T00:00:00.000 nvhook[1] INFO ok\nforged \x85\u2028x"
    bundle, state = _bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={evil}"])
    r = run([NVHOOK, "--config", str(cfg), "prestart"], input=state, cwd=str(bundle))
    assert r.returncode == 1
    data = log.read_bytes()
    assert not any(b < 0x20 and b != 0x0A for b in data), data
    text = data.decode()
    assert "\x85" not in text and "\u2028" not in text
    assert all(" nvhook[" in ln and not ln.startswith("2026-11-29T00:00:00.000") for ln in text.splitlines())
    assert "1\\r\\x1b[2K\\x1b[1A2026-11-29T00:00:00.000 nvhook[1] INFO ok\\nforged \\x85\\u2028x" in text


def test_a_fifo_as_the_log_does_not_stop_the_start(tmp_path, a100_host):
    """A FIFO nobody reads where the log goes: opening it to write waited for ever."""
    log = tmp_path / "hook.log"
    os.mkfifo(log)
    bundle, state = _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=9"])
    cfg = hookenv.write_config(tmp_path / "config.toml", a100_host, log=log)
    r = run([NVHOOK, "--config", str(cfg), "prestart"], input=state, cwd=str(bundle), timeout=60)
    assert r.stderr.splitlines() == [f"nvhook: log file {log}: a fifo, not a regular file; not logging there",
                                     "nvhook: unknown device: 9"]
