"""Paired A/B of two libinject trees' apply(): before/after numbers that survive a noisy VM.

On this project's shared 2-core VM the speed of the whole machine drifts by +-25%
between runs a minute apart, so the medians of two bench_apply.py runs cannot show a
10% change. Here both trees are measured in one run, sample by sample: a long-lived
server per tree (each imports its own libinject, what `nvhook serve` preloads, and
makes its plan once) applies one sample when asked; the driver asks them in turn
(ABBA order) and reports the median of the paired differences, with its quartiles.

Each sample is the hook's apply as bench_apply.py's pid mode in-process runs it: a
fresh busybox rootfs with runc's /dev tmpfs and /proc, a "container" process in a
private mount namespace, apply(edits, rootfs, pid=<container>, worker=False,
no_cgroups=True) in a fresh fork of the server (as a served worker is a fork of the
service). The host and the rootfs are on a tmpfs (the disk is everyone's on this
machine). Reported: wall time, CPU time (user+sys) and minor page faults of the apply()
call. Where B has ldcache_merge.remember_host_libraries, its server fills it from its
driver first, as `nvhook serve` does at warm-up.

Usage: python bench/ab_apply.py A_DIR B_DIR [--n N] [--case 1|8|both]
       (A_DIR, B_DIR: directories holding a libinject package, e.g. a git worktree)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ALL_CAPS = frozenset({"utility", "compute", "video", "graphics", "display", "ngx", "compat32"})
WAIT_S = 120


def _serve(impl: str, case: str) -> int:  # pragma: no cover - a server process
    sys.path.insert(0, str(REPO / "bench"))
    import gc
    import resource
    import shutil
    import tempfile
    import time

    from bench_apply import Container, _private_ns     # (puts REPO first on sys.path)
    sys.path.insert(0, impl)
    from libinject.apply import live
    from libinject.discover.driver import discover
    from libinject.discover.libraries import container_lib_dirs
    from libinject.linux import native
    from libinject.plan.planner import plan
    from libinject.request.model import Request
    try:
        from libinject.runtime.serve.preload import preload
    except ImportError:     # a tree from before the service's split into a package
        from libinject.runtime.service import preload
    from libinject.sim.build import create_host
    from libinject.sim.rootfs import build_rootfs

    preload()
    _private_ns()
    with tempfile.TemporaryDirectory(prefix="nvhook-ab-apply-") as tmp:
        native.mount("tmpfs", tmp, "tmpfs", 0, "size=2g,mode=755")
        try:
            t = Path(tmp)
            host = create_host(t / "host", profile="a100x8")
            template = build_rootfs(t / "template")
            subprocess.run(["/sbin/ldconfig", "-r", str(template)], check=True)
            driver = discover(str(host), snapshot=False)
            lib_dir, lib32_dir = container_lib_dirs(str(template))
            req = (Request(devices="0") if case == "1"
                   else Request(devices="all", capabilities=ALL_CAPS))
            edits = plan(req, driver, lib_dir=lib_dir, lib32_dir=lib32_dir)
            from libinject.apply import ldcache_merge
            if hasattr(ldcache_merge, "remember_host_libraries"):   # as `nvhook serve` warms up
                ldcache_merge.remember_host_libraries(lib.path for lib in driver.libraries)
            gc.collect()
            gc.freeze()
            i = 0
            print("ready", flush=True)
            while sys.stdin.readline().strip() == "go":
                i += 1
                rootfs = t / f"rootfs{i}"
                shutil.copytree(template, rootfs, symlinks=True)
                Container.edits, Container.rootfs = None, str(rootfs)
                c = Container()
                r, w = os.pipe()
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        gc.disable()
                        ru0 = resource.getrusage(resource.RUSAGE_SELF)
                        t0 = time.perf_counter()
                        live.apply(edits, str(rootfs), pid=c.pid, no_cgroups=True, worker=False)
                        t1 = time.perf_counter()
                        ru1 = resource.getrusage(resource.RUSAGE_SELF)
                        cpu = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
                        os.write(w, json.dumps([(t1 - t0) * 1e3, cpu * 1e3,
                                                ru1.ru_minflt - ru0.ru_minflt]).encode())
                        code = 0
                    finally:
                        os._exit(code)
                os.close(w)
                from libinject.linux.child import Child, collect
                try:
                    with Child(pid) as child:
                        code, (out,) = collect(child, [r], WAIT_S)
                finally:
                    os.close(r)
                c.kill()
                shutil.rmtree(rootfs)
                if code != 0:
                    raise SystemExit(f"apply failed in {impl} (exit {code})")
                print(out.decode(), flush=True)
        finally:
            native.umount2(tmp, native.MNT_DETACH)
    return 0


def _paired(a: str, b: str, case: str, n: int) -> None:
    me = [sys.executable, __file__, "--serve"]
    procs = [subprocess.Popen(me + [d, case], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for d in (a, b)]
    try:
        for p in procs:
            if p.stdout.readline().strip() != "ready":    # type: ignore[union-attr]
                raise SystemExit("a server did not start")
        got: list[list[list[float]]] = [[], []]
        for i in range(n + 2):                  # the first two rounds warm up
            for k in ((0, 1) if i % 2 else (1, 0)):
                p = procs[k]
                p.stdin.write("go\n")           # type: ignore[union-attr]
                p.stdin.flush()                 # type: ignore[union-attr]
                line = p.stdout.readline()      # type: ignore[union-attr]
                if not line:
                    raise SystemExit("a server died")
                if i >= 2:
                    got[k].append(json.loads(line))
    finally:
        for p in procs:
            p.stdin.close()                     # type: ignore[union-attr]
            p.wait(WAIT_S)
    print(f"== {'1 GPU utility,compute' if case == '1' else '8 GPUs all capabilities'}, "
          f"{n} pairs")
    for col, what in ((0, "wall"), (1, "cpu "), (2, "minflt")):
        xa = [s[col] for s in got[0]]
        xb = [s[col] for s in got[1]]
        d = [y - x for x, y in zip(xa, xb)]
        q1, _, q3 = statistics.quantiles(d, n=4)
        unit = "" if col == 2 else " ms"
        print(f"  {what}: A median {statistics.median(xa):6.2f}{unit}   B median "
              f"{statistics.median(xb):6.2f}{unit}   B-A paired median {statistics.median(d):+.2f}{unit} "
              f"(quartiles {q1:+.2f} .. {q3:+.2f})")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        return _serve(sys.argv[2], sys.argv[3])
    ap = argparse.ArgumentParser()
    ap.add_argument("a", help="directory holding libinject (A, e.g. before)")
    ap.add_argument("b", help="directory holding libinject (B, e.g. after)")
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--case", choices=("1", "8", "both"), default="both")
    args = ap.parse_args()
    print(f"A = {args.a}\nB = {args.b}")
    for case in (("1", "8") if args.case == "both" else (args.case,)):
        _paired(os.path.abspath(args.a), os.path.abspath(args.b), case, args.n)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
