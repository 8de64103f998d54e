"""Benchmark: `nvhook cdi generate` on simulated a100x8 and h100x8-mig hosts.

Per profile, interleaved in the same run (N samples each, median and p90):
  generate   `nvhook cdi generate --driver-root HOST --device-name-strategy index,uuid
             -o FILE` (a new process: start-up, discovery, one plan per device, write)
  info       `nvhook --root HOST info --json`: the same start-up and discovery, no
             planning or writing -- the baseline; the ratio is what generation adds
  startup    `python -I -c "import nvhook.cli"`: interpreter + CLI import, for scale
and in-process (no start-up, discovery done once): libinject.apply.cdi.generate() against
one libinject.plan.planner.plan() of "all" -- the per-device planning cost.
Discovery uses the default snapshot setting ([nvhook] snapshot = true), as users run it.

Usage: python bench/bench_cdi.py [N]   (default N=10; BENCH_N also works)
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from benchlib import stats as _stats, timed as _timed

REPO = Path(__file__).resolve().parent.parent
NVHOOK = str(REPO / ".venv/bin/nvhook")
PY = str(REPO / ".venv/bin/python")
PROFILES = ("a100x8", "h100x8-mig")




def _fmt(name: str, xs: list[float], base: float | None = None) -> str:
    med, p90 = _stats(xs)
    ratio = f"  x{med / base:5.2f}" if base else ""
    return f"  {name:<22} median {med * 1000:8.2f} ms  p90 {p90 * 1000:8.2f} ms{ratio}"


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else int(os.environ.get("BENCH_N", "10"))
    sys.path.insert(0, str(REPO))
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
