"""Runs every bench/bench_*.py in turn (or those named: `run.py hook cdi`); each prints its
own numbers and ratios against a baseline measured in the same run. At the end, the
ratios to NVIDIA's stack measured beside nvhook (bench/nvidia.py) with their targets,
gathered from all of them."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    only = set(sys.argv[1:])
    rc = 0
    summary: list[str] = []
    for script in sorted(HERE.glob("bench_*.py")):
        name = script.stem.removeprefix("bench_")
        if only and name not in only:
            continue
        print(f"== {name}", flush=True)
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            if "(target <=" in line and "/ NVIDIA" in line or "NVIDIA's stack" in line:
                summary.append(f"{name:6s}{line.rstrip()}")
        rc |= proc.wait()
    if summary:
        print("== ratios to NVIDIA's stack (added time over the same run's baseline, nvhook / NVIDIA)")
        print("\n".join(summary))
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
