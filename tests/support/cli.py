"""The real `nvhook` CLI as tests run it (test_list_info.py, test_selection.py,
test_bad_input*.py): a caller with a config of its own, and the one clear `nvhook: `
line a refused command must give."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Callable

from conftest import NVHOOK, run

# What a clear line is not: Python's own words for a bug.
NOT_CLEAR = re.compile(r"Traceback|internal error|\b[A-Z][A-Za-z]*Error\b"
                       r"|set_int_max_str_digits|maximum recursion")


def nvhook_caller(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess]:
    """call(*args): `nvhook ARGS`, with only PATH and a config.toml of its own in tmp_path
    (snapshot-dir under tmp_path)."""
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[nvhook]\nsnapshot-dir = "{tmp_path}/snapshots"\n')
    env = {"PATH": os.environ["PATH"], "NVHOOK_CONFIG": str(cfg)}

    def call(*args: str) -> subprocess.CompletedProcess:
        return run([NVHOOK, *args], env=env)

    return call


def one_error(r: subprocess.CompletedProcess, *expected: str,
              not_clear: re.Pattern[str] = NOT_CLEAR) -> str:
    """The single `nvhook: ` line of a failed command (asserting it is one, and clear:
    exit 1, printable, short, nothing `not_clear` matches, every `expected` in it)."""
    lines = r.stderr.splitlines()
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("nvhook: "), r.stderr[-2000:]
    line = lines[0]
    assert not not_clear.search(line), line
    assert line.isprintable() and len(line) < 1000, repr(line[:300])
    for e in expected:
        assert e in line, line
    return line
