"""Running the packaging scripts (packaging/build_*.py) as `make deb`, `make bundle` and
`make image` run them: this Python, a fresh output dir; what they print is what they made."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def build(script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 1200) -> list[str]:
    """packaging/<script> ARGS...; its stdout's lines (a failure fails the test, with the
    end of its stderr)."""
    r = subprocess.run([sys.executable, str(REPO / "packaging" / script), *args], capture_output=True,
                       text=True, timeout=timeout, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.splitlines()
