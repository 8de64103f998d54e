"""Reaching a directory root will write in (a log file's), one component at a time by fd,
so that nobody else can steer where root's write lands.

What someone who can write a directory on the way could do, and what stops it:
- plant a symlink (`hook.log -> /etc/ld.so.preload`, `nvhook -> /etc`): a link is
  followed only if it is root's (or the caller's) and sits in a directory nobody else
  can write; the file itself is opened O_NOFOLLOW by the caller;
- put a directory of their own in the way: every directory reached must be root's (or
  the caller's); one anybody can write is refused unless sticky (/tmp: nobody can
  replace root's entries there);
- make files in the directory itself (a FIFO, a hard link, their own hook.log.1): the
  directory holding the file must be writable by nobody but its owner.
A group-writable directory on the way is allowed (Ubuntu's /var/log is root:syslog 0775):
its group can only remove or swap entries, and what it could swap in is refused above
unless it is a directory only root can write, which root may as well write in.

Each check is made on the opened fd, so what is checked is what is used.
"""
from __future__ import annotations

import os
import stat

from libinject.errors import NvhookError

MAX_LINKS = 40          # as the kernel's path walk (ELOOP past it)
_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def owner(st: os.stat_result) -> str:
    """Who owns st, in words ("nobody (uid 65534)")."""
    try:
        import pwd

        return f"{pwd.getpwuid(st.st_uid).pw_name} (uid {st.st_uid})"
    except (KeyError, ImportError):
        return f"uid {st.st_uid}"


def _group(st: os.stat_result) -> str:
    try:
        import grp

        return f"group {grp.getgrgid(st.st_gid).gr_name} (gid {st.st_gid})"
    except (KeyError, ImportError):
        return f"gid {st.st_gid}"


def writable_by_others(st: os.stat_result, *, sticky_ok: bool, group_ok: bool) -> str:
    """Who besides its owner can change directory st's entries, in words ("" = nobody
    that counts: group_ok lets its group, sticky_ok a sticky bit, pass)."""
    mode = st.st_mode
    if sticky_ok and mode & stat.S_ISVTX:
        return ""
    if mode & stat.S_IWOTH:
        return "everyone"
    if mode & stat.S_IWGRP and not group_ok:
        return _group(st)
    return ""


def host_root() -> bool:
    """Whether we are root of the initial user namespace (uid_map the identity over all
    uids; unreadable counts as yes). Anyone else (a user; root of a user namespace, a
    rootless engine's, where the host's root shows as the overflow uid) can write only
    what its own user can: the walk's owner checks are for host root's writes."""
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/self/uid_map", "rb") as f:
            return f.read(4096).split() == [b"0", b"0", b"4294967295"]
    except OSError:
        return True


def open_dir(path: str, what: str, owners: frozenset[int] | None = None) -> int:
    """An O_PATH fd of directory `path` (absolute), reached from / without following a
    link others could have planted (module doc). Otherwise NvhookError starting with
    `what` ("log file /var/log/x.log") and naming the component at fault; one that
    cannot be opened (missing, not searchable) is an OSError instead (FileNotFoundError
    for a missing one: callers may take "nothing there" quietly).
    owners: the uids trusted to own what is on the way (default root and the caller)."""
    if not path.startswith("/"):
        raise NvhookError(f"{what}: not an absolute path")
    trusted = owners if owners is not None else frozenset({0, os.geteuid()})
    pending = [c for c in path.split("/") if c not in ("", ".")]
    pending.reverse()           # a stack: the next component last
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    where = "/"
    links = 0
    try:
        st = os.fstat(fd)
        _check_dir(st, where, path, what, trusted, last=not pending)
        while pending:
            name = pending.pop()
            shown = os.path.normpath(os.path.join(where, name))
            try:
                nfd = os.open(name, _FLAGS, dir_fd=fd)
            except OSError as e:     # (missing, not searchable: the caller's to judge)
                raise OSError(e.errno, f"{what}: {shown}: {e.strerror}") from None
            try:
                nst = os.fstat(nfd)
                if stat.S_ISLNK(nst.st_mode):
                    if nst.st_uid not in trusted:
                        raise NvhookError(f"{what}: {shown} is a symlink owned by {owner(nst)}")
                    who = writable_by_others(st, sticky_ok=True, group_ok=False)
                    if who:
                        raise NvhookError(f"{what}: {shown} is a symlink in {where}, which "
                                          f"{who} can write")
                    links += 1
                    if links > MAX_LINKS:
                        raise NvhookError(f"{what}: too many levels of symbolic links")
                    target = os.readlink("", dir_fd=nfd)
                    os.close(nfd)
                    nfd = -1
                    parts = [c for c in target.split("/") if c not in ("", ".")]
                    pending.extend(reversed(parts))
                    if target.startswith("/"):
                        os.close(fd)
                        fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                        st, where = os.fstat(fd), "/"
                        _check_dir(st, where, path, what, trusted, last=not pending)
                    continue
                if not stat.S_ISDIR(nst.st_mode):
                    raise NvhookError(f"{what}: {shown} is not a directory")
                _check_dir(nst, shown, path, what, trusted, last=not pending)
            except BaseException:
                if nfd >= 0:
                    os.close(nfd)
                raise
            os.close(fd)
            fd, st, where = nfd, nst, shown
        return fd
    except BaseException:
        os.close(fd)
        raise


def _check_dir(st: os.stat_result, where: str, path: str, what: str, trusted: frozenset[int],
               last: bool) -> None:
    if st.st_uid not in trusted:
        raise NvhookError(f"{what}: directory {where} is owned by {owner(st)}")
    # The directory holding the file: nobody but its owner may add or swap entries there.
    who = writable_by_others(st, sticky_ok=not last, group_ok=not last)
    if who:
        raise NvhookError(f"{what}: directory {where} is writable by {who}")


def open_root_subdir(parent: int | None, name: str, path: str, *, refusal: str, prefix: str = "",
                     create: bool = False, missing_ok: bool = False) -> int | None:
    """Directory `name` under the dir fd `parent`, by fd, never through a link, root's and
    writable by no one else (the dev dirs root makes nodes and links in). Missing: None
    with missing_ok, made (0755) with create, else NvhookError; refusal ends the line
    for a directory that is not root's alone."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=parent)
    except FileNotFoundError:
        if missing_ok:
            return None
        if not create:
            raise NvhookError(f"{prefix}{path}: no such directory") from None
        os.mkdir(name, 0o755, dir_fd=parent)
        fd = os.open(name, flags, dir_fd=parent)
    except OSError as e:
        raise NvhookError(f"{prefix}{path}: not a directory (a link is not followed): {e.strerror}") from None
    st = os.fstat(fd)
    if st.st_uid != 0 or st.st_mode & 0o022:
        os.close(fd)
        raise NvhookError(f"{prefix}{path}: owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}: "
                          f"not root's alone, {refusal}")
    return fd
