"""Behind a real engine: `docker run --rm IMAGE true` on a private dockerd (Debian's
docker.io, configured by `nvhook setup docker`), without and with nvhook, on a simulated
a100x8 host. Cases, interleaved, medians of N (default 9):

  plain                 docker run (the baseline; runc, no hook)
  --runtime=nvidia      through nvhook's shim (compiled front), container wants no GPU
  --runtime=nvidia GPU0 the shim's legacy hook, NVIDIA_VISIBLE_DEVICES=0
  --gpus device=0       dockerd's own hook, found as nvidia-container-runtime-hook
  files by -v (floor)   no hook: the GPU0 container's device nodes and driver files given
                        by docker itself (--device, -v FILE:PATH:ro for each mount the
                        hook makes), without its links and ld cache: what making the
                        same mount targets and nodes in a fresh overlay costs docker and
                        runc here, which any injector, NVIDIA's too, pays

Twice: with the hook exec'd (no service), then served: `nvhook serve` started in
dockerd's own mount namespace (the front uses a service only in its own namespaces;
this dockerd runs in a private one), on the default socket, under a private tmpfs
/run/nvhook there, as `nvhook setup service` puts it beside a node's dockerd. NVIDIA's
runtime is not run here (no ratio: a figure remembered from another run is no
measure); bench_shim.py and bench_hook.py measure its shim and hook beside nvhook's in
the same run.

    .venv/bin/python bench/bench_docker.py [N]
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchlib import await_log, stats

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

CASES = {
    "plain": [],
    "--runtime=nvidia": ["--runtime=nvidia"],
    "--runtime=nvidia GPU0": ["--runtime=nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=0"],
    "--gpus device=0": ["--gpus", "device=0"],
}


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    from libinject.sim.build import create_host
    from libinject.sim.rootfs import build_rootfs
    from nvhook import cli
    from support.engines_daemons import Dockerd, short_dir

    work = short_dir("nvbench-docker-")
    d = None
    try:
        host = create_host(work / "host", profile="a100x8")
        daemon_json, hook_dir = work / "daemon.json", work / "bin"
        hook_dir.mkdir()
        if cli.main(["setup", "docker", "--config", str(daemon_json), "--hook-dir", str(hook_dir)]) != 0:
            return 1
        # As a node has it: no `runtimes` or `log-level` (those send every call to Python)
        conf = f'[nvidia-container-cli]\nroot = "{host}"\n[nvidia-container-runtime]\nmode = "legacy"\n'
        d = Dockerd(work / "d", daemon_json, hook_dir, {"nvidia-container-runtime/config.toml": conf})
        d.import_rootfs(build_rootfs(work / "rootfs"), "nvbench:1")
        CASES["files by -v (floor)"] = _floor_args(host)
        if not _rounds(d, n, "hook exec'd"):
            return 1
        server = _serve_beside(d.proc.pid, work / "serve.log")
        try:
            if not _rounds(d, n, "hook served"):
                return 1
        finally:
            server.terminate()
            server.wait(30)
        served = (work / "serve.log").read_text(errors="replace").count(": status 0 in ")
        print(f"  nvhook serve answered {served} of the {2 * (n + 1)} GPU starts")
        return 0
    finally:
        if d is not None:
            d.stop()
        shutil.rmtree(work, ignore_errors=True)


def _rounds(d, n: int, label: str) -> bool:
    times: dict[str, list[float]] = {k: [] for k in CASES}
    for i in range(n + 1):                  # the first round warms up
        for name, args in CASES.items():
            t = time.perf_counter()
            r = d.run(*args, "nvbench:1", "true")
            ms = (time.perf_counter() - t) * 1000
            if r.returncode != 0:
                print(f"{name}: docker run failed: {r.stderr.decode(errors='replace').strip()}")
                return False
            if i:
                times[name].append(ms)
    base, _ = stats(times["plain"])
    print(f"docker run --rm (private dockerd 20.10), {label}, {n} interleaved runs each, medians (ms):")
    print(f"  {'plain':24s} {base:7.1f}")
    for name in list(CASES)[1:]:
        med, p90 = stats(times[name])
        verdict = "   (what any injector pays here)" if name.startswith("files") else ""
        print(f"  {name:24s} {med:7.1f} (p90 {p90:6.1f})   added {med - base:+6.1f}{verdict}")
    return True


def _floor_args(host: Path) -> list[str]:
    """docker run options giving the GPU0 container's nodes and driver files (the plan
    the hook makes for NVIDIA_VISIBLE_DEVICES=0, utility,compute) without a hook."""
    from libinject.discover.driver import discover
    from libinject.plan.planner import plan
    from libinject.request.model import Request

    edits = plan(Request(devices="0", capabilities=frozenset({"utility", "compute"})),
                 discover(str(host), snapshot=False))
    args = []
    for dev in edits.device_nodes:
        args += ["--device", f"{dev.host_path}:{dev.path}"]
    for m in edits.mounts:
        if not m.container_path.startswith("/proc/"):
            args += ["-v", f"{m.host_path}:{m.container_path}:ro"]
    return args


def _serve_beside(pid: int, log: Path) -> subprocess.Popen:
    """`nvhook serve` in the mount namespace of process `pid` (its config: that
    namespace's /etc/nvidia-container-runtime/config.toml), on the default socket under
    a tmpfs of its own there; returns once it listens."""
    from support import hookenv

    script = 'mkdir -p /run/nvhook && mount -t tmpfs -o mode=0700 nvhook-bench /run/nvhook && exec "$@"'
    proc = subprocess.Popen(["nsenter", "-t", str(pid), "-m", "--", "sh", "-c", script, "sh",
                             hookenv.ensure_front(), "serve"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=open(log, "wb"), env={})
    await_log(proc, log, "listening on", "nvhook serve")
    return proc


if __name__ == "__main__":
    raise SystemExit(main())
