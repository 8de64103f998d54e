"""`nvhook serve`'s loop: it accepts peers, hands each request to a spare (or a worker
forked for it), keeps what workers learned (discovery, plans, ld.so.cache merges, the
pages spares pre-fault), and keeps its children: the spare, the prober, the workers in
flight (their deadlines) and the killed ones not yet reaped.

One class: its state is the loop's (one selector, the children it watches), and every
method reads and writes it; the roles it hands work to have their own modules.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import sys
import time

from libinject.errors import NvhookError
from libinject.linux.child import Child
from libinject.linux.privileges import cap_last_cap
from libinject.log import escape
from libinject.record import record
from libinject.runtime.serve.children import _set_idle
from libinject.runtime.serve.driver_cache import PLANS_PER_REPORT, DriverCache
from libinject.runtime.serve.listen import bind
from libinject.runtime.serve.peer import _untrusted_peer
from libinject.runtime.serve.prefault import (
    LEARN_EVERY, LEARN_FIRST, MAX_PREFAULT, MAX_USER_PAGE, PREFAULTING, _as_runs, populate_write_works)
from libinject.runtime.serve.preload import preload
from libinject.runtime.serve.prober import _Prober
from libinject.runtime.serve.protocol import CRASHED, HELLO, MAX_OUTPUT, NAMESPACES, STATUS, TIMED_OUT
from libinject.runtime.serve.worker import ABANDONED, INTERNAL, NOT_RUN, REPORTED, _Worker

MAX_JOBS = 64                   # beyond this, connections are closed: the front falls back
MAX_REPORT = 4 << 20            # bytes of a worker's report read (an ld.so.cache in base64, pages)
PROBER_BACKOFF = 60.0           # s without a prober after one was stuck (a wedged driver)
REDISCOVER_BACKOFF = 30.0       # s before the server tries again a rediscovery that failed
PROBE_STUCK = 10.0              # s a probe may take before the prober is replaced
DYING_POLL = 1.0                # s between tries to reap a killed child whose exit we cannot wait for
# s from a lone request's worker's exit to the next spare's fork. The fork costs the
# server 1-2.5 ms of CPU (this 2-core VM, a 21 MB server); at once, it took that from
# the runtime finishing the very start (what runc run adds: 0.3-4.8 ms more, four paired
# bench/ab_served.py runs). Shorter than a runtime takes from one start's hook to the
# next (a shim's create to its container's hook: 27-35 ms here).
SPARE_AFTER = 0.01


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
        self.spare_due: float | None = None      # when to fork it (_finish), if pending
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
            # (escaped: a request's paths and errors may carry a container's values)
            os.write(self.log_fd, f"nvhook serve[{os.getpid()}]: {escape(msg)}\n".encode(errors="replace"))
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
        if self.spare_due is not None:
            deadlines.append(self.spare_due)
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
        except OSError as e:
            self.log(f"request from pid {pid}: abandoned: the front was gone before our hello "
                     f"({e.strerror}); it ran the start itself")
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
        if len(self.jobs) > 1:
            # A burst: the next request may well come before this one ends. A lone
            # start's spare is forked once its worker is gone (_finish): forked now, the
            # server's fork would take a CPU from the worker, the prober or the runtime
            # (2 CPUs: a served worker's wall 0.5-5.5 ms longer, bench/ab_served.py).
            self._spawn_spare()
        else:
            self.spare_due = None       # (one due from an earlier request: after this one)

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
    # Forked at start, SPARE_AFTER after a request's worker is gone (_finish), and at
    # once when a request comes while another is in flight (_accept).
    def _spawn_spare(self) -> None:
        self.spare_due = None
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
        if self.spare_due is not None and now >= self.spare_due:
            self._spawn_spare()
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
        if self.jobs:
            self._spawn_spare()     # a burst: at once (none if one is there, or we stop)
        elif self.spare is None and not self.stopping:
            # Not at once: the runtime is finishing the start this worker served
            self.spare_due = time.monotonic() + SPARE_AFTER

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
        """The job is over: the front gets its status (unless the worker sent it, or ran
        nothing: the front then runs the start itself) and the log says which."""
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
        ran = job.reported or code not in NOT_RUN
        if ran and not job.reported:
            try:
                job.conn.send(STATUS + struct.pack("i", code) + out, socket.MSG_NOSIGNAL)
            except OSError:
                pass
        job.conn.close()
        ms = (time.monotonic() - job.started) * 1000
        if ran:
            self.log(f"request from pid {job.peer}: status {code} in {ms:.1f} ms")
        elif code == ABANDONED:
            # Never "status 0": nothing was done here (README: troubleshooting)
            self.log(f"request from pid {job.peer}: abandoned: the front gave up after {ms:.0f} ms, "
                     f"before committing, and ran the start itself; nothing done here")
        else:
            self.log(f"request from pid {job.peer}: declined after {ms:.0f} ms; the front ran the start itself")
