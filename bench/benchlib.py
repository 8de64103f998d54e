"""What every benchmark here shares: timing a command and summarising samples."""
from __future__ import annotations

import statistics
import subprocess
import time


def stats(xs: list[float]) -> tuple[float, float]:
    """(median, p90) of the samples."""
    s = sorted(xs)
    return statistics.median(s), s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))]


def timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    """Seconds one run of argv takes; a failing run stops the benchmark."""
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(argv)}\n{r.stderr}")
    return dt
