"""Atomic writes of host files: a reader sees the old file or the new one, never a
half-written one, and no symlink is followed on the way.

The directory is opened once (O_NOFOLLOW: it must not itself be a symlink; its parent
path is the caller's, e.g. an admin's /var/run/cdi where /var/run links to /run) and
everything else happens relative to that fd: a new temp file made with O_EXCL |
O_NOFOLLOW (never an existing file, never through a symlink), written, fsync'ed,
then renamed over the name (a symlink there is replaced, not written through).
"""
from __future__ import annotations

import errno
import os


class discarded_on_error:
    """Unlink temp entry `tmp` of dir_fd if the block fails (it is about to be renamed
    into place: on success it is gone under that name anyway). A class, not
    contextlib: contextlib imports functools and collections (~5 ms of the hook's start)."""

    def __init__(self, dir_fd: int, tmp: str) -> None:
        self.dir_fd, self.tmp = dir_fd, tmp

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, value, tb) -> bool:
        if kind is not None:
            try:
                os.unlink(self.tmp, dir_fd=self.dir_fd)
            except OSError:
                pass
        return False


def open_dir(path: str) -> int:
    """An fd of directory `path` (O_NOFOLLOW: a symlink there is refused with ELOOP
    or ENOTDIR). Pass it to write_at(); check it with os.fstat() first if needed."""
    return os.open(path or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def write_at(dir_fd: int, name: str, data: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """Replace file `name` in directory dir_fd with `data`, atomically, with `mode`
    (whatever the umask). Raises OSError; nothing is left behind on failure.
    durable=False: no fsync (two of them: ~4-9 ms on a VM's disk), for a file that
    matters only until the next reader, a moment later, and not after a crash (a
    bundle's config.json: the runtime reads it right after; a node that crashes
    loses the container with it). Readers still see the old file or the new one."""
    if not name or "/" in name or name in (".", ".."):
        raise OSError(errno.EINVAL, f"not a file name: {name!r}")
    tmp = f".{name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=dir_fd)
    with discarded_on_error(dir_fd, tmp):
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    if not durable:
        return
    try:
        os.fsync(dir_fd)        # the rename itself survives a crash
    except OSError as e:
        if e.errno != errno.EINVAL:     # a file system without directory fsync
            raise


def write_atomic(path: str, data: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """write_at() for a path: its directory opened with open_dir()."""
    directory, name = os.path.split(os.path.abspath(path))
    dfd = open_dir(directory)
    try:
        write_at(dfd, name, data, mode, durable)
    finally:
        os.close(dfd)
