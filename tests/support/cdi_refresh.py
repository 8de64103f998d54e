"""`nvhook cdi refresh` for tests: a config of the test's own, GPUs taken from and given
back to a simulated host, and `cdi refresh --watch` run as its unit runs it (through the
front: python -I, a clean environment), with every wait bounded."""
from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import NVHOOK
from support import hookenv

START_TIMEOUT = 60


def write_config(tmp_path: Path) -> Path:
    """A config.toml whose discovery snapshots go to tmp_path/snapshots (snapshots on)."""
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[nvhook]\nsnapshot = true\nsnapshot-dir = "{tmp_path}/snapshots"\n')
    return cfg


def device_names(spec_file: Path) -> list[str]:
    return [d["name"] for d in yaml.safe_load(spec_file.read_text())["devices"]]


def gpu_entry(host: Path, minor: int) -> Path:
    """The proc/driver/nvidia/gpus/<busid> dir of the GPU with this minor."""
    for d in sorted((host / "proc/driver/nvidia/gpus").iterdir()):
        for line in (d / "information").read_text().splitlines():
            k, _, v = line.partition(":")
            if k.strip() == "Device Minor" and int(v) == minor:
                return d
    raise AssertionError(f"no GPU with minor {minor} in {host}")


def uuid_of(host: Path, minor: int) -> str:
    for line in (gpu_entry(host, minor) / "information").read_text().splitlines():
        k, _, v = line.partition(":")
        if k.strip() == "GPU UUID":
            return v.strip()
    raise AssertionError("no GPU UUID")


class GpuAway:
    """GPU `minor` taken from the host as the driver shows a GPU gone: its /dev node and
    its procfs gpus/ entry (moved aside); back() gives both back (the node made anew)."""

    def __init__(self, host: Path, minor: int, aside: Path) -> None:
        self.node = host / "dev" / f"nvidia{minor}"
        self.entry = gpu_entry(host, minor)
        self.aside = aside / self.entry.name
        st = self.node.stat()
        self.rdev, self.mode = st.st_rdev, st.st_mode
        self.node.unlink()
        self.entry.rename(self.aside)

    def back(self) -> None:
        self.aside.rename(self.entry)
        os.mknod(self.node, self.mode, self.rdev)
        os.chmod(self.node, self.mode & 0o7777)


class Watch:
    """`nvhook-hook --config CFG cdi refresh --watch ARGS` (stdout and stderr kept);
    stop() sends SIGTERM and returns the exit status."""

    def __init__(self, config: Path, *args: str, env: dict[str, str] | None = None) -> None:
        """env given: the console script `nvhook` with that environment, not the front."""
        self.out = b""
        self.err_path = config.parent / f"watch-{os.urandom(3).hex()}.err"
        exe = hookenv.ensure_front() if env is None else NVHOOK
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [exe, "--config", str(config), "cdi", "refresh", "--watch", *args],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=env or {})
        os.set_blocking(self.proc.stdout.fileno(), False)

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def lines(self) -> list[str]:
        """Its stdout lines so far (reads what is there, never waits)."""
        while True:
            try:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            self.out += chunk
        return self.out.decode(errors="replace").splitlines()

    def wait_until(self, check, what: str, timeout: float) -> float:
        """Poll check() until it holds; seconds it took. Fails the test (with stderr)
        after `timeout` s or if the watcher exits first."""
        t0 = time.monotonic()
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            while not check():
                if self.proc.poll() is not None:
                    pytest.fail(f"refresh --watch exited ({self.proc.returncode}) before {what}: "
                                f"{self.lines()} {self.stderr()}")
                if time.monotonic() - t0 > timeout:
                    pytest.fail(f"refresh --watch: not {what} within {timeout} s: "
                                f"{self.lines()} {self.stderr()}")
                sel.select(0.02)
                self.lines()
        finally:
            sel.close()
        return time.monotonic() - t0

    def started(self, output: Path) -> None:
        """Waits for its first refresh's line (it listens to uevents by then)."""
        self.wait_until(lambda: any(l.endswith(f" {output}") for l in self.lines()),
                        "started", START_TIMEOUT)

    def stop(self, timeout: float = 10) -> int | None:
        """SIGTERM; its exit status, or None if it was still running after `timeout` s
        (then it is killed)."""
        if self.proc.stdout.closed:    # stopped before
            return self.proc.returncode
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return None
        finally:
            self.lines()
            self.proc.stdout.close()
