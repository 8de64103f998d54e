"""`nvhook serve`: a warm process that runs the OCI hook for the compiled front.

A one-shot hook pays Python's start-up, its imports and a snapshot read on every GPU
container (~100 ms before any work). The server pays them once: it imports everything
the hook needs, keeps discovery results in memory, and forks a worker per request (a
fork of a warm process costs ~1 ms). csrc/hookfront.c hands GPU containers over on a
unix socket and falls back to exec'ing Python when no server answers, so the service
is optional and the hook's behaviour is the same either way: the worker runs
libinject.runtime.hook.handle(), the very function the exec'd Python runs.

Protocol (SOCK_SEQPACKET, one message each way, so no framing):
  server -> front: b"H" with SCM_RIGHTS [our mount ns, our pid ns] as soon as a peer is
      accepted: the front talks on only if they are its own namespaces.
  front -> server: b"NVHOOK2\0" then items b"a<argv entry>\0" and b"c<cwd>\0" (where the
      runtime started the hook: a relative bundle is taken from there), with SCM_RIGHTS
      [state memfd, its mount ns, its pid ns]. Nothing else: no environment, no stdio, no
      root or cwd fd.
  server -> front: b"A" + int32 serve-timeout (s) once the worker would take the request;
  front -> server: b"G": the front is committed (it no longer falls back: the container
      may be partly configured from now on); only then does the worker start. A front
      that gave up waiting for b"A" (5 s) has closed instead, and the worker does nothing.
  worker or server -> front: b"S" + int32 status + what the hook wrote to stdout/stderr
      (at most MAX_OUTPUT bytes): the hook's exit status, sent by the worker itself as
      soon as the hook is done (the front need not wait for it to exit and be reaped),
      or, from the server, CRASHED / TIMED_OUT (or a status the worker could not send). The front writes
      the text to its own stderr, so the runtime's pipes never leave the front: a wedged
      service can delay a container start by SERVE_WAIT_S at most, never hold it.
  The runtime shim's front (csrc/shimfront.c) sends its `create` the same way, as
      b"NVSHIM1\0" and its own items with SCM_RIGHTS [its mount ns, its pid ns]; the
      worker rewrites the bundle (libinject.runtime.shim_serve) and its b"S" carries the
      runtime for the front to exec.
  Anything else (refused peer, malformed request, argv the hook's parser does not take,
  too many requests): the connection closes or b"S" comes without b"A", and the front
  execs Python as if no server were there. (A client in Python, for tests:
  tests/support/serve_client.py.)

Trust: the service serves only the runtime. A peer must be uid 0 and in the service's
own mount and pid namespaces: a root process in a container that reached the socket is
refused. The proof is the namespace fds each side sends (no pid is believed: a pid can
be taken over by another process); SO_PEERCRED and, where the kernel has it,
SO_PEERPIDFD only filter early. The front checks the same of the listener before it
sends anything. Workers never enter a peer's namespaces or root: they run in the
service's own, so what they exec (ldconfig, the NVML child's python) is the host's,
opened as the service would. Only the stages the runtime runs in its own namespaces are
served: the prestart hook and a CDI spec's `cdi-hook createRuntime`
(libinject.runtime.cdi_hooks: the same worker, the same entry into the container's mount
namespace through the state's pid); a createContainer hook runs in the container's. A worker keeps only the capabilities the hook
needs, and its environment is PATH alone: settings come from the hook's argv
(--config) and root-owned files, never from an environment.

Pre-faulted spares: a worker is a fork of the server, so every page of the server's it
writes (a refcount, an allocator's free list) is copied on that first write, a fault
(~900 of them, ~4.5 ms of a 1-GPU start's CPU on the development VM). The pages requests
write are much the same each time: a worker, once its status is sent, reports which
pages it holds copies of (/proc/self/pagemap: present, anonymous, mapped by it alone;
the first LEARN_FIRST workers, then one in LEARN_EVERY), the server keeps their union
(in memory, at most MAX_PREFAULT pages: addresses in its own address space, nothing
else) and each spare copies those pages while it waits (MADV_POPULATE_WRITE: faulted in
writable, nothing written), stopping as soon as a request comes. From its fork until
then, the server has it run SCHED_IDLE (CPU nobody else wants: never at the expense of a
start in flight, nor of the runtime going on with the container after one), and gives it
normal priority back as it hands it a request; a worker goes back to SCHED_IDLE once its
status is sent (what is left of it is its report and its exit, unmapping its copy of the
server's address space). Spares and workers run with the cyclic GC off (a collection walks, and so copies, the inherited heap; a
worker lives for one request).

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

import errno
import gc
import json
import math
import os
import select
import selectors
import signal
import socket
import stat
import struct
import sys
import time

from libinject.constants import SAFE_PATH
from libinject.errors import NvhookError
from libinject.linux.child import Child
from libinject.linux.privileges import cap_last_cap
from libinject.record import record
from libinject.runtime import shim_serve
from libinject.runtime.shim_serve import ShimRequest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAGIC = b"NVHOOK2"
MAX_REQUEST = 64 << 10          # argv + cwd: a few hundred bytes in practice
MAX_OUTPUT = (16 << 10) - 5     # the hook's output sent back (hookfront.c MAX_REPLY)
NFDS = 3                        # the state memfd, the front's mount and pid namespaces
NAMESPACES = ("mnt", "pid")     # what both sides prove they share
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)     # Linux 6.5
SERVED_STAGES = ("prestart", "cdi-hook createRuntime")    # (libinject.runtime.hook.served_stage)
HELLO = b"H"
ACCEPTED = b"A"
GO = b"G"
STATUS = b"S"
CRASHED = -1                    # the worker died (signal): the front says so and fails
TIMED_OUT = -2                  # the worker ran past serve-timeout and was killed
MAX_JOBS = 64                   # beyond this, connections are closed: the front falls back
MAX_CACHED = 8                  # driver roots remembered
MAX_PLANS = 64                  # plans remembered (per request, driver and library dirs)
PLANS_PER_REPORT = 4            # a worker plans once; what a report names beyond is ignored
MAX_PLANNED_REQUEST = 4096      # characters of a request whose plan is remembered (real: ~300)
MAX_REPORT = 4 << 20            # bytes of a worker's report read (an ld.so.cache in base64, pages)
PROBER_BACKOFF = 60.0           # s without a prober after one was stuck (a wedged driver)
REDISCOVER_BACKOFF = 30.0       # s before the server tries again a rediscovery that failed
RECV_TIMEOUT = 5.0              # the front sends its request right after connect()
INTERNAL = 70                   # a worker's own failure (EX_SOFTWARE)
SPARE_NAME = "nvhook-spare"     # what ps shows of a spare worker, until it takes a request
PROBER_NAME = "nvhook-prober"
PROBE_WAIT = 1.0                # s a worker waits for the prober's fingerprint, then takes its own
PROBE_STUCK = 10.0              # s a probe may take before the prober is replaced
DYING_POLL = 1.0                # s between tries to reap a killed child whose exit we cannot wait for
WORKER_NAME = "nvhook-worker"
REPORTED = 0x80                 # in a worker's exit status: it sent b"S" itself (hook codes < 128)
PAGE = os.sysconf("SC_PAGE_SIZE")
MAX_PREFAULT = 4096             # pages a spare copies ahead at most (16 MiB); beyond: relearn
PREFAULT_STEP = 64              # pages a spare copies between two looks for a request
LEARN_FIRST = 8                 # workers report their copied pages: the first ones, then
LEARN_EVERY = 16                # every 16th (the page scan is ~1 ms after the status)
PREFAULTING = b"P"              # spare -> server: set up, pre-faulting (its CPU may go idle)
MAX_MAPPING_PAGES = 1 << 16     # a worker's mappings larger than this (256 MiB) are not scanned
MAX_USER_PAGE = (1 << 47) // PAGE   # x86-64's user address space: no report names a page above

# What the hook (and the children it forks without exec) may import: all of it before
# any worker runs, so no worker ever reads Python from the front's mount namespace.
PRELOAD = (
    "argparse", "ctypes", "errno", "glob", "grp", "json", "posixpath", "pwd",
    "re", "resource", "select", "signal", "stat", "struct", "subprocess", "time", "tomllib",
    "traceback", "pathlib", "prctl",
    "libinject.linux.native", "libinject.errors", "libinject.linux.files", "libinject.discover.model", "libinject.request.model",
    "libinject.plan.edits", "libinject.config", "libinject.request.oci_state", "libinject.request.oci_spec",
    "libinject.pipeline", "libinject.discover.snapshot", "libinject.discover.driver", "libinject.discover.nvml",
    "libinject.discover.ldcache", "libinject.discover.libraries", "libinject.plan.select", "libinject.plan.require",
    "libinject.plan.procfs", "libinject.plan.planner", "libinject.apply.rootfs", "libinject.apply.ldconfig",
    "libinject.apply.live", "libinject.apply.cgroups", "libinject.apply.bpf",
    "libinject.log", "libinject.request.user", "libinject.discover.options",
    "libinject.runtime.hook", "libinject.constants", "libinject.linux.child",
    "libinject.discover.decode", "libinject.discover.procfs", "libinject.discover.graphics",
    "libinject.linux.privileges", "libinject.linux.proc", "libinject.linux.mountinfo",
    "libinject.linux.atomic", "libinject.tomlfast", "libinject.jsonc", "libinject.record",
    "libinject.apply.ldcache_merge", "_prctl", "libinject.runtime.ceiling",
    "libinject.runtime.cdi_hooks", "libinject.installpath",
    # the runtime shim's create (libinject.runtime.shim_serve), every mode's
    "libinject.runtime.shim", "libinject.runtime.shim_serve", "libinject.apply.cdi",
    "libinject.apply.cdi_validate", "libinject.apply.spec", "libinject.plan.csv",
)


def preload() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    try:
        import _blake2  # noqa: F401  (snapshot's hash, without OpenSSL)
    except ImportError:  # pragma: no cover
        import hashlib  # noqa: F401


# -- the request ----------------------------------------------------------------------

@record(frozen=True)
class Request:
    argv: tuple[str, ...]
    cwd: str | None = None

    @property
    def args(self):
        """The hook's global options and stage (None: not argv the hook takes as is)."""
        from libinject.runtime.hook import parse_argv

        return parse_argv(list(self.argv[1:]))

    @property
    def stage(self) -> str | None:
        """The stage served (SERVED_STAGES), else the command asked for."""
        from libinject.runtime.hook import served_stage

        args = self.args
        return served_stage(args) or (args.command if args is not None else None)


def parse_request(data: bytes) -> Request | ShimRequest:
    """The front's message (ValueError if it is not one we serve): the hook's, or the
    runtime shim's create (libinject.runtime.shim_serve)."""
    if len(data) > MAX_REQUEST:
        raise ValueError("request too large")
    parts = data.split(b"\0")
    if parts[0] == shim_serve.MAGIC and parts[-1] == b"":
        return shim_serve.parse(parts[1:-1])
    if parts[0] != MAGIC or parts[-1] != b"":
        raise ValueError("not an nvhook request")
    argv: list[str] = []
    cwd: str | None = None
    for item in parts[1:-1]:
        kind, value = item[:1], item[1:].decode()
        if kind == b"a":
            argv.append(value)
        elif kind == b"c" and cwd is None and value.startswith("/"):
            cwd = value
        else:
            raise ValueError("unknown or repeated item")
    if len(argv) < 2:
        raise ValueError("no command")
    return Request(tuple(argv), cwd)


# -- discovery, remembered --------------------------------------------------------------

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


# -- pre-faulting spares ---------------------------------------------------------------------

# pagemap entry's top byte: bit 63 present (0x80), 61 file page or shared anonymous (0x20),
# 56 mapped by this process alone (0x01): a page of our own, copied or new.
_OWN_PAGE = bytes(1 if b & 0xA1 == 0x81 else 0 for b in range(256))


def copied_pages() -> list[tuple[int, int]]:
    """Runs (first page number, count) of the pages of our private writable mappings that
    this process holds its own copy of: in a worker, the pages of the server's it wrote
    (and pages new since the fork). Stacks and the kernel's [vvar]-like mappings aside."""
    from libinject.linux import proc

    dfd = proc.proc_fd()
    fd = os.open("self/maps", os.O_RDONLY | os.O_CLOEXEC, dir_fd=dfd)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    runs: list[tuple[int, int]] = []
    fd = os.open("self/pagemap", os.O_RDONLY | os.O_CLOEXEC, dir_fd=dfd)
    try:
        for line in b"".join(chunks).splitlines():
            fields = line.split(None, 5)
            if len(fields) < 5 or fields[1][1:2] != b"w" or fields[1][3:4] != b"p":
                continue
            name = fields[5].strip() if len(fields) > 5 else b""
            if name.startswith(b"[") and name != b"[heap]":
                continue
            lo, _, hi = fields[0].partition(b"-")
            first, end = int(lo, 16) // PAGE, int(hi, 16) // PAGE
            if not 0 < end - first <= MAX_MAPPING_PAGES:
                continue
            own = os.pread(fd, (end - first) * 8, first * 8)[7::8].translate(_OWN_PAGE)
            i = own.find(1)
            while i >= 0:
                j = own.find(0, i)
                if j < 0:
                    j = len(own)
                runs.append((first + i, j - i))
                i = own.find(1, j)
    finally:
        os.close(fd)
    return runs


def _as_runs(pages: list[int]) -> list[tuple[int, int]]:
    """Sorted page numbers as (first, count) runs."""
    runs: list[tuple[int, int]] = []
    for p in pages:
        if runs and runs[-1][0] + runs[-1][1] == p:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((p, 1))
    return runs


def populate_write_works() -> bool:
    """Whether this kernel takes MADV_POPULATE_WRITE (5.14), tried on a page of ours."""
    import mmap

    from libinject.linux import native

    m = mmap.mmap(-1, PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        return native.populate_write(native.address_of(m), PAGE) == 0
    finally:
        m.close()


def prefault(runs: list[tuple[int, int]], sock: socket.socket | None = None) -> int:
    """Copy these pages of ours now (MADV_POPULATE_WRITE faults them in as a write would,
    writing nothing); stops early when sock becomes readable (a request: serve it
    first). Returns the number of pages asked for. A run no longer mapped (ENOMEM) is
    only pages left to be copied when written."""
    from libinject.linux.native import populate_write

    done = since = 0
    for first, n in runs:
        for at in range(first, first + n, PREFAULT_STEP):
            if sock is not None and since >= PREFAULT_STEP:
                since = 0
                if select.select([sock], [], [], 0)[0]:
                    return done
            k = min(PREFAULT_STEP, first + n - at)
            populate_write(at * PAGE, k * PAGE)
            done += k
            since += k
    return done


# -- the socket ---------------------------------------------------------------------------

def _check_dir(path: str) -> None:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise NvhookError(f"cannot create socket dir {path}: {e.strerror}") from None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise NvhookError(f"socket dir {path} must be a directory owned by uid {os.geteuid()} "
                          "and writable by nobody else")


def serving(path: str) -> bool:
    """Whether an `nvhook serve` holds `path` (its lock, as bind() takes it, and the
    socket there): for what `nvhook setup` tells a user, never for a decision."""
    import fcntl

    path = os.path.abspath(path)
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return False
        lock = os.open(path + ".lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(lock)
    return False


def bind(path: str) -> tuple[socket.socket, int, os.stat_result]:
    """(listening socket, lock fd, the socket file's stat). One server per path: a lock
    file beside the socket says which; a socket left by a dead server is replaced."""
    import fcntl

    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    _check_dir(directory)
    lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        raise NvhookError(f"another nvhook serve is listening on {path}") from None
    try:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISSOCK(st.st_mode):
                raise NvhookError(f"{path} exists and is not a socket")
            os.unlink(path)     # we hold the lock: whoever made it is gone
        # Bind under a temporary name, restrict it, then rename it into place: the
        # socket never exists at its path with another mode, nor half set up.
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.bind(tmp)
            os.chmod(tmp, 0o600)
            sock.listen(128)
            os.rename(tmp, path)
        except OSError as e:
            sock.close()
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise NvhookError(f"cannot listen on {path}: {e.strerror}") from None
        return sock, lock, os.lstat(path)
    except BaseException:
        os.close(lock)
        raise


# -- the server ---------------------------------------------------------------------------

@record
class _Job:
    child: Child                # the worker: its own process group (ldconfig, NVML with it)
    conn: socket.socket
    learned: int                # memfd the worker writes new discovery results to
    output: int                 # memfd: the worker's stdout/stderr, sent to the front
    peer: int
    started: float
    deadline: float
    timed_out: bool = False
    reported: bool = False      # the worker sent the front its status itself
    # A spare's end of the socket pair, kept open until the worker is gone: closed with
    # its PREFAULTING unread, it would fail the spare's recvmsg (ECONNRESET) before
    # the request queued behind it.
    spare_sock: socket.socket | None = None


class Server:
    def __init__(self, path: str, *, timeout: float = 60.0, log_fd: int | None = None,
                 verbose: bool = False, notify=None) -> None:
        """log_fd: where the server and its workers write one line per event (a dup of
        the service's stderr: a worker's own fds 1 and 2 go back to the front).
        verbose: workers also log what each request asked for.
        notify: a libinject.runtime.sdnotify.Notifier (systemd's Type=notify), told
        READY=1 once the socket listens and STOPPING=1 when it stops listening."""
        self.path = os.path.abspath(path)
        self.timeout = timeout
        self.log_fd = log_fd
        self.verbose = verbose
        self.notify = notify
        self.cache = DriverCache()
        # The pages workers copied (their reports' union) and as runs, for spares to
        # copy ahead (prefault); prefaulting: the kernel can (populate_write_works).
        self.prefault_pages: set[int] = set()
        self.prefault_runs: list[tuple[int, int]] = []
        self.prefaulting = False
        self.requests = 0               # handed to a worker
        self.asked = 0                  # of them, asked to report their pages
        self._spare_idle = False        # the spare said PREFAULTING: it runs SCHED_IDLE
        self.jobs: dict[int, _Job] = {}          # by the worker's pidfd
        # The next request's worker, forked ahead of it: (its Child, our end of its socket).
        self.spare: tuple[Child, socket.socket] | None = None
        # The prober (_Prober): takes each request's fingerprint of the driver root we
        # warmed (probe_inputs) on another CPU while the worker reads the request.
        self.prober: tuple[Child, socket.socket] | None = None
        self.probe_inputs: tuple | None = None
        self.probing = 0.0              # when the probe in flight was asked for (0: none)
        self.prober_off_until = 0.0     # after a stuck prober: none until then
        self.dying: list[Child] = []    # killed, not yet reaped (stuck in the kernel)
        self.watched_dying: set[int] = set()    # their pidfds in self.sel
        self.warm_options = None        # DiscoverOptions warmed (the only ones we rediscover)
        self.rediscover_after = 0.0     # a failed rediscovery: not again before then
        self.sel = selectors.DefaultSelector()
        self.stopping = False
        self.sock: socket.socket | None = None
        self.lock = -1
        self._st: os.stat_result | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.pid = os.getpid()
        self.ns_fds = [os.open(f"/proc/self/ns/{n}", os.O_RDONLY | os.O_CLOEXEC) for n in NAMESPACES]
        self.ns_ids = [(st.st_dev, st.st_ino) for st in map(os.fstat, self.ns_fds)]

    def log(self, msg: str) -> None:
        if self.log_fd is None:
            return
        try:
            os.write(self.log_fd, f"nvhook serve[{os.getpid()}]: {msg}\n".encode(errors="replace"))
        except OSError:
            pass

    # lifecycle
    def start(self, warm=None) -> None:
        """Import what the hook needs, discover once if warm (DiscoverOptions) is given,
        then listen: the socket appears only once the service is ready, so no front ever
        waits on a service still warming up."""
        preload()
        if warm is not None:
            self.warm(warm)
        cap_last_cap()          # read once here, not in every worker
        self.prefaulting = populate_write_works()
        if not self.prefaulting:
            self.log("spares are not pre-faulted: the kernel has no MADV_POPULATE_WRITE (5.14)")
        self.sock, self.lock, self._st = bind(self.path)
        self.sock.setblocking(False)
        self.sel.register(self.sock, selectors.EVENT_READ, "accept")
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        signal.set_wakeup_fd(self._wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        self.log(f"listening on {self.path} (pid {os.getpid()})")
        self._spawn_prober()
        self._spawn_spare()
        if self.notify is not None:     # warm, bound, listening, signals handled: ready
            self.notify.ready(f"serving on {self.path}")

    def warm(self, options) -> None:
        """Discover once in our own namespace (DiscoverOptions), so the first container
        is served warm."""
        self.warm_options = options
        self.probe_inputs = (options.root, options.ldcache, options.dev_root)
        try:
            d = options.discover(self.cache.discover)
            n = self._remember_libraries(d)
            self.log(f"warm: driver {d.info.driver_version}, {len(d.info.gpus)} GPUs under {d.root}, "
                     f"{n} libraries' ELF facts")
        except NvhookError as e:
            self.log(f"warm: {e} (discovering per request)")
        self.cache.new.clear()

    @staticmethod
    def _remember_libraries(driver) -> int:
        """The ELF facts of the driver's libraries, read here (our own namespace, the
        driver root discovery found them in) for the workers' ld.so.cache merges
        (libinject.apply.ldcache_merge.remember_host_libraries); how many are known."""
        from libinject.apply import ldcache_merge

        return ldcache_merge.remember_host_libraries(lib.path for lib in driver.libraries)

    def _on_signal(self, signum, frame) -> None:
        self.stopping = True

    def serve_forever(self) -> None:
        while not (self.stopping and not self.jobs):
            if self.stopping and self.sock is not None:
                self._close_listener()
            for key, _ in self.sel.select(self._next_timeout()):
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    try:
                        os.read(self._wake_r, 512)
                    except BlockingIOError:
                        pass
                elif key.data == "spare":
                    self._spare_says(key.fileobj)
                elif key.data == "prober":
                    self._prober_says()
                elif key.data == "dying":
                    self._reap_dying()
                else:
                    self._finish(self.jobs[key.fd])
            self._expire()
        self.close()

    def close(self) -> None:
        self._close_listener()
        self._drop_spare()
        self._drop_prober()
        for child in self.dying:
            self._unwatch(child.pidfd)
            child.close()       # (waits KILL_GRACE at most: we are stopping)
        self.dying.clear()
        for job in list(self.jobs.values()):
            job.child.reap()
            self._done(job, TIMED_OUT)
        if self.lock >= 0:
            os.close(self.lock)
            self.lock = -1

    def _close_listener(self) -> None:
        if self.sock is None:
            return
        self.sel.unregister(self.sock)
        self.sock.close()
        self.sock = None
        try:            # only our socket: a successor may have taken the path already
            st = os.lstat(self.path)
            if self._st and (st.st_dev, st.st_ino) == (self._st.st_dev, self._st.st_ino):
                os.unlink(self.path)
        except OSError:
            pass
        self.log("stopped listening")
        self._drop_spare()
        if self.notify is not None:
            self.notify.stopping(f"stopping: {len(self.jobs)} request(s) in flight")

    # requests
    def _next_timeout(self) -> float | None:
        deadlines = [j.deadline for j in self.jobs.values()]
        if self.probing:
            deadlines.append(self.probing + PROBE_STUCK)
        if any(c.pidfd not in self.watched_dying for c in self.dying):
            deadlines.append(time.monotonic() + DYING_POLL)   # (exited, yet not ours to wait for yet)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())

    def _accept(self) -> None:
        assert self.sock is not None
        try:
            conn, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        pid, uid, _gid = struct.unpack("3i", conn.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        why = _untrusted_peer(conn, pid, uid, self.ns_ids[0])
        if why:
            # it falls back to exec'ing Python itself, in its own namespaces
            self.log(f"refused peer pid={pid} uid={uid}: {why}")
            conn.close()
            return
        if len(self.jobs) >= MAX_JOBS:
            self.log(f"busy ({len(self.jobs)} requests): peer {pid} falls back")
            conn.close()
            return
        try:        # the hello: our namespaces, for the front to check before it says anything
            conn.sendmsg([HELLO], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                    struct.pack(f"{len(self.ns_fds)}i", *self.ns_fds))],
                         socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT)
        except OSError:
            conn.close()
            return
        learned = os.memfd_create("nvhook-learned", os.MFD_CLOEXEC)
        output = os.memfd_create("nvhook-output", os.MFD_CLOEXEC)
        probe, probe_w = os.pipe2(os.O_CLOEXEC)
        learn = self._learn()
        spare_sock = None
        handed = self._to_spare(conn, pid, learned, output, probe, learn)
        if handed is not None:
            child, spare_sock = handed
        else:
            child = self._fork_worker(conn, pid, learned, output, probe, learn)
        os.close(probe)                     # the worker's now
        # Only now: the prober, woken, may well take this CPU from us a while.
        self._probe(probe_w)
        if child is None:                   # pragma: no cover - kernels before 5.3
            conn.close()
            os.close(learned)
            os.close(output)
            return
        now = time.monotonic()
        job = _Job(child, conn, learned, output, pid, now, now + self.timeout, spare_sock=spare_sock)
        self.jobs[child.pidfd] = job
        self.sel.register(child.pidfd, selectors.EVENT_READ, "job")
        self._spawn_spare()                 # while this one works, on another CPU

    def _fork(self, work) -> Child | None:
        """A worker process running work() (its exit status); None if no pidfd."""
        sys.stdout.flush()
        sys.stderr.flush()
        worker = os.fork()
        if worker == 0:  # pragma: no cover - runs in the worker
            code = INTERNAL
            try:
                code = work()
            except BaseException as e:  # noqa: BLE001 - never return into the server's loop
                self.log(f"worker failed: {type(e).__name__}: {e}")
            finally:
                os._exit(code)
        try:
            return Child(worker, group=True)
        except OSError:                     # pragma: no cover - kernels before 5.3
            os.kill(worker, signal.SIGKILL)
            os.waitpid(worker, 0)           # killed: returns at once
            return None

    def _fork_worker(self, conn: socket.socket, peer: int, learned: int, output: int,
                     probe: int, learn: bool = False) -> Child | None:
        return self._fork(lambda: _Worker(self, conn, peer, learned, output, probe, learn).run())

    def _learn(self) -> bool:
        """Should this request's worker report the pages it copied (copied_pages)?"""
        self.requests += 1
        if not self.prefaulting or (self.asked >= LEARN_FIRST and self.requests % LEARN_EVERY):
            return False
        self.asked += 1
        return True

    # A spare: the fork of a warm server and the worker's own set-up (~2-3 ms on the
    # hook's path) done before the request comes. It waits on a socket pair for the
    # server to pass it [conn, learned, output], the peer's pid and whether to report
    # its pages, then is a worker; before it waits, it pre-faults what requests write
    # (saying PREFAULTING first). It runs on idle CPU from its fork until it gets a
    # request (the server's to decide: _take_spare), set-up and pre-faulting alike.
    def _spawn_spare(self) -> None:
        if self.spare is not None or self.stopping:
            return
        self.spare = self._fork_talking(_Worker.spare, "spare")
        if self.spare is not None:
            # Idle CPU only until it has a request: its set-up and pre-faulting never
            # take a CPU from the worker, the prober or the runtime
            self._spare_idle = _set_idle(self.spare[0].pid, True)

    def _fork_talking(self, body, tag: str) -> tuple[Child, socket.socket] | None:
        """A child running body(server, its end of a socket pair); ours, non-blocking,
        watched for what it says (events tagged `tag`). None if no pidfd."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)

        def run() -> int:
            ours.close()
            return body(self, theirs)

        child = self._fork(run)
        theirs.close()
        if child is None:                   # pragma: no cover - kernels before 5.3
            ours.close()
            return None
        ours.setblocking(False)
        self.sel.register(ours, selectors.EVENT_READ, tag)
        return child, ours

    def _spare_says(self, sock) -> None:
        """The spare is set up and pre-faulting (PREFAULTING): it runs only on CPU
        nobody else wants (made so at its fork; here if that failed then), until it
        gets a request (_to_spare). The server decides both, one after the other, so a
        request's worker never stays idle."""
        if self.spare is None or self.spare[1] is not sock:
            return          # it took a request in this same round of events
        child = self.spare[0]
        try:
            msg = sock.recv(16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            msg = b""
        if msg == PREFAULTING and not self._spare_idle:
            self._spare_idle = _set_idle(child.pid, True)
        elif not msg:                       # it died: found out when a request comes
            self.sel.unregister(sock)

    def _take_spare(self) -> tuple[Child, socket.socket] | None:
        if self.spare is None:
            return None
        (child, sock), self.spare = self.spare, None
        try:
            self.sel.unregister(sock)
        except KeyError:
            pass
        if self._spare_idle:
            _set_idle(child.pid, False)     # a request's worker: the runtime waits for it
        return child, sock

    def _to_spare(self, conn: socket.socket, peer: int, learned: int, output: int, probe: int,
                  learn: bool = False) -> tuple[Child, socket.socket] | None:
        """Hand the request to the spare: (it, our end of its socket pair, to close once
        it is gone: _Job.spare_sock); None: there is none, or it is gone."""
        spare = self._take_spare()
        if spare is None:
            return None
        child, sock = spare
        try:
            sock.sendmsg([struct.pack("ii", peer, learn)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                             struct.pack("4i", conn.fileno(), learned, output, probe))],
                          socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT)
        except OSError as e:
            self.log(f"spare worker {child.pid}: {e.strerror}; forking one for the request")
            sock.close()
            child.close()       # killed and reaped
            return None
        return child, sock

    def _drop_spare(self) -> None:
        spare = self._take_spare()
        if spare is None:
            return
        child, sock = spare
        sock.close()
        child.close()       # killed and reaped

    # The prober: a fingerprint (DriverCache.key) takes ~1 ms of a worker's CPU, and the
    # request's must be taken after it came. The prober takes it on another CPU while
    # the worker reads the request and the container's spec (and is forked, cheaply,
    # before any request). One probe at a time: while one is in flight, or with no
    # prober, workers take their own.
    def _spawn_prober(self) -> None:
        if (self.prober is not None or self.probe_inputs is None or self.stopping
                or time.monotonic() < self.prober_off_until):
            return
        self.prober = self._fork_talking(_Prober.run, "prober")
        self.probing = 0.0

    def _probe(self, w: int) -> None:
        """Have the prober write the fingerprint of probe_inputs, taken now, to the pipe
        `w` (closed here), whose read end a request's worker has; where it cannot,
        nothing is written."""
        try:
            if self.prober is not None and not self.probing:
                msg = json.dumps(self.probe_inputs).encode()
                try:
                    self.prober[1].sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", w))],
                                           socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT)
                    self.probing = time.monotonic()
                except OSError as e:
                    self.log(f"prober {self.prober[0].pid}: {e.strerror}; starting another")
                    self._drop_prober()
        finally:
            os.close(w)
        if self.prober is None:
            self._spawn_prober()            # (for the next requests)

    def _prober_says(self) -> None:
        if self.prober is None:
            return
        try:
            msg = self.prober[1].recv(16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            msg = b""
        if msg:
            self.probing = 0.0
        else:                               # it died: a new one for the next requests
            self.log(f"prober {self.prober[0].pid} is gone; starting another")
            self._drop_prober()
            self._spawn_prober()

    def _drop_prober(self) -> None:
        """Kill the prober; reaped later (_reap_dying), never waited for here: a prober
        stuck in a wedged driver's procfs read may not die at once."""
        if self.prober is None:
            return
        (child, sock), self.prober = self.prober, None
        self.sel.unregister(sock)
        sock.close()
        child.kill()
        self.dying.append(child)
        # Watched until reaped, idle or not: the kernel closes a dying child's files (we
        # see its socket's EOF) before its exit can be waited for, so it is rarely
        # reapable yet here, and with nothing else in flight nothing else wakes us.
        self.sel.register(child.pidfd, selectors.EVENT_READ, "dying")
        self.watched_dying.add(child.pidfd)
        self._reap_dying()
        self.probing = 0.0

    def _unwatch(self, pidfd: int) -> None:
        if pidfd in self.watched_dying:
            self.watched_dying.discard(pidfd)
            self.sel.unregister(pidfd)

    def _reap_dying(self) -> None:
        for child in list(self.dying):
            if child.wait(0) is not None:
                self._unwatch(child.pidfd)
                os.close(child.pidfd)
                child.pidfd = -1
                self.dying.remove(child)
            elif child.pidfd in self.watched_dying and child.exited():
                # Exited yet not waitable (a tracer holds its exit): readable for good,
                # so polled every DYING_POLL instead of waking us in a loop
                self._unwatch(child.pidfd)

    def _expire(self) -> None:
        now = time.monotonic()
        if self.probing and now - self.probing > PROBE_STUCK:     # (a wedged driver's procfs)
            self.log(f"prober {self.prober[0].pid} took over {PROBE_STUCK:g}s; "  # type: ignore[index]
                     f"workers take their own fingerprints for {PROBER_BACKOFF:g}s")
            self._drop_prober()
            self.prober_off_until = now + PROBER_BACKOFF
        if self.dying:
            self._reap_dying()
        for job in list(self.jobs.values()):
            if now >= job.deadline and not job.timed_out:
                self.log(f"request from pid {job.peer}: worker {job.child.pid} timed out after "
                         f"{self.timeout:g}s, killed")
                job.timed_out = True
                job.deadline = now + 3600           # its exit ends it
                job.child.kill()

    def _finish(self, job: _Job) -> None:
        code = job.child.wait(0)            # its pidfd is readable: it has exited
        if code is None:
            return
        if job.timed_out:
            code = TIMED_OUT
        elif code < 0:
            self.log(f"request from pid {job.peer}: worker {job.child.pid} died of signal {-code}")
            code = CRASHED
        else:
            if code & REPORTED:
                job.reported = True
                code &= ~REPORTED
            try:
                size = os.fstat(job.learned).st_size
                if size > MAX_REPORT:
                    raise ValueError(f"{size} bytes")
                self._learn_from(json.loads(os.pread(job.learned, size, 0)) if size else {},
                                 job.child.pid)
            except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError,
                    NvhookError) as e:
                self.log(f"ignoring worker {job.child.pid}'s report: {e}")
        self._done(job, code)

    def _learn_from(self, report: dict, worker: int) -> None:
        """What a worker reported (_Worker._report), taken as data only: what is kept is
        made here (discovery, plans, merges), from inputs the report names, at a cost
        the report cannot raise far (PLANS_PER_REPORT, MAX_PLANNED_REQUEST,
        ldcache_merge.MAX_LEARN)."""
        if report.get("drivers"):
            self._rediscover(report["drivers"], worker)
        if report.get("plans"):
            self.cache.load_planned(report["plans"][:PLANS_PER_REPORT])
        if report.get("ldcache"):
            from libinject.apply import ldcache_merge

            ldcache_merge.learn(report["ldcache"])
        if report.get("pages"):
            self._keep_pages(report["pages"])

    def _rediscover(self, keys: list, worker: int) -> None:
        """A worker discovered anew, keys[] naming what for: the host changed. For the
        driver root we warmed, discover it here (our own fingerprint, the snapshot the
        worker wrote, sealed, or NVML), so the workers we fork from now on have it; a
        worker's own Driver is never taken (it could name any file as a library). Other
        roots are left to their requests' workers."""
        opts = self.warm_options
        if opts is None or type(keys) is not list or time.monotonic() < self.rediscover_after:
            return
        try:
            ours = DriverCache.key(opts.root, opts.ldcache, opts.dev_root)
            if not any(type(k) is list and k[:4] == list(ours[:4]) for k in keys):
                return
            if ours in self.cache.entries:
                return                      # what the worker saw is what we have
            d = opts.discover(self.cache.discover)
        except NvhookError as e:     # (not again at once: it runs in our loop, NVML with it)
            self.rediscover_after = time.monotonic() + REDISCOVER_BACKOFF
            self.log(f"rediscovering after worker {worker}: {e}; not again for {REDISCOVER_BACKOFF:g}s")
            return
        finally:
            self.cache.new.clear()
        self._remember_libraries(d)
        self.log(f"learned 1 driver(s) after worker {worker}: driver {d.info.driver_version}, "
                 f"{len(d.info.gpus)} GPUs under {d.root} (discovered here)")

    def _keep_pages(self, runs: list) -> None:
        """A worker's copied pages (copied_pages()), added to what spares pre-fault; past
        MAX_PREFAULT pages, only this report's (what requests write drifts as the
        server's heap does)."""
        pages: set[int] = set()
        if type(runs) is not list:
            return
        for run in runs:
            if not (type(run) is list and len(run) == 2 and type(run[0]) is int
                    and type(run[1]) is int and run[0] >= 0 and 0 < run[1] <= MAX_PREFAULT - len(pages)
                    and run[0] + run[1] <= MAX_USER_PAGE):
                return      # not what copied_pages() makes: none of it
            pages.update(range(run[0], run[0] + run[1]))
        merged = self.prefault_pages | pages
        if len(merged) > MAX_PREFAULT:
            merged = pages
        if merged != self.prefault_pages:
            self.prefault_pages = merged
            self.prefault_runs = _as_runs(sorted(merged))
            if self.verbose:
                self.log(f"spares pre-fault {len(merged)} pages ({len(self.prefault_runs)} runs)")

    def _done(self, job: _Job, code: int) -> None:
        self.sel.unregister(job.child.pidfd)
        del self.jobs[job.child.pidfd]
        job.child.close()
        if job.spare_sock is not None:
            job.spare_sock.close()
        os.close(job.learned)
        out = b""
        if not job.reported:
            try:
                out = os.pread(job.output, MAX_OUTPUT, 0)
            except OSError:
                pass
        os.close(job.output)
        if not job.reported:
            try:
                job.conn.send(STATUS + struct.pack("i", code) + out, socket.MSG_NOSIGNAL)
            except OSError:
                pass
        job.conn.close()
        self.log(f"request from pid {job.peer}: status {code} in "
                 f"{(time.monotonic() - job.started) * 1000:.1f} ms")


# -- the worker ------------------------------------------------------------------------------

class _Worker:  # pragma: no cover - runs in a forked child (covered by tests/test_hook_serve.py)
    def __init__(self, server: Server, conn: socket.socket, peer: int, learned: int,
                 output: int, probe: int, learn: bool = False) -> None:
        self.server, self.conn, self.peer = server, conn, peer
        self.learned, self.output = learned, output
        self.probe = probe          # the prober's fingerprint comes here (Server._probe)
        self.learn = learn          # report the pages we copied (the server asked)
        self.log = server.log

    @staticmethod
    def prepare(server: Server) -> bool:
        """A worker's own set-up, right after the fork; False if the server is gone."""
        os.setsid()     # its own process group: a timeout kills it with its children
        gc.disable()    # one request: a collection would walk (copy) the server's whole heap
        from libinject.linux.privileges import set_pdeathsig

        set_pdeathsig(signal.SIGKILL)     # never outlive the server (nor run unwatched)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        if os.getppid() != server.pid:      # the server died before we got here
            return False
        # Its env is PATH alone, and it keeps what the hook needs, for good: the
        # applier's capabilities, and CAP_SYS_PTRACE to open the container's namespaces
        # (/proc/PID/ns of a non-dumpable process) before it drops to the applier's set.
        os.environ.clear()
        os.environ["PATH"] = SAFE_PATH
        import _prctl

        from libinject.apply.live import caps_kept
        from libinject.linux.privileges import limit_capabilities

        limit_capabilities(caps_kept() | {_prctl.CAP_SYS_PTRACE})
        # It will read an image's data: capped, and what the OOM killer takes rather
        # than the server or a bystander (libinject.runtime.ceiling). Done here, before
        # a spare is handed a request: the hook's own call is then free.
        from libinject.errors import NvhookError
        from libinject.runtime.ceiling import contain

        try:
            contain()
        except NvhookError as e:
            server.log(f"worker {os.getpid()}: {e}")
            return False
        return True

    @staticmethod
    def spare(server: Server, sock: socket.socket) -> int:
        """A spare's life: set up, wait for a request from the server, serve it. The
        server closing its end (it stops) ends it."""
        if not _Worker.prepare(server):
            return INTERNAL
        from libinject.linux.privileges import set_name

        set_name(SPARE_NAME)
        keep = {0, 1, 2, sock.fileno()}     # nothing of the server's, while we wait
        if server.log_fd is not None:
            keep.add(server.log_fd)
        _close_all_but(keep)
        if server.prefaulting and server.prefault_runs:
            # What requests write, copied before one comes, on idle CPU (the server
            # made it so, and undoes it when it hands us a request).
            try:
                sock.send(PREFAULTING, socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT)
            except OSError:     # its end closed: it handed us a request already (or stops)
                pass
            else:
                try:
                    prefault(server.prefault_runs, sock)
                except Exception:  # noqa: BLE001 - only a head start: the request comes all the same
                    pass
        try:
            data, anc, _flags, _ = sock.recvmsg(8, socket.CMSG_SPACE(4 * 4), socket.MSG_CMSG_CLOEXEC)
        except OSError as e:
            if e.errno != errno.ECONNRESET:     # (the server stopping: its end closed)
                server.log(f"spare worker {os.getpid()}: {e}")
            return INTERNAL
        fds: list[int] = []
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += struct.unpack(f"{len(payload) // 4}i", payload[: len(payload) // 4 * 4])
        sock.close()
        if len(data) != 8 or len(fds) != 4:
            return 0                        # the server closed its end: not needed
        set_name(WORKER_NAME)
        conn = socket.socket(fileno=fds[0])
        peer, learn = struct.unpack("ii", data)
        return _Worker(server, conn, peer, fds[1], fds[2], fds[3], bool(learn)).serve()

    def run(self) -> int:
        if not self.prepare(self.server):
            return INTERNAL
        return self.serve()

    def serve(self) -> int:
        """The request on self.conn, from the front's message to its status."""
        before = set(sys.modules)
        self.server.cache.said = {"fingerprint": "", "plan": ""}    # (not the server's warm-up)

        self.conn.settimeout(RECV_TIMEOUT)
        try:
            data, anc, flags, _ = self.conn.recvmsg(MAX_REQUEST + 1, socket.CMSG_SPACE(NFDS * 4),
                                                    socket.MSG_CMSG_CLOEXEC)   # nothing we exec gets them
        except OSError as e:
            self.log(f"request from pid {self.peer}: {e}")
            return INTERNAL
        fds: list[int] = []
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += struct.unpack(f"{len(payload) // 4}i", payload[: len(payload) // 4 * 4])
        req = self._check(data, flags, fds)
        if req is None:
            return 0            # declined: the front falls back to exec'ing Python
        shim = isinstance(req, ShimRequest)
        state = b"" if shim else _read_fd(fds[0])
        for fd in fds:
            os.close(fd)

        # The hook's stdout and stderr go to a memfd sent back to the front; nothing of
        # the server's is left open.
        os.dup2(self.output, 1)
        os.dup2(self.output, 2)
        devnull = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        os.dup2(devnull, 0)
        keep = {0, 1, 2, self.conn.fileno(), self.learned, self.probe}
        if self.server.log_fd is not None:
            keep.add(self.server.log_fd)
        _close_all_but(keep)
        from libinject.runtime import hook

        if self.server.verbose:
            self.log(f"request from pid {self.peer}: {' '.join(req.argv[1:])} cwd={req.cwd} "
                     f"env=[{' '.join(sorted(os.environ))}]")
        try:
            limit = math.ceil(min(self.server.timeout, 86400))     # the front adds its grace
            self.conn.send(ACCEPTED + struct.pack("i", max(1, limit)), socket.MSG_NOSIGNAL)
            if not shim:
                self._prefetch(req)     # while the front answers
            if self.conn.recv(16) != GO:
                return 0        # it fell back (or went away): not ours to do
        except OSError:
            return 0
        head = b""      # what goes before the output in our answer (the shim's runtime)
        try:
            if shim:
                code, head = shim_serve.handle(req)
            elif (args := req.args).command == hook.CDI_HOOK:
                from libinject.runtime import cdi_hooks

                # (no discovery: the host's procfs and the argv are all it reads)
                code = cdi_hooks.handle(args, state, req.cwd, self.peer)
            else:
                code = hook.handle(args.command, state, args, cwd=req.cwd,
                                   discover=self.server.cache.discover, plan=self.server.cache.plan)
        except BaseException as e:  # noqa: BLE001 - a bug: one line for the runtime
            from libinject.errors import report

            report(f"hook service: {type(e).__name__}: {e}")
            code = INTERNAL
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except OSError:
                pass
        reported = 0
        try:        # the front goes on now; what is left of us is only our exit
            out = head + os.pread(1, MAX_OUTPUT - len(head), 0)     # our stdout: the output memfd
            self.conn.send(STATUS + struct.pack("i", code) + out, socket.MSG_NOSIGNAL)
            reported = REPORTED
        except OSError:
            pass        # the server sends it once we are gone
        # What is left of us (the report, our exit: unmapping a copy of the server's
        # address space) runs on CPU the runtime, now going on with the container, does not want.
        _set_idle(0, True)
        self._report(bool(reported))
        if self.server.verbose:
            said = self.server.cache.said
            self.log(f"request from pid {self.peer}: fingerprint {said['fingerprint'] or 'none'}, "
                     f"plan {said['plan'] or 'none'}")
        late = sorted(m for m in set(sys.modules) - before if not m.startswith("encodings."))
        if late:
            self.log(f"warning: imported after fork (add to service.PRELOAD): {', '.join(late)}")
        return (code & 0x7f) | reported

    def _prefetch(self, req: Request) -> None:
        """Read-only work of the request's, done while the front answers b"A": its
        config (kept parsed, libinject.config) and the discovery fingerprint of the
        driver root it names (DriverCache.prefetch), for hook.handle() to use. Nothing
        is written, logged or changed; anything wrong is left for handle() to find and
        report (it does all of this again where this did not). Where handle() would
        take other inputs (it reads no config in a user namespace), the fingerprint
        taken here is not the one it asks for, and goes unused."""
        try:
            from libinject import config as config_mod

            args = req.args
            if args is None or any(v and not v.startswith("/") for v in (args.config, args.root)):
                return      # handle() refuses these
            if args.command != "prestart":
                return      # (the CDI hook discovers nothing)
            config_mod._request_loads = {}      # (this worker's one request)
            cfg = config_mod.load(args.config, {}, trusted=True)
            opts = cfg.discover_options(root=args.root, ldcache=args.ldcache, user=args.user)
            if opts.snapshot:
                probe, self.probe = self.probe, -1      # (DriverCache._probed closes it)
                if (opts.root, opts.ldcache, opts.dev_root) != self.server.probe_inputs:
                    os.close(probe)                     # not what the prober takes
                    probe = -1
                self.server.cache.prefetch(opts.root, opts.ldcache, opts.dev_root, probe)
        except Exception:  # noqa: BLE001 - handle() meets it again and says so
            self.server.cache.ahead = None

    def _report(self, reported: bool) -> None:
        """What the server keeps from this request (it reads it once we are gone): the
        drivers discovered, the plans and the ld.so.cache merge made afresh
        (DriverCache.plan, ldcache_merge.learned), and, once the front has its status
        (reported) and if the server asked (learn), the pages we copied."""
        report: dict[str, list] = {}
        if self.server.cache.new:
            report["drivers"] = self.server.cache.dump_new()
        if self.server.cache.planned:
            report["plans"] = self.server.cache.dump_planned()
        from libinject.apply import ldcache_merge

        merged = ldcache_merge.learned()
        if merged:
            report["ldcache"] = merged
        if reported and self.learn:
            try:
                report["pages"] = copied_pages()
            except OSError as e:
                self.log(f"request from pid {self.peer}: cannot read our pagemap: {e}")
        if report:
            try:
                os.write(self.learned, json.dumps(report).encode())
            except OSError:
                pass

    def _check(self, data: bytes, flags: int, fds: list[int]) -> Request | ShimRequest | None:
        def decline(why: str) -> None:
            self.log(f"request from pid {self.peer}: declined: {why}")
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            return None

        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            return decline("message or fds truncated")
        try:
            req = parse_request(data)
        except (ValueError, UnicodeDecodeError) as e:
            return decline(str(e))
        if isinstance(req, ShimRequest):     # no state: the namespaces only
            if len(fds) != shim_serve.NFDS:
                return decline(f"{len(fds)} fds, expected {shim_serve.NFDS}")
            for fd, name, ours in zip(fds, NAMESPACES, self.server.ns_ids):
                if not _same_ns(fd, name, ours):
                    return decline(f"the peer is not in our {name} namespace")
            why = shim_serve.enter(req)     # (only once the peer is proven ours)
            return decline(why) if why else req
        if len(fds) != NFDS:
            return decline(f"{len(fds)} fds, expected {NFDS}")
        if req.args is None:
            return decline("arguments the hook's parser does not take as they are")
        if req.stage not in SERVED_STAGES:
            return decline(f"stage {req.stage!r} is not served")
        if not stat.S_ISREG(os.fstat(fds[0]).st_mode):
            return decline("state is not a regular file")
        for fd, name, ours in zip(fds[1:], NAMESPACES, self.server.ns_ids):
            if not _same_ns(fd, name, ours):
                return decline(f"the peer is not in our {name} namespace")
        return req


class _Prober:  # pragma: no cover - runs in a forked child (covered by tests/test_hook_serve.py)
    """The server's prober (Server._spawn_prober): for each message [root, ldcache,
    dev_root] with a pipe's write end, writes [those inputs, DriverCache.key(*them)]
    to the pipe, closes it and says b"D". Reads only; runs as a worker does (its
    capabilities, PATH alone), in the server's namespaces, until the server closes
    its end."""

    @staticmethod
    def run(server: Server, sock: socket.socket) -> int:
        if not _Worker.prepare(server):
            return INTERNAL
        from libinject.linux.privileges import set_name

        set_name(PROBER_NAME)
        gc.enable()         # (prepare() turned it off: we live as long as the server)
        keep = {0, 1, 2, sock.fileno()}
        if server.log_fd is not None:
            keep.add(server.log_fd)
        _close_all_but(keep)
        while True:
            try:
                data, anc, _flags, _ = sock.recvmsg(1 << 16, socket.CMSG_SPACE(4), socket.MSG_CMSG_CLOEXEC)
            except OSError:
                return 0
            if not data:
                return 0                    # the server closed its end
            fds: list[int] = []
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds += struct.unpack(f"{len(payload) // 4}i", payload[: len(payload) // 4 * 4])
            try:
                inputs = json.loads(data)
                key = DriverCache.key(*inputs)
                if fds:
                    os.write(fds[0], json.dumps([inputs, list(key)]).encode())
            except Exception:  # noqa: BLE001 - the worker takes its own
                pass
            finally:
                for fd in fds:
                    os.close(fd)
            try:
                sock.send(b"D", socket.MSG_NOSIGNAL)
            except OSError:
                return 0


def _set_idle(pid: int, idle: bool) -> bool:
    """SCHED_IDLE (runs only on a CPU nothing else wants) or back to SCHED_OTHER; False
    if that could not be done (gone: the server reaps it later; not allowed)."""
    try:
        os.sched_setscheduler(pid, os.SCHED_IDLE if idle else os.SCHED_OTHER, os.sched_param(0))
    except OSError:
        return False
    return True


def _same_ns(fd: int, name: str, ours: tuple[int, int] | None = None) -> bool:
    """Is fd our /proc/self/ns/<name> (the same nsfs inode)? ours: its (st_dev, st_ino),
    if known (a worker has the server's, which are its own: it enters no namespace
    before this check)."""
    try:
        a = os.fstat(fd)
        if ours is None:
            b = os.stat(f"/proc/self/ns/{name}")
            ours = (b.st_dev, b.st_ino)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == ours


def _untrusted_peer(conn: socket.socket, pid: int, uid: int,
                    our_mnt: tuple[int, int] | None = None) -> str:
    """Why a connected peer is not the runtime ("" if it is): root, in our own mount
    namespace (our_mnt: its (st_dev, st_ino), if known), and still the process that
    connected (its pidfd, where the kernel has SO_PEERPIDFD; before 6.5 the pid alone)."""
    if uid != 0:
        return "not root"
    if pid <= 0:
        return "in a pid namespace we cannot see"
    pidfd = -1
    try:
        pidfd = struct.unpack("i", conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD, 4))[0]
    except OSError as e:
        if e.errno != errno.ENOPROTOOPT:    # e.g. the peer is gone: its pid may be another's
            return f"no pidfd: {e.strerror}"
    try:
        try:
            theirs = os.stat(f"/proc/{pid}/ns/mnt")
            if our_mnt is None:
                ours = os.stat("/proc/self/ns/mnt")
                our_mnt = (ours.st_dev, ours.st_ino)
        except OSError as e:
            return f"its mount namespace: {e.strerror}"
        if (theirs.st_dev, theirs.st_ino) != our_mnt:
            return "in another mount namespace"
        if pidfd >= 0:
            try:
                signal.pidfd_send_signal(pidfd, 0)
            except OSError:
                return "gone"
        return ""
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def _read_fd(fd: int) -> bytes:
    """The state, at most MAX_STATE_BYTES + 1 bytes (handle() reports "too large")."""
    from libinject.request.oci_state import MAX_STATE_BYTES

    chunks, n, off = [], 0, 0
    while n <= MAX_STATE_BYTES:
        b = os.pread(fd, MAX_STATE_BYTES + 1 - n, off)
        if not b:
            break
        chunks.append(b)
        n += len(b)
        off += len(b)
    return b"".join(chunks)


def _close_all_but(keep: set[int]) -> None:
    from libinject.linux import proc

    keep = keep | {proc.opened()}      # the cached /proc fd stays ours
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
