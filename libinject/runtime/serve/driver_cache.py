"""Discovery and plans, remembered by the server for the workers it forks.

The prober and remembered plans: a request's discovery fingerprint (DriverCache.key, ~1
ms of a worker's CPU) must be taken after the request came, so a changed host is seen.
The server's prober, a long-lived child like a spare, takes it on another CPU as soon as
the server accepts a connection (for the driver root the server warmed) and writes it
to a pipe the worker reads when it needs it, after reading the request and the
container's spec; a worker whose prober is busy, slow (PROBE_WAIT) or gone, or whose
request names another root, takes its own. Plans are a pure function of the request,
the Driver and the container's library dirs: the server keeps those its workers made
(DriverCache.plan), making each again itself from what the worker reports; likewise the
ld.so.cache merges (libinject.apply.ldcache_merge: the image's cache and what a worker
found in the rootfs).
"""
from __future__ import annotations

import json
import os
import select

from libinject.errors import NvhookError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_CACHED = 8                  # driver roots remembered
MAX_PLANS = 64                  # plans remembered (per request, driver and library dirs)
PLANS_PER_REPORT = 4            # a worker plans once; what a report names beyond is ignored
MAX_PLANNED_REQUEST = 4096      # characters of a request whose plan is remembered (real: ~300)
PROBE_WAIT = 1.0                # s a worker waits for the prober's fingerprint, then takes its own


class DriverCache:
    """discover() with an in-memory layer keyed by snapshot's fingerprint of the host,
    taken fresh on every request (~1 ms): a changed host is never served stale data.
    Workers run it in the front's mount namespace; what they learn comes back to the
    server (learned()) so the next fork has it.

    And plan() for the Driver discover() returned: the planner is a pure function of the
    request, that Driver and the container's library dirs, so the server keeps the
    plans workers asked for, keyed by all of them (~0.5 ms of a 1-GPU start, ~1 ms of
    8 GPUs). A worker reports only what it asked for; the server makes the plan itself
    (load_planned), so what a worker reports can never put a plan under another key."""

    def __init__(self) -> None:
        self.entries: dict[tuple, Any] = {}
        self.new: list[tuple[tuple, Any]] = []
        self.last: tuple | None = None      # the key of the Driver discover() returned last
        # (driver key, Request, lib_dir, lib32_dir) -> ContainerEdits, made by the server
        self.plans: dict[tuple, Any] = {}
        self.planned: list[tuple] = []      # a worker's: the keys it planned afresh
        self.said = {"fingerprint": "", "plan": ""}     # where the last ones came from (-v)
        # (inputs, key, fd) of prefetch(): this request's fingerprint, taken a moment early
        # (key), or to be read from the prober (fd, key None)
        self.ahead: tuple[tuple, tuple | None, int] | None = None

    def discover(self, root: str = "/", *, ldcache: str | None = None,
                 dev_root: str | None = None, nvml_timeout: float = 10.0,
                 user: tuple[int, int] | None = None, snapshot: bool = True,
                 snapshot_dir: str | None = None, log=None):
        from libinject.discover import driver as D

        def fresh():
            return D.discover(root, ldcache=ldcache, dev_root=dev_root, nvml_timeout=nvml_timeout,
                              user=user, snapshot=snapshot, snapshot_dir=snapshot_dir, log=log)

        self.last = None
        if not snapshot:        # the config asks for no caching of discovery: none here either
            return fresh()
        ahead, self.ahead = self.ahead, None
        if ahead is not None and ahead[0] == (root, ldcache, dev_root):
            key = ahead[1] or self._probed(ahead[0], ahead[2])
        else:
            key = self.key(root, ldcache, dev_root)
            self.said["fingerprint"] = "taken here"
        driver = self.entries.get(key)
        if driver is None:
            driver = fresh()
            # Remember it only if the host did not change while discovering (as snapshot.py).
            if self.key(root, ldcache, dev_root) == key:
                self.remember(key, driver)
                self.new.append((key, driver))
        if self.entries.get(key) is driver:
            self.last = key
        return driver

    def plan(self, request, driver, *, lib_dir: str, lib32_dir: str):
        """libinject.plan.planner.plan, remembered for the Driver discover() returned."""
        from libinject.plan.planner import plan

        key = self.last
        if key is None or self.entries.get(key) is not driver:
            self.said["plan"] = "made here"
            return plan(request, driver, lib_dir=lib_dir, lib32_dir=lib32_dir)
        memo = (key, request, lib_dir, lib32_dir)
        edits = self.plans.get(memo)
        self.said["plan"] = "remembered"
        if edits is None:
            edits = plan(request, driver, lib_dir=lib_dir, lib32_dir=lib32_dir)
            self.planned.append(memo)
            self.said["plan"] = "made here"
        return edits

    def dump_planned(self) -> list:
        """What this worker planned afresh, for the server (load_planned), as JSON values
        (requests too large to be remembered left out)."""
        from libinject.request.model import to_json

        out = [[list(k), to_json(r), lib, lib32] for k, r, lib, lib32 in self.planned]
        return [item for item in out if _small(item[1], MAX_PLANNED_REQUEST)][:PLANS_PER_REPORT]

    def load_planned(self, items: list) -> int:
        """Make, here, the plans a worker's dump_planned() names, for a Driver we have
        (its key: discovered here: warm, Server._rediscover); returns how many."""
        from libinject.plan.planner import plan
        from libinject.request.model import from_json

        made = 0
        for k, r, lib, lib32 in items[:MAX_PLANS]:
            if not _small(r, MAX_PLANNED_REQUEST):
                continue
            key = tuple(k)
            driver = self.entries.get(key)
            if driver is None or type(lib) is not str or type(lib32) is not str:
                continue
            memo = (key, from_json(r), lib, lib32)
            if memo in self.plans:
                continue
            try:
                self.plans[memo] = plan(memo[1], driver, lib_dir=lib, lib32_dir=lib32)
            except NvhookError:     # the worker's request fails the same way each time
                continue
            made += 1
            while len(self.plans) > MAX_PLANS:
                del self.plans[next(iter(self.plans))]
        return made

    def prefetch(self, root: str, ldcache: str | None, dev_root: str | None, probe: int = -1) -> None:
        """Take key() of these inputs now, for the next discover() with the same ones
        to use (once). A worker calls it between its b"A" and the front's b"G": the
        request's own fingerprint, read while the front answers, before anything is
        done to the container; a discover() with other inputs takes its own.
        probe: a pipe the prober writes the key of the server's own inputs to, taken
        after this request came (Server._probe): read by discover() if these are they."""
        self.ahead = None
        inputs = (root, ldcache, dev_root)
        self.ahead = (inputs, None, probe) if probe >= 0 else (inputs, self.key(*inputs), -1)
        self.said["fingerprint"] = "taken here"

    def _probed(self, inputs: tuple, fd: int) -> tuple:
        """key(*inputs) as the prober wrote it to fd, or taken here (it wrote nothing
        within PROBE_WAIT, or for other inputs)."""
        try:
            ready, _, _ = select.select([fd], [], [], PROBE_WAIT)
            got = json.loads(os.read(fd, 1 << 16)) if ready else None
        except (OSError, ValueError):
            got = None
        finally:
            os.close(fd)
        if (type(got) is list and len(got) == 2 and got[0] == list(inputs) and type(got[1]) is list
                and len(got[1]) == 5 and all(type(x) is t for x, t in zip(got[1], (str, str, str, bool, str)))):
            self.said["fingerprint"] = "the prober's"
            return tuple(got[1])
        self.said["fingerprint"] = "taken here"
        return self.key(*inputs)

    @staticmethod
    def key(root: str, ldcache: str | None, dev_root: str | None) -> tuple:
        """Same inputs, same normalisation as libinject.discover.driver.discover's snapshot path."""
        from libinject.discover import driver as D
        from libinject.discover import snapshot as S

        root = D._check_root(root)
        dev = os.path.abspath(dev_root) if dev_root else root
        cache = D._join(root, ldcache or D.DEFAULT_LDCACHE)
        if D._WATCH is None:
            D._WATCH = D._watch_dirs()
        return (root, dev, cache, ldcache is not None, S.fingerprint(root, dev, cache, D._WATCH))

    def remember(self, key: tuple, driver) -> None:
        self.entries.pop(key, None)
        self.entries[key] = driver
        # One entry per driver root: an older fingerprint of the same root is stale.
        for k in [k for k in self.entries if k[:4] == key[:4] and k != key]:
            del self.entries[k]
        while len(self.entries) > MAX_CACHED:
            del self.entries[next(iter(self.entries))]
        self.plans = {m: e for m, e in self.plans.items() if self.entries.get(m[0]) is not None}

    def dump_new(self) -> list:
        """The keys of what this worker discovered, for the server (Server._rediscover)."""
        return [list(k) for k, _ in self.new]


def _small(request: object, limit: int) -> bool:
    """Is this request.model.to_json() value at most `limit` characters of strings (its
    plan is then cheap to make again: real ones are a few hundred)?"""
    if type(request) is not dict:
        return False
    total = 0
    for v in request.values():
        if type(v) is str:
            total += len(v)
        elif type(v) is list:
            total += sum(len(x) if type(x) is str else 1 for x in v[:limit + 1]) + len(v)
        if total > limit:
            return False
    return True
