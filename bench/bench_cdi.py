"""Benchmark: a GPU container's start through podman with nvhook's CDI spec beside NVIDIA's
(nvidia-ctk's) in the same run, and `nvhook cdi generate` on simulated a100x8 and
h100x8-mig hosts.

Podman (RUNTIMES.md: 4.3.1, runc, overlay storage; each case in a private mount
namespace where /etc/cdi is its own spec dir, as a node has one NVIDIA spec: podman
reads and validates every spec in its dirs on each CDI start, so specs side by side
would each pay for the others; `nvhook serve` running beside the served case), `podman
run --rm ... true` twice over: from an image imported into overlay storage (as users run
it: every file the spec's mounts and the hooks make in the image is a copy-up), and with
`--rootfs R:O`; interleaved, N runs each:
  baseline              no device
  nvhook, mounts only   nvhook's spec without its hook: what podman and runc add for its
                        mounts and nodes alone
  nvhook exec'd         --device nvidia.com/gpu=1 with nvhook's spec, its one `cdi-hook
                        createRuntime` hook exec'd (--hook-socket none)
  nvhook served         the same hook handed to the warm service
  NVIDIA                NVIDIA's spec: `nvidia-ctk cdi generate` (toolkit 1.20) for the same
                        simulated host, run under `nvhook sim enter` (bench/nvidia.py), its
                        six nvidia-cdi-hook hooks
  NVIDIA, mounts only   NVIDIA's spec without its hooks
Added = median minus the baseline's of the same storage; the ratios: nvhook's added over
NVIDIA's, targets (issue 33) served <= 0.5x, exec'd <= 1.5x. Without NVIDIA's stack
(../shared/anchors) the NVIDIA cases are left out and said so.

Per profile, interleaved in the same run (N samples each, median and p90):
  generate   `nvhook cdi generate --driver-root HOST --device-name-strategy index,uuid
             -o FILE` (a new process: start-up, discovery, one plan per device, write)
  info       `nvhook --root HOST info --json`: the same start-up and discovery, no
             planning or writing -- the baseline; the ratio is what generation adds
  startup    `python -I -c "import nvhook.cli"`: interpreter + CLI import, for scale
and in-process (no start-up, discovery done once): libinject.apply.cdi.generate() against
one libinject.plan.planner.plan() of "all" -- the per-device planning cost.
Discovery uses the default snapshot setting ([nvhook] snapshot = true), as users run it.

Usage: python bench/bench_cdi.py [N] [--podman-only | --no-podman] [--no-nvidia]
       (default N=10; BENCH_N too)
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from benchlib import EXECD_TARGET, SERVED_TARGET, ratio_line, stats as _stats, timed as _timed

REPO = Path(__file__).resolve().parent.parent
NVHOOK = str(REPO / ".venv/bin/nvhook")
PY = str(REPO / ".venv/bin/python")
PROFILES = ("a100x8", "h100x8-mig")
IMAGE = "localhost/nvbench-cdi:1"
STORAGES = ("image, overlay", "--rootfs")


def _fmt(name: str, xs: list[float], base: float | None = None) -> str:
    med, p90 = _stats(xs)
    ratio = f"  x{med / base:5.2f}" if base else ""
    return f"  {name:<22} median {med * 1000:8.2f} ms  p90 {p90 * 1000:8.2f} ms{ratio}"


def _strip_hooks(path: Path) -> None:
    import json

    spec = json.loads(path.read_text())
    spec["containerEdits"].pop("hooks", None)
    for dev in spec["devices"]:
        dev["containerEdits"].pop("hooks", None)
    path.write_text(json.dumps(spec))


def podman_start(n: int, with_nvidia: bool = True) -> int:
    """The podman cases (module docstring); 0 unless a start failed."""
    import contextlib
    import re
    import shutil

    sys.path.insert(0, str(REPO / "tests"))
    import nvidia
    from libinject.sim.build import create_host
    from libinject.sim.rootfs import build_rootfs
    from support import hookenv
    from support.podman import PODMAN, CdiNamespace, Podman, state_dir
    from support.serve import Serve

    front = hookenv.ensure_front()
    anchors = nvidia.find() if with_nvidia else None
    print(f"NVIDIA's stack: {anchors}" if anchors else nvidia.absent_note())
    sockdir = Path(tempfile.mkdtemp(prefix="nvbc", dir="/tmp"))
    sock = sockdir / "run/hook.sock"
    try:
        with tempfile.TemporaryDirectory(prefix="bench-cdip-") as tmp, state_dir("pmb") as state:
            t = Path(tmp)
            host = create_host(t / "a100x8", profile="a100x8")
            rootfs = build_rootfs(t / "rootfs")
            # an ld.so.cache of its own, as real images have (the hook merges into it)
            subprocess.run(["/sbin/ldconfig", "-r", str(rootfs)], check=True)
            kinds = ["nvhook, mounts only", "nvhook exec'd", "nvhook served"]
            if anchors:
                kinds += ["NVIDIA", "NVIDIA, mounts only"]
            dirs = {case: t / f"specs{i}" for i, case in enumerate(("baseline", *kinds))}
            for d in dirs.values():
                d.mkdir()
            for case in kinds:
                out = dirs[case] / "nvidia.json"
                if case.startswith("NVIDIA"):
                    nvidia.Nvidia(anchors, t / "nvidia").cdi_generate(host, out)
                else:
                    r = subprocess.run([NVHOOK, "cdi", "generate", "--driver-root", str(host),
                                        "--hook-path", front, "--hook-socket",
                                        str(sock) if case.endswith("served") else "none", "-o", str(out)],
                                       capture_output=True, text=True)
                    if r.returncode != 0:
                        raise SystemExit(r.stderr)
                if case.endswith("mounts only"):     # the spec's floor: what runc and podman add
                    _strip_hooks(out)
            # snapshots on, as a node runs the service (it warms up: the driver's ELF facts)
            cfg = hookenv.write_config(t / "config.toml", host, extra=f'snapshot-dir = "{t}/snap"\n')
            cfg.write_text(cfg.read_text().replace("snapshot = false", "snapshot = true"))
            pm = Podman(state / "pm")
            conf = state / "pm/storage.conf"
            conf.write_text(conf.read_text().replace('driver = "vfs"', 'driver = "overlay"'))
            env = pm.env()
            subprocess.run(f"tar -C {rootfs} -c . | {PODMAN} import - {IMAGE}", shell=True, env=env,
                           check=True, capture_output=True)
            with contextlib.ExitStack() as stack:
                spaces = {case: stack.enter_context(CdiNamespace(state / f"ns{i}", d))
                          for i, (case, d) in enumerate(dirs.items())}
                server = Serve(cfg, sock, wrap=spaces["nvhook served"].wrap)
                try:
                    cases: dict[tuple[str, str], list[str]] = {}
                    for storage in STORAGES:
                        for case in ("baseline", *kinds):
                            devices = [] if case == "baseline" else ["--device", "nvidia.com/gpu=1"]
                            if storage == "--rootfs":
                                argv = pm.argv(rootfs, ["true"], ns=spaces[case], devices=devices[1:])
                            else:
                                argv = spaces[case].wrap([PODMAN, "--hooks-dir", str(state / "pm/hooks"), "run",
                                                          "--rm", "--pull=never", *devices, IMAGE, "true"])
                            cases[(storage, case)] = argv
                    for (storage, case), argv in cases.items():   # each GPU case gets the GPU
                        if case != "baseline":
                            _timed([*argv[:-1], "test", "-c", "/dev/nvidia1"], env)
                    for argv in cases.values():      # warm-up: images, caches, a spare worker
                        _timed(argv, env)
                        _timed(argv, env)
                    res: dict[tuple[str, str], list[float]] = {k: [] for k in cases}
                    for _ in range(n):
                        for k, argv in cases.items():
                            res[k].append(_timed(argv, env))
                    took = [float(x) for x in re.findall(r"status 0 in ([\d.]+) ms", server.log())]
                finally:
                    server.stop()
                    pm.cleanup()
    finally:
        shutil.rmtree(sockdir, ignore_errors=True)
    print(f"podman run --device nvidia.com/gpu=1 ... true, a100x8, {n} interleaved runs each; the served "
          f"requests took {_stats(took)[0]:.1f} ms (median of {len(took)}, the service's log):")
    for storage in STORAGES:
        base = _stats(res[(storage, "baseline")])[0]
        added = {}
        print(f" {storage}:")
        for (st, k), xs in res.items():
            if st != storage:
                continue
            med, p90 = _stats(xs)
            added[k] = (med - base) * 1000
            extra = "" if k == "baseline" else f"  added {added[k]:+7.1f} ms"
            print(f"  {k:<22} median {med * 1000:7.1f} ms  p90 {p90 * 1000:7.1f} ms{extra}")
        for who, target in (("nvhook served", SERVED_TARGET), ("nvhook exec'd", EXECD_TARGET)):
            line, _ = ratio_line(f"{storage}, {who.removeprefix('nvhook ')}", added[who], added.get("NVIDIA"),
                                 target)
            print(line)
        if anchors:
            print(f"  {'mounts only (no hooks)':34s} nvhook {added['nvhook, mounts only']:+6.1f} ms / NVIDIA "
                  f"{added['NVIDIA, mounts only']:+6.1f} ms", flush=True)
    return 0


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    n = int(args[0]) if args else int(os.environ.get("BENCH_N", "10"))
    sys.path.insert(0, str(REPO))
    rc = 0
    if "--no-podman" not in sys.argv:
        rc = podman_start(n, with_nvidia="--no-nvidia" not in sys.argv)
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
