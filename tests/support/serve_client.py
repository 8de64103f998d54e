"""A Python client of `nvhook serve`, doing what csrc/hookfront.c does (protocol:
libinject/runtime/service.py's docstring)."""
from __future__ import annotations

import os
import socket
import struct

from libinject.runtime.service import ACCEPTED, CRASHED, GO, MAGIC, STATUS


def encode_request(argv: list[str], cwd: str | None = "/") -> bytes:
    """What hookfront.c sends."""
    out = [MAGIC]
    out += [b"a" + a.encode() for a in argv]
    if cwd is not None:
        out.append(b"c" + cwd.encode())
    return b"\0".join(out) + b"\0"


def call(path: str, argv: list[str], state: bytes, cwd: str = "/",
         output: list[bytes] | None = None) -> int | None:
    """Hand a hook request to the server at path. Returns the status, or None when the
    front would fall back to exec'ing Python; what the hook wrote goes to `output`."""
    mfd = os.memfd_create("nvhook-state", os.MFD_CLOEXEC)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        os.write(mfd, state)
        try:
            s.settimeout(5.0)           # as hookfront.c's SERVE_WAIT_S
            s.connect(path)
            s.sendmsg([encode_request(argv, cwd)],
                      [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", mfd))])
            first = s.recv(16)
        except OSError:
            return None
        if len(first) != 5 or first[:1] != ACCEPTED:
            return None
        try:
            s.send(GO)
        except OSError:
            return None
        s.settimeout(struct.unpack("i", first[1:])[0] + 30)   # the server's timeout + grace
        last = s.recv(1 << 16)
        if len(last) < 5 or last[:1] != STATUS:
            return CRASHED
        if output is not None:
            output.append(last[5:])
        return struct.unpack("i", last[1:5])[0]
    finally:
        s.close()
        os.close(mfd)
