"""Private container engines for `nvhook setup` tests, each started from the config file
nvhook wrote: containerd (Debian's 1.6) and dockerd (Debian's docker.io 20.10), with
their own root, state and sockets under a short dir of the test's; nothing of the
host's /etc/containerd or /etc/docker is read (RUNTIMES.md). Every wait has a deadline;
stop() ends the daemon by its pid and unmounts what is left under its dir."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Sequence

from support.applyenv import umount_under

CONTAINERD = shutil.which("containerd") or "/usr/bin/containerd"
CTR = shutil.which("ctr") or "/usr/bin/ctr"
DOCKERD = "/usr/sbin/dockerd"
DOCKER = "/usr/bin/docker"          # Debian's client (a newer one may be first on PATH)
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _wait(ready, proc: subprocess.Popen, log: Path, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not start within {timeout:g} s: "
                       f"{log.read_text(errors='replace')[-3000:] if log.exists() else ''}")


def _stop(proc: subprocess.Popen, d: Path) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
    umount_under(d)


def private_containerd_config(state: Path) -> str:
    """`containerd config default` with root, state and every address under state. The
    CRI plugin stays on: it starts without CNI (logging that), and it is what reads
    the runtimes nvhook adds (its start-up line lists them)."""
    import tomlkit

    out = subprocess.run([CONTAINERD, "config", "default"], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    doc = tomlkit.parse(out)
    doc["root"] = str(state / "root")
    doc["state"] = str(state / "state")
    doc["grpc"]["address"] = str(state / "c.sock")
    doc["ttrpc"]["address"] = str(state / "c.sock.ttrpc")
    doc["debug"]["address"] = str(state / "debug.sock")
    doc["metrics"]["address"] = ""
    return doc.as_string()


class Containerd:
    """containerd --config CONFIG (made by private_containerd_config, then edited by
    nvhook), environment env."""

    def __init__(self, state: Path, config: Path, env: dict[str, str]) -> None:
        self.state, self.config, self.sock = state, config, state / "c.sock"
        self.log = log = state / "containerd.log"
        self.proc = subprocess.Popen([CONTAINERD, "--config", str(config)], stdout=open(log, "wb"),
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env={"PATH": PATH, **env})
        try:
            _wait(lambda: self.sock.exists() and subprocess.run(
                [CTR, "--address", str(self.sock), "version"], capture_output=True,
                timeout=10).returncode == 0, self.proc, log, "containerd", 30)
        except BaseException:
            self.stop()
            raise

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([CTR, "--address", str(self.sock), *args], capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        _stop(self.proc, self.state)


# /etc in dockerd's private mount namespace: an overlay whose upper dir holds the
# nvidia-container-runtime/config.toml the shim and the `--gpus` hook read.
ETC_SH = r'''
set -e
D=$1; shift
mount -t overlay overlay -o lowerdir=/etc,upperdir=$D/etc-upper,workdir=$D/etc-work /etc
exec "$@"
'''


class Dockerd:
    """A private dockerd (`--config-file daemon_json`) in its own mount namespace, with
    `etc_files` (relative path -> text) over its /etc and hook_dir first on its PATH."""

    def __init__(self, d: Path, daemon_json: Path, hook_dir: Path, etc_files: dict[str, str]) -> None:
        self.d, self.sock = d, d / "docker.sock"
        for sub in ("etc-upper", "etc-work", "data", "exec"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(d / "etc-upper", 0o755)
        for rel, text in etc_files.items():
            p = d / "etc-upper" / rel
            p.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            p.write_text(text)
        log = d / "dockerd.log"
        argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", ETC_SH, "sh", str(d),
                DOCKERD, "--config-file", str(daemon_json), "--data-root", str(d / "data"),
                "--exec-root", str(d / "exec"), "-H", f"unix://{self.sock}", "--pidfile", str(d / "pid"),
                "--iptables=false", "--ip-masq=false", "--bridge=none", "--storage-driver=vfs"]
        self.proc = subprocess.Popen(argv, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env={"PATH": f"{hook_dir}:{PATH}"})
        try:
            _wait(lambda: self.sock.exists() and self.docker("info", timeout=20).returncode == 0,
                  self.proc, log, "dockerd", 90)
        except BaseException:
            self.stop()
            raise

    def docker(self, *args: str, input: bytes | None = None, timeout: float = 120):
        return subprocess.run([DOCKER, "-H", f"unix://{self.sock}", *args], capture_output=True,
                              input=input, timeout=timeout, env={"PATH": PATH, "HOME": str(self.d)},
                              stdin=None if input is not None else subprocess.DEVNULL)

    def import_rootfs(self, rootfs: Path, tag: str) -> None:
        tar = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], capture_output=True, check=True,
                             timeout=120).stdout
        r = self.docker("import", "-", tag, input=tar)
        assert r.returncode == 0, r.stderr

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return self.docker("run", "--rm", "--network", "none", *args, timeout=timeout)

    def stop(self) -> None:
        _stop(self.proc, self.d)


def uuids_seen(out: str) -> list[str]:
    import re

    return re.findall(r"UUID: (GPU-[0-9a-f-]+)", out)


def short_dir(prefix: str) -> Path:
    """A new short dir under /tmp (sockets' sun_path holds 108 bytes)."""
    import tempfile

    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


__all__: Sequence[str] = ("Containerd", "Dockerd", "private_containerd_config", "uuids_seen", "short_dir")
