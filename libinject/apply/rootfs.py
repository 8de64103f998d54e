"""Safe file system operations inside a hostile container rootfs.

Every container path is resolved with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
from an fd of the rootfs, so the image's symlinks (absolute or ../..) resolve inside
the rootfs and never leave it, even when swapped in between two operations. New
entries are made with *at() calls on the resolved parent fd without following the
last component, and owned by the rootfs owner (the container's owner). Mounts are
attached to the resolved target fd with move_mount(), never through a path.
(README "Security model"; CVE-2024-0132, CVE-2024-0133, CVE-2025-23359, CVE-2024-0134.)

A Journal records every mount and every entry created or replaced; rollback() undoes
them in reverse order (all-or-nothing apply).
"""
from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from typing import Callable

from libinject.linux import native
from libinject.linux.proc import proc_fd
from libinject.errors import NvhookError

RESOLVE = native.RESOLVE_IN_ROOT | native.RESOLVE_NO_MAGICLINKS

# mount options (as in MountEdit.options) -> mount_setattr attributes
_ATTRS = {
    "ro": native.MOUNT_ATTR_RDONLY,
    "nosuid": native.MOUNT_ATTR_NOSUID,
    "nodev": native.MOUNT_ATTR_NODEV,
    "noexec": native.MOUNT_ATTR_NOEXEC,
}
_NO_ATTR = {"rw", "bind", "rbind", "suid", "dev", "exec", "private", "rprivate", "slave",
            "rslave", "shared", "rshared"}


def umount_fd(mnt_fd: int) -> None:
    """Detach the mount whose root mnt_fd refers to (through /proc/self/fd/N of the
    /proc taken by proc_fd(), whatever the namespace's own /proc is)."""
    cwd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fchdir(proc_fd())
        native.umount2(f"self/fd/{mnt_fd}", native.MNT_DETACH)
    finally:
        os.fchdir(cwd)
        os.close(cwd)


def openat2(dirfd: int, path: str, flags: int, resolve: int) -> int:
    """openat2 that retries EAGAIN: with RESOLVE_IN_ROOT/BENEATH the kernel refuses a
    '..' walk that raced with any rename or mount on the system, asking us to retry."""
    for _ in range(1000):
        try:
            return native.openat2(dirfd, path, flags, 0, resolve)
        except BlockingIOError:
            continue
    return native.openat2(dirfd, path, flags, 0, resolve)


def mount_attrs(options: tuple[str, ...] | list[str]) -> tuple[int, bool]:
    """MountEdit options -> (mount_setattr attr_set, recursive). Unknown options fail,
    so a planner typo cannot silently give a writable or suid mount."""
    attrs, recursive = 0, False
    for o in options:
        if o in _ATTRS:
            attrs |= _ATTRS[o]
        elif o == "rbind":
            recursive = True
        elif o not in _NO_ATTR:
            raise NvhookError(f"unsupported mount option {o!r}")
    return attrs, recursive


def split(path: str) -> list[str]:
    """Container path -> components. Absolute paths only; '..' is refused (a planned
    path never needs it, and RESOLVE_IN_ROOT would clamp it anyway)."""
    if not path.startswith("/"):
        raise NvhookError(f"container path must be absolute: {path!r}")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise NvhookError(f"container path must not contain '..': {path!r}")
    return parts


def fs_type(fd: int) -> int:
    return native.fstatfs_type(fd)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISREG, "regular file"),
                       (stat.S_ISLNK, "symlink"), (stat.S_ISCHR, "char device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISFIFO, "fifo")):
        if test(mode):
            return name
    return "unknown"


def open_host(path: str, *, recursive: bool = False) -> tuple[int, os.stat_result]:
    """Clone a host path into a detached mount (open_tree OPEN_TREE_CLONE).

    Host paths come from discovery, which already resolved the driver root's symlinks
    (SONAME links, merged /lib) as if the root were "/". So here no symlink is followed
    anywhere in the path (RESOLVE_NO_SYMLINKS, magic links included): a local user who
    controls a component (a world-writable dir, a driver root that is another
    container's rootfs) cannot swap in a symlink between discovery and apply and get
    e.g. the host's /etc mounted into a container. The detached tree can later be
    attached in any mount namespace we enter (that is how sources opened on the host
    reach a container whose namespace cannot see them). Returns (tree fd, stat of the
    source); callers check its type (and a device's rdev) on that stat."""
    if not path.startswith("/"):
        raise OSError(errno.EINVAL, "host source path must be absolute", path)
    try:
        pfd = openat2(native.AT_FDCWD, path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC,
                      native.RESOLVE_NO_SYMLINKS | native.RESOLVE_NO_MAGICLINKS)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NvhookError(f"cannot open host source {path}: a component is a symlink "
                              "(it changed since discovery, or the driver root path has "
                              "symlinks); refusing to follow it") from None
        raise
    try:
        st = os.fstat(pfd)
        if stat.S_ISLNK(st.st_mode):    # never with the flags above; belt and braces
            raise NvhookError(f"cannot open host source {path}: it is a symlink")
        flags = (native.OPEN_TREE_CLONE | native.OPEN_TREE_CLOEXEC | native.AT_EMPTY_PATH
                 | (native.AT_RECURSIVE if recursive else 0))
        return native.open_tree(pfd, "", flags), st
    finally:
        os.close(pfd)


def set_attrs(tree_fd: int, attrs: int, recursive: bool = False) -> None:
    """Apply ro/nosuid/nodev/noexec to a (detached) mount before it becomes visible.
    Unlike MS_BIND|MS_RDONLY, which silently ignores MS_RDONLY without a remount."""
    if attrs:
        native.mount_setattr(tree_fd, "", native.AT_EMPTY_PATH
                             | (native.AT_RECURSIVE if recursive else 0), attrs)


@dataclass
class _Entry:
    what: str
    undo: Callable[[], None]


@dataclass
class Journal:
    """Undo log: entries are undone in reverse order; fds are kept until commit."""
    entries: list[_Entry] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)     # container paths, in order
    created: list[str] = field(default_factory=list)    # container paths, in order
    _fds: list[int] = field(default_factory=list)
    generation: int = 0     # bumped by rollback/commit (RootFS drops its cached dirs)

    def keep(self, fd: int) -> int:
        self._fds.append(fd)
        return fd

    def add(self, what: str, undo: Callable[[], None]) -> None:
        self.entries.append(_Entry(what, undo))

    def mount(self, path: str, mnt_fd: int) -> None:
        """mnt_fd is the root of the mount we attached; unmount through it (the
        mount itself, whatever happened to the path since)."""
        self.keep(mnt_fd)
        self.mounts.append(path)
        self.add(f"umount {path}", lambda: umount_fd(mnt_fd))

    def create(self, path: str, parent_fd: int, name: str, is_dir: bool,
               st: os.stat_result | None = None) -> None:
        """An entry we made; undo removes it only while it is still the same inode
        (something swapped in since is not ours to delete)."""
        pfd = self.keep(os.dup(parent_fd))
        self.created.append(path)
        if st is None:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        ident = (st.st_dev, st.st_ino)

        def undo() -> None:
            try:
                now = os.stat(name, dir_fd=pfd, follow_symlinks=False)
            except FileNotFoundError:
                return
            if (now.st_dev, now.st_ino) != ident:
                return
            os.rmdir(name, dir_fd=pfd) if is_dir else os.unlink(name, dir_fd=pfd)
        self.add(f"remove {path}", undo)

    def rollback(self) -> list[str]:
        """Undo everything; returns what could not be undone (empty when clean)."""
        errors = []
        for e in reversed(self.entries):
            try:
                e.undo()
            except OSError as err:
                errors.append(f"{e.what}: {os.strerror(err.errno)}")
        self.entries.clear()
        self.mounts.clear()
        self.created.clear()
        self._close()
        self.generation += 1
        return errors

    def commit(self) -> None:
        self.entries.clear()
        self._close()
        self.generation += 1

    def _close(self) -> None:
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()


class RootFS:
    """A container rootfs; all paths given to methods are container paths."""

    def __init__(self, path: str, journal: Journal | None = None):
        self.path = os.path.abspath(path)
        try:
            # The rootfs path itself is the runtime's (trusted); what is inside is not.
            self.fd = os.open(self.path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise NvhookError(f"rootfs {path}: {os.strerror(e.errno)}") from None
        st = os.fstat(self.fd)
        self.uid, self.gid = st.st_uid, st.st_gid     # the container's owner
        self.journal = journal if journal is not None else Journal()
        # Resolved directories (container path -> O_PATH fd), so many targets in one
        # directory resolve it once. An fd keeps naming the directory it resolved to
        # (inside the rootfs) whatever is renamed since; any directory mount clears
        # the cache, since it can cover a cached directory or one of its ancestors.
        self._dirs: dict[str, int] = {}
        self._gen = self.journal.generation

    def close(self) -> None:
        self.forget_dirs()
        os.close(self.fd)

    def forget_dirs(self) -> None:
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs.clear()

    # -- lookups -------------------------------------------------------------------
    def resolve(self, path: str, flags: int = os.O_PATH) -> int:
        """fd of a container path, symlinks resolved inside the rootfs. Raises OSError."""
        rel = "/".join(split(path)) or "."
        return openat2(self.fd, rel, flags | os.O_CLOEXEC, RESOLVE)

    def lookup(self, path: str) -> tuple[int, os.stat_result] | None:
        """(O_PATH fd, stat) of a container path, or None if it does not exist."""
        try:
            fd = self.resolve(path)
        except FileNotFoundError:
            return None
        return fd, os.fstat(fd)

    def lstat(self, path: str) -> os.stat_result | None:
        """stat of the entry itself (a last-component symlink is not followed; the
        parents resolve inside the rootfs), or None if absent."""
        try:
            fd = self.resolve(path, os.O_PATH | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def read_file(self, path: str, limit: int = 1 << 20, *, follow: bool = True) -> bytes | None:
        """Contents of a regular file of the image (None if absent). The file is
        found with O_PATH and checked (regular, not on procfs/sysfs) before it is
        opened for reading, through /proc/self/fd of that very inode: nothing of the
        image's (a device node, a fifo) is ever open()ed by us as host root.
        follow=False: a symlink at the last component is refused too."""
        try:
            fd = self.open_regular(path, follow=follow)
        except FileNotFoundError:
            return None
        try:
            return os.read(fd, limit)
        finally:
            os.close(fd)

    def open_regular(self, path: str, *, follow: bool = True) -> int:
        """O_RDONLY fd of a regular file of the image, checked before it is opened (see
        read_file). Raises FileNotFoundError if absent, NvhookError if not a regular
        file (or on procfs/sysfs)."""
        pfd = self.resolve(path, os.O_PATH | (0 if follow else os.O_NOFOLLOW))
        try:
            st = os.fstat(pfd)
            if not stat.S_ISREG(st.st_mode):
                raise NvhookError(f"{path} in the rootfs is a {_kind(st.st_mode)}, not a regular file")
            if fs_type(pfd) in (native.PROC_SUPER_MAGIC, native.SYSFS_MAGIC):
                raise NvhookError(f"{path} in the rootfs is on procfs/sysfs")
            # The magic link names the inode pfd holds, whatever the path says now.
            fd = os.open(f"self/fd/{pfd}", os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=proc_fd())
        finally:
            os.close(pfd)
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):   # never: the same inode
            os.close(fd)
            raise NvhookError(f"{path} in the rootfs changed while opening it")
        return fd

    # -- creation ------------------------------------------------------------------
    def _own(self, fd: int, mode: int, st: os.stat_result | None = None) -> None:
        """Owner and mode of a new entry; `st` (its fstat) skips what already matches
        (we create entries with their final mode, and as root for a root-owned rootfs)."""
        if st is None or (st.st_uid, st.st_gid) != (self.uid, self.gid):
            os.fchown(fd, self.uid, self.gid)
        if st is None or stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)

    def makedirs(self, path: str, mode: int = 0o755) -> int:
        """O_PATH fd of directory `path`, creating missing components (mkdirat on the
        resolved parent, owned by the rootfs owner). Each prefix is re-resolved from
        the rootfs, so a component swapped for a symlink still resolves inside it."""
        parts = split(path)
        key = "/" + "/".join(parts)
        if self._gen != self.journal.generation:   # rolled back or committed since
            self.forget_dirs()
            self._gen = self.journal.generation
        cached = self._dirs.get(key)
        if cached is not None:
            return os.dup(cached)
        try:   # the common case: it exists; one walk, still inside the rootfs
            fd = openat2(self.fd, key[1:] or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, RESOLVE)
        except OSError:
            fd = self._makedirs(parts, mode)    # creates, or finds what is wrong
        self._dirs[key] = os.dup(fd)
        return fd

    def _makedirs(self, parts: list[str], mode: int) -> int:
        cur = os.dup(self.fd)
        prefix = "/"
        try:
            for i, name in enumerate(parts):
                prefix = "/" + "/".join(parts[: i + 1])
                nxt = self._step(cur, prefix, name, mode)
                os.close(cur)
                cur = nxt
            return cur
        except OSError as e:
            os.close(cur)
            raise NvhookError(f"cannot create {prefix} in the rootfs: {os.strerror(e.errno)}") from None
        except BaseException:
            os.close(cur)
            raise

    def _step(self, cur: int, prefix: str, name: str, mode: int) -> int:
        """fd of directory `prefix` (parent: cur), made if missing."""
        for _attempt in range(5):
            try:
                return openat2(self.fd, prefix[1:], os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, RESOLVE)
            except FileNotFoundError:
                pass
            except NotADirectoryError:
                raise NvhookError(f"cannot create {prefix} in the rootfs: not a directory") from None
            try:
                os.mkdir(name, mode, dir_fd=cur)
            except FileExistsError:
                # Something is there but did not resolve: a dangling symlink (e.g. to a
                # host path) or a racing writer; never follow it.
                try:
                    st = os.stat(name, dir_fd=cur, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISLNK(st.st_mode):
                    raise NvhookError(f"cannot create {prefix} in the rootfs: it is a symlink "
                                      "that does not resolve inside the rootfs") from None
                continue
            fd = openat2(cur, name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC,
                         native.RESOLVE_NO_SYMLINKS | native.RESOLVE_BENEATH)
            try:
                st = os.fstat(fd)
                self.journal.create(prefix, cur, name, True, st)
                self._own(fd, mode, st)
            finally:
                os.close(fd)
        raise NvhookError(f"cannot create {prefix} in the rootfs: it keeps changing")

    def _parent(self, path: str) -> tuple[int, str]:
        parts = split(path)
        if not parts:
            raise NvhookError("the rootfs itself cannot be a file")
        return self.makedirs("/" + "/".join(parts[:-1])), parts[-1]

    def make_file(self, path: str, mode: int = 0o644) -> bool:
        """Create an empty regular file (mount target) unless something exists there.
        Never follows a symlink at the last component. Returns True if created."""
        fd = self._create_file(path, mode)
        if fd is None:
            return False
        os.close(fd)
        return True

    def _create_file(self, path: str, mode: int = 0o644) -> int | None:
        """make_file, returning an fd of the new file (None if something was there)."""
        parent, name = self._parent(path)
        try:
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, mode, dir_fd=parent)
            except FileExistsError:
                return None
            except OSError as e:
                raise NvhookError(f"cannot create {path} in the rootfs: {os.strerror(e.errno)}") from None
            try:
                st = os.fstat(fd)
                self.journal.create(path, parent, name, False, st)
                self._own(fd, mode, st)
            except BaseException:
                os.close(fd)
                raise
            return fd
        finally:
            os.close(parent)

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Write a file of ours into the image. A new file is made with O_EXCL; an
        existing entry (file or symlink) is replaced by rename on its parent dir, so a
        symlink is replaced, never written through. The old entry is restored on
        rollback."""
        parent, name = self._parent(path)
        try:
            try:
                old = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                old = None
            if old is not None and not (stat.S_ISREG(old.st_mode) or stat.S_ISLNK(old.st_mode)):
                raise NvhookError(f"cannot write {path} in the rootfs: it is a {_kind(old.st_mode)}")
            tmp = f".{name}.nvhook-{os.getpid()}-{os.urandom(4).hex()}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600, dir_fd=parent)
            try:
                os.write(fd, data)
                self._own(fd, mode)
            except BaseException:
                os.unlink(tmp, dir_fd=parent)
                raise
            finally:
                os.close(fd)
            if old is None:
                os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
                self.journal.create(path, parent, name, False)
            else:
                self._replace(path, parent, name, tmp, old)
        except OSError as e:
            raise NvhookError(f"cannot write {path} in the rootfs: {os.strerror(e.errno)}") from None
        finally:
            os.close(parent)

    def _replace(self, path: str, parent: int, name: str, tmp: str, old: os.stat_result) -> None:
        """rename tmp over name, keeping what was there for rollback."""
        self._save(path, parent, name, old)
        os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)

    def preserve(self, path: str) -> None:
        """Journal the current state of an entry something else will rewrite (the
        image's /etc/ld.so.cache before ldconfig), so rollback puts it back."""
        parent, name = self._parent(path)
        try:
            try:
                old = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                old = None
            if old is None:
                pfd = self.journal.keep(os.dup(parent))

                def remove() -> None:
                    try:
                        os.unlink(name, dir_fd=pfd)
                    except FileNotFoundError:
                        pass
                self.journal.add(f"remove {path}", remove)
            elif stat.S_ISREG(old.st_mode) or stat.S_ISLNK(old.st_mode):
                self._save(path, parent, name, old)
        finally:
            os.close(parent)

    def _save(self, path: str, parent: int, name: str, old: os.stat_result) -> None:
        if stat.S_ISLNK(old.st_mode):
            saved: tuple[str, bytes | str] = ("link", os.readlink(name, dir_fd=parent))
        else:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=parent)
            try:
                saved = ("file", os.read(fd, 1 << 24))
            finally:
                os.close(fd)
        pfd = self.journal.keep(os.dup(parent))

        def restore() -> None:
            t = f".{name}.nvhook-undo-{os.urandom(4).hex()}"
            if saved[0] == "link":
                os.symlink(saved[1], t, dir_fd=pfd)
            else:
                f = os.open(t, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                            0o600, dir_fd=pfd)
                try:
                    os.write(f, saved[1])  # type: ignore[arg-type]
                    os.fchmod(f, stat.S_IMODE(old.st_mode))
                finally:
                    os.close(f)
            os.chown(t, old.st_uid, old.st_gid, dir_fd=pfd, follow_symlinks=False)
            os.rename(t, name, src_dir_fd=pfd, dst_dir_fd=pfd)
        self.journal.add(f"restore {path}", restore)

    def symlink(self, target: str, path: str) -> bool:
        """Make symlink `path` -> `target` (symlinkat on the resolved parent; the link
        itself is never followed). Same link already there: nothing to do; another
        symlink: replaced (restored on rollback); anything else: left alone.
        Returns True if the image changed."""
        parent, name = self._parent(path)
        try:
            try:
                os.symlink(target, name, dir_fd=parent)
            except FileExistsError:
                old = os.stat(name, dir_fd=parent, follow_symlinks=False)
                if not stat.S_ISLNK(old.st_mode) or os.readlink(name, dir_fd=parent) == target:
                    return False
                tmp = f".{name}.nvhook-{os.getpid()}-{os.urandom(4).hex()}"
                os.symlink(target, tmp, dir_fd=parent)
                os.chown(tmp, self.uid, self.gid, dir_fd=parent, follow_symlinks=False)
                self._replace(path, parent, name, tmp, old)
                return True
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            self.journal.create(path, parent, name, False, st)
            if (st.st_uid, st.st_gid) != (self.uid, self.gid):
                os.chown(name, self.uid, self.gid, dir_fd=parent, follow_symlinks=False)
            return True
        except OSError as e:
            raise NvhookError(f"cannot create symlink {path} in the rootfs: {os.strerror(e.errno)}") from None
        finally:
            os.close(parent)

    # -- mounts --------------------------------------------------------------------
    def target(self, path: str, *, is_dir: bool, also: int = 0, allow_proc: bool = False) -> int:
        """O_PATH fd of a mount target, created if missing. A file target must be a
        regular file or of file type `also` (S_IFMT bits: the source's own type, as
        left by an earlier configure). Refuses targets on procfs/sysfs (mounting over
        e.g. /proc/sys files through an image symlink)."""
        if is_dir:
            fd = self.makedirs(path)
        else:
            # A file we just made is the target itself (no second lookup); anything
            # already there is resolved (inside the rootfs) and checked below.
            made = self._create_file(path)
            if made is not None:
                fd = made
            else:
                try:
                    fd = self.resolve(path)
                except OSError as e:
                    raise NvhookError(f"mount target {path} in the rootfs: {os.strerror(e.errno)}") from None
        try:
            st = os.fstat(fd)
            ok = stat.S_ISDIR(st.st_mode) if is_dir else (
                stat.S_ISREG(st.st_mode) or (also != 0 and stat.S_IFMT(st.st_mode) == also))
            if not ok:
                want = "directory" if is_dir else "regular file"
                raise NvhookError(f"mount target {path} in the rootfs is a {_kind(st.st_mode)}, "
                                  f"expected a {want}")
            if not allow_proc and fs_type(fd) in (native.PROC_SUPER_MAGIC, native.SYSFS_MAGIC):
                raise NvhookError(f"mount target {path} in the rootfs is on procfs/sysfs")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def attach(self, tree_fd: int, path: str, target_fd: int) -> None:
        """move_mount a detached tree onto a resolved target fd; journaled."""
        try:
            native.move_mount(tree_fd, "", target_fd, "",
                              native.MOVE_MOUNT_F_EMPTY_PATH | native.MOVE_MOUNT_T_EMPTY_PATH)
        except OSError as e:
            raise NvhookError(f"cannot mount {path}: {os.strerror(e.errno)}") from None
        self.journal.mount(path, tree_fd)
        if self._dirs and stat.S_ISDIR(os.fstat(target_fd).st_mode):
            self.forget_dirs()

    def bind_mount(self, host_path: str, path: str, options: tuple[str, ...] = ("ro", "nosuid", "nodev"),
                   *, expect: str | None = None) -> None:
        """Bind a host path at container `path`. `expect`: "file", "dir", "socket",
        "char" or None (anything but a symlink). The target's type follows the source."""
        attrs, recursive = mount_attrs(options)
        try:
            tree, st = open_host(host_path, recursive=recursive)
        except OSError as e:
            raise NvhookError(f"cannot mount {host_path} at {path}: {os.strerror(e.errno)}") from None
        try:
            self.bind_tree(tree, st, path, attrs, recursive=recursive, expect=expect, source=host_path)
        except BaseException:
            os.close(tree)
            raise

    def bind_tree(self, tree: int, st: os.stat_result, path: str, attrs: int, *,
                  recursive: bool = False, expect: str | None = None, source: str = "") -> None:
        """Attach a source cloned with open_host(); on success the journal owns `tree`."""
        check = {"file": stat.S_ISREG, "dir": stat.S_ISDIR, "socket": stat.S_ISSOCK,
                 "char": stat.S_ISCHR}.get(expect or "", None)
        if check is not None and not check(st.st_mode):
            raise NvhookError(f"cannot mount {source or path} at {path}: source is a "
                              f"{_kind(st.st_mode)}, expected {expect}")
        try:
            set_attrs(tree, attrs, recursive)
        except OSError as e:
            raise NvhookError(f"cannot mount {source} at {path}: {os.strerror(e.errno)}") from None
        is_dir = stat.S_ISDIR(st.st_mode)
        tfd = self.target(path, is_dir=is_dir, also=0 if is_dir else stat.S_IFMT(st.st_mode))
        try:
            self.attach(tree, path, tfd)
        finally:
            os.close(tfd)

    def tmpfs(self, path: str, *, files: dict[str, bytes] | None = None, dirs: tuple[str, ...] = (),
              mode: int = 0o555, attrs: int = native.MOUNT_ATTR_NOSUID | native.MOUNT_ATTR_NODEV
              | native.MOUNT_ATTR_NOEXEC, readonly: bool = True, allow_proc: bool = False,
              target_fd: int | None = None) -> int:
        """Mount a tmpfs holding `files` (relative name -> bytes, mode 0444) and `dirs`
        at `path`. Built detached (fsopen/fsmount), filled, made read-only, then
        attached: the container never sees it writable or half-filled.
        Returns the mount fd (owned by the journal)."""
        try:
            sfd = native.fsopen("tmpfs")
            try:
                native.fsconfig(sfd, native.FSCONFIG_SET_STRING, "mode", f"{mode:o}")
                native.fsconfig(sfd, native.FSCONFIG_SET_STRING, "size", "4m")
                native.fsconfig(sfd, native.FSCONFIG_SET_STRING, "uid", str(self.uid))
                native.fsconfig(sfd, native.FSCONFIG_SET_STRING, "gid", str(self.gid))
                native.fsconfig(sfd, native.FSCONFIG_CMD_CREATE)
                mfd = native.fsmount(sfd, native.FSMOUNT_CLOEXEC, attrs)
            finally:
                os.close(sfd)
        except OSError as e:
            raise NvhookError(f"cannot make tmpfs for {path}: {os.strerror(e.errno)}") from None
        try:
            names = sorted(set(dirs) | {os.path.dirname(n) for n in (files or {})} - {""})
            for d in names:
                sub = ""
                for p in d.split("/"):
                    sub = f"{sub}/{p}" if sub else p
                    try:
                        os.mkdir(sub, 0o555, dir_fd=mfd)
                        os.chown(sub, self.uid, self.gid, dir_fd=mfd, follow_symlinks=False)
                    except FileExistsError:
                        pass
            for name, data in (files or {}).items():
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o444, dir_fd=mfd)
                try:
                    os.write(fd, data)
                    self._own(fd, 0o444)
                finally:
                    os.close(fd)
            if readonly:
                native.mount_setattr(mfd, "", native.AT_EMPTY_PATH, native.MOUNT_ATTR_RDONLY)
            own_target = target_fd is None
            tfd = self.target(path, is_dir=True, allow_proc=allow_proc) if own_target else target_fd
            try:
                self.attach(mfd, path, tfd)
            finally:
                if own_target:
                    os.close(tfd)
        except OSError as e:
            os.close(mfd)
            raise NvhookError(f"cannot mount tmpfs at {path}: {os.strerror(e.errno)}") from None
        except BaseException:
            os.close(mfd)
            raise
        return mfd

