"""Benchmark: `nvhook configure` of all GPUs with all capabilities on a simulated a100x8
host, into a fresh busybox+glibc rootfs, in a private mount namespace.

Each sample runs, as a new process tree:
    unshare -m --propagation private sh -c 'nvhook --root HOST configure --device=all
        --utility --compute --video --graphics --display --ngx --compat32 ROOTFS'
(the rootfs is a fresh copy for every sample; copying is not timed).

Baseline, measured in the same run, interleaved with the samples:
    unshare -m --propagation private sh -c 'mount --bind ROOTFS ROOTFS'
i.e. the fixed cost of the harness (fork/exec of unshare and sh, a new mount namespace,
one bind mount) that any injector pays. Also printed for scale: the start-up of the
venv's interpreter importing nvhook's CLI (`python -I -c "import nvhook.cli"`).

Usage: python bench/bench_configure.py [N]   (default N=10; BENCH_N also works)
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from benchlib import stats as _stats, timed as _timed

REPO = Path(__file__).resolve().parent.parent
NVHOOK = str(REPO / ".venv/bin/nvhook")
PY = str(REPO / ".venv/bin/python")
CAPS = ("--utility", "--compute", "--video", "--graphics", "--display", "--ngx", "--compat32")




def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else int(os.environ.get("BENCH_N", "10"))
    sys.path.insert(0, str(REPO))
    from libinject.sim.build import create_host
    from libinject.sim.rootfs import build_rootfs

    with tempfile.TemporaryDirectory(prefix="nvhook-bench-") as tmp:
        t = Path(tmp)
        host = create_host(t / "host", profile="a100x8")
        template = build_rootfs(t / "template")

        def fresh(i: int) -> Path:
            dst = t / f"rootfs{i}"
            shutil.copytree(template, dst, symlinks=True)
            return dst

        def configure_cmd(rootfs: Path) -> list[str]:
            inner = " ".join([NVHOOK, "--root", str(host), "configure", "--device=all", *CAPS, str(rootfs)])
            return ["unshare", "-m", "--propagation", "private", "sh", "-c", inner]

        def baseline_cmd(rootfs: Path) -> list[str]:
            return ["unshare", "-m", "--propagation", "private", "sh", "-c",
                    f"mount --bind {rootfs} {rootfs}"]

        # Cold first run (fills any discovery snapshot), then warm-up of the baseline.
        cold = _timed(configure_cmd(fresh(-1)))
        _timed(baseline_cmd(template))
        conf: list[float] = []
        base: list[float] = []
        for i in range(n):
            rootfs = fresh(i)
            base.append(_timed(baseline_cmd(rootfs)))
            conf.append(_timed(configure_cmd(rootfs)))
            shutil.rmtree(rootfs)
        py = [_timed([PY, "-I", "-c", "import nvhook.cli"]) for _ in range(n)]

        # What one configure injects, for the record.
        import json
        plan = json.loads(subprocess.run(
            [NVHOOK, "--root", str(host), "configure", "--dry-run", "--json", "--device=all", *CAPS,
             str(template)], capture_output=True, text=True, check=True).stdout)

    cm, cp = _stats(conf)
    bm, bp = _stats(base)
    pm, pp = _stats(py)
    print(f"configure a100x8, all GPUs, all capabilities: {len(plan['mounts'])} mounts, "
          f"{len(plan['device_nodes'])} device nodes, {len(plan['symlinks'])} symlinks; N={n}")
    print(f"  configure          median {cm * 1000:8.1f} ms   p90 {cp * 1000:8.1f} ms   (cold first run {cold * 1000:.1f} ms)")
    print(f"  baseline (unshare+sh+1 bind) median {bm * 1000:8.1f} ms   p90 {bp * 1000:8.1f} ms")
    print(f"  python -I import nvhook.cli  median {pm * 1000:8.1f} ms   p90 {pp * 1000:8.1f} ms")
    print(f"  ratio configure/baseline: median {cm / bm:.1f}x   p90 {cp / bp:.1f}x;"
          f"  configure minus baseline: {(cm - bm) * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
