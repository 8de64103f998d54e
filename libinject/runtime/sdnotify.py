"""sd_notify(3) for `nvhook serve`: systemd's readiness protocol (Type=notify), with
the standard library only (no libsystemd, no python-systemd).

The service manager passes NOTIFY_SOCKET: a unix datagram socket, as a path ("/run/...")
or an abstract name spelled with a leading "@". A notification is one datagram of
newline-separated VAR=value lines (READY=1, STOPPING=1, STATUS=...); the kernel
attaches our credentials, and with NotifyAccess=main systemd takes it only from the
unit's main pid. NOTIFY_SOCKET unset: nothing is sent (not started by systemd). Other
forms (vsock:...) are not supported: nothing is sent either, and why() says so.
"""
from __future__ import annotations

import os
import socket

ENV = "NOTIFY_SOCKET"
SUN_PATH = 108          # sizeof(sockaddr_un.sun_path)
SEND_TIMEOUT = 2.0      # a manager whose queue is full must not hold the service


def address(value: str | None) -> bytes | None:
    """The sockaddr_un path NOTIFY_SOCKET's value names, or None (unset, or not a unix
    socket we can address)."""
    if not value:
        return None
    raw = os.fsencode(value)
    if raw[:1] == b"@":         # abstract: a leading NUL, every byte counts
        raw = b"\0" + raw[1:]
        return raw if len(raw) <= SUN_PATH else None
    if raw[:1] != b"/" or b"\0" in raw or len(raw) >= SUN_PATH:
        return None
    return raw


class Notifier:
    """Sends notifications to one address (None: sends nothing); log(msg) is told when
    one cannot be sent. Never raises: a manager that went away must not stop the service."""

    def __init__(self, addr: bytes | None, log=None, value: str | None = None) -> None:
        self.addr = addr
        self.log = log
        self.value = value      # NOTIFY_SOCKET as given (for messages)

    @classmethod
    def from_environ(cls, log=None, environ=None) -> Notifier:
        """From $NOTIFY_SOCKET, which is taken out of the environment: nothing we start
        (workers, ldconfig, the NVML child) may notify in our name."""
        env = os.environ if environ is None else environ
        value = env.pop(ENV, None)
        return cls(address(value), log, value)

    def why(self) -> str:
        """Why nothing will be sent although NOTIFY_SOCKET is set ("" otherwise)."""
        if self.value and self.addr is None:
            return f"{ENV}={self.value!r} is not a unix socket path or @name: not notifying"
        return ""

    def send(self, *fields: str) -> bool:
        """One datagram of `fields` (VAR=value each; newlines in a value become spaces).
        True if it was sent."""
        if self.addr is None:
            return False
        msg = "\n".join(f.replace("\n", " ") for f in fields).encode(errors="replace")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.settimeout(SEND_TIMEOUT)
                s.sendto(msg, self.addr)
            return True
        except OSError as e:
            if self.log is not None:
                self.log(f"sd_notify {fields[0] if fields else ''} to {self.value}: "
                         f"{e.strerror or e}")
            return False

    def ready(self, status: str) -> bool:
        return self.send("READY=1", f"STATUS={status}")

    def stopping(self, status: str) -> bool:
        return self.send("STOPPING=1", f"STATUS={status}")
