"""Reading files we are handed (config.toml, an OCI spec, a CDI spec, a sim profile) with a
size bound, so a huge or endless file is a clear error, not memory exhaustion, and only
regular files, so a FIFO nobody writes or a device (/dev/zero, a tty) is a clear error,
not a hang.

Symlinks are followed: these paths are the host's own (an engine's bundle, /etc), where
a symlink is an ordinary thing (a k8s ConfigMap is one); what must never happen is
blocking on or reading from something that is not a file, and the checks on the opened
fd guarantee that whatever the path resolves to. Where others may write the directory
(/var/run/cdi, which device plugins' containers are given), follow=False: a link there
could name a device, whose open alone may act (a watchdog, a tape), so it is not opened.
"""
from __future__ import annotations

import errno
import os
import stat

from libinject.errors import NvhookError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a fifo"), (stat.S_ISCHR, "a char device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def kind(mode: int) -> str:
    """What a non-regular file is, in words ("a fifo")."""
    return next((name for test, name in _KINDS if test(mode)), "not a file")


def read_bounded(path: str, limit: int, what: str, *, missing_ok: bool = False,
                 check=None, follow: bool = True) -> bytes | None:
    """The whole file, at most `limit` bytes; NvhookError naming `what` and path otherwise
    (also for anything but a regular file). A missing file is None when missing_ok
    (callers with a default). check(fd, stat): called on the opened file before it is
    read (it raises to refuse it): what is checked is what is read. follow=False: a
    symlink as the last component is refused, not opened (module doc)."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; O_NOCTTY: a tty given
        # as a config must not become our controlling terminal.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
                     | (0 if follow else os.O_NOFOLLOW))
    except FileNotFoundError:
        if missing_ok:
            return None
        raise NvhookError(f"cannot read {what} {path}: No such file or directory") from None
    except OSError as e:
        if e.errno == errno.ELOOP and not follow:
            raise NvhookError(f"cannot read {what} {path}: a symlink (not followed)") from None
        raise NvhookError(f"cannot read {what} {path}: {e.strerror}") from None
    except ValueError:  # a NUL in the path
        raise NvhookError(f"cannot read {what} {path!r}: invalid path") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NvhookError(f"cannot read {what} {path}: {kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise NvhookError(f"{what} {path} is larger than {limit} bytes")
        if check is not None:
            check(fd, st)
        chunks: list[bytes] = []
        n = 0
        while n <= limit:
            b = os.read(fd, limit + 1 - n)
            if not b:
                break
            chunks.append(b)
            n += len(b)
    except OSError as e:
        raise NvhookError(f"cannot read {what} {path}: {e.strerror}") from None
    finally:
        os.close(fd)
    if n > limit:
        raise NvhookError(f"{what} {path} is larger than {limit} bytes")
    return b"".join(chunks)
