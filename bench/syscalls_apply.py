"""Syscall counts of one libinject.apply.live.apply(), per syscall, under strace.

Wall-clock timings on a shared 2-core VM are noisy; syscall counts are not. This runs
the same two plans as bench_apply.py (a100x8 simulated host, fresh busybox rootfs,
a "container" process in a private mount namespace) and, under `strace -f`, applies
each plan once as the hook does (pid mode, worker=False: the apply in this process,
no worker fork), between two marker syscalls. It prints the syscalls made between the
markers (by the applying process and any child it forked), by name, and the reads of
/proc/.../mountinfo.

--runc: instead, a real `runc run` with the exec'd hook as its prestart hook, the hook
run under strace (its rootfs then has runc's /proc, /dev tmpfs and propagation); counts
are of the whole hook process from its open of /proc/PID/ns/mnt on.

--here: apply(pid=None) in the bench's own (private) mount namespace, as `configure
ROOTFS` without --pid (the mounts outlive the apply there, so they are journaled too).

Where the tree has ldcache_merge.remember_host_libraries, the driver's libraries' ELF
facts are remembered first, as `nvhook serve` does at warm-up (its workers' applies).

Usage: python bench/syscalls_apply.py [--impl DIR] [--worker] [--here] [--runc] [--top N]
       (re-runs itself under strace; needs strace and root; --impl not with --runc)
"""
from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ALL_CAPS = frozenset({"utility", "compute", "video", "graphics", "display", "ngx", "compat32"})
MARK = "/nvhook-syscalls-mark"


def _inner(impl: str | None, worker: bool, here: bool = False) -> int:
    sys.path.insert(0, str(REPO / "bench"))
    import shutil

    from bench_apply import Container, _private_ns     # (puts REPO first on sys.path)
    sys.path.insert(0, impl or str(REPO))
    from libinject.apply import live
    from libinject.discover.driver import discover
    from libinject.discover.libraries import container_lib_dirs
    from libinject.plan.planner import plan
    from libinject.request.model import Request
    from libinject.sim.build import create_host
    from libinject.sim.rootfs import build_rootfs

    _private_ns()
    with tempfile.TemporaryDirectory(prefix="nvhook-syscalls-") as tmp:
        t = Path(tmp)
        host = create_host(t / "host", profile="a100x8")
        template = build_rootfs(t / "template")
        subprocess.run(["/sbin/ldconfig", "-r", str(template)], check=True)
        driver = discover(str(host), snapshot=False)
        from libinject.apply import ldcache_merge
        if hasattr(ldcache_merge, "remember_host_libraries"):   # as `nvhook serve` warms up
            ldcache_merge.remember_host_libraries(lib.path for lib in driver.libraries)
        lib_dir, lib32_dir = container_lib_dirs(str(template))
        cases = {
            "1gpu": plan(Request(devices="0"), driver, lib_dir=lib_dir, lib32_dir=lib32_dir),
            "8gpu": plan(Request(devices="all", capabilities=ALL_CAPS), driver,
                         lib_dir=lib_dir, lib32_dir=lib32_dir),
        }
        for name, edits in cases.items():
            for i in range(2):      # the first warms up (imports, proc_fd, the journal dir)
                rootfs = t / f"rootfs-{name}-{i}"
                shutil.copytree(template, rootfs, symlinks=True)
                Container.edits, Container.rootfs = None, str(rootfs)
                c = Container()
                try:
                    tag = f"{name}-{i}"
                    # --here: in a child with a namespace of its own (its mounts go with it)
                    child = os.fork() if here else -1
                    if child == 0:  # pragma: no cover - child
                        try:
                            _private_ns()
                            os.access(f"{MARK}-begin-{tag}", os.F_OK)
                            live.apply(edits, str(rootfs), no_cgroups=True,
                                       **({} if worker else {"worker": False}))
                            os.access(f"{MARK}-end-{tag}", os.F_OK)
                        finally:
                            os._exit(0)
                    elif child > 0:
                        os.waitpid(child, 0)
                    else:
                        os.access(f"{MARK}-begin-{tag}", os.F_OK)
                        live.apply(edits, str(rootfs), pid=c.pid, no_cgroups=True,
                                   **({} if worker else {"worker": False}))
                        os.access(f"{MARK}-end-{tag}", os.F_OK)
                finally:
                    c.kill()
                    shutil.rmtree(rootfs)
    return 0


def _runc(keep: str | None, top: int) -> int:
    """The exec'd hook under runc, run under strace by a wrapper script."""
    import json
    import shutil

    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "tests"))
    from libinject.sim.build import create_host
    from libinject.sim.rootfs import build_rootfs
    from support import hookenv

    runc = shutil.which("runc") or "/usr/sbin/runc"
    with tempfile.TemporaryDirectory(prefix="nvhook-strace-runc-") as tmp:
        work = Path(tmp)
        host = create_host(work / "host", profile="a100x8")
        template = build_rootfs(work / "template")
        subprocess.run(["/sbin/ldconfig", "-r", str(template)], check=True)
        cfg = work / "config.toml"
        cfg.write_text(f'[nvidia-container-cli]\nroot = "{host}"\n[nvhook]\nsnapshot = false\n')
        front = hookenv.ensure_front()
        for name, env in (("1gpu", ["NVIDIA_VISIBLE_DEVICES=0"]),
                          ("8gpu", ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=all"])):
            for i in range(2):      # the first warms the page cache
                trace = work / f"trace-{name}-{i}"
                wrapper = work / f"hook-{name}-{i}"
                wrapper.write_text(f"#!/bin/sh\nexec strace -f -qq -s 96 -o {trace} {front} "
                                   f"--config {cfg} --socket none prestart\n")
                wrapper.chmod(0o755)
                rootfs = work / f"rootfs-{name}-{i}"
                shutil.copytree(template, rootfs, symlinks=True)
                b = work / f"bundle-{name}-{i}"
                b.mkdir()
                subprocess.run([runc, "spec", "--bundle", str(b)], check=True)
                spec = json.loads((b / "config.json").read_text())
                spec["root"] = {"path": str(rootfs), "readonly": False}
                spec["process"].update(terminal=False, args=["true"],
                                       env=["PATH=/usr/bin:/bin", *env])
                spec["hooks"] = {"prestart": [{"path": str(wrapper), "timeout": 60}]}
                (b / "config.json").write_text(json.dumps(spec))
                r = subprocess.run([runc, "--root", str(work / "state"), "run", "--bundle", str(b),
                                    f"sc-{name}-{i}"], capture_output=True, text=True,
                                   stdin=subprocess.DEVNULL, timeout=120)
                if r.returncode != 0:
                    raise SystemExit(f"runc run failed: {r.stderr.strip()}")
            if keep:
                Path(f"{keep}.{name}").write_bytes(trace.read_bytes())
            calls, mi, total = _count(trace, None)
            print(f"== runc prestart hook, {name}: {total} syscalls from the setns on, "
                  f"{mi} mountinfo reads")
            for n, c in calls.most_common(top):
                print(f"   {c:5d} {n}")
    return 0


def _count(trace: Path, tag: str | None) -> tuple[collections.Counter, int, int]:
    """Syscalls between the markers of `tag` (None: from the hook's open of
    /proc/PID/ns/mnt on): (by name, mountinfo opens, total)."""
    lines = trace.read_text(errors="replace").splitlines()
    me = None
    seen_before: set[str] = set()
    calls: collections.Counter = collections.Counter()
    mountinfo = total = 0
    for ln in lines:
        pid, _, rest = ln.partition(" ")
        rest = rest.lstrip()
        if me is None:
            seen_before.add(pid)
            if (f"{MARK}-begin-{tag}\"" in rest if tag is not None
                    else "/ns/mnt\"" in rest and rest.startswith("openat")):
                me = pid
            continue
        if pid == me and tag is not None and f"{MARK}-end-{tag}\"" in rest:
            break
        if pid != me and pid in seen_before:
            continue        # another process of the bench (the container)
        if rest.startswith("<...") or rest.startswith("+++") or rest.startswith("---"):
            continue
        name = rest.split("(", 1)[0]
        if not name or not name.replace("_", "").isalnum():
            continue
        calls[name] += 1
        total += 1
        if "mountinfo" in rest and name in ("openat", "open", "openat2"):
            mountinfo += 1
    return calls, mountinfo, total


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", metavar="DIR")
    ap.add_argument("--worker", action="store_true", help="apply in a forked worker")
    ap.add_argument("--here", action="store_true", help="apply in this process's own mount "
                    "namespace (`configure ROOTFS` without --pid: mounts are journaled)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--runc", action="store_true", help="the exec'd hook under runc")
    ap.add_argument("--keep", metavar="FILE", help="also copy the whole strace output there")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        return _inner(args.impl, args.worker, args.here)
    if args.runc:
        return _runc(args.keep, args.top)
    with tempfile.TemporaryDirectory(prefix="nvhook-strace-") as tmp:
        out = Path(tmp) / "trace"
        cmd = [sys.executable, __file__, "--inner"] + (["--impl", args.impl] if args.impl else []) \
            + (["--worker"] if args.worker else []) + (["--here"] if args.here else [])
        subprocess.run(["strace", "-f", "-qq", "-s", "96", "-o", str(out), *cmd], check=True)
        if args.keep:
            Path(args.keep).write_bytes(out.read_bytes())
        for tag in ("1gpu-1", "8gpu-1"):
            calls, mi, total = _count(out, tag)
            print(f"== {tag[:-2]}: {total} syscalls, {mi} mountinfo reads")
            for name, n in calls.most_common(args.top):
                print(f"   {n:5d} {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
