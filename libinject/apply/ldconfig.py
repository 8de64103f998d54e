"""Update a container's dynamic linker cache, safely (CVE-2025-23267).

ldconfig runs in a sandboxed child: its own private copy of the (container's) mount
namespace, pivoted into the rootfs with the old root detached, so every path it
follows (the image's /etc/ld.so.cache or /etc/ld.so.conf.d symlinks included) resolves
inside the rootfs; procfs/sysfs mounts in the rootfs detached too (no /proc/1/root way
out); empty environment, no new privileges, only CAP_DAC_OVERRIDE (as the rootfs owner
root) or none, rlimits, and a timeout.

The sandbox is also its own pid, network and IPC namespace (ldconfig is pid 1 there:
it can see and signal no host process, reach no abstract socket or SysV IPC object),
and its copy of the rootfs is nodev,nosuid and private: the host's ldconfig following an
image's `include /etc/x` into a device node gets EACCES instead of running a driver's
open() as host root. In the copy, kernel filesystems are detached and every other mount
but the rootfs's own is read-only: volumes are host directories, where ldconfig must
not make SONAME links (their libraries are still cached, as before); a mount that
cannot be detached or made read-only aborts the run (fail closed). It runs under a
seccomp deny-list (EPERM for keyrings, user and other namespaces, ptrace, bpf, the
mount API, modules, kexec, ...; csrc/native.c), in a session keyring of its own, named
nvhook-ldconfig until it execs, and dies with its parent (a killed hook leaves no
ldconfig writing the cache).

By default the *host's* ldconfig runs ("@/sbin/ldconfig"): Debian's is static, so it
runs inside any rootfs, and images without ldconfig work. A path without "@" is the
image's own ldconfig, accepted only when it resolves to a regular file in the rootfs.
That is allowed (as nvidia-container-cli allows it), since the sandbox above holds
an image binary as well as the host's: it runs as the rootfs owner with at most
CAP_DAC_OVERRIDE, no new privileges, inside the rootfs copy and its own namespaces.
musl images have no ld.so.cache: their /etc/ld-musl-<arch>.path gets the folders
(only a regular file there, never a symlink, counts as musl's and is read).

By default ldconfig does not run at all: update() merges the libraries we mounted
into the image's own ld.so.cache in-process (libinject.apply.ldcache_merge: what
ldconfig would write, without the fork, namespaces and exec), and runs the sandboxed
ldconfig only where the merge does not cover the image (no or an odd cache, CUDA
forward-compat folders, CDI's update-ldcache hook: see that module). "@!PATH" always
runs the host's PATH; a container path (the image's ldconfig) always runs.
"""
from __future__ import annotations

import errno
import gc
import os
import resource
import select
import _signal as signal   # not signal: its enums cost ~5 ms (libinject.linux.child)
import stat

from libinject.linux import mountinfo, native
from libinject.linux.child import Child, collect
from libinject.linux.privileges import (cap_last_cap, limit_capabilities, no_new_privs, set_name,
                                       set_pdeathsig)
from libinject.linux.proc import proc_fd
from libinject.errors import NvhookError
from libinject.apply import ldcache_merge
from libinject.apply.rootfs import RootFS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Iterable, Sequence

    from libinject.plan.edits import SymlinkEdit

CONF_DIR = "/etc/ld.so.conf.d"
KERNEL_FS = {"proc", "sysfs", "debugfs", "securityfs", "tracefs", "bpf", "cgroup", "cgroup2",
             "configfs", "efivarfs", "fusectl", "binfmt_misc", "hugetlbfs", "mqueue", "pstore"}
TIMEOUT = 30.0
MAX_FD = 0x7FFFFFFE     # closerange's upper end: "all" (one close_range(2) call)
MUSL_DEFAULT_PATH = ("/lib", "/usr/local/lib", "/usr/lib")   # musl's built-in default
MAX_MUSL_PATH = 64 << 10    # bytes of an image's musl .path read (a real one: ~30)


DEFAULT = "@/sbin/ldconfig"
UBUNTU_REAL = "/sbin/ldconfig.real"


def open_ldconfig(spec: str, root: RootFS | None = None,
                  note: Callable[[str], None] | None = None) -> int:
    """fd of the ldconfig to execute. "@PATH" (or "@!PATH": always run it) is a host
    path: open it *before* entering the container's mount namespace. A plain path is
    the image's, resolved inside the rootfs (regular file only). A host "X.real" that
    does not exist falls back to the host's X, said through `note`."""
    if spec.startswith("@"):
        bang = "@!" if spec.startswith("@!") else "@"
        path = spec[len(bang):]
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            if e.errno == errno.ENOENT and path.endswith(".real") and len(path) > 6:
                # Ubuntu's name in a config copied to a host without it (RHEL, Debian, the
                # GPU Operator's): NVIDIA's toolkit falls back to the name without ".real"
                # (config.NormalizeLDConfigPath). Still a host path from the trusted config.
                if note is not None:
                    note(f"ldconfig {path} does not exist on this host: using {path[:-5]}")
                return open_ldconfig(bang + path[:-5], root, note)
            raise NvhookError(f"ldconfig {path}: {os.strerror(e.errno)}") from None
    else:
        if root is None:
            raise NvhookError(f"ldconfig {spec}: a container path needs the rootfs")
        try:
            fd = root.open_regular(spec)    # checked before it is opened for reading
        except OSError as e:
            raise NvhookError(f"ldconfig {spec} in the rootfs: {os.strerror(e.errno)}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NvhookError(f"ldconfig {spec} is not a regular file")
    head = os.pread(fd, 2, 0)
    if head == b"#!" and spec in (DEFAULT, "@!" + DEFAULT[1:]) and os.path.isfile(UBUNTU_REAL):
        # Ubuntu's /sbin/ldconfig is a shell wrapper around ldconfig.real: the default
        # becomes that, as NVIDIA's toolkit makes its default config there
        # (internal/config: "@/sbin/ldconfig.real" where it exists). A host path: trusted.
        os.close(fd)
        return open_ldconfig(spec.replace(DEFAULT[1:], UBUNTU_REAL), root)
    if head == b"#!":
        os.close(fd)
        raise NvhookError(f"ldconfig {spec} is a script (on Ubuntu use @/sbin/ldconfig.real)")
    return fd


def musl_arch() -> str:
    m = os.uname().machine
    return {"i686": "i386", "i586": "i386", "armv7l": "armhf", "ppc64le": "powerpc64le"}.get(m, m)


def is_musl(root: RootFS) -> str | None:
    """Container path of the musl .path file if the image uses musl's loader: it has
    the loader, or a .path that is a regular file itself (an image's symlink there,
    to anything, does not make a glibc image musl)."""
    arch = musl_arch()
    path = f"/etc/ld-musl-{arch}.path"
    st = root.lstat(path)
    if st is not None and stat.S_ISREG(st.st_mode):
        return path
    if root.lookup(f"/lib/ld-musl-{arch}.so.1") is not None:
        return path
    return None


def update_musl(root: RootFS, path: str, folders: Sequence[str]) -> None:
    """Add folders to musl's search path file (replacing, not writing through, a
    symlink). A new file starts from musl's default path, which it replaces. Only a
    regular file is read: a symlink (to a file the container cannot read, say) is
    replaced by a new file, never copied into one readable by all. The image's file is
    read as bytes, at most MAX_MUSL_PATH of them (real ones: a line or two): a larger one
    is one error, before anything is parsed or changed."""
    st = root.lstat(path)
    data = None
    if st is not None and not stat.S_ISLNK(st.st_mode):
        data = root.read_file(path, MAX_MUSL_PATH + 1, follow=False)
    if data is None:
        have = [os.fsencode(p) for p in MUSL_DEFAULT_PATH]
    else:
        if len(data) > MAX_MUSL_PATH:
            raise NvhookError(f"{path} in the rootfs: larger than {MAX_MUSL_PATH} bytes")
        have = data.replace(b":", b"\n").split()
    known = set(have)
    new = have + [f for f in dict.fromkeys(map(os.fsencode, folders)) if f not in known]
    if data is not None and len(new) == len(have):
        return
    root.write_file(path, b"\n".join(new) + b"\n", 0o644)


def write_conf(root: RootFS, folders: Sequence[str]) -> str | None:
    """/etc/ld.so.conf.d/00-nvcr-<random>.conf listing the folders (as NVIDIA's
    update-ldcache hook does), so a later ldconfig in the container keeps them.
    Only when the image has an ld.so.conf.d directory (inside the rootfs)."""
    found = root.lookup(CONF_DIR)
    if found is None:
        return None
    fd, st = found
    os.close(fd)
    if not stat.S_ISDIR(st.st_mode):
        return None
    data = ("\n".join(folders) + "\n").encode()
    # A second configure of the same rootfs must not pile up identical files.
    dfd = root.resolve(CONF_DIR, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in os.listdir(dfd):
            if name.startswith("00-nvcr-") and name.endswith(".conf"):
                try:
                    same = root.read_file(f"{CONF_DIR}/{name}", 1 << 16, follow=False) == data
                except (NvhookError, OSError):
                    continue
                if same:
                    return f"{CONF_DIR}/{name}"
    finally:
        os.close(dfd)
    path = f"{CONF_DIR}/00-nvcr-{os.urandom(5).hex()}.conf"
    root.write_file(path, data, 0o644)
    return path


def merges(spec: str) -> bool:
    """Whether the ldconfig setting lets update() merge the cache in-process: a host
    ldconfig ("@PATH", the fallback), not "@!PATH" nor the image's own."""
    return spec.startswith("@") and not spec.startswith("@!")


def update(root: RootFS, folders: Sequence[str], *, exec_fd: int | None = None,
           ldconfig: str = "@/sbin/ldconfig", timeout: float = TIMEOUT,
           mark: Callable[[str], None] | None = None,
           libraries: Iterable[tuple[str, int]] | None = None,
           links: Iterable[SymlinkEdit] = ()) -> str:
    """Make `folders` visible to the container's loader. Returns "musl", "merged"
    (ldcache_merge) or "ldconfig".
    `exec_fd`: an ldconfig fd opened earlier (host binary opened before setns).
    `mark`: optional timing hook, called with a phase name at the end of each phase.
    `libraries`: (container path, fd of the source) of every library mounted, and
    `links` the planned symlinks, for the merge; None: run ldconfig."""
    mark = mark or (lambda phase: None)
    folders = list(dict.fromkeys(folders))
    musl = is_musl(root)
    if musl:
        update_musl(root, musl, folders)
        return "musl"
    if folders:
        write_conf(root, folders)
    mark("ld.so.conf")
    ldcache_merge.last_fallback = "no libraries given" if libraries is None else "@! or image ldconfig"
    if libraries is not None and merges(ldconfig):
        try:
            ldcache_merge.merge(root, folders, libraries, links)
        except ldcache_merge.Unsupported as e:
            ldcache_merge.last_fallback = str(e)
        else:
            ldcache_merge.last_fallback = None
            mark("ldcache")
            return "merged"
    root.preserve("/etc/ld.so.cache")   # rollback restores the image's cache
    root.preserve("/etc/ld.so.cache~")  # and removes ldconfig's temp file, if killed
    own = exec_fd is None
    fd = open_ldconfig(ldconfig, root) if own else exec_fd
    try:
        run_sandboxed(root, fd, ["ldconfig", "-f", "/etc/ld.so.conf", "-C", "/etc/ld.so.cache",
                                 *folders], timeout=timeout)
    finally:
        if own:
            os.close(fd)  # type: ignore[arg-type]
    mark("ldconfig")
    return "ldconfig"


def run_sandboxed(root: RootFS, exec_fd: int, argv: list[str], *, timeout: float = TIMEOUT) -> None:
    """Run exec_fd with argv inside the rootfs, sandboxed; raise NvhookError on failure."""
    cap_last_cap()              # read once, here, rather than in every child
    proc = proc_fd()
    # The child is pid 1 of a new pid namespace: unshare(CLONE_NEWPID) here applies to
    # our next child only, and setns back to our own namespace right after the fork
    # keeps every later child of ours in it. (Unsharing in the child would need one
    # more fork of this big process: ~2 ms; this costs two syscalls.)
    own_pidns = os.open("self/ns/pid", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
    try:
        native.unshare(native.CLONE_NEWPID)
    except OSError as e:
        os.close(own_pidns)
        raise NvhookError(f"ldconfig sandbox: new pid namespace: {os.strerror(e.errno)}") from None
    try:
        r, w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
    except BaseException:
        native.setns(own_pidns, native.CLONE_NEWPID)
        os.close(own_pidns)
        raise
    if pid != 0:
        try:
            native.setns(own_pidns, native.CLONE_NEWPID)
        except OSError as e:    # never expected; later forks would fail, so say so now
            Child(pid).close()      # killed and reaped
            os.close(r)
            os.close(w)
            raise NvhookError(f"ldconfig sandbox: back to our pid namespace: "
                              f"{os.strerror(e.errno)}") from None
        finally:
            os.close(own_pidns)
    if pid == 0:  # pragma: no cover - child
        gc.disable()            # a collection would copy (COW) the whole inherited heap
        try:
            os.close(r)
            _sandbox_child(root, exec_fd, argv, w)
        except BaseException as e:  # report, never return into the caller's stack
            msg = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            what = f"{e.filename}: " if isinstance(e, OSError) and e.filename else ""
            line = f"nvhook sandbox: {what}{msg}\n".encode()
            try:
                os.write(w, line)
            except OSError:     # w is closed once it is stdout/stderr (closerange)
                try:
                    os.write(2, line)
                except OSError:
                    pass
            finally:
                os._exit(126)
        os._exit(126)
    os.close(w)
    out = _wait(pid, r, timeout)
    if out is not None:
        raise NvhookError(f"ldconfig failed: {out}")


def _wait(pid: int, r: int, timeout: float) -> str | None:
    """Collect output and wait with a deadline; None when the child exited 0."""
    try:
        with Child(pid) as child:
            code, (buf,) = collect(child, [r], timeout, limit=1 << 16)
    except TimeoutError as e:
        return str(e)
    finally:
        os.close(r)
    if code == 0:
        return None
    lines = [ln for ln in buf.decode(errors="replace").splitlines() if ln.strip()]
    detail = lines[-1] if lines else ""
    return f"exit status {code}" + (f": {detail}" if detail else "")


def _sandbox_child(root: RootFS, exec_fd: int, argv: list[str], err_fd: int) -> None:
    import _prctl

    set_name("nvhook-ldconfig")   # what ps shows until it execs
    proc = proc_fd()                 # the host's /proc: our own fds and mountinfo
    last_cap = cap_last_cap()
    # A detached copy of the rootfs with what is mounted in it, taken from the fd (the
    # rootfs may be "/" of a container that has already pivoted).
    tree = native.open_tree(root.fd, "", native.OPEN_TREE_CLONE | native.OPEN_TREE_CLOEXEC
                            | native.AT_EMPTY_PATH | native.AT_RECURSIVE)
    # nodev: the image's device nodes cannot be opened (an ld.so.conf `include` of a
    # char device would run its driver's open as host root); nosuid: nothing gains
    # privileges by exec (no_new_privs too); private: a clone of a shared mount is its
    # peer, and detaching mounts in the copy below would detach them in the container
    # (or the host) too. Before the copy is attached anywhere.
    native.mount_setattr(tree, "", native.AT_EMPTY_PATH | native.AT_RECURSIVE,
                         native.MOUNT_ATTR_NODEV | native.MOUNT_ATTR_NOSUID,
                         propagation=native.MS_PRIVATE)
    # A private mount namespace (nothing below propagates anywhere), and network and
    # IPC namespaces of its own (the pid namespace came with the fork).
    native.unshare(native.CLONE_NEWNS | native.CLONE_NEWNET | native.CLONE_NEWIPC)
    native.mount(None, "/", None, native.MS_REC | native.MS_PRIVATE)
    native.move_mount(tree, "", native.AT_FDCWD, "/", native.MOVE_MOUNT_F_EMPTY_PATH)
    os.fchdir(tree)
    native.pivot_root(".", ".")
    native.umount2(".", native.MNT_DETACH)
    os.chdir("/")
    # Kernel filesystems inside the rootfs (runc has mounted the container's /proc by
    # prestart time) would give a way back to the host (/proc/1/root): detach them,
    # and abort if any is left (one covered by another mount surfaces once the mount
    # above it is gone: a few rounds).
    left = _kernel_mounts(proc)
    for _round in range(8):
        if not left:
            break
        for mp in left:
            try:
                native.umount2(mp, native.MNT_DETACH | native.UMOUNT_NOFOLLOW)
            except OSError:
                pass
        left = _kernel_mounts(proc)
    if left:
        raise OSError(errno.EBUSY, f"cannot detach kernel filesystem at {left[0]} in the "
                      "rootfs copy; refusing to run ldconfig")
    # Every other mount but the rootfs's own read-only: volumes are host directories,
    # and an image's ld.so.conf naming one would have ldconfig make SONAME links there
    # (as root). Then check, and fail closed.
    for mp in _writable_mounts(proc):
        _read_only(mp)
    writable = _writable_mounts(proc)
    if writable:
        raise OSError(errno.EBUSY, f"cannot make the mount at {writable[0]} in the rootfs "
                      "copy read-only; refusing to run ldconfig")
    # stdin: an empty pipe; stdout/stderr: our pipe; nothing else but the binary
    # (close_range around it: whatever the caller had open, CLOEXEC or not).
    pr, pw = os.pipe()
    os.dup2(pr, 0)
    os.dup2(err_fd, 1)
    os.dup2(err_fd, 2)
    if exec_fd < 3:   # never: 0-2 were open before; keep it out of the way anyway
        exec_fd = os.dup(exec_fd)
    os.closerange(3, exec_fd)
    os.closerange(exec_fd + 1, MAX_FD)
    for res, lim in ((resource.RLIMIT_CPU, 30), (resource.RLIMIT_AS, 1 << 30),
                     (resource.RLIMIT_FSIZE, 256 << 20), (resource.RLIMIT_CORE, 0),
                     (resource.RLIMIT_NOFILE, 1024)):
        soft, hard = resource.getrlimit(res)
        lim = lim if hard == resource.RLIM_INFINITY else min(lim, hard)
        resource.setrlimit(res, (lim, lim))
    # As the rootfs owner. Root keeps CAP_DAC_OVERRIDE only (an /etc that is not
    # writable to its owner); anyone else runs without capabilities.
    os.setgroups([])
    os.setresgid(root.gid, root.gid, root.gid)
    if root.uid == 0:
        limit_capabilities({_prctl.CAP_DAC_OVERRIDE}, last_cap=last_cap)
    else:
        os.setresuid(root.uid, root.uid, root.uid)
    # Nothing keyed in the caller's session keyring (the runtime's) is reachable. Where
    # keyctl is refused to us (a seccomp filter: systemd-nspawn's, a container's) it is
    # refused to ldconfig as well, and the filter below denies the key syscalls anyway.
    try:
        native.join_session_keyring()
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOSYS):
            raise
    # Dies with the apply that runs it (a hook killed by its runtime's timeout): set
    # after the last credential change, which clears it. The parent may have died
    # before: its end of our pipe (stdout now) is closed then.
    set_pdeathsig(signal.SIGKILL)
    if _reader_gone(1):
        os._exit(126)
    no_new_privs()
    native.seccomp_ldconfig()       # last: execve itself must still be allowed
    os.execve(exec_fd, argv, {})


def _reader_gone(fd: int) -> bool:
    """True if the read end of pipe `fd` (the parent's) is closed."""
    p = select.poll()
    p.register(fd, select.POLLOUT)
    return any(ev & select.POLLERR for _, ev in p.poll(0))


def _kernel_mounts(proc: int) -> list[str]:
    """Mount points of proc/sysfs/... in our (pivoted) namespace, deepest first."""
    out = [m.mountpoint for m in mountinfo.read(proc_fd=proc)
           if m.fstype in KERNEL_FS and m.mountpoint != "/"]
    return sorted(out, key=lambda p: -p.count("/"))


def _writable_mounts(proc: int) -> list[str]:
    """Mount points of the writable mounts in our (pivoted) namespace but "/", less
    those covered by another mount at the same place (unreachable)."""
    mounts = mountinfo.read(proc_fd=proc)
    where = {m.id: m.mountpoint for m in mounts}
    covered = {m.parent for m in mounts if where.get(m.parent) == m.mountpoint}
    return [m.mountpoint for m in mounts
            if m.mountpoint != "/" and "ro" not in m.options and m.id not in covered]


def _read_only(mountpoint: str) -> None:
    """Make the mount at `mountpoint` (a path from mountinfo: symlink-free unless the
    image swapped one in since, which is then refused) read-only, itself only."""
    try:
        fd = native.openat2(native.AT_FDCWD, mountpoint, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW,
                            0, native.RESOLVE_NO_SYMLINKS | native.RESOLVE_NO_MAGICLINKS)
    except OSError:
        return      # the check after the loop fails closed
    try:
        native.mount_setattr(fd, "", native.AT_EMPTY_PATH, native.MOUNT_ATTR_RDONLY)
    except OSError:
        pass
    finally:
        os.close(fd)
