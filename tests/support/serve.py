"""`nvhook serve` run for tests: started through the front (python -I, a clean env), as a
unit file would start it; its log, request statuses and workers; stopped on the way out."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from support import hookenv

START_TIMEOUT = 60


class Serve:
    """`nvhook-hook --config CFG serve --socket SOCK -v` (through the front: python -I and
    a clean env, as a unit file would start it), stopped by stop()."""

    def __init__(self, config: Path, sock: Path, *extra: str, wrap=None) -> None:
        """wrap: argv -> argv that runs it elsewhere (e.g. support.podman.CdiNamespace.wrap),
        exec'ing it in place (so our child is the server)."""
        self.sock = sock
        self.logfile = sock.parent.parent / f"serve-{os.urandom(3).hex()}.log"
        argv = [hookenv.ensure_front(), "--config", str(config), "serve", "--socket", str(sock), "-v", *extra]
        self.proc = subprocess.Popen(
            wrap(argv) if wrap else argv,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(self.logfile, "wb"), env={})
        # with snapshots on it discovers the driver before serving (cmd_serve.run)
        warm = "--no-warm" not in extra and "snapshot = false" not in config.read_text()
        try:
            self.wait_until(lambda: "listening on" in self.log(), "listening", START_TIMEOUT)
            if warm:
                self.wait_until(lambda: "warm:" in self.log(), "warmed up", START_TIMEOUT)
        except BaseException:
            self.stop()
            raise

    def wait_until(self, check, what: str, timeout: float = 30) -> None:
        """Poll check() until it holds; fails the test, with the server's log, when
        `timeout` s pass or the server exits first."""
        deadline = time.monotonic() + timeout
        while not check():
            if self.proc.poll() is not None:
                pytest.fail(f"nvhook serve exited ({self.proc.returncode}) before {what}: {self.log()}")
            if time.monotonic() > deadline:
                pytest.fail(f"nvhook serve: not {what} within {timeout} s: {self.log()}")
            time.sleep(0.02)

    def log(self) -> str:
        return self.logfile.read_text(errors="replace")

    def statuses(self, n: int = 0) -> list[int]:
        """The statuses the server logged, once there are at least n (a worker sends the
        front its status before the server reaps it and logs it: wait for the log)."""
        def logged() -> list[int]:
            return [int(s) for s in re.findall(r"request from pid \d+: status (-?\d+)", self.log())]

        if n:
            self.wait_until(lambda: len(logged()) >= n, f"{n} statuses logged", timeout=10)
        return logged()

    def children(self) -> list[int]:
        try:
            return [int(p) for p in Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()]
        except FileNotFoundError:
            return []

    def _named(self, want) -> list[int]:
        out = []
        for pid in self.children():
            try:
                if want(Path(f"/proc/{pid}/comm").read_text().strip()):
                    out.append(pid)
            except FileNotFoundError:
                pass
        return out

    def workers(self) -> list[int]:
        """The server's children working on a request (named so once they take it). Not
        "every child but the spare and the prober": a spare forked a moment ago has not
        named itself yet, and a test that killed "the worker" then killed it instead
        (test_server_survives_a_worker_crash waited out its 60 s)."""
        from libinject.runtime.serve.worker import WORKER_NAME

        return self._named(lambda comm: comm == WORKER_NAME)

    def spares(self) -> list[int]:
        from libinject.runtime.serve.worker import SPARE_NAME

        return self._named(lambda comm: comm == SPARE_NAME)

    def probers(self) -> list[int]:
        from libinject.runtime.serve.prober import PROBER_NAME

        return self._named(lambda comm: comm == PROBER_NAME)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
                pytest.fail(f"nvhook serve did not stop within 30 s of signal {sig}: {self.log()}")
        return self.proc.returncode
