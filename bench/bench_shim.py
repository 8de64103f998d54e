"""Benchmark: the runtime shim's pass-through (every runc command but `create`), added to
calling runc directly, and its `create`. Engines call the runtime several times per
container (state, start, kill, delete...), so the pass-through is paid on every
container, GPU or not; `create` is where the shim does its work.

    .venv/bin/python bench/bench_shim.py [N] [--no-nvidia]     (default N=30)

Pass-through: interleaved runs of `runc --root R list` and `nvhook-runtime --root R list`
(the compiled front, csrc/shimfront.c, execs runc itself) and, for reference, `nvhook
runtime --root R list` (the same through Python).

create: what the shim itself adds to `create`, with the low-level runtime a stub
(`runc` first on PATH is /bin/true, so the container's own start and the hook it adds
are not in the figure): the stub called directly (baseline) against `nvhook-runtime
create --bundle B ID` for a container with no GPU (the front execs the runtime
directly), a GPU container in legacy mode (config.json rewritten with the prestart
hook) and in cdi mode (the devices' CDI edits applied from a generated spec), each on a
fresh config.json, each GPU case twice: exec'd (the config names a socket nobody
listens on: the front execs Python, the state before issue 24) and served (an `nvhook
serve` this benchmark starts listens there, one per mode, started with that mode's
config, as a node's service is with the config its engine's shim reads: the front
hands the create to it, libinject/runtime/serve/shim.py). Beside them, in the same
rounds, NVIDIA's shim (nvidia-container-runtime 1.20 from ../shared/anchors,
bench/nvidia.py) on the same config.json: no GPU, legacy mode (it adds its hook) and
cdi mode (the edits of nvidia-ctk's spec for the same simulated host). Targets (issue
33): what a GPU create adds, over what NVIDIA's adds in the same mode and run: served
<= 0.5x, exec'd <= 1.5x; no GPU: noise (<= 1 ms). Without NVIDIA's stack: nvhook only, said so. Prints medians,
p90 and the added time.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from benchlib import EXECD_TARGET, SERVED_TARGET, ratio_line, stats, timed

REPO = Path(__file__).resolve().parent.parent
NO_GPU_MS = 1.0


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    n = int(args[0]) if args else 30
    runc = shutil.which("runc") or "/usr/sbin/runc"
    shim = str(REPO / ".venv/bin/nvhook-runtime")
    py = [str(REPO / ".venv/bin/nvhook"), "runtime"]
    state = tempfile.mkdtemp(prefix="nvbench-shim")
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
           "XDG_CONFIG_HOME": state}          # no config.toml: NVIDIA's defaults
    cases = {"runc": [runc, "--root", state, "list"], "shim (compiled front)": [shim, "--root", state, "list"],
             "shim through Python": [*py, "--root", state, "list"]}
    times: dict[str, list[float]] = {k: [] for k in cases}
    try:
        for _ in range(2):                    # warm the page cache
            for argv in cases.values():
                timed(argv, env)
        for _ in range(n):
            for k, argv in cases.items():
                times[k].append(timed(argv, env))
    finally:
        shutil.rmtree(state, ignore_errors=True)
    base, _ = stats(times["runc"])
    print(f"runtime shim pass-through (`list`), {n} interleaved runs each, medians:")
    for k, xs in times.items():
        med, p90 = stats(xs)
        print(f"  {k:24s} {med * 1000:7.2f} ms (p90 {p90 * 1000:6.2f})  added {1000 * (med - base):+7.2f} ms"
              f"  x{med / base:.2f}")
    return create(max(5, n // 3), shim, with_nvidia="--no-nvidia" not in sys.argv)


def create(n: int, shim: str, with_nvidia: bool = True) -> int:
    """The create cases (module docstring); 0 unless one failed (targets are reported)."""
    import json
    import re
    import subprocess

    import nvidia
    from benchlib import await_log, timed as _timed

    tmp = Path(tempfile.mkdtemp(prefix="nvbench-shimc"))
    try:
        stub = tmp / "stub"
        stub.mkdir()
        shutil.copy("/bin/true", stub / "runc")       # a copy: never the front itself
        host = tmp / "host"
        subprocess.run([str(REPO / ".venv/bin/nvhook"), "sim", "create", "--profile", "a100x8", str(host)],
                       check=True, capture_output=True)
        specs = tmp / "specs"
        specs.mkdir()
        subprocess.run([str(REPO / ".venv/bin/nvhook"), "cdi", "generate", "--driver-root", str(host),
                        "-o", str(specs / "nvidia.json")], check=True, capture_output=True)
        # A service per mode, started with that mode's config, which its shim reads too:
        # a node runs one, with the node's config (the engine's shim reads the same file,
        # which the service has parsed already). The exec'd cases name a socket nobody is on.
        socks = {mode: tmp / f"run/{mode}.sock" for mode in ("legacy", "cdi")}
        configs = {}
        for served in ("served", "exec'd"):
            for mode in ("legacy", "cdi"):
                sockpath = socks[mode] if served == "served" else tmp / "run/nobody.sock"
                configs[(mode, served)] = tmp / f"{mode}-{served[0]}.toml"
                configs[(mode, served)].write_text(
                    (f'[nvidia-container-runtime]\nmode = "cdi"\n'
                     f'[nvidia-container-runtime.modes.cdi]\nspec-dirs = ["{specs}"]\n' if mode == "cdi" else "")
                    + f'[nvhook]\nsocket = "{sockpath}"\n')
        logs = {mode: tmp / f"serve-{mode}.log" for mode in socks}
        servers = []
        for mode, sock in socks.items():
            servers.append(subprocess.Popen(
                [str(REPO / ".venv/bin/nvhook-hook"), "--config", str(configs[(mode, "served")]),
                 "serve", "--socket", str(sock), "--no-warm"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(logs[mode], "wb"), env={}))
            await_log(servers[-1], logs[mode], "listening on", "nvhook serve")
        path = f"{stub}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        bundle = tmp / "bundle"
        (bundle / "rootfs").mkdir(parents=True)
        subprocess.run(["runc", "spec", "--bundle", str(bundle)], check=True)
        spec = json.loads((bundle / "config.json").read_text())
        spec["root"]["path"] = str(bundle / "rootfs")
        fresh = {}
        for name, env in (("no GPU", []), ("GPU", ["NVIDIA_VISIBLE_DEVICES=0"])):
            spec["process"]["env"] = ["PATH=/bin", *env]
            fresh[name] = json.dumps(spec)

        def nvh(conf: tuple[str, str]) -> dict[str, str]:
            return {"PATH": path, "NVHOOK_CONFIG": str(configs[conf])}

        cases = {"stub runtime (baseline)": ("no GPU", nvh(("legacy", "served")), [str(stub / "runc")]),
                 "shim, no GPU": ("no GPU", nvh(("legacy", "served")), [shim])}
        for mode in ("legacy", "cdi"):
            for served in ("exec'd", "served"):
                cases[f"shim, GPU, {mode}, {served}"] = ("GPU", nvh((mode, served)), [shim])
        anchors = nvidia.find() if with_nvidia else None
        print(f"NVIDIA's stack: {anchors}" if anchors else nvidia.absent_note())
        if anchors:
            nv = nvidia.Nvidia(anchors, tmp / "nvidia")
            nvspecs = tmp / "nvspecs"
            nvspecs.mkdir()
            nv.cdi_generate(host, nvspecs / "nvidia.json")
            for mode in ("legacy", "cdi"):
                # NVIDIA's runtime reads $XDG_CONFIG_HOME/nvidia-container-runtime/config.toml
                xdg = tmp / f"xdg-{mode}"
                (xdg / "nvidia-container-runtime").mkdir(parents=True)
                (xdg / "nvidia-container-runtime/config.toml").write_text(nv.config_text(
                    host, f'[nvidia-container-runtime]\nmode = "{mode}"\nruntimes = ["{stub}/runc"]\n'
                          f'[nvidia-container-runtime.modes.cdi]\nspec-dirs = ["{nvspecs}"]\n'))
                nenv = {"PATH": path, "XDG_CONFIG_HOME": str(xdg)}
                if mode == "legacy":
                    cases["NVIDIA shim, no GPU"] = ("no GPU", nenv, [nv.runtime])
                cases[f"NVIDIA shim, GPU, {mode}"] = ("GPU", nenv, [nv.runtime])
        times: dict[str, list[float]] = {k: [] for k in cases}
        try:
            for i in range(n + 1):
                for k, (want, env, front) in cases.items():
                    (bundle / "config.json").write_text(fresh[want])
                    t = _timed([*front, "--root", str(tmp / "state"), "create", "--bundle", str(bundle), "c1"], env)
                    if i:                               # (the first round warms caches)
                        times[k].append(t)
                    if not i and want == "GPU":         # (each did its work: a hook or the devices)
                        edited = json.loads((bundle / "config.json").read_text())
                        if not edited.get("hooks") and not edited["linux"].get("devices"):
                            raise SystemExit(f"{k}: config.json not edited")
        finally:
            for server in servers:
                server.terminate()
                server.wait(30)
        for mode, log in logs.items():
            served_n = len(re.findall(r"request from pid \d+: status 0", log.read_text()))
            if served_n != n + 1:
                raise SystemExit(f"the {mode} service served {served_n} creates, not {n + 1}: {log.read_text()}")
        base, _ = stats(times["stub runtime (baseline)"])
        print(f"runtime shim `create` (the runtime a stub), {n} interleaved runs each, medians:")
        rc = 0
        added = {}
        for k, xs in times.items():
            med, p90 = stats(xs)
            added[k] = 1000 * (med - base)
            target = ""
            if k == "shim, no GPU":
                ok = added[k] <= NO_GPU_MS
                target = f"  target <= {NO_GPU_MS:g} ms: {'met' if ok else 'NOT met'}"
            print(f"  {k:30s} {med * 1000:7.2f} ms (p90 {p90 * 1000:6.2f})  added {added[k]:+7.2f} ms{target}")
        print("nvhook over NVIDIA, added time (same run, same baseline):")
        for mode in ("legacy", "cdi"):
            for served, goal in (("served", SERVED_TARGET), ("exec'd", EXECD_TARGET)):
                line, _ = ratio_line(f"create, GPU, {mode}, {served}", added[f"shim, GPU, {mode}, {served}"],
                                     added.get(f"NVIDIA shim, GPU, {mode}"), goal)
                print(line)
        if "NVIDIA shim, no GPU" in added:
            print(f"  create, no GPU: nvhook {added['shim, no GPU']:+.2f} ms, NVIDIA "
                  f"{added['NVIDIA shim, no GPU']:+.2f} ms", flush=True)
        return rc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
