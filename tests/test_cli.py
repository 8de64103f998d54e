"""The CLI dispatcher: hook stages skip argparse, and agree with it."""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO
from libinject.runtime.hook import parse_argv
from nvhook import cli


@pytest.mark.parametrize("argv", [
    ["prestart"],
    ["--config", "/etc/x.toml", "prestart"],
    ["--root", "/r", "--ldcache", "/c", "--user", "1:2", "--debug", "/d", "--load-kmods",
     "--config", "/x", "createContainer"],
    ["poststop"],
])
def test_hook_args_match_argparse(argv):
    fast = parse_argv(argv)
    parser = cli._global_parser()
    sub = parser.add_subparsers(dest="command")
    sub.add_parser(argv[-1])
    slow = parser.parse_args(argv)
    assert fast is not None and vars(fast) == vars(slow)


@pytest.mark.parametrize("argv", [
    ["--config=/x", "prestart"], ["--bogus", "prestart"], ["--config", "prestart"],
    ["-h", "prestart"], ["prestart", "extra"], ["configure", "prestart"], ["--config", "-x", "prestart"],
])
def test_unusual_hook_args_go_to_argparse(argv):
    assert parse_argv(argv) is None


def test_hook_stage_does_not_import_argparse():
    """The exec'd hook's start-up: a no-op stage imports no argparse and, of libinject,
    only the hook runner, what the front tells it, the shared names, the error type, the state reader (stdin is
    drained with a deadline), its JSON reader and the record type its State is."""
    code = ("import sys; from nvhook.cli import main; rc = main(['poststart']); "
            "print(rc, 'argparse' in sys.modules, "
            "sorted(m for m in sys.modules if m.startswith('libinject')))")
    r = subprocess.run([sys.executable, "-I", "-c", code], input="{}", capture_output=True,
                       text=True, cwd=REPO, timeout=60)
    assert r.stdout.strip().split(maxsplit=2) == [
        "0", "False", "['libinject', 'libinject.constants', 'libinject.errors', 'libinject.jsonc', "
        "'libinject.record', "
        "'libinject.request', 'libinject.request.oci_state', 'libinject.runtime', 'libinject.runtime.front', "
            "'libinject.runtime.hook']"], \
        r.stdout + r.stderr


def test_bad_global_option_is_reported_by_argparse():
    r = subprocess.run([sys.executable, "-I", "-m", "nvhook", "--bogus", "prestart"], input="{}",
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 2 and "unrecognized arguments: --bogus" in r.stderr


def test_a_user_who_is_not_root_is_told_root_is_needed():
    """`nvhook info` as a user (nobody) on a simulated host everyone can read: NVML's
    query needs root (a mount namespace, then dropping to nobody); one line saying so
    (old code: `NVML ... failed: PermissionError: ... Operation not permitted`, no hint)."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from libinject.sim.build import create_host

    top = Path(tempfile.mkdtemp(prefix="nvu", dir="/tmp"))
    try:
        os.chmod(top, 0o755)
        host = create_host(top / "host", profile="t4x1")
        cfg = top / "config.toml"
        cfg.write_text("[nvhook]\nsnapshot = false\n")
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            str(REPO / ".venv/bin/nvhook"), "--root", str(host), "info"],
                           capture_output=True, text=True, timeout=120,
                           env={"PATH": "/usr/bin:/bin", "NVHOOK_CONFIG": str(cfg)})
        assert r.returncode == 1 and r.stdout == "", r
        [line] = r.stderr.splitlines()
        assert line.startswith(f"nvhook: NVML on driver root {host} needs root: run this as root ("), line
    finally:
        shutil.rmtree(top)


@pytest.mark.parametrize("stage", ["poststart", "poststop", "prestart", "createContainer"])
def test_every_hook_stage_prints_its_usage_on_help(stage):
    """`nvhook STAGE --help` through the installed front (as a user types it): usage on
    stdout, exit 0; the no-op stages used to exit 0 printing nothing."""
    from conftest import NVHOOK

    r = subprocess.run([NVHOOK, stage, "--help"], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin"})
    assert (r.returncode, r.stdout.splitlines()[:1], r.stderr) == (0, [f"usage: nvhook {stage} [-h]"], "")
