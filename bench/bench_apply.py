"""Benchmark: libinject.apply.live.apply() alone (no discovery, no planning, no CLI
start-up), per phase, on a simulated a100x8 host.

Two plans, made once (outside the timed region) with discover() + plan():
  (a) 1 GPU, utility+compute          (NVIDIA_VISIBLE_DEVICES=0, the default caps)
  (b) 8 GPUs, all capabilities        (--device=all, every capability, compat32)

Each sample gets a fresh busybox rootfs (copy of one build_rootfs() template) and a
fresh "container": a forked process in its own private mount namespace (a copy of the
bench's, so the rootfs path is visible there, as at runc's prestart) with, as runc has
by then, a tmpfs on <rootfs>/dev and a procfs on <rootfs>/proc (--bare: neither; device
targets and /proc/driver/nvidia are then made in the rootfs itself). Untimed setup.
Then, timed:
  pid  mode (the hook):               apply(edits, rootfs, pid=<container>, no_cgroups=True)
  self mode (configure without --pid): the container process itself calls
                                       apply(edits, rootfs, pid=None, no_cgroups=True)
Cgroups are left out (they need a real container cgroup; bench_hook covers them).
The container process is then killed, its namespace goes with it, the rootfs removed.
The first sample of each case is checked: every planned mount present in the
container's mountinfo and the injected libraries listed in its /etc/ld.so.cache.

Baselines, interleaved with the samples, in the same process:
  fork+wait           os.fork(), child _exit(0), reaped through its pidfd, with a
                      deadline (libinject.linux.child.Child, as apply() waits on its worker)
  fork+setns+1 bind   the least any live injector does: fork, setns into the
                      container, clone one host file (open_tree) and attach it
                      (move_mount) onto an existing file in the rootfs, exit
Phases come from apply_live.trace (marks at the end of each phase; the worker's are
sent back with its report), printed as median / p90 over the samples.

Every wait on a child or a pipe has a deadline (WAIT_S); past it the bench stops (SystemExit).

Usage: python bench/bench_apply.py [N] [--mode pid|self|both] [--apply worker|inproc|both]
                                  [--preload] [--bare] [--tmpfs] [--impl DIR]
       (default N=20, both modes; --impl: libinject from DIR, for before/after runs;
       --preload: import what `nvhook serve` imports before its workers fork
       (libinject.runtime.serve.preload.PRELOAD), so the in-process apply is the served hook's;
       --tmpfs: host and rootfs on a tmpfs, so that the disk (shared with everything else
       on the machine) does not swamp the applier's own cost in before/after comparisons)
"""
from __future__ import annotations

import argparse
import gc
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from benchlib import stats as _stats

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

ALL_CAPS = frozenset({"utility", "compute", "video", "graphics", "display", "ngx", "compat32"})
WAIT_S = 120        # the most any one wait on a child (or its pipe) may take



def _private_ns() -> None:
    from libinject.linux import native
    native.unshare(native.CLONE_NEWNS)
    native.mount(None, "/", None, native.MS_REC | native.MS_PRIVATE)


class Container:
    """A process in its own (private) copy of our mount namespace; runs fn in it when
    asked (self mode) or just waits (pid mode)."""

    def __init__(self) -> None:
        self.cmd_r, self.cmd_w = os.pipe()
        self.res_r, self.res_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - child
            os.close(self.cmd_w)
            os.close(self.res_r)
            try:
                _private_ns()
                if self.runtime_mounts and self.rootfs:
                    from libinject.linux import native
                    native.mount("tmpfs", f"{self.rootfs}/dev", "tmpfs",
                                 native.MS_NOSUID | native.MS_NOEXEC, "mode=755,size=64k")
                    native.mount("proc", f"{self.rootfs}/proc", "proc",
                                 native.MS_NOSUID | native.MS_NODEV | native.MS_NOEXEC, None)
                os.write(self.res_w, b"r")
                while os.read(self.cmd_r, 1) == b"a":
                    os.write(self.res_w, self._self_apply())
            finally:
                os._exit(0)
        from libinject.linux.child import Child
        self.child = Child(self.pid)
        os.close(self.cmd_r)
        os.close(self.res_w)
        if _read(self.res_r, 1, time.monotonic() + WAIT_S) != b"r":
            raise SystemExit("container process failed to start")

    edits = None
    rootfs = ""
    worker = True
    runtime_mounts = True       # runc's /dev tmpfs and /proc procfs in the rootfs

    def _self_apply(self) -> bytes:  # pragma: no cover - child
        import json

        from libinject.apply import live as apply_live
        marks: list[tuple[str, float]] = []
        apply_live.trace = lambda p, t: marks.append((p, t))
        gc.collect()
        t0 = time.perf_counter()
        try:
            apply_live.apply(self.edits, self.rootfs, pid=None, no_cgroups=True,
                             **({} if self.worker else {"worker": False}))
            err = ""
        except Exception as e:  # noqa: BLE001
            err = str(e)
        t1 = time.perf_counter()
        return (json.dumps({"t": t1 - t0, "t0": t0, "marks": marks, "err": err}) + "\n").encode()

    def kill(self) -> None:
        try:
            if self.child.reap() is None:
                raise SystemExit(f"container process {self.pid} still there after SIGKILL")
        finally:
            self.child.close()
            os.close(self.cmd_w)
            os.close(self.res_r)


def _container(edits=None, rootfs: str = "", worker: bool = True) -> Container:
    Container.edits, Container.rootfs, Container.worker = edits, rootfs, worker  # inherited
    return Container()


def _self_sample(c: Container) -> dict:
    import json
    os.write(c.cmd_w, b"a")
    buf = b""
    deadline = time.monotonic() + WAIT_S
    while not buf.endswith(b"\n"):
        chunk = _read(c.res_r, 65536, deadline)
        if not chunk:
            raise SystemExit("container process died")
        buf += chunk
    return json.loads(buf)


def _pid_sample_oneshot(edits, rootfs: str, pid: int) -> dict:
    """apply(worker=False) as the hook would run it: in a one-shot process (forked
    here, untimed), which it leaves in its own namespace with fewer capabilities."""
    import json

    from libinject.linux.child import Child, collect
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - child
        try:
            os.write(w, json.dumps(_pid_sample(edits, rootfs, pid, worker=False)).encode())
        finally:
            os._exit(0)
    os.close(w)
    try:
        with Child(child) as c:
            code, (buf,) = collect(c, [r], WAIT_S)
    except TimeoutError:
        raise SystemExit(f"one-shot apply did not finish within {WAIT_S} s") from None
    finally:
        os.close(r)
    if code != 0:
        raise SystemExit(f"one-shot apply process exited with {code}")
    return json.loads(buf)


def _pid_sample(edits, rootfs: str, pid: int, worker: bool = True) -> dict:
    from libinject.apply import live as apply_live
    marks: list[tuple[str, float]] = []
    apply_live.trace = lambda p, t: marks.append((p, t))
    gc.collect()
    t0 = time.perf_counter()
    try:
        apply_live.apply(edits, rootfs, pid=pid, no_cgroups=True,
                         **({} if worker else {"worker": False}))
        err = ""
    except Exception as e:  # noqa: BLE001
        err = str(e)
    t1 = time.perf_counter()
    apply_live.trace = None
    return {"t": t1 - t0, "t0": t0, "marks": marks, "err": err}


def _phases(sample: dict) -> dict[str, float]:
    out: dict[str, float] = {}
    prev = sample["t0"]
    for name, t in sample["marks"]:
        if name == "start":
            out["enter"] = t - prev
        else:
            out[name] = out.get(name, 0.0) + (t - prev)
        prev = t
    out["return"] = sample["t0"] + sample["t"] - prev
    return out


def _fork_wait() -> float:
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # pragma: no cover
        os._exit(0)
    return _reaped(pid, t0, "baseline fork+wait")


def _fork_setns_bind(pid: int, src: str, target: str) -> float:
    from libinject.linux import native
    t0 = time.perf_counter()
    child = os.fork()
    if child == 0:  # pragma: no cover
        code = 1
        try:
            tree = native.open_tree(-100, src, native.OPEN_TREE_CLONE | native.OPEN_TREE_CLOEXEC)
            ns = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
            native.setns(ns, native.CLONE_NEWNS)
            native.move_mount(tree, "", -100, target, native.MOVE_MOUNT_F_EMPTY_PATH)
            code = 0
        finally:
            os._exit(code)
    return _reaped(child, t0, "baseline bind")


def _reaped(pid: int, t0: float, what: str) -> float:
    """Wait (at most WAIT_S) for child `pid`, forked at t0 (time.perf_counter()), to exit
    0; the time since t0. The child is reaped through its pidfd, as apply() reaps its worker."""
    from libinject.linux.child import Child
    with Child(pid) as c:
        code = c.wait(WAIT_S)
    dt = time.perf_counter() - t0
    if code != 0:
        raise SystemExit(f"{what} failed: {'timed out' if code is None else f'exit {code}'}")
    return dt


def _read(fd: int, n: int, deadline: float) -> bytes:
    """os.read(fd, n), waiting at most until `deadline` (time.monotonic()) for data."""
    if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
        raise SystemExit(f"no answer from a child within {WAIT_S} s")
    return os.read(fd, n)


def _cache_names(cache: Path) -> dict[str, str]:
    """SONAME -> path, as `ldconfig -p` lists a cache file."""
    out = subprocess.run(["/sbin/ldconfig", "-p", "-C", str(cache)], capture_output=True,
                         text=True, check=True).stdout
    return {ln.split()[0]: ln.rsplit("=> ", 1)[1] for ln in out.splitlines()[1:] if "=> " in ln}


def _check(edits, rootfs: Path, pid: int, host: Path) -> str:
    """The injection really happened: every planned mount, and every SONAME the host's
    cache has for a library we mounted listed in the container's /etc/ld.so.cache."""
    from libinject.linux import mountinfo
    mps = {m.mountpoint for m in mountinfo.read(pid)}
    want = {str(rootfs) + m.container_path for m in edits.mounts}
    want |= {str(rootfs) + d.path for d in edits.device_nodes}
    missing = want - mps
    if missing:
        return f"missing mounts: {sorted(missing)[:3]}"
    mounted = {os.path.basename(m.host_path) for m in edits.mounts if m.kind == "library"}
    expect = {name for name, path in _cache_names(host / "etc/ld.so.cache").items()
              if ".so." in name  # SONAMEs, not the -dev "libX.so" links
              and os.path.basename(os.path.realpath(str(host) + path)) in mounted}
    got = _cache_names(rootfs / "etc/ld.so.cache")
    absent = sorted(expect - set(got))
    if not expect or absent:
        return f"ld.so.cache lacks {absent[:5]} (expected {len(expect)})"
    return ""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", nargs="?", type=int, default=int(os.environ.get("BENCH_N", "20")))
    ap.add_argument("--mode", choices=("pid", "self", "both"), default="both")
    ap.add_argument("--apply", choices=("worker", "inproc", "both"), default="both",
                    help="apply() in a forked worker (default) or in-process (worker=False, "
                    "one-shot callers)")
    ap.add_argument("--tmpfs", action="store_true", help="the host and every rootfs on a tmpfs "
                    "(takes the disk out: what is left is the applier's own cost)")
    ap.add_argument("--bare", action="store_true", help="no /dev tmpfs nor /proc in the "
                    "container's rootfs (what this bench did before)")
    ap.add_argument("--preload", action="store_true", help="import what the hook service "
                    "imports before forking a worker (the served hook's apply)")
    ap.add_argument("--impl", metavar="DIR", help="import libinject from DIR (A/B against "
                    "another version of the applier; the plan is made with it too)")
    args = ap.parse_args()
    if args.impl:
        sys.path.insert(0, args.impl)
    Container.runtime_mounts = not args.bare

    _private_ns()   # nothing below reaches the host's mount table
    with tempfile.TemporaryDirectory(prefix="nvhook-bench-apply-") as tmp:
        if args.tmpfs:      # (in our private namespace: nobody else sees it)
            from libinject.linux import native
            native.mount("tmpfs", tmp, "tmpfs", 0, "size=4g,mode=755")
        try:
            _bench(args, Path(tmp))
        finally:
            if args.tmpfs:
                native.umount2(tmp, native.MNT_DETACH)
    return 0


def _bench(args: argparse.Namespace, t: Path) -> None:
    from libinject.discover.driver import discover
    from libinject.discover.libraries import container_lib_dirs
    from libinject.plan.planner import plan
    from libinject.request.model import Request
    from libinject.sim.build import create_host
    from libinject.sim.rootfs import build_rootfs

    host = create_host(t / "host", profile="a100x8")
    template = build_rootfs(t / "template")
    # Real images ship an /etc/ld.so.cache (the hook merges into it; without one it
    # runs ldconfig): make the template's as an image build would.
    subprocess.run(["/sbin/ldconfig", "-r", str(template)], check=True)
    driver = discover(str(host), snapshot=False)
    lib_dir, lib32_dir = container_lib_dirs(str(template))
    cases = {
        "1 GPU utility,compute": plan(Request(devices="0"), driver,
                                      lib_dir=lib_dir, lib32_dir=lib32_dir),
        "8 GPUs all capabilities": plan(Request(devices="all", capabilities=ALL_CAPS), driver,
                                        lib_dir=lib_dir, lib32_dir=lib32_dir),
    }
    bind_src = str(next(p for p in (host / "usr/bin").iterdir()))
    modes = [(m, w) for m in (("pid", "self") if args.mode == "both" else (args.mode,))
             for w in ((True, False) if args.apply == "both" else (args.apply == "worker",))]
    import inspect
    from libinject.apply import live as apply_live
    if "worker" not in inspect.signature(apply_live.apply).parameters:
        modes = [(m, w) for m, w in modes if w]      # an older applier: worker only
    if args.preload:
        try:
            from libinject.runtime.serve.preload import preload
        except ImportError:     # --impl: a tree from before the service's split into a package
            from libinject.runtime.service import preload
        preload()
    gc.collect()
    gc.freeze()      # the bench's heap is bigger than the hook's: keep fork cheap-ish
    seq = 0

    def fresh() -> Path:
        nonlocal seq
        seq += 1
        dst = t / f"rootfs{seq}"
        shutil.copytree(template, dst, symlinks=True)
        return dst

    import libinject
    print(f"apply_live.apply ({Path(libinject.__file__).parent}) on a simulated a100x8 host, "
          f"fresh busybox rootfs per sample, N={args.n}, cgroups off")
    fw_all: list[float] = []
    bind_all: list[float] = []
    for name, edits in cases.items():
        print(f"\n== {name}: {len(edits.mounts)} mounts, {len(edits.device_nodes)} device nodes, "
              f"{len(edits.symlinks)} symlinks, procfs {'yes' if edits.procfs else 'no'}, "
              f"ldconfig over {len(edits.ldconfig_folders)} folders")
        for mode, worker in modes:
            samples: list[dict] = []
            fw: list[float] = []
            bind: list[float] = []
            for i in range(args.n + 1):          # sample 0 is warm-up (and checked)
                rootfs = fresh()
                (rootfs / "bench-target").write_text("")
                c = _container(edits if mode == "self" else None, str(rootfs), worker)
                try:
                    fw.append(_fork_wait())
                    bind.append(_fork_setns_bind(c.pid, bind_src, str(rootfs / "bench-target")))
                    if mode == "self":
                        s = _self_sample(c)
                    elif worker:
                        s = _pid_sample(edits, str(rootfs), c.pid)
                    else:
                        s = _pid_sample_oneshot(edits, str(rootfs), c.pid)
                    if s["err"]:
                        raise SystemExit(f"apply failed: {s['err']}")
                    if i == 0:
                        bad = _check(edits, rootfs, c.pid, host)
                        if bad:
                            raise SystemExit(f"apply did not inject: {bad}")
                    else:
                        samples.append(s)
                finally:
                    c.kill()
                    shutil.rmtree(rootfs)
            fw_all += fw[1:]
            bind_all += bind[1:]
            _report(mode, worker, samples, fw[1:], bind[1:])
    fm, fp = _stats(fw_all)
    bm, bp = _stats(bind_all)
    print(f"\nbaselines over all samples: fork+wait median {fm * 1e3:.2f} ms p90 {fp * 1e3:.2f} ms; "
          f"fork+setns+1 bind median {bm * 1e3:.2f} ms p90 {bp * 1e3:.2f} ms")


def _report(mode: str, worker: bool, samples: list[dict], fw: list[float], bind: list[float]) -> None:
    tot = [s["t"] for s in samples]
    tm, tp = _stats(tot)
    fm, _ = _stats(fw)
    bm, _ = _stats(bind)
    label = ("pid (hook)" if mode == "pid" else "self (configure, no --pid)") + \
        (", worker" if worker else ", in-process")
    print(f"  mode {label}: total median {tm * 1e3:6.1f} ms  p90 {tp * 1e3:6.1f} ms   "
          f"= {tm / fm:.1f}x fork+wait ({fm * 1e3:.2f} ms), {tm / bm:.1f}x fork+setns+1 bind "
          f"({bm * 1e3:.2f} ms)")
    per = [_phases(s) for s in samples]
    names: list[str] = []
    for p in per:
        for k in p:
            if k not in names:
                names.append(k)
    for k in names:
        m, p90 = _stats([p.get(k, 0.0) for p in per])
        print(f"      {k:<12} median {m * 1e3:6.2f} ms  p90 {p90 * 1e3:6.2f} ms")


if __name__ == "__main__":
    raise SystemExit(main())
