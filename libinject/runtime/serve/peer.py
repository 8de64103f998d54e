"""Who `nvhook serve` serves: the proof a peer gives of being the runtime.

Trust: the service serves only the runtime. A peer must be uid 0 and in the service's
own mount and pid namespaces: a root process in a container that reached the socket is
refused. The proof is the namespace fds each side sends (no pid is believed: a pid can
be taken over by another process); SO_PEERCRED and, where the kernel has it,
SO_PEERPIDFD only filter early. The front checks the same of the listener before it
sends anything. Workers never enter a peer's namespaces or root: they run in the
service's own, so what they exec (ldconfig, the NVML child's python) is the host's,
opened as the service would. Only the stages the runtime runs in its own namespaces are
served: the prestart hook and a CDI spec's `cdi-hook createRuntime`
(libinject.runtime.cdi_hooks: the same worker, the same entry into the container's mount
namespace through the state's pid); a createContainer hook runs in the container's. A
worker keeps only the capabilities the hook needs, and its environment is PATH alone:
settings come from the hook's argv (--config) and root-owned files, never from an
environment.
"""
from __future__ import annotations

import errno
import os
import signal
import socket
import struct

SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)     # Linux 6.5


def _same_ns(fd: int, name: str, ours: tuple[int, int] | None = None) -> bool:
    """Is fd our /proc/self/ns/<name> (the same nsfs inode)? ours: its (st_dev, st_ino),
    if known (a worker has the server's, which are its own: it enters no namespace
    before this check)."""
    try:
        a = os.fstat(fd)
        if ours is None:
            b = os.stat(f"/proc/self/ns/{name}")
            ours = (b.st_dev, b.st_ino)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == ours


def _untrusted_peer(conn: socket.socket, pid: int, uid: int,
                    our_mnt: tuple[int, int] | None = None) -> str:
    """Why a connected peer is not the runtime ("" if it is): root, in our own mount
    namespace (our_mnt: its (st_dev, st_ino), if known), and still the process that
    connected (its pidfd, where the kernel has SO_PEERPIDFD; before 6.5 the pid alone)."""
    if uid != 0:
        return "not root"
    if pid <= 0:
        return "in a pid namespace we cannot see"
    pidfd = -1
    try:
        pidfd = struct.unpack("i", conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD, 4))[0]
    except OSError as e:
        if e.errno != errno.ENOPROTOOPT:    # e.g. the peer is gone: its pid may be another's
            return f"no pidfd: {e.strerror}"
    try:
        try:
            theirs = os.stat(f"/proc/{pid}/ns/mnt")
            if our_mnt is None:
                ours = os.stat("/proc/self/ns/mnt")
                our_mnt = (ours.st_dev, ours.st_ino)
        except OSError as e:
            return f"its mount namespace: {e.strerror}"
        if (theirs.st_dev, theirs.st_ino) != our_mnt:
            return "in another mount namespace"
        if pidfd >= 0:
            try:
                signal.pidfd_send_signal(pidfd, 0)
            except OSError:
                return "gone"
        return ""
    finally:
        if pidfd >= 0:
            os.close(pidfd)
