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


def nvhook_in_process(capsys, *args: str) -> tuple[int, str, str]:
    """`nvhook ARGS` through nvhook.cli.main in this process: (exit code, stdout, stderr)."""
    from nvhook import cli

    code = cli.main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def tree_state(*bases: Path, deep: bool = True) -> dict[str, tuple]:
    """Every entry under bases (deep: all levels; else the top level, keyed by name):
    its bytes or link target ("dir" for a directory), mode and owner -- what `--undo`
    must restore exactly."""
    import stat

    out = {}
    for base in bases:
        for p in sorted(base.rglob("*") if deep else base.iterdir()):
            st = p.lstat()
            body = os.readlink(p) if p.is_symlink() else "dir" if p.is_dir() else p.read_bytes()
            out[str(p) if deep else p.name] = (body, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
    return out
