"""Benchmark: discover() on a simulated host, cold (NVML child + file lookup) vs warm
(snapshot whose fingerprint still matches), in this process.

Baseline, measured in the same run, interleaved with the samples: cold discovery,
i.e. discover(snapshot=False) — what every container start would pay without
snapshots. Printed: median and p90 of each, and warm/cold ratio. Also for scale:
one `python -I -c pass` start (the floor of any NVML child).

Usage: python bench/bench_discover.py [N] [PROFILE]   (default N=20, a100x8; BENCH_N works)
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from benchlib import stats as _stats

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))



def main() -> int:
    from libinject.discover.driver import discover
    from libinject.sim.build import create_host

    n = int(sys.argv[1]) if len(sys.argv) > 1 else int(os.environ.get("BENCH_N", "20"))
    profile = sys.argv[2] if len(sys.argv) > 2 else "a100x8"
    with tempfile.TemporaryDirectory(prefix="bench-discover-") as tmp:
        root = str(create_host(Path(tmp) / "host", profile=profile))
        snaps = os.path.join(tmp, "snapshots")
        first = discover(root, snapshot_dir=snaps)           # writes the snapshot
        cold, warm, pystart = [], [], []
        for _ in range(n):
            t = time.perf_counter()
            d = discover(root, snapshot=False)
            cold.append(time.perf_counter() - t)
            t = time.perf_counter()
            w = discover(root, snapshot_dir=snaps)
            warm.append(time.perf_counter() - t)
            t = time.perf_counter()
            subprocess.run([sys.executable, "-I", "-c", "pass"], check=True)
            pystart.append(time.perf_counter() - t)
            assert w == d == first
    (cm, cp), (wm, wp), (pm, _) = _stats(cold), _stats(warm), _stats(pystart)
    print(f"discover {profile} ({len(first.info.gpus)} GPUs, {len(first.libraries)} libraries), n={n}")
    print(f"  cold (NVML child, baseline): median {cm * 1e3:7.2f} ms  p90 {cp * 1e3:7.2f} ms")
    print(f"  warm (snapshot):             median {wm * 1e3:7.2f} ms  p90 {wp * 1e3:7.2f} ms")
    print(f"  warm/cold ratio: {wm / cm:.4f} ({cm / wm:.1f}x faster)")
    print(f"  for scale: python -I -c pass median {pm * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
