"""Helpers for the hook's tests: the compiled front, a hook config pointing at a simulated
host, and crun / podman / containerd runners (runc: tests/support/runc.py).

Nothing here touches the host's /etc: the hook gets its config.toml by --config, podman
and containerd get private config/state dirs, crun runs in a private mount namespace.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[2]
PY = REPO / ".venv/bin/python"
FRONT = REPO / ".venv/bin/nvhook-hook"
FRONT_SRC = REPO / "csrc/hookfront.c"
CRUN = shutil.which("crun") or "/usr/bin/crun"
PODMAN = shutil.which("podman") or "/usr/bin/podman"
CTR = shutil.which("ctr") or "/usr/bin/ctr"
CONTAINERD = shutil.which("containerd") or "/usr/bin/containerd"


def ensure_front() -> str:
    """The front as `make venv` builds it (same defines as the Makefile rule); rebuilt
    here when missing or older than its source."""
    if not FRONT.exists() or FRONT.stat().st_mtime < FRONT_SRC.stat().st_mtime:
        import sysconfig

        pypath = f"{REPO}:{sysconfig.get_paths()['purelib']}"
        defines = [f'-DNVHOOK_PYTHON="{PY}"', f'-DNVHOOK_PYPATH="{pypath}"']
        tmp = FRONT.with_name(f".nvhook-hook.{os.getpid()}")
        r = subprocess.run(["cc", "-O2", "-static", *defines, "-o", str(tmp), str(FRONT_SRC)],
                           capture_output=True)
        if r.returncode != 0:
            subprocess.run(["cc", "-O2", *defines, "-o", str(tmp), str(FRONT_SRC)], check=True)
        os.replace(tmp, FRONT)
    return str(FRONT)


def gpu_uuids(host: Path) -> list[str]:
    """The simulated host's GPU UUIDs, in index order, as its own nvidia-smi -L prints them."""
    import re

    out = subprocess.run(["chroot", str(host), "/usr/bin/nvidia-smi", "-L"], capture_output=True,
                         text=True, check=True).stdout
    return re.findall(r"UUID: (GPU-[0-9a-f-]+)", out)


def write_config(path: Path, host: Path, *, log: Path | None = None, extra: str = "",
                 top: str = "") -> Path:
    """config.toml whose driver root is the simulated host."""
    text = top + f'\n[nvidia-container-cli]\nroot = "{host}"\n[nvhook]\nsnapshot = false\n'
    if log:
        text += f'log-file = "{log}"\nlog-level = "debug"\n'
    path.write_text(text + extra)
    return path


def hook_entry(config: Path | str, stage: str = "prestart", env: Sequence[str] = (),
               path: str | None = None) -> dict[str, Any]:
    """A hook entry for the front. It never uses a hook service unless env names one: a
    service at the default socket on the test machine must not answer for these tests."""
    env = list(env)
    if not any(e.startswith("NVHOOK_SOCKET=") for e in env):
        env.append("NVHOOK_SOCKET=none")
    return {"path": path or ensure_front(),
            "args": ["nvhook-hook", "--config", str(config), stage],
            "env": env, "timeout": 60}


# -- crun -------------------------------------------------------------------------------

def crun_run(bundle: Path, cid: str, state_root: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`crun run` in a private mount namespace without the cgroup2 mount (RUNTIMES.md:
    crun refuses hybrid cgroups)."""
    script = ('umount /sys/fs/cgroup/unified 2>/dev/null; '
              f'exec {CRUN} --root "{state_root}" run --bundle "{bundle}" "{cid}"')
    try:
        return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    finally:
        subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        f'umount /sys/fs/cgroup/unified 2>/dev/null; '
                        f'{CRUN} --root "{state_root}" delete -f "{cid}"'],
                       capture_output=True, stdin=subprocess.DEVNULL)


# -- podman -----------------------------------------------------------------------------

class Podman:
    """podman with its own config, storage and runtime dirs under `state` (RUNTIMES.md)."""

    def __init__(self, state: Path) -> None:
        self.state = state
        for d in ("networks", "tmp", "root", "runroot", "xdg"):
            (state / d).mkdir(parents=True, exist_ok=True)
        (state / "containers.conf").write_text(f"""\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
netns = "none"
[network]
network_config_dir = "{state}/networks"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "{state}/events.log"
tmp_dir = "{state}/tmp"
static_dir = "{state}/root/libpod"
volume_path = "{state}/root/volumes"
""")
        (state / "storage.conf").write_text(f"""\
[storage]
driver = "vfs"
graphroot = "{state}/root"
runroot = "{state}/runroot"
""")
        (state / "registries.conf").write_text("")
        os.chmod(state / "xdg", 0o700)

    def env(self) -> dict[str, str]:
        return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME": str(self.state),
                "CONTAINERS_CONF": str(self.state / "containers.conf"),
                "CONTAINERS_STORAGE_CONF": str(self.state / "storage.conf"),
                "CONTAINERS_REGISTRIES_CONF": str(self.state / "registries.conf"),
                "XDG_RUNTIME_DIR": str(self.state / "xdg")}

    def run(self, hooks_dir: Path, rootfs: Path, cmd: Sequence[str], *, env: Sequence[str] = (),
            annotations: dict[str, str] | None = None, devices: Sequence[str] = (),
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        argv = [PODMAN, "--hooks-dir", str(hooks_dir), "run", "--rm", "--pull=never"]
        for e in env:
            argv += ["--env", e]
        for k, v in (annotations or {}).items():
            argv += ["--annotation", f"{k}={v}"]
        for d in devices:
            argv += ["--device", d]
        argv += ["--rootfs", f"{rootfs}:O", *cmd]
        return subprocess.run(argv, env=self.env(), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def cleanup(self) -> None:
        subprocess.run([PODMAN, "rm", "-af"], env=self.env(), capture_output=True)
        subprocess.run([PODMAN, "system", "reset", "-f"], env=self.env(), capture_output=True)
        # vfs/overlay leftovers may be mounted under the state dir
        with open("/proc/self/mountinfo") as f:
            points = [l.split()[4] for l in f if l.split()[4].startswith(str(self.state))]
        for p in sorted(points, reverse=True):
            subprocess.run(["umount", "-l", p], capture_output=True)


# -- containerd -------------------------------------------------------------------------

class Containerd:
    """A private containerd (own root/state/socket, no CRI) for `ctr run --config`."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.sock = state / "containerd.sock"
        state.mkdir(parents=True, exist_ok=True)
        (state / "config.toml").write_text(f"""\
version = 2
root = "{state}/root"
state = "{state}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{self.sock}"
[ttrpc]
  address = "{self.sock}.ttrpc"
[debug]
  address = "{state}/debug.sock"
[metrics]
  address = ""
""")
        self.proc = subprocess.Popen([CONTAINERD, "--config", str(state / "config.toml")],
                                     stdout=open(state / "containerd.log", "wb"),
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.sock.exists() and subprocess.run(
                    [CTR, "--address", str(self.sock), "version"], capture_output=True).returncode == 0:
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        log = (state / "containerd.log").read_text(errors="replace")
        self.stop()
        raise RuntimeError(f"containerd did not start: {log[-2000:]}")

    def run(self, spec: dict[str, Any], cid: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        path = self.state / f"{cid}.json"
        path.write_text(json.dumps(spec))
        return subprocess.run([CTR, "--address", str(self.sock), "run", "--rm",
                               "--config", str(path), cid],
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with open("/proc/self/mountinfo") as f:
            points = [l.split()[4] for l in f if l.split()[4].startswith(str(self.state))]
        for p in sorted(points, reverse=True):
            subprocess.run(["umount", "-l", p], capture_output=True)
