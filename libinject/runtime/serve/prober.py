"""The server's prober: a long-lived child that takes each request's discovery
fingerprint (DriverCache.key) on another CPU while the worker reads the request
(the why: libinject.runtime.serve.driver_cache)."""
from __future__ import annotations

import gc
import json
import os
import socket

from libinject.runtime.serve.children import _close_all_but
from libinject.runtime.serve.driver_cache import DriverCache
from libinject.runtime.serve.protocol import received_fds
from libinject.runtime.serve.worker import INTERNAL, _Worker

TYPE_CHECKING = False
if TYPE_CHECKING:
    from libinject.runtime.serve.children import Parent   # the server, as its children see it

PROBER_NAME = "nvhook-prober"


class _Prober:  # pragma: no cover - runs in a forked child (covered by tests/test_hook_serve.py)
    """The server's prober (Server._spawn_prober): for each message [root, ldcache,
    dev_root] with a pipe's write end, writes [those inputs, DriverCache.key(*them)]
    to the pipe, closes it and says b"D". Reads only; runs as a worker does (its
    capabilities, PATH alone), in the server's namespaces, until the server closes
    its end."""

    @staticmethod
    def run(server: Parent, sock: socket.socket) -> int:
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
            fds = received_fds(anc)
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
