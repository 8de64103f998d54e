"""`nvhook serve`'s socket: bound under a lock (one server per path), made private before
it appears at its path; serving() says whether a server holds a path."""
from __future__ import annotations

import os
import socket
import stat

from libinject.errors import NvhookError


def _check_dir(path: str) -> None:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise NvhookError(f"cannot create socket dir {path}: {e.strerror}") from None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise NvhookError(f"socket dir {path} must be a directory owned by uid {os.geteuid()} "
                          "and writable by nobody else")


def serving(path: str) -> bool:
    """Whether an `nvhook serve` holds `path` (its lock, as bind() takes it, and the
    socket there): for what `nvhook setup` tells a user, never for a decision."""
    import fcntl

    path = os.path.abspath(path)
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return False
        lock = os.open(path + ".lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(lock)
    return False


def bind(path: str) -> tuple[socket.socket, int, os.stat_result]:
    """(listening socket, lock fd, the socket file's stat). One server per path: a lock
    file beside the socket says which; a socket left by a dead server is replaced."""
    import fcntl

    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    _check_dir(directory)
    lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        raise NvhookError(f"another nvhook serve is listening on {path}") from None
    try:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISSOCK(st.st_mode):
                raise NvhookError(f"{path} exists and is not a socket")
            os.unlink(path)     # we hold the lock: whoever made it is gone
        # Bind under a temporary name, restrict it, then rename it into place: the
        # socket never exists at its path with another mode, nor half set up.
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.bind(tmp)
            os.chmod(tmp, 0o600)
            sock.listen(128)
            os.rename(tmp, path)
        except OSError as e:
            sock.close()
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise NvhookError(f"cannot listen on {path}: {e.strerror}") from None
        return sock, lock, os.lstat(path)
    except BaseException:
        os.close(lock)
        raise
