"""Benchmark: the runtime shim's pass-through (every runc command but `create`), added to
calling runc directly. Engines call the runtime several times per container (state,
start, kill, delete...), so this is paid on every container, GPU or not.

    .venv/bin/python bench/bench_shim.py [N]      (default N=30)

Interleaved runs of `runc --root R list` and `nvhook-runtime --root R list` (the compiled
front, csrc/shimfront.c, execs runc itself) and, for reference, `nvhook runtime --root
R list` (the same through Python). Prints medians, p90 and the added time.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from benchlib import stats, timed

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    runc = shutil.which("runc") or "/usr/sbin/runc"
    shim = str(REPO / ".venv/bin/nvhook-runtime")
    py = [str(REPO / ".venv/bin/nvhook"), "runtime"]
    state = tempfile.mkdtemp(prefix="nvbench-shim")
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
           "XDG_CONFIG_HOME": state}          # no config.toml: NVIDIA's defaults
    cases = {"runc": [runc, "--root", state, "list"], "shim (compiled front)": [shim, "--root", state, "list"],
             "shim through Python": [*py, "--root", state, "list"]}
    times: dict[str, list[float]] = {k: [] for k in cases}
    try:
        for _ in range(2):                    # warm the page cache
            for argv in cases.values():
                timed(argv, env)
        for _ in range(n):
            for k, argv in cases.items():
                times[k].append(timed(argv, env))
    finally:
        shutil.rmtree(state, ignore_errors=True)
    base, _ = stats(times["runc"])
    print(f"runtime shim pass-through (`list`), {n} interleaved runs each, medians:")
    for k, xs in times.items():
        med, p90 = stats(xs)
        print(f"  {k:24s} {med * 1000:7.2f} ms (p90 {p90 * 1000:6.2f})  added {1000 * (med - base):+7.2f} ms"
              f"  x{med / base:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
