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
    only the hook runner, the shared names, the error type, the state reader (stdin is
    drained with a deadline), its JSON reader and the record type its State is."""
    code = ("import sys; from nvhook.cli import main; rc = main(['poststart']); "
            "print(rc, 'argparse' in sys.modules, "
            "sorted(m for m in sys.modules if m.startswith('libinject')))")
    r = subprocess.run([sys.executable, "-I", "-c", code], input="{}", capture_output=True,
                       text=True, cwd=REPO, timeout=60)
    assert r.stdout.strip().split(maxsplit=2) == [
        "0", "False", "['libinject', 'libinject.constants', 'libinject.errors', 'libinject.jsonc', "
        "'libinject.record', "
        "'libinject.request', 'libinject.request.oci_state', 'libinject.runtime', 'libinject.runtime.hook']"], \
        r.stdout + r.stderr


def test_bad_global_option_is_reported_by_argparse():
    r = subprocess.run([sys.executable, "-I", "-m", "nvhook", "--bogus", "prestart"], input="{}",
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 2 and "unrecognized arguments: --bogus" in r.stderr
