"""Runs every bench/bench_*.py in turn; each prints its own numbers and ratios
against a baseline measured in the same process."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    only = set(sys.argv[1:])
    rc = 0
    for script in sorted(HERE.glob("bench_*.py")):
        name = script.stem.removeprefix("bench_")
        if only and name not in only:
            continue
        print(f"== {name}", flush=True)
        rc |= subprocess.call([sys.executable, str(script)])
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
