"""Benchmark: what a CDI spec's mounts cost a podman GPU start, nvhook's spec beside
NVIDIA's, with an image on overlay storage (as users run it), issue 33 item 2.

`podman run --rm --pull=never [--device nvidia.com/gpu=1] IMAGE true`, podman 4.3.1 + runc,
storage driver overlay, the image imported from a busybox+glibc rootfs (with an
ld.so.cache). Each case has its own spec dir seen as /etc/cdi (a private mount namespace,
support.podman.CdiNamespace); `nvhook serve` runs in the served cases' namespace.
Interleaved, N runs each, medians; "added" = median minus the no-GPU baseline's.

Cases (a100x8, GPU 1, the default spec: every capability but compat32):
  baseline          no device
  nodes only        nvhook's spec with neither mounts nor hooks: the device nodes' floor
  nvhook mounts     nvhook's spec, hooks stripped: its mounts and nodes alone
  nvhook served     nvhook's spec as generated, its one hook served
  nvidia mounts     `nvidia-ctk cdi generate`'s spec (../shared/anchors), hooks stripped
  nvidia            NVIDIA's spec as generated (six nvidia-cdi-hook calls)
  and any shape given (--shape NAME=SPEC.json: a hand-made spec to try; @HOST@, @FRONT@
  and @SOCK@ in it become the simulated host, the hook front and, for a NAME holding
  "served", the socket of a service started for it).
NVIDIA's tools read /proc/driver/nvidia and sysfs outside --driver-root: nvidia-ctk
runs under `nvhook sim enter`. Its hooks run in the container and need nothing of that.

  --runc: instead, runc alone (`runc run` of a bundle whose rootfs is an overlay of the
  same rootfs, fresh upper dir each run), the OCI mounts of nvhook's spec (0, 42, and the
  42 twice), and NVIDIA's spec's 42 (its options: rbind, rprivate): wall time and the CPU
  time of runc and its children (runc init), which the machine's load moves less.
  --slope: also "mounts x2", nvhook's mounts twice (the copies under /opt/nvx): the
  difference to "nvhook mounts" is what 42 more file mounts cost.

Usage: python bench/cdi_mounts.py [N] [--runc] [--slope] [--only CASE,...]
                                   [--shape NAME=SPEC.json ...] [--keep DIR]
(default N=10; BENCH_N too). Needs root, podman, runc; NVIDIA's cases are left out
when ../shared/anchors is missing.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import stats, timed


def timed_cpu(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s of argv's own process tree as it waits for it: podman's, not
    conmon's or runc's, which conmon runs detached, nor the service's)."""
    import resource

    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = timed(argv, env)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)

REPO = Path(__file__).resolve().parent.parent
NVHOOK = str(REPO / ".venv/bin/nvhook")
ANCHORS = Path(os.environ.get("NVHOOK_ANCHORS", REPO.parent.parent / "shared/anchors")) / "nvidia"
IMAGE = "localhost/nvhook-cdi-mounts:bench"
PROFILE = "a100x8"
DEVICE = "nvidia.com/gpu=1"


def _strip(spec: dict, mounts: bool = True, hooks: bool = True) -> dict:
    """The spec without its hooks (and, mounts false, without its mounts), everywhere."""
    spec = json.loads(json.dumps(spec))
    for e in [spec.get("containerEdits") or {}, *[d.get("containerEdits") or {} for d in spec["devices"]]]:
        if hooks:
            e.pop("hooks", None)
        if not mounts:
            e.pop("mounts", None)
    return spec


def _nvidia_spec(host: Path, out: Path) -> dict | None:
    ctk = ANCHORS / "bin/nvidia-ctk"
    if not ctk.exists():
        print(f"(no {ctk}: NVIDIA's cases left out)")
        return None
    r = subprocess.run([NVHOOK, "sim", "enter", str(host), "--", str(ctk), "cdi", "generate",
                        "--driver-root", str(host), "--dev-root", str(host),
                        "--nvidia-cdi-hook-path", str(ANCHORS / "bin/nvidia-cdi-hook"),
                        "--output", str(out)], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"nvidia-ctk cdi generate: {r.stderr}")
    return json.loads(out.read_text())


def _sock(sockdir: Path, case: str) -> Path:
    """The socket of the service serving `case` (its spec names it)."""
    return sockdir / f"run-{re.sub('[^a-z0-9]+', '-', case.lower())}/hook.sock"


def _count(spec: dict) -> str:
    edits = [spec.get("containerEdits") or {}]
    m = sum(len(e.get("mounts") or ()) for e in edits)
    h = sum(len(e.get("hooks") or ()) for e in edits)
    return f"{m} mounts, {h} hooks"


def runc_mounts(n: int, t: Path, rootfs: Path, specs: dict[str, list[dict]]) -> None:
    """--runc (module docstring): runc run of `true` with each case's mounts, interleaved."""
    runc = shutil.which("runc") or "/usr/sbin/runc"
    subprocess.run([runc, "spec", "--bundle", str(t)], check=True)
    base = json.loads((t / "config.json").read_text())
    base["process"].update(args=["true"], terminal=False)
    state = t / "runc-state"

    def one(mounts: list[dict], i: int) -> tuple[float, float]:
        b = t / f"bundle{i}"
        for d in ("upper", "work", "rootfs"):
            (b / d).mkdir(parents=True)
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={rootfs},upperdir={b}/upper,workdir={b}/work", str(b / "rootfs")],
                       check=True)
        try:
            cfg = json.loads(json.dumps(base))
            cfg["mounts"] += [{"source": m["hostPath"], "destination": m["containerPath"],
                               "options": m["options"], "type": "bind"} for m in mounts]
            (b / "config.json").write_text(json.dumps(cfg))
            return timed_cpu([runc, "--root", str(state), "run", "--bundle", str(b), f"cdim{i}"], {})
        finally:
            subprocess.run(["umount", str(b / "rootfs")], check=True)
            shutil.rmtree(b)

    res: dict[str, list[tuple[float, float]]] = {k: [] for k in specs}
    i = 0
    for _ in range(n + 1):          # the first round warms up
        for k, mounts in specs.items():
            res[k].append(one(mounts, i))
            i += 1
    print(f"runc run true, rootfs an overlay (fresh upper), {n} interleaved runs each")
    w0, c0 = (stats([x[j] for x in res["no mounts"][1:]])[0] for j in (0, 1))
    for k, xs in res.items():
        w, c = (stats([x[j] for x in xs[1:]])[0] for j in (0, 1))
        print(f"  {k:<22} wall {w * 1000:6.1f} ms ({(w - w0) * 1000:+6.1f})  runc CPU {c * 1000:6.1f} ms "
              f"({(c - c0) * 1000:+6.1f}; {len(specs[k])} mounts)", flush=True)


def main() -> int:
    argv = sys.argv[1:]
    shapes: dict[str, Path] = {}
    keep = None
    slope = False
    runc = False
    only: list[str] = []
    args = []
    while argv:
        a = argv.pop(0)
        if a == "--shape":
            name, _, path = argv.pop(0).partition("=")
            shapes[name] = Path(path).resolve()
        elif a == "--only":
            only = argv.pop(0).split(",")
        elif a == "--runc":
            runc = True
        elif a == "--slope":
            slope = True
        elif a == "--keep":
            keep = Path(argv.pop(0))
        else:
            args.append(a)
    n = int(args[0]) if args else int(os.environ.get("BENCH_N", "10"))
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "tests"))
    from libinject.sim.build import create_host
    from libinject.sim.rootfs import build_rootfs
    from support import hookenv
    from support.podman import PODMAN, CdiNamespace, Podman, state_dir
    from support.serve import Serve

    front = hookenv.ensure_front()
    sockdir = Path(tempfile.mkdtemp(prefix="nvcm", dir="/tmp"))
    sock = sockdir / "run/hook.sock"
    try:
        with tempfile.TemporaryDirectory(prefix="bench-cdim-") as tmp, state_dir("pcm") as state:
            t = Path(tmp)
            host = create_host(t / PROFILE, profile=PROFILE)
            if keep:
                keep.mkdir(parents=True, exist_ok=True)
            rootfs = build_rootfs(t / "rootfs")
            subprocess.run(["/sbin/ldconfig", "-r", str(rootfs)], check=True)
            specs: dict[str, dict | None] = {"baseline": None}
            r = subprocess.run([NVHOOK, "cdi", "generate", "--driver-root", str(host), "--hook-path",
                                front, "--hook-socket", str(sock), "-o", str(t / "nvhook.json")],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(r.stderr)
            ours = json.loads((t / "nvhook.json").read_text())
            specs["nodes only"] = _strip(ours, mounts=False)
            specs["nvhook mounts"] = _strip(ours)
            specs["nvhook served"] = ours
            theirs = _nvidia_spec(host, t / "nvidia.json")
            if runc:
                ms = ours["containerEdits"]["mounts"]
                cases = {"no mounts": [], "nvhook's 42": ms,
                         "nvhook's 42 twice": ms + [{**m, "containerPath": "/opt/nvx" + m["containerPath"]}
                                                    for m in ms]}
                if theirs is not None:
                    cases["nvidia's 42"] = theirs["containerEdits"]["mounts"]
                runc_mounts(n, t, rootfs, cases)
                return 0
            if slope:
                # the same mounts twice (the copies under /opt/nvx): the cost of one more
                # mount, from the difference, whatever the nodes and the spec's parse cost
                twice = _strip(ours)
                ms = twice["containerEdits"]["mounts"]
                ms += [{**m, "containerPath": "/opt/nvx" + m["containerPath"]} for m in ms]
                specs["mounts x2"] = twice
            if theirs is not None:
                specs["nvidia mounts"] = _strip(theirs)
                specs["nvidia"] = theirs
            for name, path in shapes.items():
                text = path.read_text().replace("@HOST@", str(host)).replace("@FRONT@", front) \
                    .replace("@SOCK@", str(_sock(sockdir, name)))
                specs[name] = json.loads(text)
            if only:
                specs = {k: v for k, v in specs.items() if k == "baseline" or k in only}
            dirs = {}
            for i, (case, spec) in enumerate(specs.items()):
                d = t / f"specs{i}"
                d.mkdir()
                if spec is not None:
                    (d / "nvidia.json").write_text(json.dumps(spec))
                    if keep:
                        (keep / f"{case.replace(' ', '_')}.json").write_text(json.dumps(spec, indent=1))
                dirs[case] = d
            cfg = hookenv.write_config(t / "config.toml", host, extra=f'snapshot-dir = "{t}/snap"\n')
            cfg.write_text(cfg.read_text().replace("snapshot = false", "snapshot = true"))
            pm = Podman(state / "pm")
            conf = pm.state / "storage.conf"
            conf.write_text(conf.read_text().replace('driver = "vfs"', 'driver = "overlay"'))
            env = pm.env()
            tar = t / "rootfs.tar"
            subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], check=True)
            subprocess.run([PODMAN, "import", str(tar), IMAGE], env=env, check=True,
                           capture_output=True)
            with contextlib.ExitStack() as stack:
                spaces = {case: stack.enter_context(CdiNamespace(state / f"ns{i}", d))
                          for i, (case, d) in enumerate(dirs.items())}
                # a service per case with a served hook, in that case's namespace (it serves
                # only peers in its own mount namespace), on the socket its spec names
                servers = []
                for case in specs:
                    if case == "nvhook served" or (case in shapes and "served" in case):
                        s = sock if case == "nvhook served" else _sock(sockdir, case)
                        servers.append(Serve(cfg, s, wrap=spaces[case].wrap))
                try:
                    cases = {}
                    for case in specs:
                        dev = [] if specs[case] is None else ["--device", DEVICE]
                        cases[case] = spaces[case].wrap([PODMAN, "--hooks-dir", str(pm.state / "hooks"),
                                                         "run", "--rm", "--pull=never", *dev, IMAGE, "true"])
                    probe = ("echo $(wc -l < /proc/self/mountinfo) mounts, "
                             "$(ls /usr/lib/x86_64-linux-gnu | grep -c nvidia) nvidia files, "
                             "$(ls -l /usr/lib/x86_64-linux-gnu/libcuda.so.1 2>&1)")
                    seen = {}
                    for k, a in cases.items():      # what each case gives, then warm-up
                        r = subprocess.run([*a[:-1], "sh", "-c", probe], env=env, capture_output=True,
                                           text=True)
                        seen[k] = (r.stdout or r.stderr).strip()
                        timed(a, env)
                        timed(a, env)
                    res: dict[str, list[float]] = {k: [] for k in cases}
                    cpu: dict[str, list[float]] = {k: [] for k in cases}
                    for _ in range(n):
                        for k, a in cases.items():
                            wall, used = timed_cpu(a, env)
                            res[k].append(wall)
                            cpu[k].append(used)
                    for srv in servers:
                        other = [float(x) for x in re.findall(r"status 0 in ([\d.]+) ms", srv.log())]
                        print(f"(service on {srv.sock}: requests {stats(other)[0]:.1f} ms, "
                              f"median of {len(other)}, its log)")
                finally:
                    for srv in servers:
                        srv.stop()
                    pm.cleanup()
    finally:
        shutil.rmtree(sockdir, ignore_errors=True)
    base = stats(res["baseline"])[0]
    cbase = stats(cpu["baseline"])[0]
    ref = stats(res["nvidia"])[0] - base if "nvidia" in res else None
    print(f"podman run --device {DEVICE} IMAGE true (overlay), {PROFILE}, {n} interleaved runs each")
    for k, xs in res.items():
        med, p90 = stats(xs)
        added = (med - base) * 1000
        line = f"  {k:<16} median {med * 1000:7.1f} ms  p90 {p90 * 1000:7.1f} ms"
        line += f"  podman CPU {(stats(cpu[k])[0] - cbase) * 1000:+6.1f} ms"
        if k != "baseline":
            line += f"  added {added:+7.1f} ms"
            if ref:
                line += f"  x{added / (ref * 1000):4.2f} of NVIDIA's"
            if specs[k]:
                line += f"  ({_count(specs[k])})"
        print(line, flush=True)
        print(f"    inside: {seen[k]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
