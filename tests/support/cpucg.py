"""A CPU-starved cgroup (the cpu controller's bandwidth quota: cgroup v2's cpu.max, or
v1's cpu.cfs_quota_us on a hybrid host), for tests of a service that gets almost no CPU.
Processes are moved in by pid (`add`), and moved back to our own cgroup on close."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

V2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()


def _own() -> Path:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if V2 and controllers == "":
            return Path("/sys/fs/cgroup") / path.lstrip("/")
        if not V2 and "cpu" in controllers.split(","):
            return Path("/sys/fs/cgroup/cpu") / path.lstrip("/")
    raise RuntimeError("no cpu controller for this process")


class CpuCgroup:
    def __init__(self, quota_us: int, period_us: int) -> None:
        self.path = _own() / f"nvhook-test-cpu-{os.getpid()}-{os.urandom(3).hex()}"
        self.path.mkdir()
        if V2:
            (self.path / "cpu.max").write_text(f"{quota_us} {period_us}")
        else:
            (self.path / "cpu.cfs_period_us").write_text(str(period_us))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota_us))
        self.hogs: list[subprocess.Popen] = []

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def hog(self, n: int) -> None:
        """n busy loops in here: the quota is used up as each period starts."""
        for _ in range(n):
            self.hogs.append(subprocess.Popen(
                ["/bin/sh", "-c", f'echo $$ > {self.path}/cgroup.procs && while :; do :; done']))

    def pids(self) -> list[int]:
        return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]

    def close(self) -> None:
        # Fed first: a throttled process needs CPU to die (its exit runs as itself)
        if V2:
            (self.path / "cpu.max").write_text("max")
        else:
            (self.path / "cpu.cfs_quota_us").write_text("-1")
        for p in self.hogs:
            p.kill()
            p.wait()
        parent = self.path.parent / "cgroup.procs"
        for pid in self.pids():
            try:
                parent.write_text(str(pid))
            except OSError:
                pass
        self.path.rmdir()

    def __enter__(self) -> "CpuCgroup":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
