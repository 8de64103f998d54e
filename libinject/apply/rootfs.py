"""Safe file system operations inside a hostile container rootfs.

Every container path is resolved with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
from an fd of the rootfs, so the image's symlinks (absolute or ../..) resolve inside
the rootfs and never leave it, even when swapped in between two operations. New
entries are made with *at() calls on the resolved parent fd without following the
last component, and owned by the rootfs owner (the container's owner). Mounts are
attached to the resolved target fd with move_mount(), never through a path.
(README "Security model"; CVE-2024-0132, CVE-2024-0133, CVE-2025-23359, CVE-2024-0134.)

Mount targets, and every entry we create, must be on the rootfs's own mount (or the
runtime's /dev tmpfs for /dev paths, its procfs for the /proc/driver/nvidia mask, or a
tmpfs of ours): RESOLVE_IN_ROOT keeps paths inside the container's *view*, which
includes its volumes, and an image symlink into a volume must not get driver files
mounted (or files created) there, in a host directory. Nothing is attached to a shared
mount (its peers, possibly on the host, would get the mount too): in the container's
own namespace its rootfs, /dev and /proc mounts are made slaves first; anywhere else
a shared target mount is refused.

What was done is journaled (libinject.apply.journal): undone in reverse order on
failure, and what a killed apply left is replayed by the next apply on that rootfs.
"""
from __future__ import annotations

import binascii
import errno
import os
import stat

from libinject.apply import links
from libinject.apply.journal import SAVE_LIMIT, Journal, ReplayMixin, put_back, temp_name
from libinject.linux import mountinfo, native
from libinject.linux.proc import proc_fd
from libinject.linux.resolve import RESOLVE, openat2, split
from libinject.errors import NvhookError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable

# mount options (as in MountEdit.options) -> mount_setattr attributes
_ATTRS = {
    "ro": native.MOUNT_ATTR_RDONLY,
    "nosuid": native.MOUNT_ATTR_NOSUID,
    "nodev": native.MOUNT_ATTR_NODEV,
    "noexec": native.MOUNT_ATTR_NOEXEC,
}
_NO_ATTR = {"rw", "bind", "rbind", "suid", "dev", "exec", "private", "rprivate", "slave",
            "rslave", "shared", "rshared"}


# O_PATH fds of image files our write_file() replaced, kept open until the next RootFS
# (or our exit): closing the last reference to a replaced inode frees it, ~0.5 ms of ext4
# work a served start need not wait for (the worker exits after sending its status).
_replaced: list[int] = []


def _release_replaced() -> None:
    while _replaced:
        try:
            os.close(_replaced.pop())
        except OSError:
            pass


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


_EXPECT_TYPE = {"file": stat.S_ISREG, "dir": stat.S_ISDIR, "socket": stat.S_ISSOCK,
                "char": stat.S_ISCHR}


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
    Unlike MS_BIND|MS_RDONLY, which silently ignores MS_RDONLY without a remount.
    Also private: a clone of a shared host mount is in its peer group, and must not be
    (nothing mounted on it later may reach the host's)."""
    native.mount_setattr(tree_fd, "", native.AT_EMPTY_PATH
                         | (native.AT_RECURSIVE if recursive else 0), attrs,
                         propagation=native.MS_PRIVATE)


def _entry(parent: int, name: str) -> tuple[int | None, os.stat_result | None]:
    """(O_PATH fd, fstat) of the entry `name` itself (a symlink is not followed), or
    (None, None): the one lookup every later step uses."""
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except FileNotFoundError:
        return None, None
    try:
        return fd, os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise


class OnHostMount(NvhookError):
    """A refusal because the place is on a mount the container does not own (a volume
    of a host directory, a shared mount): an optional item there is skipped."""


# Memory file systems: a mount of one whose superblock the hook's own namespace does
# not have is one the runtime made for this container alone (its tmpfs on /run, /tmp,
# /proc/driver): it dies with the container and no host directory is behind it.
PRIVATE_FSTYPES = frozenset({"tmpfs", "ramfs"})


class RootFS(ReplayMixin):
    """A container rootfs; all paths given to methods are container paths."""

    def __init__(self, path: str, journal: Journal | None = None, *, own_ns: bool = False,
                 host_mounts: int = -1):
        """own_ns: we entered the container's own mount namespace (not the one we
        started in), where the rootfs, /dev and /proc mounts are the container's: a
        shared one among them is made a slave before anything is attached to it.
        host_mounts: an fd of the mountinfo of the namespace we started in (opened
        there, so it reads that namespace's mounts), ours once we are made: what
        tells a memory file system the runtime made for the container from one the
        host has too (_container_own)."""
        self.host_mounts = host_mounts
        self._host_devs: frozenset[str] | None = None
        _release_replaced()
        self.path = os.path.abspath(path)
        try:
            # The rootfs path itself is the runtime's (trusted); what is inside is not.
            self.fd = os.open(self.path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise NvhookError(f"rootfs {path}: {os.strerror(e.errno)}") from None
        st = os.fstat(self.fd)
        self.uid, self.gid = st.st_uid, st.st_gid     # the container's owner
        self.journal = journal if journal is not None else Journal()
        self.own_ns = own_ns
        try:
            self.mnt_id, self._root_is_mount = native.mount_id(self.fd)
        except OSError as e:
            os.close(self.fd)
            raise NvhookError(f"rootfs {path}: cannot tell its mount (statx STATX_MNT_ID, "
                              f"Linux >= 5.8): {os.strerror(e.errno)}") from None
        # The runtime's own mounts at <rootfs>/dev and <rootfs>/proc: (mount id, fd of
        # its root), looked up when first needed.
        self._runtime: dict[str, tuple[int, int] | None] = {}
        # One reading of this namespace's mountinfo, taken when first needed and kept
        # for the whole apply (_mount says why that is enough); read again only for a
        # mount it does not list.
        self._table: mountinfo.Table | None = None
        self._unshared: set[int] = set()                 # mounts known not to be shared
        # Resolved directories (container path -> O_PATH fd), so many targets in one
        # directory resolve it once. An fd keeps naming the directory it resolved to
        # (inside the rootfs) whatever is renamed since; any directory mount clears
        # the cache, since it can cover a cached directory or one of its ancestors.
        self._dirs: dict[str, int] = {}
        self._dir_mids: dict[str, int] = {}     # their mount ids, once asked (_check_create)
        self._gen = self.journal.generation
        self._ahead: set[tuple[str, int]] = set()   # (path, mount id) recorded by expect_mounts
        self._ns: int | None = None                 # our mount namespace's inode, when needed
        self._made: dict[str, dict] = {}            # replay: path -> its create record

    def close(self) -> None:
        if self.host_mounts >= 0:
            os.close(self.host_mounts)
            self.host_mounts = -1
        self.forget_dirs()
        for got in self._runtime.values():
            if got is not None:
                os.close(got[1])
        self._runtime.clear()
        os.close(self.fd)

    # -- which mount a path is on --------------------------------------------------
    def _runtime_mount(self, name: str) -> tuple[int, int] | None:
        """The mount the runtime made at <rootfs>/<name> ("dev", "proc"): reached from
        the rootfs without any symlink and the root of a mount other than the
        rootfs's; (its id, an fd of its root), or None."""
        if name not in self._runtime:
            got = None
            try:
                fd = openat2(self.fd, name, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC,
                             native.RESOLVE_NO_SYMLINKS | native.RESOLVE_NO_MAGICLINKS
                             | native.RESOLVE_BENEATH)
            except OSError:
                fd = -1
            if fd >= 0:
                mid, is_root = native.mount_id(fd)
                want = native.PROC_SUPER_MAGIC if name == "proc" else native.TMPFS_MAGIC
                if is_root and mid != self.mnt_id and fs_type(fd) == want:
                    got = (mid, fd)
                else:
                    os.close(fd)
            self._runtime[name] = got
        return self._runtime[name]

    def _mount(self, mid: int) -> mountinfo.Mount:
        """Mount `mid` as this apply's one reading of mountinfo lists it (read when
        first needed; again only when `mid` is not in it, i.e. made since).

        Why one reading is enough. Which mount a target is on is never taken from it:
        that is statx(STATX_MNT_ID) of the very fd we attach onto, fresh every time
        (_check_attach, _check_create). The reading only answers questions about mounts
        the runtime made before we started (the rootfs, its /dev and /proc, what an
        earlier configure stacked there): their file system type (fixed for a mount's
        life), their place (parent, mountpoint) and whether they are shared. Mounts we
        made ourselves are never looked up for propagation (attach() knows they are
        not shared), and our own propagation change (MS_SLAVE) is remembered in
        _unshared, not re-read. What could make the reading wrong is a change to the
        container's mounts during the apply (a mount moved, made shared, or unmounted
        and its id reused): at prestart nothing of the container runs yet; on a
        running container (configure --pid), only a process with CAP_SYS_ADMIN over its
        mount namespace can, and it could as well do so between a fresh read and our
        move_mount: a reading per mount would close no window, it would only cost
        ~0.1-0.3 ms each (as it did: 3 readings per apply at runc's prestart)."""
        t = self._table
        m = t.get(mid) if t is not None else None
        if m is None:
            self._table = mountinfo.table(proc_fd=proc_fd())
            m = self._table.get(mid)
            if m is None:
                raise NvhookError(f"mount {mid} is not in this namespace's mountinfo")
        return m

    def _dev_writable(self, path: str, mid: int) -> bool:
        """An entry under /dev may be made in the runtime's /dev: a tmpfs of its own,
        never a bind of the host's devtmpfs (privileged containers)."""
        if not (path == "/dev" or path.startswith("/dev/")):
            return False
        dev = self._runtime_mount("dev")
        return dev is not None and dev[0] == mid and self._mount(mid).fstype == "tmpfs"

    def _container_own(self, mid: int) -> bool:
        """Mount `mid` is the container's alone: a memory file system (PRIVATE_FSTYPES)
        that is not mounted anywhere in the namespace we started in (the runtime made
        it in the container's namespace: `--tmpfs /run`, podman's read-only tmpfs, a
        spec's tmpfs at /proc/driver). A bind of a host tmpfs (the host's /run as a
        volume) has a superblock the host namespace has too: not the container's."""
        if self.host_mounts < 0 or not self.own_ns:
            return False        # (in the namespace we started in, every mount is the host's)
        m = self._mount(mid)
        if m.fstype not in PRIVATE_FSTYPES:
            return False
        if self._host_devs is None:
            chunks = []
            while chunk := os.read(self.host_mounts, 1 << 16):
                chunks.append(chunk)
            text = b"".join(chunks).decode(errors="surrogateescape")
            self._host_devs = frozenset(h.dev for h in mountinfo.parse(text, PRIVATE_FSTYPES))
        return m.dev not in self._host_devs

    def _check_create(self, dir_fd: int, path: str, key: str | None = None) -> bool:
        """Refuse to create `path` in directory dir_fd unless that directory is on the
        rootfs's own mount, a tmpfs of ours, a memory file system the container owns
        (_container_own) or (under /dev) the runtime's /dev tmpfs: never in a volume (an
        image symlink into one), whose files are a host directory's (OnHostMount).
        Returns whether it is on the rootfs's own mount (the entry then
        outlives the container: the disk journal records it). key: dir_fd is a dup of
        the cached fd of that directory (makedirs): its mount id is asked once per
        cached fd (a property of the fd, which no rename or mount changes)."""
        mid = self._dir_mids.get(key) if key is not None else None
        if mid is None:
            mid = native.mount_id(dir_fd)[0]
            if key is not None and key in self._dirs:
                self._dir_mids[key] = mid
        if mid == self.mnt_id:
            return True
        if mid in self.journal.mount_ids or self._dev_writable(path, mid) or self._container_own(mid):
            return False
        raise OnHostMount(f"cannot create {path} in the rootfs: its directory is on a mount "
                          f"that is not the container's own ({self._describe(mid)}); refusing")

    def _describe(self, mid: int) -> str:
        """A mount, for an error line: its type and source, and whether it is shared."""
        try:
            m = self._mount(mid)
        except NvhookError:
            return f"mount {mid}"
        shared = ", shared" if any(o.startswith("shared:") for o in m.optional) else ""
        return f"{m.fstype} from {m.source}{shared}: a volume?"

    def _check_attach(self, target_fd: int, path: str, allow_proc: bool) -> None:
        """A mount target must be on the rootfs's own mount (or the runtime's /dev for
        /dev paths, its procfs for allow_proc, a tmpfs of ours), or be a mount stacked
        on such a place (an earlier configure's); and the mount we attach onto must not
        be shared."""
        mid, is_root = native.mount_id(target_fd)
        ours = self.journal.mount_ids
        runtime: set[int] | None = None     # the runtime's mounts allowed here, when asked
        cur, root = mid, is_root
        for _ in range(64):
            if cur == self.mnt_id or cur in ours or self._container_own(cur):
                break
            if runtime is None:
                runtime = set()
                for name, ok in (("dev", path == "/dev" or path.startswith("/dev/")),
                                 ("proc", allow_proc)):
                    got = self._runtime_mount(name) if ok else None
                    if got is not None:
                        runtime.add(got[0])
            if cur in runtime:
                break
            if not root:
                raise OnHostMount(f"mount target {path} in the rootfs is on a mount that is not "
                                  f"the container's own ({self._describe(cur)}); refusing")
            m = self._mount(cur)
            parent = self._mount(m.parent)
            root = parent.mountpoint == m.mountpoint     # stacked on the parent's root too
            cur = m.parent
        else:
            raise NvhookError(f"mount target {path} in the rootfs: too many stacked mounts")
        self._not_shared(mid, target_fd, path)

    def _not_shared(self, mid: int, fd: int, path: str) -> None:
        """Whatever is attached to a shared mount is copied to its peers (the host's
        mount of the rootfs, under Docker's rshared volumes or Kubernetes'
        Bidirectional). In the container's own namespace its own mounts (rootfs, /dev,
        /proc: the roots we know) become slaves: events still come in from the host,
        none go out. Anything else shared is refused."""
        if mid in self._unshared:
            return
        if any(o.startswith("shared:") for o in self._mount(mid).optional):
            # an fd of that mount's root, if it is one of the container's own
            roots = [(self.mnt_id, self.fd if self._root_is_mount else -1)]
            roots += [got for got in (self._runtime_mount("dev"), self._runtime_mount("proc"))
                      if got is not None]
            own = next((rfd for m, rfd in roots if m == mid and rfd >= 0), -1)
            opened = -1
            if own < 0 and self.own_ns and self._container_own(mid):
                own = opened = self._mount_root(mid)
            try:
                if not self.own_ns or own < 0:
                    raise OnHostMount(f"mount target {path} in the rootfs is on a shared mount: "
                                      "what is mounted there would propagate to its peers (the "
                                      "host); refusing (run in a private mount namespace)")
                try:
                    native.mount_setattr(own, "", native.AT_EMPTY_PATH, 0,
                                         propagation=native.MS_SLAVE)
                except OSError as e:
                    raise NvhookError(f"cannot make the container's mount under {path} a slave: "
                                      f"{os.strerror(e.errno)}") from None
            finally:
                if opened >= 0:
                    os.close(opened)
            # Only this mount's propagation changed (a slave now, remembered below); no
            # other mount's "shared:" state does, so the reading stays good for them.
        self._unshared.add(mid)

    def _mount_root(self, mid: int) -> int:
        """O_PATH fd of the root of the container's mount `mid` (found by its mountpoint
        under the rootfs and checked to be that very mount's root), or -1."""
        top = self.path.rstrip("/")
        point = self._mount(mid).mountpoint
        if not point.startswith(top + "/"):
            return -1
        try:
            fd = self.resolve(point[len(top):])
        except OSError:
            return -1
        if native.mount_id(fd) != (mid, True):
            os.close(fd)
            return -1
        return fd

    def forget_dirs(self) -> None:
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs.clear()
        self._dir_mids.clear()

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

    def is_same(self, path: str, st: os.stat_result) -> bool:
        """Whether container `path` (a last-component symlink not followed) is the very
        inode `st` describes (a host node, seen through a bind of the host's /dev)."""
        try:
            fd = self.resolve(path, os.O_PATH | os.O_NOFOLLOW)
        except OSError:
            return False
        try:
            now = os.fstat(fd)
        finally:
            os.close(fd)
        return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)

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
        """O_PATH fd of directory `path` (the caller's), creating missing components
        (mkdirat on the resolved parent, owned by the rootfs owner). Each prefix is
        re-resolved from the rootfs, so a component swapped for a symlink still
        resolves inside it."""
        parts = split(path)
        return os.dup(self._dir("/" + "/".join(parts), parts, mode))

    def _dir(self, key: str, parts: list[str], mode: int = 0o755) -> int:
        """makedirs() of `key` ("/" + "/".join(parts)), the fd lent from the cache: good
        until the cache is next cleared (forget_dirs: a directory mount, rollback or
        commit), and never to be closed by the borrower."""
        if self._gen != self.journal.generation:   # rolled back or committed since
            self.forget_dirs()
            self._gen = self.journal.generation
        cached = self._dirs.get(key)
        if cached is not None:
            return cached
        try:   # the common case: it exists; one walk, still inside the rootfs
            fd = openat2(self.fd, key[1:] or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, RESOLVE)
        except OSError:
            fd = self._makedirs(parts, mode)    # creates, or finds what is wrong
        self._dirs[key] = fd
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
            durable = self._check_create(cur, prefix)
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
                self.journal.create(prefix, cur, name, True, st, durable=durable)
                self._own(fd, mode, st)
            finally:
                os.close(fd)
        raise NvhookError(f"cannot create {prefix} in the rootfs: it keeps changing")

    def _parent(self, path: str) -> tuple[int, str, bool]:
        """(fd of the directory of `path`, made if missing, the last component, whether
        that directory is on the rootfs's own mount); refused unless we may create
        entries there (_check_create). The fd is lent (_dir): the callers use it for
        the one entry they make, with no mount in between, and never close it."""
        parts = split(path)
        if not parts:
            raise NvhookError("the rootfs itself cannot be a file")
        key = "/" + "/".join(parts[:-1])
        fd = self._dir(key, parts[:-1])
        return fd, parts[-1], self._check_create(fd, path, key)

    def make_file(self, path: str, mode: int = 0o644) -> bool:
        """Create an empty regular file (mount target) unless something exists there.
        Never follows a symlink at the last component. Returns True if created."""
        made = self._create_file(path, mode)
        if made is None:
            return False
        os.close(made[0])
        return True

    def _create_file(self, path: str, mode: int = 0o644) -> tuple[int, os.stat_result] | None:
        """make_file, returning an fd of the new file and its fstat (None if something
        was there)."""
        parent, name, durable = self._parent(path)    # (lent: not closed here)
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, mode, dir_fd=parent)
        except FileExistsError:
            return None
        except OSError as e:
            raise NvhookError(f"cannot create {path} in the rootfs: {os.strerror(e.errno)}") from None
        try:
            st = os.fstat(fd)
            self.journal.create(path, parent, name, False, st, durable=durable)
            self._own(fd, mode, st)
        except BaseException:
            os.close(fd)
            raise
        return fd, st

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Write a file of ours into the image. A new file is made with O_EXCL; an
        existing entry (file or symlink) is replaced by rename on its parent dir, so a
        symlink is replaced, never written through. The old entry is restored on
        rollback."""
        parent, name, durable = self._parent(path)
        old_fd = None
        try:
            old_fd, old = _entry(parent, name)
            if old is not None and not (stat.S_ISREG(old.st_mode) or stat.S_ISLNK(old.st_mode)):
                raise NvhookError(f"cannot write {path} in the rootfs: it is a {_kind(old.st_mode)}")
            tmp = temp_name(name)
            self.journal.temp(path, parent, tmp, durable)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600, dir_fd=parent)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                self._own(fd, mode)
                st = os.fstat(fd)
            except BaseException:
                os.unlink(tmp, dir_fd=parent)
                raise
            finally:
                os.close(fd)
            self._swap_in(path, parent, name, tmp, st, old_fd, old, durable)
        except OSError as e:
            raise NvhookError(f"cannot write {path} in the rootfs: {os.strerror(e.errno)}") from None
        finally:
            if old_fd is not None:
                _replaced.append(old_fd)        # (freed later: _replaced)

    def _swap_in(self, path: str, parent: int, name: str, tmp: str, st: os.stat_result,
                 old_fd: int | None, old: os.stat_result | None, durable: bool) -> None:
        """rename our finished temp entry `tmp` (stat `st`) to `name`, keeping what was
        there (old_fd: O_PATH of it) for rollback. Journaled before the rename, under
        both names: a kill on either side of it leaves nothing the replay cannot find."""
        from libinject.linux.atomic import discarded_on_error

        with discarded_on_error(parent, tmp):
            self.journal.create(path, parent, name, False, st, durable=durable, alias=tmp)
            if old is not None:
                self._save(path, parent, name, old_fd, old, durable)  # type: ignore[arg-type]
            os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)

    def preserve(self, path: str) -> None:
        """Journal the current state of an entry something else will rewrite (the
        image's /etc/ld.so.cache before ldconfig), so rollback puts it back."""
        parent, name, durable = self._parent(path)
        fd = None
        try:
            fd, old = _entry(parent, name)
            if old is None:
                if durable:
                    self.journal.record({"op": "absent", "path": path})
                pfd = self.journal.keep(os.dup(parent))

                def remove() -> None:
                    try:
                        os.unlink(name, dir_fd=pfd)
                    except FileNotFoundError:
                        pass
                self.journal.add(f"remove {path}", remove)
            elif stat.S_ISREG(old.st_mode) or stat.S_ISLNK(old.st_mode):
                self._save(path, parent, name, fd, old, durable)  # type: ignore[arg-type]
        finally:
            if fd is not None:
                os.close(fd)

    def _save(self, path: str, parent: int, name: str, fd: int, old: os.stat_result,
              durable: bool) -> None:
        """Keep the entry `fd` (O_PATH, not following a symlink; `old` its fstat) for
        rollback. Never opened by name: a regular file is read through /proc/self/fd of
        that very inode, so a device node swapped in after the check is never opened."""
        if stat.S_ISLNK(old.st_mode):
            saved: bytes | str = os.readlink("", dir_fd=fd)
        elif stat.S_ISREG(old.st_mode):
            if old.st_size > SAVE_LIMIT:
                raise NvhookError(f"cannot save {path} in the rootfs for rollback: larger than "
                                  f"{SAVE_LIMIT} bytes")
            rfd = os.open(f"self/fd/{fd}", os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC,
                          dir_fd=proc_fd())
            try:
                now = os.fstat(rfd)
                if (now.st_dev, now.st_ino) != (old.st_dev, old.st_ino):   # never: same inode
                    raise NvhookError(f"{path} in the rootfs changed while saving it")
                chunks, size = [], 0
                while size <= SAVE_LIMIT and (chunk := os.read(rfd, 1 << 20)):
                    chunks.append(chunk)
                    size += len(chunk)
                saved = b"".join(chunks)[:SAVE_LIMIT]
            finally:
                os.close(rfd)
        else:
            raise NvhookError(f"cannot save {path} in the rootfs: it is a {_kind(old.st_mode)}")
        rec = {"op": "save", "path": path, "kind": "link" if isinstance(saved, str) else "file",
               "mode": stat.S_IMODE(old.st_mode), "uid": old.st_uid, "gid": old.st_gid,
               "atime": old.st_atime_ns, "mtime": old.st_mtime_ns, "ino": old.st_ino}
        if durable:
            self.journal.record({**rec, "data": saved if isinstance(saved, str)
                                 else binascii.b2a_base64(saved, newline=False).decode()})
        pfd = self.journal.keep(os.dup(parent))
        self.journal.add(f"restore {path}", lambda: put_back(pfd, name, rec, saved))

    def symlink(self, target: str, path: str) -> bool:
        """Make symlink `path` -> `target` (symlinkat on the resolved parent; the link
        itself is never followed). Same link already there: nothing to do; another
        symlink: replaced (restored on rollback); anything else: left alone.
        Returns True if the image changed."""
        parent, name, durable = self._parent(path)
        try:
            try:
                os.symlink(target, name, dir_fd=parent)
            except FileExistsError:
                fd, old = _entry(parent, name)
                if fd is None or old is None:
                    raise NvhookError(f"cannot create symlink {path} in the rootfs: "
                                      "it keeps changing") from None
                try:
                    if not stat.S_ISLNK(old.st_mode) or os.readlink("", dir_fd=fd) == target:
                        return False
                    tmp = temp_name(name)
                    self.journal.temp(path, parent, tmp, durable)
                    os.symlink(target, tmp, dir_fd=parent)
                    try:
                        os.chown(tmp, self.uid, self.gid, dir_fd=parent, follow_symlinks=False)
                        st = os.stat(tmp, dir_fd=parent, follow_symlinks=False)
                    except BaseException:
                        os.unlink(tmp, dir_fd=parent)
                        raise
                    self._swap_in(path, parent, name, tmp, st, fd, old, durable)
                    return True
                finally:
                    os.close(fd)
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            self.journal.create(path, parent, name, False, st, durable=durable)
            if (st.st_uid, st.st_gid) != (self.uid, self.gid):
                os.chown(name, self.uid, self.gid, dir_fd=parent, follow_symlinks=False)
            return True
        except OSError as e:
            raise NvhookError(f"cannot create symlink {path} in the rootfs: {os.strerror(e.errno)}") from None

    # -- mounts --------------------------------------------------------------------
    def target(self, path: str, *, is_dir: bool, also: int = 0, allow_proc: bool = False,
               followed: bool = False) -> int:
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
                # A regular file, just made (O_EXCL) in a directory _check_create allowed:
                # the rootfs's own mount, a tmpfs of ours or the runtime's /dev tmpfs, so
                # never on procfs/sysfs (neither lets anyone create a file anyway).
                return made[0]
            try:
                fd = self.resolve(path)
            except FileNotFoundError:
                # The image's name is a symlink naming nothing (yet): NVIDIA's cli makes
                # what it names (and its directories), inside the rootfs, and mounts there.
                real = path if followed else links.follow(self.fd, path)
                if real == path:
                    raise NvhookError(f"mount target {path} in the rootfs: "
                                      f"{os.strerror(errno.ENOENT)}") from None
                return self.target(real, is_dir=False, also=also, allow_proc=allow_proc, followed=True)
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

    def attach(self, tree_fd: int, path: str, target_fd: int, *, allow_proc: bool = False,
               is_dir: bool | None = None) -> None:
        """move_mount a detached tree onto a resolved target fd (checked first: the
        rootfs's own mount, never shared; _check_attach); journaled. is_dir: whether
        the target is a directory, if the caller knows (else fstat tells)."""
        self._check_attach(target_fd, path, allow_proc)
        mid = native.mount_id(tree_fd)[0]     # the tree's, and the mount's once attached
        # In the container's namespace, mounts die with it: no record.
        if not self.own_ns and (path, mid) not in self._ahead:
            self.journal.record(self._mount_record(path, tree_fd, mid))
        try:
            native.move_mount(tree_fd, "", target_fd, "",
                              native.MOVE_MOUNT_F_EMPTY_PATH | native.MOVE_MOUNT_T_EMPTY_PATH)
        except OSError as e:
            raise NvhookError(f"cannot mount {path}: {os.strerror(e.errno)}") from None
        self.journal.mount(path, tree_fd)
        self.journal.mount_ids.add(mid)
        # Not shared, known without mountinfo: the tree was private (open_host's clones
        # are made private by set_attrs, fsmount's are), and the kernel makes a mount
        # shared on attach only when the mount it is attached to is shared, which
        # _check_attach has just refused (or made a slave). So targets on our own mounts
        # (the procfs tmpfs and the gpus/ entries bound in it) need no new reading.
        self._unshared.add(mid)
        if self._dirs and (is_dir if is_dir is not None else stat.S_ISDIR(os.fstat(target_fd).st_mode)):
            self.forget_dirs()

    def _mount_record(self, path: str, tree_fd: int, mid: int,
                      st: os.stat_result | None = None) -> dict:
        """The write-ahead record of attaching detached mount `tree_fd` (mount id `mid`,
        `st` its root's stat if known) at `path`: the mount id (it stays the mount's
        once attached) and our namespace let the replay tell the mount we made from
        any other of the same source there (an earlier, committed configure's) and
        from none at all (a record written ahead of a step a kill prevented)."""
        if st is None:
            st = os.fstat(tree_fd)
        if self._ns is None:
            self._ns = os.stat("self/ns/mnt", dir_fd=proc_fd()).st_ino
        return {"op": "mount", "path": path, "dev": st.st_dev, "ino": st.st_ino, "mnt": mid,
                "ns": self._ns}

    def expect_mounts(self, trees: Iterable[tuple[str, int, os.stat_result | None]]) -> None:
        """Write ahead, in one write, the records of the mounts a phase is about to
        attach: (container path, detached tree fd, its root's stat or None). attach()
        then writes none of its own for them. Only where mounts outlive a killed apply
        (not own_ns); a record whose mount never happens (the phase failed or was
        killed first) is passed over by the replay (see _mount_record)."""
        if self.own_ns or self.journal.disk is None:
            return
        recs = []
        for path, tree, st in trees:
            mid = native.mount_id(tree)[0]
            recs.append(self._mount_record(path, tree, mid, st))
            self._ahead.add((path, mid))
        self.journal.record(*recs)

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
        check = _EXPECT_TYPE.get(expect or "")
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
            self.attach(tree, path, tfd, is_dir=is_dir)   # target() checked its type
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
                self.attach(mfd, path, tfd, allow_proc=allow_proc)
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

