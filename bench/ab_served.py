"""Paired A/B of the served hook of two libinject trees, end to end: `runc run` with the
compiled front as prestart hook, handed to an `nvhook serve` of tree A or of tree B.

bench_hook.py measures one tree; on this shared 2-core VM two of its runs minutes apart
differ by more than the changes we make. Here one session runs both services (each its
own `python -I` with its tree first on sys.path, started as `nvhook serve` is) and
alternates the containers between them (ABBA), so drift hits both alike. Reported per
case: median added ms (minus `runc run` without a hook, interleaved too), the median of
the paired B-A differences with its quartiles, and, from inside each served worker
(_Worker.serve wrapped in the service process, so what the workers inherit), its minor
page faults, CPU ms and wall ms from the request's arrival to its status being sent.

    .venv/bin/python bench/ab_served.py A_DIR B_DIR [--runs N] [--case 1|8|both]
                                        [-v] [--show TEXT] [--perf] [--block N]
    (A_DIR, B_DIR: directories holding a libinject package, e.g. a copy of the tree
    before a change; nvhook/ is the tree's where it holds one, else this checkout's;
    the front is this checkout's. -v: the services run with -v; --show: print their
    log lines containing TEXT, e.g. "spares pre-fault";
    --perf: also the hook's own time, from the kernel's exec and exit of each front
    (`perf record` of two sched tracepoints, system-wide): runc's own variance, the
    largest part of the end-to-end noise here, is not in it, but neither is what the
    service's work costs runc after the hook; --block N: N rounds of A, then N of B, and
    so on, instead of alternating every round: what a service does after a request (its
    next spare) then falls on its own next container, not the other tree's)
"""
from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from bench_hook import GPU1, GPU8, RUNC, _bundle, _run  # noqa: E402
from benchlib import await_log  # noqa: E402

# The service process: tree first on sys.path, _Worker.serve timed, then `nvhook serve`.
LAUNCH = r"""
import resource, sys, time
sys.path[:0] = [sys.argv[1], sys.argv[2]]
try:                    # the tree's module of _Worker
    from libinject.runtime.serve import worker as service
except ImportError:     # a tree from before the service's split into a package
    from libinject.runtime import service
orig = service._Worker.serve
at_status = []
def serve(self):
    r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.perf_counter()
    try:
        return orig(self)
    finally:
        t1, r1 = at_status[0] if at_status else (time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF))
        cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
        self.log(f"bench-worker minflt={r1.ru_minflt - r0.ru_minflt} cpu={cpu * 1e3:.3f} "
                 f"wall={(t1 - t0) * 1e3:.3f}")
service._Worker.serve = serve
if hasattr(service._Worker, "_report"):      # the status is sent: the request's end
    orig_report = service._Worker._report
    def report(self, reported):
        at_status.append((time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)))
        return orig_report(self, reported)
    service._Worker._report = report
from nvhook.cli import main
sys.exit(main(sys.argv[3:]))
"""
WORKER = re.compile(r"bench-worker minflt=(\d+) cpu=([\d.]+) wall=([\d.]+)")


def _serve(tree: str, cfg: Path, sock: Path, log: Path, verbose: bool) -> subprocess.Popen:
    proc = subprocess.Popen([str(REPO / ".venv/bin/python"), "-I", "-c", LAUNCH, tree, str(REPO),
                             "--config", str(cfg), "serve", "--socket", str(sock),
                             *(["-v"] if verbose else [])],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=open(log, "wb"), env={}, cwd="/")
    await_log(proc, log, "warm:", f"nvhook serve ({tree})")
    return proc


def _perf_start(path: Path) -> subprocess.Popen | None:
    perf = shutil.which("perf")
    if perf is None:
        print("--perf: no perf; hook times left out")
        return None
    proc = subprocess.Popen([perf, "record", "-q", "-a", "-o", str(path), "-e",
                             "sched:sched_process_exec,sched:sched_process_exit"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)     # set up before the first container
    return proc


def _hook_times(proc: subprocess.Popen, path: Path) -> list[float]:
    """ms from each front's exec to its exit, in exec order."""
    import signal

    proc.send_signal(signal.SIGINT)
    proc.wait(60)
    out = subprocess.run([shutil.which("perf") or "perf", "script", "-i", str(path), "-F",
                          "pid,time,event,trace"], capture_output=True, text=True).stdout
    start: dict[int, float] = {}
    order: list[int] = []
    end: dict[int, float] = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) < 3:
            continue
        pid, t = int(f[0]), float(f[1].rstrip(":"))
        if "sched_process_exec" in line and "nvhook-hook" in line:
            start[pid] = t
            order.append(pid)
        elif "sched_process_exit" in line and pid in start and pid not in end:
            end[pid] = t
    return [(end[p] - start[p]) * 1000 for p in order if p in end]


def _q(d: list[float]) -> str:
    if len(d) < 2:
        return ""
    q1, _, q3 = statistics.quantiles(d, n=4)
    return f"(quartiles {q1:+.2f} .. {q3:+.2f})"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("a", help="directory holding libinject (A, e.g. before)")
    ap.add_argument("b", help="directory holding libinject (B, e.g. after)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--case", choices=("1", "8", "both"), default="both")
    ap.add_argument("--show", metavar="TEXT", help="print the services' log lines containing TEXT")
    ap.add_argument("-v", "--verbose", action="store_true", help="run the services with -v")
    ap.add_argument("--perf", action="store_true", help="also the hook's own time (perf record)")
    ap.add_argument("--block", type=int, default=0, metavar="N",
                    help="N rounds of A, then N of B, ... instead of ABBA rounds")
    opts = ap.parse_args()
    trees = [str(Path(opts.a).resolve()), str(Path(opts.b).resolve())]
    cases = {"1": ("1 GPU utility,compute", GPU1), "8": ("8 GPUs all caps", GPU8)}
    if opts.case != "both":
        cases = {opts.case: cases[opts.case]}

    from libinject.sim.build import create_host
    from libinject.sim.rootfs import build_rootfs
    from support import hookenv

    work = Path(tempfile.mkdtemp(prefix="nvhook-ab-served-"))
    servers: list[subprocess.Popen] = []
    perf: subprocess.Popen | None = None
    try:
        host = create_host(work / "host", profile="a100x8")
        rootfs = build_rootfs(work / "rootfs")
        subprocess.run(["/sbin/ldconfig", "-r", str(rootfs)], check=True)
        cfg = work / "config.toml"
        cfg.write_text(f'[nvidia-container-cli]\nroot = "{host}"\n'
                       f'[nvhook]\nsnapshot = true\nsnapshot-dir = "{work}/snapshots"\n')
        logs = [work / "serve-a.log", work / "serve-b.log"]
        socks = [work / "serve-a/hook.sock", work / "serve-b/hook.sock"]
        base = _bundle(work, "no hook", rootfs, None, {})
        bundles = {(c, k): _bundle(work, f"{c}-{k}", rootfs, env,
                                   hookenv.hook_entry(cfg, socket=str(socks[k])))
                   for c, (_, env) in cases.items() for k in (0, 1)}
        for t, s, lg in zip(trees, socks, logs):
            servers.append(_serve(t, cfg, s, lg, opts.verbose))     # (stopped on the way out)
        state = work / "runc"
        n = 0
        hooked: list = []       # what each run with a hook was, in order (--perf)
        perf = _perf_start(work / "perf.data") if opts.perf else None

        def run(b: Path) -> float:
            nonlocal n
            n += 1
            hooked.append(next((key for key, v in bundles.items() if v == b), None) if b != base else "base")
            ms, r = _run(state, b, f"c{n}")
            if r.returncode != 0:
                raise SystemExit(f"runc run failed: {r.stderr.strip()}")
            return ms

        for b in [base, *bundles.values()]:     # warm-up: page cache, snapshots, first spares
            run(b)
            run(b)
        time.sleep(0.5)     # the warm-up workers' last lines (a worker logs after its status)
        worker_before = [len(WORKER.findall(lg.read_text(errors="replace"))) for lg in logs]
        times: dict = {"base": [], **{key: [] for key in bundles}}
        if opts.block:
            # blocks of rounds per tree: what a service does in the background after a
            # request (its next spare) lands on its own next containers, not the other's
            for i in range(0, opts.runs, opts.block):
                n_i = min(opts.block, opts.runs - i)
                for k in ((0, 1) if (i // opts.block) % 2 == 0 else (1, 0)):
                    for _ in range(n_i):
                        times["base"].append(run(base))
                        for c in cases:
                            times[(c, k)].append(run(bundles[(c, k)]))
        for i in range(0 if opts.block else opts.runs):
            times["base"].append(run(base))
            for c in cases:
                for k in ((0, 1) if i % 2 == 0 else (1, 0)):
                    times[(c, k)].append(run(bundles[(c, k)]))
            times["base"].append(run(base))
        time.sleep(0.5)                         # the last workers' lines
        hook_ms: dict = {key: [] for key in bundles}
        if perf is not None:
            got = _hook_times(perf, work / "perf.data")
            keys = [k for k in hooked if k != "base"]
            if len(got) != len(keys):
                print(f"--perf: {len(got)} fronts seen for {len(keys)} runs; hook times left out")
            else:
                warm = len(keys) - 2 * len(cases) * opts.runs
                for k, ms in list(zip(keys, got))[warm:]:
                    hook_ms[k].append(ms)
        workers = [WORKER.findall(lg.read_text(errors="replace"))[wb:] for lg, wb in zip(logs, worker_before)]

        print(f"A = {trees[0]}\nB = {trees[1]}\n{opts.runs} rounds, ABBA; runc run without hook: "
              f"median {statistics.median(times['base']):.1f} ms")
        base_med = statistics.median(times["base"])
        for j, (c, (label, _)) in enumerate(cases.items()):
            a, b = times[(c, 0)], times[(c, 1)]
            d = [y - x for x, y in zip(a, b)]
            print(f"== {label} (served)")
            print(f"  added to runc run: A {statistics.median(a) - base_med:6.2f} ms   B "
                  f"{statistics.median(b) - base_med:6.2f} ms   B-A paired median "
                  f"{statistics.median(d):+.2f} ms {_q(d)}")
            if hook_ms[(c, 0)] and len(hook_ms[(c, 0)]) == len(hook_ms[(c, 1)]):
                ha, hb = hook_ms[(c, 0)], hook_ms[(c, 1)]
                dh = [y - x for x, y in zip(ha, hb)]
                print(f"  hook (front exec to exit): A {statistics.median(ha):6.2f} ms   B "
                      f"{statistics.median(hb):6.2f} ms   B-A paired median {statistics.median(dh):+.2f} ms "
                      f"{_q(dh)}")
                rest = [[t - h for t, h in zip(times[(c, k)], hook_ms[(c, k)])] for k in (0, 1)]
                dr = [y - x for x, y in zip(*rest)]
                print(f"  runc without the hook: A {statistics.median(rest[0]):6.2f} ms   B "
                      f"{statistics.median(rest[1]):6.2f} ms   B-A paired median {statistics.median(dr):+.2f} ms "
                      f"{_q(dr)}")
            # the workers' lines come in request order: case j of each round
            cols = []
            for k, name in ((0, "A"), (1, "B")):
                rows = workers[k][j::len(cases)]
                if not rows:
                    continue
                flt = [int(r[0]) for r in rows]
                cpu = [float(r[1]) for r in rows]
                wall = [float(r[2]) for r in rows]
                cols.append((cpu, wall))
                print(f"  worker {name}: minflt median {statistics.median(flt):.0f}   cpu "
                      f"{statistics.median(cpu):.2f} ms   wall {statistics.median(wall):.2f} ms")
            if len(cols) == 2:
                for i, what in ((0, "cpu "), (1, "wall")):
                    d = [y - x for x, y in zip(cols[0][i], cols[1][i])]
                    print(f"  worker {what} B-A paired median {statistics.median(d):+.2f} ms {_q(d)}")
        for k, lg in enumerate(logs):
            for line in lg.read_text(errors="replace").splitlines():
                if opts.show and opts.show in line:
                    print(f"  {'AB'[k]}: {line}")
        return 0
    finally:
        if perf is not None and perf.poll() is None:
            perf.kill()
        for p in servers:
            if p.poll() is None:
                p.terminate()
                p.wait(30)
        subprocess.run(["sh", "-c", f'for c in $({RUNC} --root "{work}/runc" list -q 2>/dev/null); do '
                       f'{RUNC} --root "{work}/runc" delete -f "$c"; done'], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
