"""The wire format of `nvhook serve` (the fronts' side: csrc/serveclient.h), and the
request parsed from it.

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
      that gave up waiting for b"A" (5 s in all since it connected) has closed instead,
      and the worker does nothing (worker.ABANDONED: the server logs it so, no status).
  worker or server -> front: b"S" + int32 status + what the hook wrote to stdout/stderr
      (at most MAX_OUTPUT bytes): the hook's exit status, sent by the worker itself as
      soon as the hook is done (the front need not wait for it to exit and be reaped),
      or, from the server, CRASHED / TIMED_OUT (or a status the worker could not send). The front writes
      the text to its own stderr, so the runtime's pipes never leave the front: a wedged
      service can delay a container start by SERVE_WAIT_S at most, never hold it.
  The runtime shim's front (csrc/shimfront.c) sends its `create` the same way, as
      b"NVSHIM1\0" and its own items with SCM_RIGHTS [its mount ns, its pid ns]; the
      worker rewrites the bundle (libinject.runtime.serve.shim) and its b"S" carries the
      runtime for the front to exec.
  Anything else (refused peer, malformed request, argv the hook's parser does not take,
  too many requests): the connection closes or b"S" comes without b"A", and the front
  execs Python as if no server were there. (A client in Python, for tests:
  tests/support/serve_client.py.)
"""
from __future__ import annotations

import os
import socket
import struct

from libinject.record import record
from libinject.runtime.serve import shim as shim_serve
from libinject.runtime.serve.shim import ShimRequest

MAGIC = b"NVHOOK2"
MAX_REQUEST = 64 << 10          # argv + cwd: a few hundred bytes in practice
MAX_OUTPUT = (16 << 10) - 5     # the hook's output sent back (hookfront.c MAX_REPLY)
NFDS = 3                        # the state memfd, the front's mount and pid namespaces
NAMESPACES = ("mnt", "pid")     # what both sides prove they share
SERVED_STAGES = ("prestart", "cdi-hook createRuntime")    # (libinject.runtime.hook.served_stage)
HELLO = b"H"
ACCEPTED = b"A"
GO = b"G"
STATUS = b"S"
CRASHED = -1                    # the worker died (signal): the front says so and fails
TIMED_OUT = -2                  # the worker ran past serve-timeout and was killed
RECV_TIMEOUT = 5.0              # the front sends its request right after connect()


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
    runtime shim's create (libinject.runtime.serve.shim)."""
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


def received_fds(ancdata: list) -> list[int]:
    """The fds a recvmsg's ancillary data carried (SCM_RIGHTS), in order."""
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += struct.unpack(f"{len(payload) // 4}i", payload[: len(payload) // 4 * 4])
    return fds


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
