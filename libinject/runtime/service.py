"""`nvhook serve`: a warm process that runs the OCI hook for the compiled front.

A one-shot hook pays Python's start-up, its imports and a snapshot read on every GPU
container (~100 ms before any work). The server pays them once: it imports everything
the hook needs, keeps discovery results in memory, and forks a worker per request (a
fork of a warm process costs ~1 ms). csrc/hookfront.c hands GPU containers over on a
unix socket and falls back to exec'ing Python when no server answers, so the service
is optional and the hook's behaviour is the same either way: the worker runs
libinject.runtime.hook.handle(), the very function the exec'd Python runs.

Protocol (SOCK_SEQPACKET, one message each way, so no framing):
  front -> server: b"NVHOOK1\\0" then items b"a<argv entry>\\0" and b"e<NAME=value>\\0"
      (only NVHOOK_CONFIG and XDG_CONFIG_HOME: what the exec path honours), with
      SCM_RIGHTS fds [state memfd, stdout, stderr, cwd (O_PATH), root (O_PATH)].
  server -> front: b"A" once the worker would take the request;
  front -> server: b"G": the front is committed (it no longer falls back: the container
      may be partly configured from now on); only then does the worker start. A front
      that gave up waiting for b"A" (5 s) has closed instead, and the worker does nothing.
  server -> front: b"S" + int32 status: the hook's exit status, or CRASHED / TIMED_OUT.
  Anything else (refused peer, malformed request, argv the hook's parser does not take,
  a peer we cannot follow into its namespaces, too many requests): the connection closes
  or b"S" comes without b"A", and the front execs Python as if no server were there.
  (A client in Python, for tests: tests/support/serve_client.py.)

Trust: only uid 0 peers (SO_PEERCRED) are served, on a socket in a root-only dir.
The server never takes env from the container (that is data in config.json) nor from
the runtime beyond the two config entries above; it never runs container code.

The worker becomes the front as far as the hook can tell: it joins the front's
mount and cgroup namespaces (a runtime may run hooks in a private mount namespace,
e.g. runc on cgroup v2 in tests), its root and cwd, and takes its
stdio. Everything is imported before that: after setns the filesystem is the front's.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import stat
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from libinject.constants import CONFIGURE_STAGES, SAFE_PATH
from libinject.errors import NvhookError
from libinject.linux.child import Child

MAGIC = b"NVHOOK1"
MAX_REQUEST = 64 << 10          # argv + two env entries: a few hundred bytes in practice
NFDS = 5                        # state, stdout, stderr, cwd, root
ALLOWED_ENV = ("NVHOOK_CONFIG", "XDG_CONFIG_HOME")
ACCEPTED = b"A"
GO = b"G"
STATUS = b"S"
CRASHED = -1                    # the worker died (signal): the front says so and fails
TIMED_OUT = -2                  # the worker ran past serve-timeout and was killed
MAX_JOBS = 64                   # beyond this, connections are closed: the front falls back
MAX_CACHED = 8                  # driver roots remembered
RECV_TIMEOUT = 5.0              # the front sends its request right after connect()
INTERNAL = 70                   # a worker's own failure (EX_SOFTWARE)

# What the hook (and the children it forks without exec) may import: all of it before
# any worker runs, so no worker ever reads Python from the front's mount namespace.
PRELOAD = (
    "argparse", "ctypes", "dataclasses", "errno", "glob", "grp", "json", "posixpath", "pwd",
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
    "libinject.linux.privileges", "libinject.linux.proc", "libinject.linux.mountinfo",
    "libinject.linux.atomic",
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

@dataclass(frozen=True)
class Request:
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def args(self):
        """The hook's global options and stage (None: not argv the hook takes as is)."""
        from libinject.runtime.hook import parse_argv

        return parse_argv(list(self.argv[1:]))

    @property
    def stage(self) -> str | None:
        args = self.args
        return args.command if args is not None else None


def parse_request(data: bytes) -> Request:
    """The front's message (ValueError if it is not one we serve)."""
    if len(data) > MAX_REQUEST:
        raise ValueError("request too large")
    parts = data.split(b"\0")
    if parts[0] != MAGIC or parts[-1] != b"":
        raise ValueError("not an nvhook request")
    argv: list[str] = []
    env: dict[str, str] = {}
    for item in parts[1:-1]:
        kind, value = item[:1], item[1:].decode()
        if kind == b"a":
            argv.append(value)
        elif kind == b"e":
            name, eq, v = value.partition("=")
            if not eq or name not in ALLOWED_ENV or name in env:
                raise ValueError(f"env entry {name!r} not accepted")
            env[name] = v
        else:
            raise ValueError("unknown item")
    if len(argv) < 2:
        raise ValueError("no command")
    return Request(tuple(argv), env)


# -- discovery, remembered --------------------------------------------------------------

class DriverCache:
    """discover() with an in-memory layer keyed by snapshot's fingerprint of the host,
    taken fresh on every request (~1 ms): a changed host is never served stale data.
    Workers run it in the front's mount namespace; what they learn comes back to the
    server (learned()) so the next fork has it."""

    def __init__(self) -> None:
        self.entries: dict[tuple, Any] = {}
        self.new: list[tuple[tuple, Any]] = []

    def discover(self, root: str = "/", *, ldcache: str | None = None,
                 dev_root: str | None = None, nvml_timeout: float = 10.0,
                 user: tuple[int, int] | None = None, snapshot: bool = True,
                 snapshot_dir: str | None = None):
        from libinject.discover import driver as D

        def fresh():
            return D.discover(root, ldcache=ldcache, dev_root=dev_root, nvml_timeout=nvml_timeout,
                              user=user, snapshot=snapshot, snapshot_dir=snapshot_dir)

        if not snapshot:        # the config asks for no caching of discovery: none here either
            return fresh()
        key = self.key(root, ldcache, dev_root)
        driver = self.entries.get(key)
        if driver is None:
            driver = fresh()
            # Remember it only if the host did not change while discovering (as snapshot.py).
            if self.key(root, ldcache, dev_root) == key:
                self.remember(key, driver)
                self.new.append((key, driver))
        return driver

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

    def dump_new(self) -> bytes:
        import dataclasses

        return json.dumps([[list(k), dataclasses.asdict(d)] for k, d in self.new]).encode()

    def load_new(self, data: bytes) -> int:
        from libinject.discover.snapshot import driver_from_dict

        items = json.loads(data)
        for k, d in items:
            self.remember(tuple(k), driver_from_dict(d))
        return len(items)


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

@dataclass
class _Job:
    child: Child                # the worker: its own process group (ldconfig, NVML with it)
    conn: socket.socket
    learned: int                # memfd the worker writes new discovery results to
    peer: int
    started: float
    deadline: float
    timed_out: bool = False


class Server:
    def __init__(self, path: str, *, timeout: float = 60.0, log_fd: int | None = None,
                 verbose: bool = False) -> None:
        """log_fd: where the server and its workers write one line per event (a dup of
        the service's stderr: a worker's own fd 2 is the front's, the runtime's).
        verbose: workers also log what each request asked for."""
        self.path = os.path.abspath(path)
        self.timeout = timeout
        self.log_fd = log_fd
        self.verbose = verbose
        self.cache = DriverCache()
        self.jobs: dict[int, _Job] = {}          # by the worker's pidfd
        self.sel = selectors.DefaultSelector()
        self.stopping = False
        self.sock: socket.socket | None = None
        self.lock = -1
        self._st: os.stat_result | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def log(self, msg: str) -> None:
        if self.log_fd is None:
            return
        try:
            os.write(self.log_fd, f"nvhook serve[{os.getpid()}]: {msg}\n".encode(errors="replace"))
        except OSError:
            pass

    # lifecycle
    def start(self) -> None:
        preload()
        self.sock, self.lock, self._st = bind(self.path)
        self.sock.setblocking(False)
        self.sel.register(self.sock, selectors.EVENT_READ, "accept")
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        signal.set_wakeup_fd(self._wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        self.log(f"listening on {self.path} (pid {os.getpid()})")

    def warm(self, options) -> None:
        """Discover once in our own namespace (DiscoverOptions), so the first container
        is served warm."""
        try:
            d = options.discover(self.cache.discover)
            self.log(f"warm: driver {d.info.driver_version}, {len(d.info.gpus)} GPUs under {d.root}")
        except NvhookError as e:
            self.log(f"warm: {e} (discovering per request)")
        self.cache.new.clear()

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
                else:
                    self._finish(self.jobs[key.fd])
            self._expire()
        self.close()

    def close(self) -> None:
        self._close_listener()
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

    # requests
    def _next_timeout(self) -> float | None:
        if not self.jobs:
            return None
        return max(0.0, min(j.deadline for j in self.jobs.values()) - time.monotonic())

    def _accept(self) -> None:
        assert self.sock is not None
        try:
            conn, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        pid, uid, _gid = struct.unpack("3i", conn.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if uid != 0 or pid <= 0:
            # pid 0: a peer in a pid namespace we cannot see into; it falls back to exec.
            self.log(f"refused peer pid={pid} uid={uid}")
            conn.close()
            return
        if len(self.jobs) >= MAX_JOBS:
            self.log(f"busy ({len(self.jobs)} requests): peer {pid} falls back")
            conn.close()
            return
        learned = os.memfd_create("nvhook-learned", os.MFD_CLOEXEC)
        sys.stdout.flush()
        sys.stderr.flush()
        worker = os.fork()
        if worker == 0:  # pragma: no cover - runs in the worker
            code = INTERNAL
            try:
                code = _Worker(self, conn, pid, learned).run()
            except BaseException as e:  # noqa: BLE001 - never return into the server's loop
                self.log(f"request from pid {pid}: worker failed: {type(e).__name__}: {e}")
            finally:
                os._exit(code)
        try:
            child = Child(worker, group=True)
        except OSError:                     # pragma: no cover - kernels before 5.3
            os.kill(worker, signal.SIGKILL)
            os.waitpid(worker, 0)           # killed: returns at once
            conn.close()
            os.close(learned)
            return
        now = time.monotonic()
        job = _Job(child, conn, learned, pid, now, now + self.timeout)
        self.jobs[child.pidfd] = job
        self.sel.register(child.pidfd, selectors.EVENT_READ, "job")

    def _expire(self) -> None:
        now = time.monotonic()
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
            try:
                size = os.fstat(job.learned).st_size
                if size:
                    n = self.cache.load_new(os.pread(job.learned, size, 0))
                    self.log(f"learned {n} driver(s) from worker {job.child.pid}")
            except (OSError, ValueError, KeyError, TypeError) as e:
                self.log(f"ignoring worker {job.child.pid}'s discovery results: {e}")
        self._done(job, code)

    def _done(self, job: _Job, code: int) -> None:
        self.sel.unregister(job.child.pidfd)
        del self.jobs[job.child.pidfd]
        job.child.close()
        os.close(job.learned)
        try:
            job.conn.send(STATUS + struct.pack("i", code), socket.MSG_NOSIGNAL)
        except OSError:
            pass
        job.conn.close()
        self.log(f"request from pid {job.peer}: status {code} in "
                 f"{(time.monotonic() - job.started) * 1000:.1f} ms")


# -- the worker ------------------------------------------------------------------------------

class _Worker:  # pragma: no cover - runs in a forked child (covered by tests/test_hook_serve.py)
    def __init__(self, server: Server, conn: socket.socket, peer: int, learned: int) -> None:
        self.server, self.conn, self.peer, self.learned = server, conn, peer, learned
        self.log = server.log

    def run(self) -> int:
        os.setsid()     # its own process group: a timeout kills it with its children
        import prctl

        prctl.set_pdeathsig(signal.SIGKILL)     # never outlive the server (nor run unwatched)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        if os.getppid() == 1:
            return INTERNAL
        before = set(sys.modules)

        self.conn.settimeout(RECV_TIMEOUT)
        try:
            data, anc, flags, _ = self.conn.recvmsg(MAX_REQUEST + 1, socket.CMSG_SPACE(NFDS * 4))
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
        state_fd, out_fd, err_fd, cwd_fd, root_fd = fds
        state = _read_fd(state_fd)
        # Open the front's namespaces through our /proc while its pid still names it:
        # the front waits on this connection, so a hang-up afterwards means it is gone.
        try:
            mnt = os.open(f"/proc/{self.peer}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
            cg = os.open(f"/proc/{self.peer}/ns/cgroup", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            self.log(f"request from pid {self.peer}: its namespaces: {e.strerror}")
            return 0
        if _hung_up(self.conn):
            return 0
        mnt_st = os.fstat(mnt)

        # Become the front: its stdio, only the two config entries for env, then its
        # namespaces, root and cwd. Nothing of the server's is left open.
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        devnull = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        os.dup2(devnull, 0)
        keep = {0, 1, 2, self.conn.fileno(), self.learned, mnt, cg, cwd_fd, root_fd}
        if self.server.log_fd is not None:
            keep.add(self.server.log_fd)
        _close_all_but(keep)
        os.environ.clear()
        os.environ.update({"PATH": SAFE_PATH, **req.env})
        from libinject.linux import native

        try:
            native.setns(cg, native.CLONE_NEWCGROUP)
            native.setns(mnt, native.CLONE_NEWNS)
            os.fchdir(root_fd)
            os.chroot(".")
            os.fchdir(cwd_fd)
        except OSError as e:
            # Nothing done yet: let the front do it itself.
            self.log(f"request from pid {self.peer}: cannot enter its namespaces: {e}")
            return 0
        for fd in (mnt, cg, cwd_fd, root_fd):
            os.close(fd)
        try:
            cwd: str | None = os.getcwd()
        except OSError:
            cwd = None
        own_pid = None
        if req.stage == "createContainer":
            # The exec path stands its own pid (/proc/self) in for the container; ours is
            # the front's pid as our /proc counts it. Serve only if the /proc here counts
            # alike (it names the same process); else the front does it itself.
            try:
                st = os.stat(f"/proc/{self.peer}/ns/mnt")
                if (st.st_dev, st.st_ino) != (mnt_st.st_dev, mnt_st.st_ino):
                    return 0
            except OSError:
                return 0
            own_pid = self.peer

        from libinject.runtime import hook

        if self.server.verbose:
            self.log(f"request from pid {self.peer}: {' '.join(req.argv[1:])} cwd={cwd} "
                     f"env=[{' '.join(sorted(os.environ))}]")
        try:
            self.conn.send(ACCEPTED, socket.MSG_NOSIGNAL)
            if self.conn.recv(16) != GO:
                return 0        # it fell back (or went away): not ours to do
        except OSError:
            return 0
        try:
            code = hook.handle(req.stage, state, req.args, cwd=cwd, own_pid=own_pid,
                               discover=self.server.cache.discover)
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
        if self.server.cache.new:
            try:
                os.write(self.learned, self.server.cache.dump_new())
            except OSError:
                pass
        late = sorted(m for m in set(sys.modules) - before if not m.startswith("encodings."))
        if late:
            self.log(f"warning: imported after fork (add to hookserver.PRELOAD): {', '.join(late)}")
        return code

    def _check(self, data: bytes, flags: int, fds: list[int]) -> Request | None:
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
        if len(fds) != NFDS:
            return decline(f"{len(fds)} fds, expected {NFDS}")
        try:
            req = parse_request(data)
        except (ValueError, UnicodeDecodeError) as e:
            return decline(str(e))
        if req.args is None:
            return decline("arguments the hook's parser does not take as they are")
        if req.stage not in CONFIGURE_STAGES:
            return decline(f"stage {req.stage!r} is not served")
        st = os.fstat(fds[0])
        if not stat.S_ISREG(st.st_mode):
            return decline("state is not a regular file")
        for fd in fds[3:]:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                return decline("cwd/root is not a directory")
        return req


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


def _hung_up(conn: socket.socket) -> bool:
    import select

    p = select.poll()
    p.register(conn.fileno(), select.POLLIN | select.POLLRDHUP)
    return bool(p.poll(0))


def _close_all_but(keep: set[int]) -> None:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
