"""A Python client of `nvhook serve`, doing what csrc/hookfront.c does (protocol:
libinject/runtime/service.py's docstring)."""
from __future__ import annotations

import os
import socket
import struct

from libinject.runtime.service import ACCEPTED, CRASHED, GO, MAGIC, NFDS, STATUS


def encode_request(argv: list[str], env: dict[str, str]) -> bytes:
    """What hookfront.c sends."""
    out = [MAGIC]
    out += [b"a" + a.encode() for a in argv]
    out += [b"e" + f"{k}={v}".encode() for k, v in env.items()]
    return b"\0".join(out) + b"\0"

def call(path: str, argv: list[str], state: bytes, env: dict[str, str] | None = None,
         stdout: int = 1, stderr: int = 2, cwd: str = "/") -> int | None:
    """Do what hookfront.c does: hand a hook request to the server at path. Returns the
    status, or None when the front would fall back to exec'ing Python."""
    mfd = os.memfd_create("nvhook-state", os.MFD_CLOEXEC)
    cfd = os.open(cwd, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    rfd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        os.write(mfd, state)
        try:
            s.settimeout(5.0)           # as hookfront.c's SERVE_WAIT_S
            s.connect(path)
            s.sendmsg([encode_request(argv, env or {})],
                      [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                        struct.pack(f"{NFDS}i", mfd, stdout, stderr, cfd, rfd))])
            first = s.recv(16)
        except OSError:
            return None
        if first != ACCEPTED:
            return None
        try:
            s.send(GO)
        except OSError:
            return None
        s.settimeout(120)          # past serve-timeout (60 s): a server that never answers fails
        last = s.recv(16)
        if len(last) != 5 or last[:1] != STATUS:
            return CRASHED
        return struct.unpack("i", last[1:])[0]
    finally:
        s.close()
        for fd in (mfd, cfd, rfd):
            os.close(fd)
