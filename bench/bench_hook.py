"""The OCI hook's cost: `runc run` of a small container with a prestart hook (as a
hooks.d entry gives one) against the same without a hook, nvhook's and NVIDIA's in the
same run, interleaved, on a simulated a100x8 host.

Cases (each its own copy of the rootfs, so that what one hook leaves in an image, mount
targets and an ld.so.cache, never meets another):
  no hook                      the baseline: runc's own start
  no GPU, nvhook / NVIDIA      the hook, a container that wants no GPU
  1 GPU (utility,compute) and 8 GPUs (all capabilities), each:
    nvhook exec'd              the front execs Python (--socket none)
    nvhook served              the front hands the start to a warm `nvhook serve`
                               (libinject/runtime/serve/), started here on a private socket
    NVIDIA                     nvidia-container-runtime-hook 1.20 + nvidia-container-cli 1.17
                               (bench/nvidia.py; absent: nvhook only, said so)
  no hook, /proc bound         NVIDIA's baseline (below)
Interleaved, in a shuffled order each round; medians of N. "Added" is a case's median
minus the baseline's; the ratio is nvhook's added over NVIDIA's added, with its target
(issue 33): served <= 0.5x, exec'd <= 1.5x. Then the hook process alone for a container
that wants no GPU (target <= 1 ms), and 50 containers with 1 GPU started at once,
exec'd and served: all must succeed.

Everything runs under `nvhook sim enter HOST` (NVIDIA's cli reads the kernel's view,
/proc/driver/nvidia, /proc/devices, PCI sysfs, from the host's paths), where /run/nvhook
is a private tmpfs (as /run is on a node). NVIDIA's cli mounts over the container's
/proc/driver/nvidia and fails where there is none (a simulated host's procfs), so its
containers get the host's /proc bound in, with the simulated one there, and their own
baseline ("no hook, /proc bound"); nvhook refuses to mount on a mount that is not the
container's own (that bound tmpfs), so its containers keep runc's fresh procfs, where it
makes /proc/driver/nvidia on a tmpfs (two tmpfs mounts to NVIDIA's one).

    .venv/bin/python bench/bench_hook.py [--runs N] [--no-serve] [--no-nvidia]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from benchlib import EXECD_TARGET, SERVED_TARGET, await_log, ratio_line, stats as _stats

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

RUNC = shutil.which("runc") or "/usr/sbin/runc"
NVHOOK = str(REPO / ".venv/bin/nvhook")
NO_GPU_TARGET_MS = 1.0
GPU1 = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=utility,compute"]
GPU8 = ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=all"]
KINDS = {"1 GPU utility,compute": GPU1, "8 GPUs all caps": GPU8}
WHO = ("nvhook exec'd", "nvhook served", "NVIDIA")
BOUND_BASE = "no hook, /proc bound"


def _cases(nvidia: bool, serve: bool) -> dict[str, tuple[list[str] | None, str]]:
    """name -> (the container's GPU env, None: no hook; the hook: exec/served/nvidia; the
    baselines "" and "nvidia-base", NVIDIA's with the host's /proc bound in)."""
    cases: dict[str, tuple[list[str] | None, str]] = {"no hook": (None, ""), "no GPU, nvhook": ([], "exec")}
    if nvidia:
        cases[BOUND_BASE] = (None, "nvidia-base")
        cases["no GPU, NVIDIA"] = ([], "nvidia")
    for kind, env in KINDS.items():
        for who in WHO:
            if (who == "NVIDIA" and not nvidia) or (who.endswith("served") and not serve):
                continue
            cases[f"{kind}, {who}"] = (env, {"nvhook exec'd": "exec", "nvhook served": "served",
                                              "NVIDIA": "nvidia"}[who])
    return cases


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def _bundle(work: Path, name: str, rootfs: Path, env: list[str] | None, hook: dict | None,
            bind_proc: bool = False) -> Path:
    b = work / f"bundle-{_slug(name)}"
    b.mkdir()
    subprocess.run([RUNC, "spec", "--bundle", str(b)], check=True)
    cfg = json.loads((b / "config.json").read_text())
    cfg["root"] = {"path": str(rootfs), "readonly": False}
    cfg["process"].update(terminal=False, args=["true"], env=["PATH=/usr/bin:/bin", *(env or [])])
    for m in cfg["mounts"]:
        if m["destination"] == "/proc" and bind_proc:   # the simulated /proc/driver/nvidia (doc)
            m.update(type="bind", source="/proc", options=["rbind", "nosuid", "noexec", "nodev"])
    if env is not None and hook:        # (env None: a baseline, whatever hook is given)
        cfg["hooks"] = {"prestart": [hook]}
    (b / "config.json").write_text(json.dumps(cfg))
    return b


def _run(state: Path, bundle: Path, cid: str) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    r = subprocess.run([RUNC, "--root", str(state), "run", "--bundle", str(bundle), cid],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return (time.perf_counter() - t) * 1000, r


def _serve(cfg: Path, sock: Path, log: Path) -> subprocess.Popen:
    """`nvhook serve` on a private socket, as a unit would start it (through the front:
    python -I, clean env); returns once it listens and has warmed discovery."""
    from support import hookenv

    proc = subprocess.Popen([hookenv.ensure_front(), "--config", str(cfg), "serve", "--socket", str(sock)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=open(log, "wb"), env={})
    await_log(proc, log, "warm:", "nvhook serve")
    return proc


def _modeset(host: Path) -> None:
    """/dev/nvidia-modeset, as a node with the nvidia-modeset module loaded has it: NVIDIA's
    cli fails a `display` (so "all") request without it; the simulator makes none."""
    import stat

    node = host / "dev/nvidia-modeset"
    if not node.exists():
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(195, 254))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--parallel", type=int, default=50, help="containers started at once (0: none)")
    ap.add_argument("--no-snapshot", action="store_true", help="rediscover the driver on every start")
    ap.add_argument("--no-serve", action="store_true", help="only the exec'd hook (no `nvhook serve`)")
    ap.add_argument("--no-nvidia", action="store_true", help="nvhook only, even where NVIDIA's stack is")
    ap.add_argument("--inside", metavar="WORK", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.inside:
        return inside(opts, Path(opts.inside))

    from libinject.sim.build import create_host
    from libinject.sim.rootfs import build_rootfs

    work = Path(tempfile.mkdtemp(prefix="nvhook-bench-hook-"))
    try:
        host = create_host(work / "host", profile="a100x8")
        _modeset(host)
        rootfs = build_rootfs(work / "rootfs")
        subprocess.run(["/sbin/ldconfig", "-r", str(rootfs)], check=True)   # as images ship one
        os.makedirs("/run/nvhook", mode=0o755, exist_ok=True)       # (a tmpfs goes over it inside)
        return subprocess.call([NVHOOK, "sim", "enter", str(host), "--", sys.executable, __file__,
                                "--inside", str(work), *sys.argv[1:]])
    finally:
        subprocess.run(["sh", "-c", f'for c in $({RUNC} --root "{work}/runc" list -q 2>/dev/null); do '
                        f'{RUNC} --root "{work}/runc" delete -f "$c"; done'], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def inside(opts: argparse.Namespace, work: Path) -> int:
    """The measurement, in `nvhook sim enter`'s mount namespace (module doc)."""
    import nvidia
    from support import hookenv

    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "nvbench", "/run/nvhook"], check=True)
    host, rootfs = work / "host", work / "rootfs"
    anchors = None if opts.no_nvidia else nvidia.find()
    nv = nvidia.Nvidia(anchors, work / "nvidia") if anchors else None
    print(f"NVIDIA's stack: {anchors}" if nv else nvidia.absent_note())
    cases = _cases(nv is not None, not opts.no_serve)
    snapshot = "false" if opts.no_snapshot else "true"
    cfg = work / "config.toml"
    # load-kmods off for both (NVIDIA's cli would run modprobe on every start here, where
    # no nvidia module is loaded; on a node the modules are there and neither does)
    cfg.write_text(f'[nvidia-container-cli]\nroot = "{host}"\nload-kmods = false\n'
                   f'[nvhook]\nsnapshot = {snapshot}\nsnapshot-dir = "{work}/snapshots"\n')
    sock = work / "serve/hook.sock"
    hooks = {"": None, "nvidia-base": None, "exec": hookenv.hook_entry(cfg, socket="none"),
             "served": hookenv.hook_entry(cfg, socket=str(sock))}
    if nv:
        nvcfg = work / "nvidia.toml"
        nvcfg.write_text(nv.config_text(host))
        hooks["nvidia"] = nv.hook_entry(nvcfg)
    state = work / "runc"
    bundles = {}
    for name, (env, hook) in cases.items():
        own = work / f"rootfs-{_slug(name)}"
        subprocess.run(["cp", "-a", str(rootfs), str(own)], check=True)
        bundles[name] = _bundle(work, name, own, env, hooks[hook], bind_proc=hook.startswith("nvidia"))
    server: subprocess.Popen | None = None
    try:
        if not opts.no_serve:
            server = _serve(cfg, sock, work / "serve.log")
        return _measure(opts, work, cases, bundles, hooks, state, cfg, rootfs)
    finally:
        if server is not None and server.poll() is None:
            server.terminate()
            server.wait(30)


def _measure(opts, work: Path, cases, bundles, hooks, state: Path, cfg: Path, rootfs: Path) -> int:
    # warm-up: page cache, discovery snapshot, the service's spare
    for _ in range(2):
        for name, b in bundles.items():
            ms, r = _run(state, b, "warm")
            if r.returncode != 0:
                print(f"{name}: runc run failed: {r.stderr.strip()}")
                return 1
    times: dict[str, list[float]] = {n: [] for n in cases}
    for i in range(opts.runs):
        # Interleaved, so drift hits every case alike, in a shuffled order: what a case
        # leaves running after it (a service's next spare, a worker's exit) falls on a
        # different case each round, not always on the one after it.
        order = list(bundles.items())
        random.Random(i).shuffle(order)
        for name, b in order:
            ms, r = _run(state, b, f"c{i}")
            if r.returncode != 0:
                print(f"{name}: runc run failed: {r.stderr.strip()}")
                return 1
            times[name].append(ms)

    print(f"runc run ... true, prestart hook, a100x8, {opts.runs} interleaved runs each (ms): "
          f"median / p90; added = median minus its baseline's ('no hook'; NVIDIA's: '{BOUND_BASE}')")
    added: dict[str, float] = {}
    for name, (_, hook) in cases.items():
        base, base90 = _stats(times[BOUND_BASE if hook == "nvidia" else "no hook"])
        med, p90 = _stats(times[name])
        added[name] = med - base
        extra = "" if hook in ("", "nvidia-base") else f"   added {med - base:+6.1f} / {p90 - base90:+6.1f}"
        print(f"  {name:34s} {med:7.1f} / {p90:6.1f}{extra}")
    nvidia_in = any(h == "nvidia" for _, h in cases.values())
    print("nvhook over NVIDIA, added time (same run, same baseline):")
    results: list[bool | None] = []
    for kind in KINDS:
        theirs = added.get(f"{kind}, NVIDIA")
        for who, target in (("nvhook served", SERVED_TARGET), ("nvhook exec'd", EXECD_TARGET)):
            if f"{kind}, {who}" not in added:
                continue
            line, met = ratio_line(f"{kind}, {who.removeprefix('nvhook ')}", added[f"{kind}, {who}"], theirs, target)
            print(line)
            results.append(met)
    if nvidia_in:
        print(f"  no GPU: nvhook {added['no GPU, nvhook']:+.1f} ms, NVIDIA {added['no GPU, NVIDIA']:+.1f} ms "
              f"(within runc's noise; the hook process alone, below)")

    # What the service logged of the interleaved rounds (before the parallel burst below)
    serial_log = "" if opts.no_serve else (work / "serve.log").read_text(errors="replace")

    # The hook process alone, for a container that wants no GPU (no runc around it).
    st = json.dumps({"ociVersion": "1.0.2-dev", "id": "x", "status": "creating", "pid": 1,
                     "bundle": str(bundles["no GPU, nvhook"])}).encode()
    front = []
    for _ in range(opts.runs):
        t = time.perf_counter()
        subprocess.run([hooks["exec"]["path"], "--config", str(cfg), "prestart"], input=st, check=True, env={})
        front.append((time.perf_counter() - t) * 1000)
    fmed, f90 = _stats(front)
    ok = fmed <= NO_GPU_TARGET_MS
    print(f"  hook process alone, no GPU: median {fmed:.2f} ms, p90 {f90:.2f} ms "
          f"(target <= {NO_GPU_TARGET_MS:.0f} ms: {'met' if ok else 'NOT met'})")
    results.append(ok)

    # 50 GPU containers at once, each with its own rootfs (as image layers would give them;
    # one shared rootfs would have them all renaming the same ld.so.cache).
    all_ok = True
    for label in ([] if not opts.parallel else ["exec'd"] + ([] if opts.no_serve else ["served"])):
        entry = hooks["exec" if label == "exec'd" else "served"]
        par = []
        for i in range(opts.parallel):
            own = work / f"rootfs-{label[:4]}-{i}"
            subprocess.run(["cp", "-a", str(rootfs), str(own)], check=True)
            par.append(_bundle(work, f"par-{label[:4]}-{i}", own, GPU1, entry))
        t = time.perf_counter()
        with ThreadPoolExecutor(opts.parallel) as pool:
            res = list(pool.map(lambda i: _run(state, par[i], f"par-{label[:4]}-{i}"), range(opts.parallel)))
        wall = (time.perf_counter() - t) * 1000
        failed = [r.stderr.strip() for _, r in res if r.returncode != 0]
        print(f"  {opts.parallel} containers (1 GPU, {label}) in parallel: {opts.parallel - len(failed)} ok, "
              f"{len(failed)} failed, {wall:.0f} ms wall")
        for f in failed[:3]:
            print(f"    {f}")
        all_ok &= not failed
    if not opts.no_serve:
        # (a worker's status reaches its front before the service reaps it and logs it)
        want = (2 + opts.runs) * sum(h == "served" for _, h in cases.values()) + opts.parallel
        deadline = time.monotonic() + 5
        while True:
            log = (work / "serve.log").read_text(errors="replace")
            n = log.count(": status 0 in ")
            if n >= want or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        took = [float(x) for x in re.findall(r"status 0 in ([\d.]+) ms", serial_log)]
        if took:
            print(f"  the served requests took {_stats(took)[0]:.1f} ms (median of {len(took)}, the rounds "
                  "above, the service's log: request to the worker's exit, past its status)")
        print(f"  nvhook serve answered {n} of the {want} served starts (the rest fell back to exec)")
    verdict = ("no ratios (NVIDIA's stack absent)" if not nvidia_in else
               "all met" if all(results) else "some NOT met")
    print(f"  targets: {verdict}; parallel: {'0 failures' if all_ok else 'FAILURES'}", flush=True)
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
