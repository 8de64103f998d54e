"""What every benchmark here shares: timing a command, summarising samples, waiting
for a service a benchmark started."""
from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path


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


def await_log(proc: subprocess.Popen, log: Path, text: str, what: str, timeout: float = 60) -> None:
    """Wait until `log` holds `text` (e.g. `nvhook serve`'s "warm:"); a process that
    exits first, or `timeout` s, stops the benchmark (the process killed)."""
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"{what} did not start: {log.read_text(errors='replace')}")
        time.sleep(0.02)
