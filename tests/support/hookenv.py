"""Helpers for the hook's tests: the compiled front, a hook config pointing at a simulated
host, a GPU container under runc with the front as its hook and what it should see, and
crun / containerd runners (runc: tests/support/runc.py; podman: tests/support/podman.py).

Nothing here touches the host's /etc: the hook gets its config.toml by --config,
containerd gets private config/state dirs, crun runs in a private mount namespace.
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

from libinject.linux import mountinfo

REPO = Path(__file__).resolve().parents[2]
PY = REPO / ".venv/bin/python"
FRONT = REPO / ".venv/bin/nvhook-hook"
FRONT_SRC = REPO / "csrc/hookfront.c"
FRONT_DEPS = (FRONT_SRC, REPO / "csrc/pyexec.h", REPO / "csrc/gpuscan.h", REPO / "csrc/serveclient.h")
CRUN = shutil.which("crun") or "/usr/bin/crun"
CTR = shutil.which("ctr") or "/usr/bin/ctr"
CONTAINERD = shutil.which("containerd") or "/usr/bin/containerd"


def ensure_front() -> str:
    """The front as `make venv` builds it (same defines as the Makefile rule); rebuilt
    here when missing or older than its source. NVHOOK_TEST_FRONT names another front
    (e.g. one built from an older tree, to show a test fails there)."""
    if os.environ.get("NVHOOK_TEST_FRONT"):
        return os.environ["NVHOOK_TEST_FRONT"]
    if not FRONT.exists() or FRONT.stat().st_mtime < max(p.stat().st_mtime for p in FRONT_DEPS):
        import sysconfig

        pypath = f"{REPO}:{sysconfig.get_paths()['purelib']}"
        defines = [f'-DNVHOOK_PYTHON="{PY}"', f'-DNVHOOK_PYPATH="{pypath}"']
        tmp = FRONT.with_name(f".nvhook-hook.{os.getpid()}")
        subprocess.run(["cc", "-O2", "-static", *defines, "-o", str(tmp), str(FRONT_SRC)],
                       check=True, capture_output=True, timeout=120)
        os.replace(tmp, FRONT)
    return str(FRONT)


def gpu_uuids(host: Path) -> list[str]:
    """The simulated host's GPU UUIDs, in index order, as its own nvidia-smi -L prints them."""
    import re

    out = subprocess.run(["chroot", str(host), "/usr/bin/nvidia-smi", "-L"], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    return re.findall(r"UUID: (GPU-[0-9a-f-]+)", out)


def write_config(path: Path, host: Path, *, log: Path | None = None, extra: str = "",
                 top: str = "") -> Path:
    """config.toml whose driver root is the simulated host."""
    text = top + f'\n[nvidia-container-cli]\nroot = "{host}"\n[nvhook]\nsnapshot = false\n'
    if log:
        text += f'log-file = "{log}"\nlog-level = "debug"\n'
    path.write_text(text + extra)
    return path



def slow_warm_config(tmp_path: Path, host: Path, delay_ms: int = 1500) -> Path:
    """config.toml for host (snapshots on, under tmp_path/snap) with its NVML made
    delay_ms slow, so a service's warm-up (which comes before its socket) takes that long."""
    conf = host / "etc/nvhook-sim/nvml.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(f"delay_ms = {delay_ms}\n")
    cfg = write_config(tmp_path / "c.toml", host, extra=f'snapshot-dir = "{tmp_path}/snap"\n')
    cfg.write_text(cfg.read_text().replace("snapshot = false", "snapshot = true"))
    return cfg

def hook_entry(config: Path | str, stage: str = "prestart", env: Sequence[str] = (),
               path: str | None = None, socket: str = "none") -> dict[str, Any]:
    """A hook entry for the front. It never uses a hook service unless `socket` names one:
    a service at the default socket on the test machine must not answer for these tests."""
    return {"path": path or ensure_front(),
            "args": ["nvhook-hook", "--config", str(config), "--socket", socket, stage],
            "env": list(env), "timeout": 60}


# -- a GPU container under runc, and what it should see ----------------------------------

ENV = ["PATH=/usr/bin:/bin"]
# nvidia-smi's view, then open() of a GPU node the cgroup denies (nvidia0) and of one it
# allows (nvidia1; ENXIO: no driver behind major 195 on a simulated host)
PROBE = ("nvidia-smi -L; for d in /dev/nvidia0 /dev/nvidia1; do "
         "dd if=$d of=/dev/null bs=1 count=0 2>&1 | grep -o \"can't open.*\" || echo \"$d: OK\"; done")


def gpu_container(workdir: Path, config: Path, env: Sequence[str], script: str, mode: str = "v1",
                  stage: str = "prestart", hook_env: Sequence[str] = (), socket: str = "none",
                  front: str | None = None):
    """A RuncContainer running `sh -c script` with ENV + env, /dev/nvidia0 made but not
    allowed by its cgroup, and the front (this checkout's, or `front`) as its `stage`
    hook (hook_env: the hook entry's env; socket: the hook service it tries)."""
    from support.runc import RuncContainer

    entry = hook_entry(config, stage, env=hook_env, socket=socket, path=front)
    return RuncContainer(workdir, mode=mode, args=["sh", "-c", script], env=ENV + list(env),
                         devices=[("/dev/nvidia0", 195, 0)], hooks={stage: [entry]})


def assert_only_gpu1(out: str, uuids: list[str]) -> None:
    """PROBE's output in a container given GPU 1 (of uuids) and nothing else."""
    import re

    assert re.findall(r"UUID: (GPU-[0-9a-f-]+)", out) == [uuids[1]], out
    assert "can't open '/dev/nvidia0': Operation not permitted" in out, out
    assert "can't open '/dev/nvidia1': No such device or address" in out, out


def mounts_naming(text: str, pid: int | str = "self") -> list[mountinfo.Mount]:
    """The mounts process `pid` sees whose mount point, root or source contains `text`."""
    return [m for m in mountinfo.read(pid) if text in m.mountpoint or text in m.root or text in m.source]


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
                       capture_output=True, stdin=subprocess.DEVNULL, timeout=60)


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
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.sock.exists() and subprocess.run(
                    [CTR, "--address", str(self.sock), "version"], capture_output=True,
                    timeout=10).returncode == 0:
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        log = (state / "containerd.log").read_text(errors="replace")
        self.stop()
        raise RuntimeError(f"containerd did not start within 30 s: {log[-2000:]}")

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
                self.proc.wait(30)
        from support.applyenv import umount_under

        umount_under(self.state)
