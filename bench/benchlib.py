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


# Targets of issue 33: what nvhook adds to a start over what NVIDIA's stack adds in the same run.
SERVED_TARGET = 0.5
EXECD_TARGET = 1.5


def ratio_line(label: str, ours_ms: float, theirs_ms: float | None, target: float) -> tuple[str, bool | None]:
    """One line: nvhook's added ms over NVIDIA's added ms (same run, same baseline) and its
    target; and whether it is met (None: no NVIDIA figure, or one too small to divide by)."""
    if theirs_ms is None:
        return f"  {label:34s} nvhook +{ours_ms:.1f} ms (NVIDIA's not measured)", None
    if theirs_ms <= 0.5:
        return (f"  {label:34s} nvhook {ours_ms:+.1f} ms / NVIDIA {theirs_ms:+.1f} ms: no ratio "
                "(NVIDIA's within noise of the baseline)"), None
    r = ours_ms / theirs_ms
    met = r <= target
    return (f"  {label:34s} nvhook {ours_ms:+6.1f} ms / NVIDIA {theirs_ms:+6.1f} ms = {r:4.2f}x  "
            f"(target <= {target:g}x: {'met' if met else 'NOT met'})"), met
