"""`nvhook setup service` (the systemd unit of `nvhook serve`) and the service's sd_notify
readiness, through the front as the unit runs it.

PID 1 here is not systemd: the unit is checked offline with `systemd-analyze verify`,
systemctl is a fake that records its calls (in-process, with the module's paths pointed
at it), and the notifications go to a datagram socket of the test's own.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest

from conftest import NVHOOK, REPO, run
from libinject.constants import SAFE_PATH
from support import hookenv, serve_client
from support.cli import one_error, tree_state

UNIT = "nvhook-serve.service"
TEMPLATE = REPO / "libinject/setup/units" / UNIT
ANALYZE = "/usr/bin/systemd-analyze"


def setup(*args: str, config: str | None = None) -> subprocess.CompletedProcess:
    """`nvhook [--config C] setup service ARGS` as an administrator runs it, with the
    store of backups beside the unit dir (never the host's /var/lib/nvhook)."""
    pre = ["--config", config] if config else []
    units = Path(args[args.index("--unit-dir") + 1])
    return run([NVHOOK, *pre, "setup", "service", *args, "--backup-dir", str(units.parent / "setup-backups")],
               env={"PATH": SAFE_PATH})


def snapshot(d: Path) -> dict[str, tuple]:
    """Every entry of d: its bytes (or link target), mode and owner."""
    return tree_state(d, deep=False)


@pytest.fixture(autouse=True)
def backup_dir(tmp_path, monkeypatch) -> Path:
    """The store of backups for in-process runs: tmp_path's, as setup() passes it."""
    from libinject.setup import store

    d = tmp_path / "setup-backups"
    monkeypatch.setattr(store, "STORE_DIR", str(d))
    return d


@pytest.fixture
def units(tmp_path) -> Path:
    d = tmp_path / "units"
    d.mkdir()
    return d


# -- the unit it writes ---------------------------------------------------------------------

def test_written_unit_passes_systemd_analyze_verify(units):
    hookenv.ensure_front()
    assert setup("--unit-dir", str(units)).returncode == 0
    unit = units / UNIT
    # --man=no: no man pages to look up offline; the ExecStart binary must exist (it does:
    # this install's front)
    r = run([ANALYZE, "verify", "--man=no", str(unit)], env={"PATH": SAFE_PATH})
    assert r.returncode == 0 and str(unit) not in r.stderr + r.stdout, r.stderr + r.stdout


def test_systemd_analyze_verify_rejects_a_unit_whose_front_is_missing(tmp_path):
    """The check above has teeth: the template as shipped (placeholder ExecStart) fails."""
    unit = tmp_path / UNIT
    unit.write_bytes(TEMPLATE.read_bytes())
    r = run([ANALYZE, "verify", "--man=no", str(unit)], env={"PATH": SAFE_PATH})
    assert r.returncode != 0 and "is not executable" in r.stderr, r.stderr


def test_unit_runs_this_installs_front_with_notify(units):
    front = hookenv.ensure_front()
    setup("--unit-dir", str(units), config="/etc/nvhook serve.toml")
    lines = (units / UNIT).read_text().splitlines()
    assert [l for l in lines if l.startswith(("ExecStart=", "Type=", "NotifyAccess="))] == [
        "Type=notify", "NotifyAccess=main", f'ExecStart={front} --config "/etc/nvhook serve.toml" serve']
    # everything else is the template's
    tmpl = TEMPLATE.read_text().splitlines()
    assert [l for l in lines if not l.startswith("ExecStart=")] == [
        l for l in tmpl if not l.startswith("ExecStart=")]


def test_second_run_is_unchanged(units):
    first = setup("--unit-dir", str(units))
    before = (units / UNIT).stat()
    second = setup("--unit-dir", str(units))
    after = (units / UNIT).stat()
    assert first.stdout.startswith(f"wrote {units / UNIT};"), first.stdout
    assert second.stdout.startswith(f"unchanged: {units / UNIT};"), second.stdout
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)


def test_dry_run_shows_the_diff_and_writes_nothing(units):
    old = TEMPLATE.read_text()
    (units / UNIT).write_text(old)
    was = snapshot(units)
    r = setup("--unit-dir", str(units), "--dry-run")
    front = hookenv.ensure_front()
    assert r.returncode == 0 and snapshot(units) == was
    assert r.stdout.startswith(f"--- {units / UNIT}\n+++ {units / UNIT}\n@@ "), r.stdout
    changed = [l for l in r.stdout.splitlines()[2:] if l[:1] in "+-"]
    assert changed == ["-ExecStart=/usr/local/libexec/nvhook/nvhook-hook serve",
                       f"+ExecStart={front} serve"]


def test_dry_run_of_a_new_unit_diffs_against_nothing(units):
    r = setup("--unit-dir", str(units), "--dry-run")
    assert r.returncode == 0 and list(units.iterdir()) == []
    assert r.stdout.startswith(f"--- /dev/null\n+++ {units / UNIT}\n"), r.stdout


# -- undo ---------------------------------------------------------------------------------------

def test_undo_restores_a_previous_unit_byte_identical(units):
    (units / UNIT).write_bytes(b"[Service]\r\nExecStart=/bin/true  \n# no newline at the end")
    os.chmod(units / UNIT, 0o600)
    os.chown(units / UNIT, 0, 4)
    was = snapshot(units)
    assert setup("--unit-dir", str(units)).returncode == 0
    assert snapshot(units) != was
    r = setup("--unit-dir", str(units), "--undo")
    assert r.returncode == 0, r.stderr
    assert snapshot(units) == was, r.stdout


def test_undo_removes_the_unit_when_there_was_none(units):
    (units / "other.service").write_text("[Service]\nExecStart=/bin/true\n")
    was = snapshot(units)
    assert setup("--unit-dir", str(units)).returncode == 0
    assert setup("--unit-dir", str(units), "--undo").returncode == 0
    assert snapshot(units) == was


def test_undo_restores_what_was_there_before_the_first_run(units):
    """A later run that changes the unit (another --config) keeps the first backup."""
    (units / UNIT).write_text("[Service]\nExecStart=/bin/admins-own\n")
    was = snapshot(units)
    setup("--unit-dir", str(units))
    assert setup("--unit-dir", str(units), config="/srv/n.toml").stdout.startswith("wrote")
    setup("--unit-dir", str(units), "--undo")
    assert snapshot(units) == was


def test_undo_restores_a_symlinked_unit(units, tmp_path):
    target = tmp_path / "elsewhere.service"
    target.write_text("[Service]\nExecStart=/bin/true\n")
    (units / UNIT).symlink_to(target)
    was = snapshot(units)
    setup("--unit-dir", str(units))
    assert target.read_text() == "[Service]\nExecStart=/bin/true\n"    # replaced, not written through
    setup("--unit-dir", str(units), "--undo")
    assert snapshot(units) == was


def test_undo_with_nothing_to_undo_changes_nothing(units):
    (units / UNIT).write_text("[Service]\nExecStart=/bin/admins-own\n")
    was = snapshot(units)
    r = setup("--unit-dir", str(units), "--undo")
    assert r.returncode == 0 and r.stdout.startswith("nothing to undo") and snapshot(units) == was


# -- refusals ----------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["masked", "no dir", "relative config", "a directory there"])
def test_refusals_are_one_line_and_change_nothing(units, tmp_path, case):
    args, config = ["--unit-dir", str(units)], None
    if case == "masked":
        (units / UNIT).symlink_to("/dev/null")
        expected = "is masked"
    elif case == "no dir":
        args = ["--unit-dir", str(tmp_path / "missing")]
        expected = "No such file or directory"
    elif case == "relative config":
        config = "nvhook.toml"
        expected = "--config must be absolute"
    else:
        (units / UNIT).mkdir()
        expected = "neither a file nor a symlink"
    was = snapshot(units)
    one_error(setup(*args, config=config), expected)
    assert snapshot(units) == was and not (tmp_path / "missing").exists()


# -- systemd -----------------------------------------------------------------------------------

def test_without_systemd_it_says_so_in_one_line(units, tmp_path, monkeypatch, capsys):
    from nvhook import cli, cmd_setup

    gone = tmp_path / "no-run-systemd"         # as on a host whose init is not systemd
    monkeypatch.setattr(cmd_setup, "SYSTEMD_RUNNING", str(gone))
    assert cli.main(["setup", "service", "--unit-dir", str(units)]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    assert out.out == (f"wrote {units / UNIT}; systemd is not running here (no {gone}): "
                       "not enabled or started\n")


@pytest.fixture
def fake_systemd(tmp_path, monkeypatch):
    """cmd_setup with systemd "running", units in tmp_path/units counted as a systemd
    unit directory, and a systemctl that appends its argv to tmp_path/calls."""
    from nvhook import cmd_setup

    (tmp_path / "run-systemd").mkdir()
    calls = tmp_path / "calls"
    fake = tmp_path / "systemctl"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n[ "$1" != sleep ] || exec sleep 30\n')
    fake.chmod(0o755)
    monkeypatch.setattr(cmd_setup, "SYSTEMD_RUNNING", str(tmp_path / "run-systemd"))
    monkeypatch.setattr(cmd_setup, "SYSTEMD_UNIT_DIRS", (str(tmp_path / "units"),))
    monkeypatch.setattr(cmd_setup, "SYSTEMCTL", str(fake))

    def nvhook(*args: str) -> tuple[int, list[str]]:
        from nvhook import cli

        calls.unlink(missing_ok=True)
        code = cli.main(["setup", "service", "--unit-dir", str(tmp_path / "units"), *args])
        return code, calls.read_text().splitlines() if calls.exists() else []

    return nvhook


def test_under_systemd_it_reloads_and_enables_the_service(units, fake_systemd, capsys):
    assert fake_systemd() == (0, ["daemon-reload", f"try-restart {UNIT}", f"enable --now {UNIT}"])
    assert capsys.readouterr().out.endswith(f"; {UNIT} enabled and running\n")
    assert fake_systemd() == (0, [f"enable --now {UNIT}"])      # unchanged: nothing to reload
    assert fake_systemd("--no-start") == (0, [])


def test_under_systemd_undo_stops_and_disables_first(units, fake_systemd):
    fake_systemd()
    assert fake_systemd("--undo") == (0, [f"disable --now {UNIT}", "daemon-reload"])
    assert not (units / UNIT).exists()


def test_systemctl_past_its_deadline_is_killed(units, fake_systemd, monkeypatch, capsys):
    from nvhook import cmd_setup

    monkeypatch.setattr(cmd_setup, "SYSTEMCTL_TIMEOUT", 1.0)
    real = cmd_setup._systemctl
    monkeypatch.setattr(cmd_setup, "_systemctl", lambda argv, timeout: real(["sleep", *argv], timeout))
    t = time.monotonic()
    code, _ = fake_systemd()
    assert code == 1 and time.monotonic() - t < 10
    err = capsys.readouterr().err
    assert err.startswith("nvhook: `systemctl daemon-reload` did not finish within 1 s (killed); "
                          f"wrote {units / UNIT}"), err


# -- sd_notify, through the front --------------------------------------------------------------

class NotifySocket:
    """A datagram socket standing in for systemd's notify socket: each message with the
    sender's pid (SCM_CREDENTIALS, as systemd checks NotifyAccess=main)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.s.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.s.bind(str(path))

    def recv(self, timeout: float) -> tuple[str, int] | None:
        self.s.settimeout(timeout)
        try:
            data, anc, _, _ = self.s.recvmsg(4096, socket.CMSG_SPACE(12))
        except TimeoutError:
            return None
        pid = next(struct.unpack("3i", p)[0] for level, kind, p in anc
                   if (level, kind) == (socket.SOL_SOCKET, socket.SCM_CREDENTIALS))
        return data.decode(), pid

    def close(self) -> None:
        self.s.close()


@pytest.fixture
def notified(tmp_path, fresh_sim_host, sockdir):
    """`nvhook-hook --config C serve --socket S`, as the unit runs it, with NOTIFY_SOCKET
    set; the host's NVML takes 1.5 s, so warm-up (before the socket) is slow."""
    cfg = hookenv.slow_warm_config(tmp_path, fresh_sim_host("t4x1"))
    ns = NotifySocket(sockdir / "notify")
    log = tmp_path / "serve.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([hookenv.ensure_front(), "--config", str(cfg), "serve",
                                 "--socket", str(sockdir / "run/hook.sock")],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err, env={"NOTIFY_SOCKET": str(ns.path)})
    try:
        yield proc, ns, sockdir / "run/hook.sock", log
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        ns.close()


def _served(sock: Path, tmp_path: Path) -> int | None:
    b = tmp_path / "bundle"
    (b / "rootfs").mkdir(parents=True, exist_ok=True)
    (b / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": "rootfs"},
                                               "process": {"env": ["PATH=/bin"]}}))
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 1,
                        "bundle": str(b)})
    return serve_client.call(str(sock), ["nvhook-hook", "prestart"], state.encode())


def test_ready_comes_from_the_main_pid_once_the_socket_serves(notified, tmp_path):
    proc, ns, sock, log = notified
    msg = ns.recv(60)
    assert msg is not None, log.read_text()
    # at once: the hook socket takes a request and serves it
    assert _served(sock, tmp_path) is not None, log.read_text()
    text, pid = msg
    assert text == f"READY=1\nSTATUS=serving on {sock}"
    assert pid == proc.pid              # the front exec'd python: NotifyAccess=main holds
    assert "warm: driver" in log.read_text()


def test_stopping_on_sigterm(notified):
    proc, ns, _, log = notified
    assert ns.recv(60) is not None, log.read_text()
    proc.send_signal(signal.SIGTERM)
    msg = ns.recv(30)
    assert msg == ("STOPPING=1\nSTATUS=stopping: 0 request(s) in flight", proc.pid), log.read_text()
    assert proc.wait(30) == 0


# -- the front passes NOTIFY_SOCKET on to `serve` only -------------------------------------------

SPY = """#!/bin/sh
env > "{out}"
"""


@pytest.fixture(scope="module")
def spy_front(tmp_path_factory) -> tuple[Path, Path]:
    """The front built against a "python" that records the environment it is given."""
    d = tmp_path_factory.mktemp("spy")
    py = d / "python"
    py.write_text(SPY.format(out=d / "env"))
    py.chmod(0o755)
    subprocess.run(["cc", "-O2", "-static", f'-DNVHOOK_PYTHON="{py}"', "-o", str(d / "nvhook-hook"),
                    str(hookenv.FRONT_SRC)], check=True, timeout=120)
    return d / "nvhook-hook", d / "env"


@pytest.mark.parametrize("command", ["prestart", "createContainer", "serve"])
def test_front_passes_notify_socket_to_serve_only(tmp_path, spy_front, command):
    front, out = spy_front
    out.unlink(missing_ok=True)
    b = tmp_path / "bundle"
    b.mkdir()
    (b / "config.json").write_text(json.dumps({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}}))
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 1,
                        "bundle": str(b)})
    env = {"NOTIFY_SOCKET": "/run/systemd/notify", "LD_PRELOAD": "/evil.so", "PATH": "/x"}
    r = subprocess.run([str(front), "--socket", "none", command], input=state.encode(),
                       capture_output=True, env=env, cwd="/", timeout=60)
    assert r.returncode == 0, r.stderr
    seen = dict(l.split("=", 1) for l in out.read_text().splitlines() if "=" in l)
    for k in ("PWD", "SHLVL", "_"):     # the spy's shell sets these
        seen.pop(k, None)
    expected = {"PATH": SAFE_PATH, "NVHOOK_HOOK_CWD": "/"}
    if command == "serve":
        expected["NOTIFY_SOCKET"] = "/run/systemd/notify"
    assert seen == expected


def test_hook_stage_sends_nothing_to_notify_socket(tmp_path, a100_host, sockdir):
    """The real front and hook, for a GPU container, with NOTIFY_SOCKET set: Python runs
    (its answer proves it) and the socket hears nothing."""
    ns = NotifySocket(sockdir / "notify")
    try:
        cfg = hookenv.write_config(tmp_path / "c.toml", a100_host)
        b = tmp_path / "bundle"
        (b / "rootfs").mkdir(parents=True)
        (b / "config.json").write_text(json.dumps({
            "ociVersion": "1.0.2", "root": {"path": "rootfs"},
            "process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=9"]}}))
        state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 1,
                            "bundle": str(b)})
        r = subprocess.run([hookenv.ensure_front(), "--config", str(cfg), "--socket", "none", "prestart"],
                           input=state, capture_output=True, text=True, timeout=60,
                           env={"NOTIFY_SOCKET": str(ns.path)})
        assert r.stderr == "nvhook: unknown device: 9\n"
        assert ns.recv(0.5) is None
    finally:
        ns.close()


def test_cdi_refresh_unit_runs_this_installs_front(units):
    """`setup service --cdi-refresh` also writes nvhook-cdi-refresh.service from its
    template (whose ExecStart is a placeholder), running this install's front; it passes
    systemd-analyze verify; --undo takes both away."""
    from libinject.setup.service import REFRESH_UNIT

    front = hookenv.ensure_front()
    r = setup("--unit-dir", str(units), "--cdi-refresh", config="/etc/nvhook/config.toml")
    assert r.returncode == 0, r.stderr
    assert [ln.split(";")[0] for ln in r.stdout.splitlines()] == [f"wrote {units / UNIT}",
                                                                   f"wrote {units / REFRESH_UNIT}"]
    lines = (units / REFRESH_UNIT).read_text().splitlines()
    assert [ln for ln in lines if ln.startswith("ExecStart=")] == [
        f"ExecStart={front} --config /etc/nvhook/config.toml cdi refresh --watch"]
    v = run([ANALYZE, "verify", "--man=no", str(units / REFRESH_UNIT)], env={"PATH": SAFE_PATH})
    assert v.returncode == 0, v.stderr + v.stdout
    assert setup("--unit-dir", str(units), "--cdi-refresh", "--undo").returncode == 0
    assert sorted(p.name for p in units.iterdir()) == []
