"""A request's worker: a fork of the server (or a spare, forked before its request came)
that reads the front's message, proves the peer, answers b"A", waits for b"G", runs the
hook (or the shim's create) and sends b"S" itself; then reports what the server keeps
(the drivers, plans and ld.so.cache merges it made afresh, the pages it copied)."""
from __future__ import annotations

import errno
import gc
import json
import math
import os
import signal
import socket
import stat
import struct
import sys

from libinject.constants import SAFE_PATH
from libinject.runtime.serve import shim as shim_serve
from libinject.runtime.serve.children import _close_all_but, _set_idle
from libinject.runtime.serve.peer import _same_ns
from libinject.runtime.serve.prefault import PREFAULTING, copied_pages, prefault
from libinject.runtime.serve.protocol import (
    ACCEPTED, GO, MAX_OUTPUT, MAX_REQUEST, NAMESPACES, NFDS, RECV_TIMEOUT, SERVED_STAGES, STATUS,
    Request, _read_fd, parse_request, received_fds)
from libinject.runtime.serve.shim import ShimRequest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from libinject.runtime.serve.children import Parent   # the server, as its children see it

INTERNAL = 70                   # a worker's own failure (EX_SOFTWARE)
SPARE_NAME = "nvhook-spare"     # what ps shows of a spare worker, until it takes a request
WORKER_NAME = "nvhook-worker"
REPORTED = 0x80                 # in a worker's exit status: it sent b"S" itself (hook codes < 128)
# Exit statuses of a worker that ran nothing (the server logs these, not a status: the
# front ran the start itself); a hook's own code that is one of them is sent as INTERNAL.
DECLINED = 0x7d                 # the request was refused (the worker logged why)
ABANDONED = 0x7e                # the front went away (gave up waiting) before committing
NOT_RUN = (DECLINED, ABANDONED)


class _Worker:  # pragma: no cover - runs in a forked child (covered by tests/test_hook_serve.py)
    def __init__(self, server: Parent, conn: socket.socket, peer: int, learned: int,
                 output: int, probe: int, learn: bool = False) -> None:
        self.server, self.conn, self.peer = server, conn, peer
        self.learned, self.output = learned, output
        self.probe = probe          # the prober's fingerprint comes here (Server._probe)
        self.learn = learn          # report the pages we copied (the server asked)
        self.log = server.log

    @staticmethod
    def prepare(server: Parent) -> bool:
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
        # (/proc/PID/ns of a non-dumpable process) before it drops to the applier's set,
        # and CAP_MKNOD for load-kmods' missing driver nodes (libinject.linux.devnodes),
        # made before that drop too.
        os.environ.clear()
        os.environ["PATH"] = SAFE_PATH
        import _prctl

        from libinject.apply.live import caps_kept
        from libinject.linux.privileges import limit_capabilities

        limit_capabilities(caps_kept() | {_prctl.CAP_SYS_PTRACE, _prctl.CAP_MKNOD})
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
    def spare(server: Parent, sock: socket.socket) -> int:
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
        fds = received_fds(anc)
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
        except TimeoutError:
            return ABANDONED    # (the front gives up as soon, and so did not send it)
        except OSError as e:
            self.log(f"request from pid {self.peer}: {e}")
            return INTERNAL
        fds = received_fds(anc)
        if not data and not fds:
            return ABANDONED    # it closed before sending its request
        req = self._check(data, flags, fds)
        if req is None:
            return DECLINED     # the front falls back to exec'ing Python
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
                return ABANDONED    # it fell back (or went away): not ours to do
        except OSError:
            return ABANDONED
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
            self.log(f"warning: imported after fork (add to serve.preload.PRELOAD): {', '.join(late)}")
        code &= 0x7f
        return (INTERNAL if code in NOT_RUN else code) | reported

    def _prefetch(self, req: Request) -> None:
        """Read-only work of the request's, done while the front answers b"A": its
        config (kept parsed, libinject.config) and the discovery fingerprint of the
        driver root it names (DriverCache.prefetch), for hook.handle() to use. Nothing
        is written, logged or changed; anything wrong is left for handle() to find and
        report (it does all of this again where this did not). Where handle() would
        take other inputs (in a user namespace it reads the config with that
        namespace's owners), the fingerprint taken here is not the one it asks for,
        and goes unused."""
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
