"""A fresh Debian 12 root (mmdebstrap, from Debian's registry) booted with systemd-nspawn,
so a package is tested the way a node runs it: its postinst in a chroot, its units started
by the root's own systemd at boot, its purge against the root's file list.

PID 1 here is not systemd (no bus to register a machine with), so nspawn runs with
--register=no --keep-unit inside a cgroup made for it, and the container gets the unified
hierarchy (SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1: on this hybrid host the v1 controllers
would be read-only inside, and runc could not make its container's cgroups). nspawn's
seccomp filter (which holds for what the root's systemd starts, not for what nsenter
runs) would refuse bpf (runc's and nvhook's device programs): allowed, as a node's
runtime has it. keyctl stays refused unless asked for (syscalls="bpf @keyring": runc 1.1
started by containerd fails without it; nvhook's service, started by the root's systemd,
goes on without a session keyring of its own). Commands run inside through
nsenter into the container's PID 1.

cgroup="v1" boots the root on this host's own layout instead (hybrid: the v1 controllers,
devices among them, with systemd tracking units on the unified hierarchy), as a cgroup v1
node runs: nspawn is started in fresh cgroups of every hierarchy (the root of the
machine's cgroup namespace), and since nspawn mounts the v1 controllers read-only
inside (systemd there would then leave them alone and runc could not make its cgroups),
PID 1 is a shell that remounts them writable (the bind mount only: the superblock is
rw) and execs systemd.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Sequence

MMDEBSTRAP = shutil.which("mmdebstrap") or "/usr/bin/mmdebstrap"
NSPAWN = shutil.which("systemd-nspawn") or "/usr/bin/systemd-nspawn"
PACKAGES = "python3,systemd,systemd-sysv,dbus,runc"
# A GPU node as a package sees it: systemd and a runtime, no Python, no compiler.
NODE_PACKAGES = "systemd,systemd-sysv,dbus,runc"
BOOT_TIMEOUT = 120
# What booting and dpkg's own book-keeping change in a root, whatever is installed.
NOISE = ("var/log/journal", "var/lib/systemd", "run", "tmp", "var/tmp",
         "var/log/dpkg.log", "var/log/alternatives.log")      # dpkg's own record of each run


def debootstrap(dest: Path, packages: str = PACKAGES, suite: str = "bookworm") -> Path:
    """Debian `suite` (12 by default; minbase, with `packages`: systemd and runc by
    default) in dest."""
    r = subprocess.run([MMDEBSTRAP, "--variant=minbase", f"--include={packages}", suite, str(dest)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return dest


def file_list(root: Path) -> dict[str, str]:
    """Every path under root (but NOISE) -> its type and, for a link, its target."""
    out: dict[str, str] = {}
    for top, dirs, files in os.walk(root):
        rel_top = os.path.relpath(top, root)
        dirs[:] = [d for d in dirs if os.path.normpath(os.path.join(rel_top, d)) not in NOISE]
        for name in dirs + files:
            path = os.path.join(top, name)
            rel = os.path.normpath(os.path.join(rel_top, name))
            if rel in NOISE:
                continue
            out[rel] = f"-> {os.readlink(path)}" if os.path.islink(path) else ("dir" if os.path.isdir(path) else "file")
    return out


def chroot(root: Path, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(["chroot", str(root), *argv], capture_output=True, text=True, timeout=timeout, env=env)


def _unified() -> Path:
    for p in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")):
        if (p / "cgroup.procs").exists() and (p / "cgroup.subtree_control").exists():
            return p
    raise RuntimeError("no cgroup2 hierarchy mounted")


V1_ROOT = Path("/sys/fs/cgroup")
# PID 1 of a v1 machine: the controllers writable, then systemd (as --boot would start it).
V1_INIT = ('for d in /sys/fs/cgroup/*/; do mount -o remount,bind,rw "$d" || exit 1; done; '
           'exec /lib/systemd/systemd')


def _v1_hierarchies() -> list[Path]:
    """The v1 hierarchies mounted under /sys/fs/cgroup (links, as cpu -> cpu,cpuacct, skipped)."""
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _src, mnt, fstype = line.split()[:3]
        if fstype == "cgroup" and Path(mnt).parent == V1_ROOT:
            out.append(Path(mnt))
    return out


def _make_cgroup(path: Path) -> None:
    path.mkdir()
    if (path / "cpuset.cpus").exists():     # an empty cpuset takes no task
        for f in ("cpuset.cpus", "cpuset.mems"):
            (path / f).write_text((path.parent / f).read_text())


def _rm_cgroups(paths: list[Path], wait: float = 5) -> None:
    """Remove the cgroups paths and what is below them; processes the machine's end
    killed may still be leaving (a pid namespace's last ones go after its init), so
    retry a while, all of them within one deadline. (A v1 machine's runc containers'
    cgroups can stay busy longer than that: they are left, empty, for later.)"""
    deadline = time.monotonic() + wait
    left = [p for p in paths if p.exists()]
    while left:
        for path in left:
            for top, dirs, _files in os.walk(path, topdown=False):
                for d in dirs:
                    try:
                        os.rmdir(os.path.join(top, d))
                    except OSError:
                        pass
            try:
                os.rmdir(path)
            except OSError:
                pass
        left = [p for p in left if p.exists()]
        if not left or time.monotonic() > deadline:
            return
        time.sleep(0.2)


class Machine:
    """root booted with systemd-nspawn (binds: (host path, path inside))."""

    def __init__(self, root: Path, binds: Sequence[tuple[Path | str, str]] = (), syscalls: str = "bpf",
                 cgroup: str = "v2") -> None:
        assert cgroup in ("v2", "v1")
        self.root = root
        name = f"nvhook-test-{os.getpid()}-{time.monotonic_ns()}"
        self.cgroup = _unified() / name
        self.cgroups = [self.cgroup] + ([h / name for h in _v1_hierarchies()] if cgroup == "v1" else [])
        for cg in self.cgroups:
            _make_cgroup(cg)
        boot = ["--boot"] if cgroup == "v2" else ["/bin/sh", "-c", V1_INIT]
        argv = [NSPAWN, "-q", "-D", str(root), "--register=no", "--keep-unit", "--console=pipe",
                "--capability=all", f"--system-call-filter={syscalls}",
                *[f"--bind={host}:{inside}" for host, inside in binds], *boot]
        self.log = open(root.parent / f"{root.name}.nspawn.log", "wb")
        env = dict(os.environ)
        if cgroup == "v2":
            env["SYSTEMD_NSPAWN_UNIFIED_HIERARCHY"] = "1"
        else:
            env.pop("SYSTEMD_NSPAWN_UNIFIED_HIERARCHY", None)     # the host's layout: hybrid
        join = " && ".join(f'echo $$ > "{cg}/cgroup.procs"' for cg in self.cgroups)
        self.proc = subprocess.Popen(["sh", "-c", f'{join} && exec "$@"', "sh", *argv], stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        try:
            self.pid1 = self._wait_boot()
        except BaseException:
            self.stop()
            raise

    def _wait_boot(self) -> int:
        deadline = time.monotonic() + BOOT_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited {self.proc.returncode}: {self._log()}")
            kids = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
            if kids:
                self.pid1 = int(kids[0])
                r = self.run("systemctl", "is-system-running", "--wait", timeout=BOOT_TIMEOUT)
                if r.stdout.strip() in ("running", "degraded"):
                    return self.pid1
            time.sleep(0.2)
        raise RuntimeError(f"{self.root} did not boot within {BOOT_TIMEOUT} s: {self._log()}")

    def _log(self) -> str:
        return (self.root.parent / f"{self.root.name}.nspawn.log").read_text(errors="replace")[-2000:]

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """argv inside the machine (all its namespaces), with a plain PATH."""
        return subprocess.run(["nsenter", "-t", str(self.pid1), "-m", "-u", "-i", "-n", "-p", "--",
                               "env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", *argv],
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def journal_has(self, unit: str, pattern: str, wait: float = 30) -> str:
        """unit's journal once a line matches pattern (journald takes a service's lines
        asynchronously: the line of a start just served may not be in yet); what it holds
        then, or at the deadline."""
        import re

        deadline = time.monotonic() + wait
        while True:
            text = self.run("journalctl", "-u", unit, "--no-pager", "-o", "cat").stdout
            if re.search(pattern, text, re.M) or time.monotonic() > deadline:
                return text
            time.sleep(0.2)

    def popen(self, *argv: str, log: Path) -> subprocess.Popen:
        """argv inside the machine, in the background, its output to log."""
        return subprocess.Popen(["nsenter", "-t", str(self.pid1), "-m", "-u", "-i", "-n", "-p", "--",
                                 "env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", *argv],
                                stdout=open(log, "wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc.poll() is None:
            if getattr(self, "pid1", None):
                self.run("systemctl", "poweroff", "--no-block", timeout=30)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.log.close()
        # (nspawn mirrors the unified path in a hybrid host's name=systemd hierarchy)
        _rm_cgroups([*self.cgroups, V1_ROOT / "systemd" / self.cgroup.name])

    def __enter__(self) -> Machine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
