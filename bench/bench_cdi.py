"""Benchmark: a GPU container's start through podman with nvhook's CDI spec, and `nvhook cdi
generate` on simulated a100x8 and h100x8-mig hosts.

Podman (RUNTIMES.md: 4.3.1, runc, vfs; in a private mount namespace where /etc/cdi is
our spec dir, `nvhook serve` running beside it): `podman run --rm --rootfs R:O true`,
interleaved, N runs each:
  baseline     no device
  mounts only  the spec without its hook: what podman and runc add for its mounts and
               nodes alone (the floor of any spec, NVIDIA's too)
  3 hooks      --device <kind>=1 with the spec as it was before issue 24: three
               createContainer hooks (mask-procfs, create-symlinks, update-ldcache), each
               an exec'd Python (the same subcommands, still accepted)
  exec'd       the spec's one `cdi-hook createRuntime` hook, no service (--hook-socket none)
  served       the same hook handed to the warm service
Added = median minus the baseline's; the target: served at most half of what NVIDIA's
spec (`nvidia-ctk cdi generate`: six small Go hooks) adds on this machine kind,
NVIDIA_CDI_MS (issue 24: +85-113 ms, interleaved medians of 10; nvidia-ctk is not
installed here, so its low end is the figure to beat).

Per profile, interleaved in the same run (N samples each, median and p90):
  generate   `nvhook cdi generate --driver-root HOST --device-name-strategy index,uuid
             -o FILE` (a new process: start-up, discovery, one plan per device, write)
  info       `nvhook --root HOST info --json`: the same start-up and discovery, no
             planning or writing -- the baseline; the ratio is what generation adds
  startup    `python -I -c "import nvhook.cli"`: interpreter + CLI import, for scale
and in-process (no start-up, discovery done once): libinject.apply.cdi.generate() against
one libinject.plan.planner.plan() of "all" -- the per-device planning cost.
Discovery uses the default snapshot setting ([nvhook] snapshot = true), as users run it.

Usage: python bench/bench_cdi.py [N] [--podman-only | --no-podman]   (default N=10; BENCH_N too)
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from benchlib import stats as _stats, timed as _timed

REPO = Path(__file__).resolve().parent.parent
NVHOOK = str(REPO / ".venv/bin/nvhook")
PY = str(REPO / ".venv/bin/python")
PROFILES = ("a100x8", "h100x8-mig")
NVIDIA_CDI_MS = 85.0        # what NVIDIA's spec adds to a podman GPU start (issue 24: 85-113)
TARGET_RATIO = 0.5




def _fmt(name: str, xs: list[float], base: float | None = None) -> str:
    med, p90 = _stats(xs)
    ratio = f"  x{med / base:5.2f}" if base else ""
    return f"  {name:<22} median {med * 1000:8.2f} ms  p90 {p90 * 1000:8.2f} ms{ratio}"


def _three_hooks(spec: dict) -> dict:
    """The spec as `cdi generate` wrote it before issue 24: the one hook's steps as three
    createContainer hooks, one exec'd Python each."""
    import copy

    spec = copy.deepcopy(spec)
    [hook] = spec["containerEdits"]["hooks"]
    args = hook["args"][hook["args"].index("createRuntime") + 1:]
    flags = list(zip(args[::2], args[1::2]))
    steps = [("mask-procfs", ["--procfs-dir"]), ("create-symlinks", ["--link"]),
             ("update-ldcache", ["--ldconfig", "--folder"])]
    spec["containerEdits"]["hooks"] = [
        {"hookName": "createContainer", "path": hook["path"], "env": hook["env"],
         "args": ["nvhook-hook", "cdi-hook", step, *[x for f, v in flags if f in mine for x in (f, v)]]}
        for step, mine in steps]
    return spec


def podman_start(n: int) -> int:
    """The podman cases (module docstring); 0 if the target is met."""
    import contextlib
    import json
    import shutil

    sys.path.insert(0, str(REPO / "tests"))
    from libinject.sim.build import create_host
    from libinject.sim.rootfs import build_rootfs
    from support import hookenv
    from support.podman import CdiNamespace, Podman, state_dir
    from support.serve import Serve

    front = hookenv.ensure_front()
    sockdir = Path(tempfile.mkdtemp(prefix="nvbc", dir="/tmp"))
    sock = sockdir / "run/hook.sock"
    try:
        with tempfile.TemporaryDirectory(prefix="bench-cdip-") as tmp, state_dir("pmb") as state:
            t = Path(tmp)
            host = create_host(t / "a100x8", profile="a100x8")
            rootfs = build_rootfs(t / "rootfs")
            # an ld.so.cache of its own, as real images have (the hook merges into it)
            subprocess.run(["/sbin/ldconfig", "-r", str(rootfs)], check=True)
            # Each case alone in its spec dir, seen as /etc/cdi in a mount namespace of its
            # own (a node has one NVIDIA spec; podman reads and validates every spec in its
            # dirs on each CDI start, so specs side by side would each pay for the others).
            kinds = ("mounts only", "3 hooks", "exec'd", "served")
            dirs = {case: t / f"specs{i}" for i, case in enumerate(("baseline (no GPU)", *kinds))}
            for d in dirs.values():
                d.mkdir()
            for case in kinds:
                out = dirs[case] / "nvidia.json"
                r = subprocess.run([NVHOOK, "cdi", "generate", "--driver-root", str(host),
                                    "--hook-path", front, "--hook-socket",
                                    str(sock) if case == "served" else "none", "-o", str(out)],
                                   capture_output=True, text=True)
                if r.returncode != 0:
                    raise SystemExit(r.stderr)
                if case == "3 hooks":
                    out.write_text(json.dumps(_three_hooks(json.loads(out.read_text()))))
                if case == "mounts only":       # the spec's floor: what runc and podman add
                    spec = json.loads(out.read_text())
                    del spec["containerEdits"]["hooks"]
                    out.write_text(json.dumps(spec))
            # snapshots on, as a node runs the service (it warms up: the driver's ELF facts)
            cfg = hookenv.write_config(t / "config.toml", host, extra=f'snapshot-dir = "{t}/snap"\n')
            cfg.write_text(cfg.read_text().replace("snapshot = false", "snapshot = true"))
            with contextlib.ExitStack() as stack:
                spaces = {case: stack.enter_context(CdiNamespace(state / f"ns{i}", d))
                          for i, (case, d) in enumerate(dirs.items())}
                server = Serve(cfg, sock, wrap=spaces["served"].wrap)
                try:
                    pm = Podman(state / "pm")
                    env = pm.env()
                    cases = {"baseline (no GPU)": pm.argv(rootfs, ["true"], ns=spaces["baseline (no GPU)"])}
                    for case in kinds:
                        cases[case] = pm.argv(rootfs, ["true"], ns=spaces[case], devices=["nvidia.com/gpu=1"])
                    for argv in cases.values():      # warm-up: images, caches, a spare worker
                        _timed(argv, env)
                        _timed(argv, env)
                    res: dict[str, list[float]] = {k: [] for k in cases}
                    for _ in range(n):
                        for k, argv in cases.items():
                            res[k].append(_timed(argv, env))
                    import re

                    took = [float(x) for x in re.findall(r"status 0 in ([\d.]+) ms", server.log())]
                finally:
                    server.stop()
                    pm.cleanup()
    finally:
        shutil.rmtree(sockdir, ignore_errors=True)
    base = _stats(res["baseline (no GPU)"])[0]
    print(f"podman run --device <kind>=1 ... true, a100x8, {n} interleaved runs each; the served "
          f"requests took {_stats(took)[0]:.1f} ms (median of "
          f"{len(took)}, the service's log):")
    for k, xs in res.items():
        med, p90 = _stats(xs)
        added = (med - base) * 1000
        extra = "" if k.startswith("baseline") else (
            f"  added {added:+7.1f} ms  x{added / NVIDIA_CDI_MS:4.2f} of NVIDIA's +{NVIDIA_CDI_MS:g}")
        print(f"  {k:<18} median {med * 1000:7.1f} ms  p90 {p90 * 1000:7.1f} ms{extra}")
    added = (_stats(res["served"])[0] - base) * 1000
    met = added <= TARGET_RATIO * NVIDIA_CDI_MS
    print(f"  target: served adds <= {TARGET_RATIO:g}x NVIDIA's (<= {TARGET_RATIO * NVIDIA_CDI_MS:.1f} ms): "
          f"{added:+.1f} ms -> {'met' if met else 'NOT met'}; before (3 hooks): "
          f"{(_stats(res['3 hooks'])[0] - base) * 1000:+.1f} ms", flush=True)
    return 0 if met else 1


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    n = int(args[0]) if args else int(os.environ.get("BENCH_N", "10"))
    sys.path.insert(0, str(REPO))
    rc = 0
    if "--no-podman" not in sys.argv:
        rc = podman_start(n)
    if "--podman-only" in sys.argv:
        return rc
    generate_cost(n)
    return rc


def generate_cost(n: int) -> None:
    from libinject.apply import cdi
    from libinject.plan import planner as P
    from libinject.discover.driver import discover
    from libinject.request.model import Request
    from libinject.sim.build import create_host

    with tempfile.TemporaryDirectory(prefix="bench-cdi-") as tmp:
        t = Path(tmp)
        cfgfile = t / "config.toml"
        cfgfile.write_text("")          # defaults; never the machine's /etc config
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NVHOOK_CONFIG": str(cfgfile)}
        for profile in PROFILES:
            host = create_host(t / profile, profile=profile)
            out = t / f"{profile}.json"
            gen = [NVHOOK, "cdi", "generate", "--driver-root", str(host),
                   "--device-name-strategy", "index,uuid", "-o", str(out)]
            info = [NVHOOK, "--root", str(host), "info", "--json"]
            start = [PY, "-I", "-c", "import nvhook.cli"]
            for argv in (gen, info, start):     # warm-up: snapshot written, caches hot
                _timed(argv, env)
            res: dict[str, list[float]] = {"generate": [], "info": [], "startup": []}
            for _ in range(n):
                res["generate"].append(_timed(gen, env))
                res["info"].append(_timed(info, env))
                res["startup"].append(_timed(start, env))
            driver = discover(str(host), snapshot=False)
            hook = cdi.HookOptions(path=NVHOOK)
            spec = cdi.generate(driver, hook=hook)
            inproc: dict[str, list[float]] = {"cdi.generate()": [], "plan(all)": []}
            for _ in range(n):
                t0 = time.perf_counter()
                cdi.generate(driver, hook=hook)
                inproc["cdi.generate()"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                P.plan(Request(devices="all", capabilities=frozenset({"all"}),
                               cuda_compat_mode="disabled"), driver)
                inproc["plan(all)"].append(time.perf_counter() - t0)
            gpus = len(driver.info.gpus)
            migs = sum(len(g.mig_devices) for g in driver.info.gpus)
            print(f"{profile}: {gpus} GPUs, {migs} MIG devices -> {len(spec['devices'])} CDI "
                  f"devices, cdiVersion {spec['cdiVersion']}, {out.stat().st_size} bytes; N={n}")
            base = _stats(res["info"])[0]
            print(_fmt("generate (process)", res["generate"], base) + "  vs info")
            print(_fmt("info --json (baseline)", res["info"]))
            print(_fmt("startup (scale)", res["startup"]))
            pbase = _stats(inproc["plan(all)"])[0]
            print(_fmt("cdi.generate() in-proc", inproc["cdi.generate()"], pbase) + "  vs plan(all)")
            print(_fmt("plan(all) in-proc", inproc["plan(all)"]))
            print(f"  ratio generate/info {_stats(res['generate'])[0] / base:.2f}, "
                  f"generate/startup {_stats(res['generate'])[0] / _stats(res['startup'])[0]:.2f}",
                  flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
