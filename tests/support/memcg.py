"""A memory cgroup (v1 `memory` controller, under this process's own) for tests that
run something as the node would bound it: a program started in it (`wrap`) and every
child it makes are charged there, OOM-killed there past the limit, and `oom_kills`
says how often that happened."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path("/sys/fs/cgroup/memory")


def _own() -> Path:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return ROOT / path.lstrip("/")
    raise RuntimeError("no v1 memory controller for this process")


class MemoryCgroup:
    def __init__(self, limit: int) -> None:
        self.path = _own() / f"nvhook-test-{os.getpid()}-{os.urandom(3).hex()}"
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(limit))
        (self.path / "memory.memsw.limit_in_bytes").write_text(str(limit))

    def wrap(self, argv: list[str]) -> list[str]:
        """argv, started in this cgroup (a shell joins it, then execs argv)."""
        return ["/bin/sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$0" "$@"', *argv]

    def oom_kills(self) -> int:
        for line in (self.path / "memory.oom_control").read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                return int(v)
        raise RuntimeError("memory.oom_control has no oom_kill count")

    def peak(self) -> int:
        return int((self.path / "memory.max_usage_in_bytes").read_text())

    def pids(self) -> list[int]:
        return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]

    def close(self) -> None:
        parent = self.path.parent / "cgroup.procs"
        for pid in self.pids():         # what is left (a server): back to where we are
            try:
                parent.write_text(str(pid))
            except OSError:
                pass
        self.path.rmdir()

    def __enter__(self) -> "MemoryCgroup":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
