"""A Python client of `nvhook serve`, doing what csrc/hookfront.c does (protocol:
libinject/runtime/serve/protocol.py's docstring)."""
from __future__ import annotations

import os
import socket
import struct

from libinject.runtime.serve.protocol import ACCEPTED, CRASHED, GO, HELLO, MAGIC, NAMESPACES, STATUS


def encode_request(argv: list[str], cwd: str | None = "/") -> bytes:
    """What hookfront.c sends."""
    out = [MAGIC]
    out += [b"a" + a.encode() for a in argv]
    if cwd is not None:
        out.append(b"c" + cwd.encode())
    return b"\0".join(out) + b"\0"


def own_ns_fds() -> list[int]:
    return [os.open(f"/proc/self/ns/{n}", os.O_RDONLY | os.O_CLOEXEC) for n in NAMESPACES]


def hello(s: socket.socket) -> bool:
    """Read the service's hello; True if its namespace fds are ours (what the front checks)."""
    data, anc, flags, _ = s.recvmsg(16, socket.CMSG_SPACE(8 * 4))
    fds = [f for level, kind, p in anc if (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS)
           for f in struct.unpack(f"{len(p) // 4}i", p[:len(p) // 4 * 4])]
    try:
        same = [os.fstat(f)[1:3] == os.stat(f"/proc/self/ns/{n}")[1:3] for f, n in zip(fds, NAMESPACES)]
        return data == HELLO and len(fds) == len(NAMESPACES) and all(same)
    finally:
        for f in fds:
            os.close(f)


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
            if not hello(s):
                return None
            ns = own_ns_fds()
            try:
                s.sendmsg([encode_request(argv, cwd)],
                          [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", mfd, *ns))])
            finally:
                for f in ns:
                    os.close(f)
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
