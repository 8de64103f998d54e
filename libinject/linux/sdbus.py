"""A minimal D-Bus client for systemd's private socket (/run/systemd/private): the two
manager calls nvhook makes (GetUnitByPID, SetUnitProperties), with a deadline.

Why not busctl/systemctl: a process spawn on every GPU container start costs more than
the whole exchange, and busctl talks through dbus-daemon, which a node may not run.
The private socket is a direct (peer-to-peer) connection to PID 1: no Hello, no bus
names. The peer is authenticated by the kernel (SO_PEERCRED): uid 0 and pid 1 *in our
pid namespace*, so a socket planted at the path by anyone else is refused, and pids we
send mean to systemd what they mean to us.

Only what these calls need of the wire format (little- or big-endian replies; basic
types, arrays, structs, variants in what we send).
"""
from __future__ import annotations

import os
import socket
import struct
import time

from libinject.errors import NvhookError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

PRIVATE = "/run/systemd/private"
MANAGER_PATH = "/org/freedesktop/systemd1"
MANAGER = "org.freedesktop.systemd1.Manager"
MAX_MESSAGE = 1 << 20      # our replies are an object path or an error line
_METHOD_CALL, _METHOD_RETURN, _ERROR = 1, 2, 3
_F_PATH, _F_INTERFACE, _F_MEMBER, _F_ERROR_NAME, _F_REPLY_SERIAL, _F_SIGNATURE = 1, 2, 3, 4, 5, 8


class BusError(NvhookError):
    """systemd answered with a D-Bus error (name: e.g. org.freedesktop.systemd1.NoSuchUnit)."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}" if message else name)
        self.name = name


# -- marshalling (what we send: little-endian) -------------------------------------------
class _Writer:
    def __init__(self) -> None:
        self.buf = bytearray()

    def align(self, n: int) -> None:
        self.buf += b"\0" * (-len(self.buf) % n)

    def byte(self, v: int) -> None:
        self.buf.append(v)

    def u32(self, v: int) -> None:
        self.align(4)
        self.buf += struct.pack("<I", v)

    def string(self, v: str) -> None:      # s, o
        data = v.encode()
        self.u32(len(data))
        self.buf += data + b"\0"

    def signature(self, v: str) -> None:   # g
        data = v.encode()
        self.buf += bytes([len(data)]) + data + b"\0"

    def array(self, elem_align: int, write_items: Callable[[], None]) -> None:
        self.u32(0)
        at = len(self.buf) - 4
        self.align(elem_align)       # the length does not count this padding
        start = len(self.buf)
        write_items()
        struct.pack_into("<I", self.buf, at, len(self.buf) - start)


def _header_field(w: _Writer, code: int, sig: str, value: str | int) -> None:
    w.align(8)
    w.byte(code)
    w.signature(sig)
    if sig == "u":
        w.u32(int(value))
    elif sig == "g":
        w.signature(str(value))
    else:
        w.string(str(value))


def _message(serial: int, path: str, interface: str, member: str, sig: str, body: bytes) -> bytes:
    w = _Writer()
    w.buf += b"l" + bytes([_METHOD_CALL, 0, 1])
    w.u32(len(body))
    w.u32(serial)

    def fields() -> None:
        _header_field(w, _F_PATH, "o", path)
        _header_field(w, _F_INTERFACE, "s", interface)
        _header_field(w, _F_MEMBER, "s", member)
        if sig:
            _header_field(w, _F_SIGNATURE, "g", sig)

    w.array(8, fields)
    w.align(8)
    return bytes(w.buf) + body


# -- unmarshalling (replies) ---------------------------------------------------------------
class _Reader:
    def __init__(self, data: bytes, endian: str) -> None:
        self.data, self.pos, self.e = data, 0, endian

    def align(self, n: int) -> None:
        self.pos += -self.pos % n

    def _take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise NvhookError("systemd: truncated D-Bus message")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def byte(self) -> int:
        return self._take(1)[0]

    def u32(self) -> int:
        self.align(4)
        return struct.unpack(self.e + "I", self._take(4))[0]

    def string(self) -> str:
        n = self.u32()
        s = self._take(n + 1)[:-1]
        return s.decode(errors="replace")

    def signature(self) -> str:
        n = self.byte()
        return self._take(n + 1)[:-1].decode(errors="replace")

    def basic(self, sig: str) -> str | int:
        """One value of a basic type we may meet in a header field."""
        if sig in ("s", "o"):
            return self.string()
        if sig == "g":
            return self.signature()
        if sig in ("u", "i"):
            return self.u32()
        if sig == "y":
            return self.byte()
        raise NvhookError(f"systemd: unexpected D-Bus header type {sig!r}")


def _parse(data: bytes) -> tuple[int, dict[int, str | int], _Reader]:
    """(message type, header fields, a reader at the body's start) of one whole message."""
    endian = {ord("l"): "<", ord("B"): ">"}.get(data[0])
    if endian is None:
        raise NvhookError("systemd: bad D-Bus message")
    r = _Reader(data, endian)
    r.pos = 12
    end = r.u32() + 16
    fields: dict[int, str | int] = {}
    while r.pos < end:
        r.align(8)
        code = r.byte()
        fields[code] = r.basic(r.signature())
    r.align(8)
    body = _Reader(data[r.pos:], endian)
    return data[1], fields, body


# -- the connection ------------------------------------------------------------------------
class Systemd:
    """A connection to systemd (PID 1 of this pid namespace); every call before `deadline`
    (time.monotonic()), else NvhookError."""

    def __init__(self, deadline: float, path: str = PRIVATE) -> None:
        self.deadline = deadline
        self.serial = 0
        self.inbuf = b""
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self._timeout()
            try:
                self.sock.connect(path)
            except OSError as e:
                raise NvhookError(f"cannot connect to {path}: {e.strerror or e}") from None
            pid, uid, _gid = struct.unpack(
                "3i", self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
            if uid != 0 or pid != 1:
                raise NvhookError(f"{path}: its peer is pid {pid} uid {uid} here, not PID 1 (root) of "
                                  "this pid namespace")
            self._auth()
        except BaseException:
            self.sock.close()
            raise

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "Systemd":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _timeout(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise NvhookError("systemd did not answer in time")
        self.sock.settimeout(left)

    def _send(self, data: bytes) -> None:
        self._timeout()
        try:
            self.sock.sendall(data)
        except TimeoutError:
            raise NvhookError("systemd did not answer in time") from None

    def _recv_more(self) -> None:
        self._timeout()
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            raise NvhookError("systemd did not answer in time") from None
        if not chunk:
            raise NvhookError("systemd closed the connection")
        self.inbuf += chunk
        if len(self.inbuf) > MAX_MESSAGE:
            raise NvhookError("systemd: reply too large")

    def _line(self) -> bytes:
        while b"\r\n" not in self.inbuf:
            self._recv_more()
        line, self.inbuf = self.inbuf.split(b"\r\n", 1)
        return line

    def _auth(self) -> None:
        # BEGIN in the same write as AUTH, as sd-bus's own client sends it: systemd 252's
        # server leaves a message that arrives in one read with BEGIN unprocessed until
        # more input comes, so the first call must follow systemd's OK.
        self._send(b"\0AUTH EXTERNAL " + str(os.geteuid()).encode().hex().encode() + b"\r\nBEGIN\r\n")
        if not self._line().startswith(b"OK "):
            raise NvhookError("systemd refused the connection")

    def _message(self) -> bytes:
        while len(self.inbuf) < 16:
            self._recv_more()
        endian = {ord("l"): "<", ord("B"): ">"}.get(self.inbuf[0])
        if endian is None:
            raise NvhookError("systemd: bad D-Bus message")
        body_len, _serial, fields_len = struct.unpack(endian + "III", self.inbuf[4:16])
        total = 16 + fields_len + (-(16 + fields_len) % 8) + body_len
        if total > MAX_MESSAGE:
            raise NvhookError("systemd: reply too large")
        while len(self.inbuf) < total:
            self._recv_more()
        msg, self.inbuf = self.inbuf[:total], self.inbuf[total:]
        return msg

    def call(self, member: str, sig: str, body: bytes, path: str = MANAGER_PATH,
             interface: str = MANAGER) -> tuple[str, _Reader]:
        """Call member; (the reply's signature, a reader of its body). BusError on an error reply."""
        self.serial += 1
        self._send(_message(self.serial, path, interface, member, sig, body))
        while True:
            kind, fields, body_reader = _parse(self._message())
            if fields.get(_F_REPLY_SERIAL) != self.serial:
                continue          # a signal or anything else not ours
            rsig = str(fields.get(_F_SIGNATURE, ""))
            if kind == _ERROR:
                text = body_reader.string() if rsig.startswith("s") else ""
                raise BusError(str(fields.get(_F_ERROR_NAME, "error")), text)
            if kind == _METHOD_RETURN:
                return rsig, body_reader

    # -- the manager's calls ------------------------------------------------------------
    def unit_by_pid(self, pid: int) -> str:
        """The object path of the unit holding pid, as systemd itself tells from its cgroup."""
        w = _Writer()
        w.u32(pid)
        sig, r = self.call("GetUnitByPID", "u", bytes(w.buf))
        if sig != "o":
            raise NvhookError(f"systemd: GetUnitByPID answered {sig!r}")
        return r.string()

    def allow_devices(self, unit: str, entries: list[tuple[str, str]]) -> None:
        """DeviceAllow=(path, access) entries added to unit, runtime only (an empty list
        would reset the unit's list: refused here)."""
        if not entries:
            raise NvhookError("no DeviceAllow entries")
        w = _Writer()
        w.string(unit)
        w.u32(1)                                   # runtime: gone at reboot, with a transient unit

        def props() -> None:
            w.align(8)
            w.string("DeviceAllow")
            w.signature("a(ss)")

            def items() -> None:
                for path, access in entries:
                    w.align(8)
                    w.string(path)
                    w.string(access)

            w.array(8, items)

        w.array(8, props)
        self.call("SetUnitProperties", "sba(sv)", bytes(w.buf))


def unit_object_path(unit: str) -> str:
    """systemd's object path of a unit (bus_label_escape: all but [A-Za-z0-9], and a
    leading digit, as _XX)."""
    out = []
    for i, b in enumerate(unit.encode()):
        c = chr(b)
        if c.isascii() and (c.isalpha() or (i > 0 and c.isdigit())):
            out.append(c)
        else:
            out.append(f"_{b:02x}")
    return f"{MANAGER_PATH}/unit/{''.join(out)}"
