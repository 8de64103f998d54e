"""The live applier: make ContainerEdits real in a container's rootfs.

Work happens in a forked child, so the caller keeps its mount namespace and its
capabilities:
  1. in the caller's (host) mount namespace, open every host source as a detached
     mount (open_tree OPEN_TREE_CLONE) and check it (device nodes: char device with the
     planned major:minor); open the host's ldconfig;
  2. with a pid, enter the container's mount namespace (runc's prestart hook runs in
     the runtime's namespace, where the container's /dev tmpfs is invisible);
  3. drop capabilities the rest does not need;
  4. in order: procfs tmpfs, binaries, libraries, symlinks, CUDA compat, firmware, IPC,
     graphics files, control devices, per-GPU devices and their procfs entries, DRM
     nodes, MIG, IMEX, ldconfig;
     every container path through safefs.RootFS, every step journaled;
  5. report to the parent, which applies the cgroup rules (they need the host's view of
     the cgroup tree) and then tells the child to commit or roll back.
Any failure undoes everything done so far and raises NvhookError with one line.

A process killed mid-apply (a runtime's hook timeout, serve-timeout) cannot undo
anything: each step is written ahead to a journal on the host (journal.DiskJournal,
/run/nvhook/journal/<rootfs key>), and the next apply on the same rootfs (the
container retried, or any `configure` of it) first replays what it finds there
(RootFS.replay), before step 4. What a kill leaves until then: in the rootfs, the
entries made so far (placeholders, directories, SONAME links, the ld.so.conf.d file,
a rewritten ld.so.cache or musl path file); mounts die with the container's mount
namespace (and are replayed too where they were made in ours). Not covered: an entry
made in the microseconds between its syscall and its record, the SONAME links the
sandboxed ldconfig itself makes (never undone, as on rollback), and cgroup device
rules (they die with the container's cgroup).
"""
from __future__ import annotations

import gc
import os
import select
import stat
import time

import _prctl     # python-prctl's constants (libinject.linux.privileges says why not prctl)

from libinject import jsonc
from libinject.linux import native
from libinject.linux.child import Child
from libinject.linux.privileges import limit_capabilities
from libinject.linux.proc import proc_fd
from libinject.linux.resolve import openat2
from libinject.plan.edits import RUNTIME_LIBRARY, ContainerEdits, DeviceEdit, MountEdit
from libinject.errors import NvhookError
from libinject.apply.journal import DiskJournal, Journal
from libinject.apply.rootfs import OnHostMount, RootFS, fs_type, mount_attrs, open_host
from libinject.linux.resolve import split
from libinject.record import field, record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Protocol

TIMEOUT = 120.0
LIB_OPTS = ("ro", "nosuid", "nodev")
# Read-only as NVIDIA binds them (nvc_mount.c mount_device): a device node is written
# through its driver, which a read-only mount does not stop; the node itself cannot be changed.
DEV_ATTRS = native.MOUNT_ATTR_RDONLY | native.MOUNT_ATTR_NOSUID | native.MOUNT_ATTR_NOEXEC
PROC_ATTRS = (native.MOUNT_ATTR_RDONLY | native.MOUNT_ATTR_NOSUID | native.MOUNT_ATTR_NODEV
              | native.MOUNT_ATTR_NOEXEC)
# mounts by kind, in the order they are applied; symlinks and compat go after libraries
EARLY_KINDS = ("binary", "library")
LATE_KINDS = ("firmware", "ipc", "graphics")
OPTIONAL_KINDS = ("ipc",)   # skipped (a note) where only a mount not the container's could take them
EXPECT = {"binary": "file", "library": "file", "firmware": "file", "ipc": None,
          "graphics": "file", "procfs-gpu": "dir", "devdir": "dir"}
DEVICE_KINDS = ("control", "gpu", "drm", "mig", "imex")
# Optional timing hook (bench/bench_apply.py): called as trace(phase, t) with t =
# time.perf_counter() at the end of each phase (the worker's marks come back with
# its report; perf_counter is CLOCK_MONOTONIC, the same clock in every process).
trace: Callable[[str, float], None] | None = None
_marks: list[tuple[str, float]] = []
# What the last apply has to say besides its result (a discarded journal): log lines
# for the caller (pipeline.configure logs them).
notes: list[str] = []


def _mark(phase: str) -> None:
    if trace is not None:
        _marks.append((phase, time.perf_counter()))


COMPAT_LIBS = ("libcuda.so.", "libcudadebugger.so.", "libnvidia-nvvm.so.",
               "libnvidia-ptxjitcompiler.so.", "libnvidia-pkcs11", "libnvidia-gpucomp.so.")


def _preload(edits: ContainerEdits) -> None:
    """Import what the worker needs before forking: importing in a fresh fork costs
    several times more (every page the import machinery writes is copied), and after
    setns the container's namespace may not show this Python's files at all."""
    if edits.ldconfig_folders or edits.cuda_compat:
        from libinject.apply import ldconfig  # noqa: F401


def caps_kept() -> set[int]:
    """The capabilities applying edits needs (the rest is dropped for good)."""
    return {_prctl.CAP_SYS_ADMIN, _prctl.CAP_SYS_CHROOT, _prctl.CAP_CHOWN, _prctl.CAP_FOWNER,
            _prctl.CAP_DAC_OVERRIDE, _prctl.CAP_DAC_READ_SEARCH, _prctl.CAP_SETUID,
            _prctl.CAP_SETGID, _prctl.CAP_SETPCAP, _prctl.CAP_KILL}


class _Source:
    """A host source opened as a detached tree: its fd and the source's stat."""
    __slots__ = ("fd", "st")

    def __init__(self, fd: int, st: os.stat_result) -> None:
        self.fd, self.st = fd, st


@record
class _Sources:
    """Host sources opened before entering the container's namespace."""
    mounts: list[_Source] = field(default_factory=list)
    devices: list[_Source] = field(default_factory=list)
    gpu_dirs: list[_Source] = field(default_factory=list)
    ldconfig_fd: int | None = None


def apply(edits: ContainerEdits, rootfs: str, *, pid: int | None = None,
          ldconfig: str = "@/sbin/ldconfig", no_cgroups: bool = False,
          timeout: float = TIMEOUT, worker: bool = True, owner: str | None = None) -> list[str]:
    """Apply edits to rootfs (in pid's mount namespace when pid is given), all or
    nothing. Returns the container paths mounted, in order.

    worker=False is for one-shot callers (a CLI process that exits afterwards): the
    work runs in this process, without the worker's fork, pipes and copied pages. It
    leaves this process with the worker's limited capabilities (for good) and umask
    022; with a pid it enters the container's mount namespace and comes back to ours
    (cwd kept) before the cgroup step. No `timeout` for the mount phase then (the
    sandboxed ldconfig keeps its own)."""
    notes.clear()
    _marks.clear()
    _mark("start")
    nsfd = None
    if pid is not None:
        try:
            nsfd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise NvhookError(f"container process {pid}: {os.strerror(e.errno)}") from None
    _preload(edits)
    # Without a cgroup step nothing can fail after the worker's report: it commits
    # on its own, saving a round trip.
    cgroup_step = bool(edits.cgroup_rules and pid is not None and not no_cgroups)
    if not worker:
        try:
            return _apply_here(edits, rootfs, pid, nsfd, ldconfig, cgroup_step, owner)
        finally:
            if nsfd is not None:
                os.close(nsfd)
            _mark("commit")
            _flush()
    rep_r, rep_w = os.pipe2(os.O_CLOEXEC)
    cmd_r, cmd_w = os.pipe2(os.O_CLOEXEC)
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 1
        # A short-lived worker: no collections, whose walk over the inherited heap
        # would copy (COW) most of the parent's pages.
        gc.disable()
        try:
            os.close(rep_r)
            os.close(cmd_w)
            code = _child(edits, rootfs, nsfd, ldconfig, rep_w, cmd_r, wait=cgroup_step, owner=owner)
        finally:
            os._exit(code)
    os.close(rep_w)
    os.close(cmd_r)
    if nsfd is not None:
        os.close(nsfd)
    watched = Child(child)
    reader = _Reader(rep_r, watched)
    try:
        report = reader.get(timeout)
        _marks.extend((str(n), float(t)) for n, t in report.get("marks", ()))
        notes.extend(str(n) for n in report.get("notes", ()))
        _mark("report")
        if not report.get("ok"):
            raise NvhookError(report.get("error", "apply failed"))
        mounts = list(report.get("mounts", []))
        if not report.get("committed"):
            _cgroups_then_commit(_WorkerTx(cmd_w, reader, timeout), edits, pid, cgroup_step)
        _mark("commit")
        return mounts
    finally:
        # A worker still waiting for its verdict reads EOF and rolls back: give it the
        # time (its report pipe still open, so it can say so), then kill if need be.
        os.close(cmd_w)
        watched.wait(timeout)
        watched.close()
        reader.close()
        _mark("reap")
        _flush()


def _flush() -> None:
    if trace is not None:
        for phase, t in _marks:
            trace(phase, t)
    _marks.clear()


class _Reader:
    """JSON lines from the child, with a deadline; a dead or hung child is an error."""

    def __init__(self, fd: int, child: Child):
        self.fd, self.child, self.buf = fd, child, b""

    def get(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.child.kill()
                raise NvhookError(f"applying edits timed out after {timeout:g}s; "
                                  "the container may be left partly configured")
            r, _, _ = select.select([self.fd], [], [], left)
            if r:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    raise NvhookError("applying edits failed: worker process died")
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return jsonc.loads(line)

    def close(self) -> None:
        os.close(self.fd)


def _send(fd: int, msg: dict) -> None:
    data = (jsonc.dumps(msg) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


# -- the child ---------------------------------------------------------------------
def _child(edits: ContainerEdits, rootfs: str, nsfd: int | None, ldconfig: str,
           rep: int, cmd: int, wait: bool = True,
           owner: str | None = None) -> int:  # pragma: no cover - runs in the child
    journal = Journal(owner=owner)
    _marks.clear()
    _mark("fork")
    os.umask(0o022)
    try:
        _attempt(edits, rootfs, nsfd, ldconfig, journal)
    except NvhookError as e:    # rolled back; reported to the parent as one line
        _send(rep, {"ok": False, "error": str(e), "marks": _marks, "notes": notes})
        return 1
    if not wait:
        mounts = list(journal.mounts)
        journal.commit()
        _send(rep, {"ok": True, "mounts": mounts, "committed": True, "marks": _marks, "notes": notes})
        return 0
    try:
        _send(rep, {"ok": True, "mounts": journal.mounts, "marks": _marks, "notes": notes})
        verdict = os.read(cmd, 64).strip()
    except OSError:
        verdict = b""
    if verdict == b"commit":
        journal.commit()
        _send(rep, {"ok": True})
        return 0
    # Rollback asked for, or the parent went away. If it died after its cgroup step
    # (allow_devices) and before "commit", the device rules it added stay (nobody is
    # left to undo them) while the mounts go: the runtime fails the container start
    # on the hook's death, so the rules die with that container's cgroup.
    left = journal.rollback()
    try:
        _send(rep, {"ok": not left, "left": left})
    except OSError:
        pass
    return 0


def _work(edits: ContainerEdits, rootfs: str, nsfd: int | None, ldconfig: str,
          journal: Journal) -> None:
    """Open the host side, enter the container's namespace (nsfd), limit
    capabilities, apply. Raises; the journal holds what was done."""
    # Everything is imported before setns (_preload): after it, the container's
    # namespace may not show this Python's files at all (a container that already
    # pivoted), or show the image's.
    src = _open_sources(edits, ldconfig)
    proc = proc_fd()                # the host's /proc, for after setns
    host_id = _identity(rootfs)
    journal.disk = DiskJournal.open(rootfs, owner=journal.owner)   # on the host, for this very rootfs
    notes.extend(journal.disk.notes)
    _mark("sources")
    own_ns = False
    host_mounts = -1
    if nsfd is not None:
        # Another namespace than ours: the container's, whose own mounts we may change
        own_ns = os.fstat(nsfd).st_ino != os.stat("self/ns/mnt", dir_fd=proc).st_ino
        if own_ns:      # (read, if ever, from the container's: RootFS._container_own)
            host_mounts = os.open("self/mountinfo", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
        try:
            native.setns(nsfd, native.CLONE_NEWNS)
        except BaseException:
            if host_mounts >= 0:
                os.close(host_mounts)
            raise
        os.chdir("/")
        rootfs = _container_rootfs(rootfs, host_id)
        _mark("setns")
    try:
        limit_capabilities(caps_kept())
        root = RootFS(rootfs, journal, own_ns=own_ns, host_mounts=host_mounts)
    except BaseException:
        if host_mounts >= 0:
            os.close(host_mounts)
        raise
    _mark("caps")
    try:
        if journal.disk.stale:      # what a killed apply left in this rootfs
            root.replay(journal.disk.stale)
            journal.disk.restart()
            _mark("replay")
        _apply(edits, root, src, ldconfig)
    finally:
        root.close()


def _attempt(edits: ContainerEdits, rootfs: str, nsfd: int | None, ldconfig: str,
             journal: Journal) -> None:
    """_work, all or nothing: on failure everything done is undone (in the namespace
    it was done in: umount2 only detaches mounts of the caller's own) and NvhookError
    raised, one line, naming what could not be undone."""
    try:
        _work(edits, rootfs, nsfd, ldconfig, journal)
    except Exception as e:  # noqa: BLE001 - one line, after the undo
        err = _error_line(e)
        raise NvhookError(err + _undo_note(journal.rollback())) from None
    except BaseException:
        journal.rollback()
        raise


def _undo_note(left: list[str]) -> str:
    return f" (undo incomplete: {'; '.join(left)})" if left else ""


if TYPE_CHECKING:     # a type only: defining a Protocol at run time needs typing
    class _Transaction(Protocol):
        """Applied mounts, not yet final: roll back (returns what could not be undone)
        or commit."""

        def rollback(self) -> list[str]: ...

        def commit(self) -> None: ...


class _WorkerTx:
    """The worker's journal, through its pipes."""

    def __init__(self, cmd: int, reader: _Reader, timeout: float):
        self.cmd, self.reader, self.timeout = cmd, reader, timeout

    def rollback(self) -> list[str]:
        os.write(self.cmd, b"rollback\n")
        back = self.reader.get(self.timeout)
        return [] if back.get("ok") else [str(x) for x in back.get("left") or ("rollback failed",)]

    def commit(self) -> None:
        os.write(self.cmd, b"commit\n")
        done = self.reader.get(self.timeout)
        if not done.get("ok"):
            raise NvhookError(done.get("error", "apply failed"))


class _HereTx:
    """This process's own journal (apply(worker=False)): rollback in the container's
    mount namespace (`enter`), then back to ours (`leave`)."""

    def __init__(self, journal: Journal, enter: Callable[[], None], leave: Callable[[], None]):
        self.journal, self.enter, self.leave = journal, enter, leave

    def rollback(self) -> list[str]:
        self.enter()
        try:
            return self.journal.rollback()
        finally:
            self.leave()

    def commit(self) -> None:
        self.journal.commit()


def _cgroups_then_commit(tx: _Transaction, edits: ContainerEdits, pid: int | None,
                         cgroup_step: bool) -> None:
    """How every apply ends: the cgroup step, here in the caller's mount namespace (it
    needs the host's view of the cgroup tree), then commit. A failed cgroup step
    rolls the mounts back; a failed commit undoes the cgroup step."""
    undo = None
    if cgroup_step:
        try:
            from libinject.apply import cgroups
            undo = cgroups.allow_devices(pid, edits.cgroup_rules)  # type: ignore[arg-type]
        except Exception as e:  # noqa: BLE001 - any failure rolls the mounts back
            left = tx.rollback()
            msg = str(e) if isinstance(e, NvhookError) else f"{type(e).__name__}: {e}"
            raise NvhookError(f"cgroup device rules: {msg}{_undo_note(left)}") from None
        _mark("cgroups")
    try:
        tx.commit()
    except BaseException:
        if undo is not None:
            try:
                undo.undo()
            except Exception:  # noqa: BLE001 - the original error is the one to show
                pass
        raise
    if undo is not None:
        # Committed: a systemd scope's DeviceAllow= too, so a daemon-reload keeps them
        # (after the commit: an entry there cannot be taken back alone). Never fails.
        from libinject.apply import sdunit
        note = sdunit.keep_across_reload(pid, edits.cgroup_rules, undo)  # type: ignore[arg-type]
        if note:
            notes.append(note)


def _error_line(e: Exception) -> str:
    if isinstance(e, NvhookError):
        return str(e)
    if isinstance(e, OSError):
        why = os.strerror(e.errno) if e.errno else str(e)
        return f"{e.filename + ': ' if e.filename else ''}{why}"
    return f"internal error: {type(e).__name__}: {e}"


def _apply_here(edits: ContainerEdits, rootfs: str, pid: int | None, nsfd: int | None,
                ldconfig: str, cgroup_step: bool, owner: str | None = None) -> list[str]:
    """apply(worker=False): the worker's steps in this process, then the cgroup step
    back in our own mount namespace (it needs the host's view of the cgroup tree)."""
    journal = Journal(owner=owner)
    home = cwd = None
    if nsfd is not None:
        home = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        cwd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)

    def go_home() -> None:
        if home is not None:
            native.setns(home, native.CLONE_NEWNS)
            os.fchdir(cwd)  # type: ignore[arg-type]

    def enter() -> None:
        if nsfd is not None:
            native.setns(nsfd, native.CLONE_NEWNS)

    os.umask(0o022)
    try:
        try:
            _attempt(edits, rootfs, nsfd, ldconfig, journal)    # enters nsfd's namespace
        finally:
            go_home()
        _mark("report")
        mounts = list(journal.mounts)
        _cgroups_then_commit(_HereTx(journal, enter, go_home), edits, pid, cgroup_step)
        return mounts
    finally:
        for fd in (home, cwd):
            if fd is not None:
                os.close(fd)


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _container_rootfs(rootfs: str, host_id: tuple[int, int] | None) -> str:
    """The rootfs path to use inside the container's mount namespace. Before the
    runtime pivots (prestart hook) it is the same path; after (`configure --pid` on a
    created or running container) the rootfs is that namespace's "/"."""
    if host_id is None or _identity(rootfs) == host_id:
        return rootfs
    if _identity("/") == host_id:
        return "/"
    raise NvhookError(f"rootfs {rootfs} is not the root of process's mount namespace, nor visible in it")


def _open_sources(edits: ContainerEdits, ldconfig: str) -> _Sources:
    """Everything on the host side, opened in the host's mount namespace: every source
    in one native call (native.open_trees: what open_host does for each, without its
    Python around each of the dozens of them), checked as _open_sources_one_by_one
    checks them; one that cannot be opened: that, which says why."""
    procfs_dirs = edits.procfs.all_binds() if edits.procfs else ()
    ours = [m for m in edits.mounts if m.kind != RUNTIME_LIBRARY]
    paths = [m.host_path for m in ours]
    recursive = [mount_attrs(m.options)[1] for m in ours]
    paths += [d.host_path for d in edits.device_nodes]
    paths += [host_dir for host_dir, _, _ in procfs_dirs]
    recursive += [False] * (len(paths) - len(recursive))
    fds = native.open_trees(paths, recursive)
    if fds is None:
        return _open_sources_one_by_one(edits, ldconfig)
    src = _Sources()
    try:
        sources = [_Source(fd, os.fstat(fd)) for fd in fds]
        nm, nd = len(ours), len(edits.device_nodes)
        mine = iter(sources[:nm])
        for m in edits.mounts:      # (in edits.mounts' order: _apply zips the two)
            if m.kind == RUNTIME_LIBRARY:
                s = _runtime_library(m.host_path)
                if s.fd >= 0:
                    fds.append(s.fd)
                src.mounts.append(s)
            else:
                src.mounts.append(next(mine))
        src.devices = sources[nm:nm + nd]
        src.gpu_dirs = sources[nm + nd:]
        for d, s in zip(edits.device_nodes, src.devices):
            _check_device(d, s.st)
        for (host_path, _, is_dir), s in zip(procfs_dirs, src.gpu_dirs):
            _check_procfs_entry(host_path, is_dir, s.st)
        if ldconfig.startswith("@") and (edits.ldconfig_folders or edits.cuda_compat):
            from libinject.apply.ldconfig import open_ldconfig
            src.ldconfig_fd = open_ldconfig(ldconfig, note=notes.append)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return src


def _open_sources_one_by_one(edits: ContainerEdits, ldconfig: str) -> _Sources:
    """_open_sources, a source at a time (open_host each)."""
    src = _Sources()
    for m in edits.mounts:
        if m.kind == RUNTIME_LIBRARY:
            src.mounts.append(_runtime_library(m.host_path))
            continue
        _, recursive = mount_attrs(m.options)
        src.mounts.append(_open(m.host_path, f"{m.kind} {m.host_path}", recursive))
    for d in edits.device_nodes:
        s = _open(d.host_path, f"device {d.host_path}")
        _check_device(d, s.st)
        src.devices.append(s)
    if edits.procfs:
        for host_path, _, is_dir in edits.procfs.all_binds():
            s = _open(host_path, f"procfs entry {host_path}")
            _check_procfs_entry(host_path, is_dir, s.st)
            src.gpu_dirs.append(s)
    if ldconfig.startswith("@") and (edits.ldconfig_folders or edits.cuda_compat):
        from libinject.apply.ldconfig import open_ldconfig
        src.ldconfig_fd = open_ldconfig(ldconfig, note=notes.append)
    return src


def _check_procfs_entry(host_path: str, is_dir: bool, st: os.stat_result) -> None:
    if is_dir and not stat.S_ISDIR(st.st_mode):
        raise NvhookError(f"procfs entry {host_path} is not a directory")
    if not is_dir and not stat.S_ISREG(st.st_mode):
        raise NvhookError(f"procfs entry {host_path} is not a regular file")


def _runtime_library(path: str) -> _Source:
    """A library the runtime mounted from `path` (a CDI spec's mount, as the runtime
    resolved it): only read (its ELF header, for the ld cache), so a plain O_PATH fd,
    not a detached mount; a regular file. No path: the library is known by its
    container path only, and read where the runtime mounted it (_image_library): fd -1."""
    if not path:
        return _Source(-1, None)  # type: ignore[arg-type]
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as e:
        raise NvhookError(f"cannot open library {path}: {os.strerror(e.errno)}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NvhookError(f"library {path} is not a regular file")
    return _Source(fd, st)


def _open(path: str, what: str, recursive: bool = False) -> _Source:
    try:
        fd, st = open_host(path, recursive=recursive)
    except OSError as e:
        raise NvhookError(f"cannot open {what}: {os.strerror(e.errno)}") from None
    return _Source(fd, st)


def _check_device(d: DeviceEdit, st: os.stat_result) -> None:
    want = stat.S_ISBLK if d.type == "b" else stat.S_ISCHR
    if not want(st.st_mode):
        raise NvhookError(f"device {d.host_path} is not a {'block' if d.type == 'b' else 'char'} device")
    got = (os.major(st.st_rdev), os.minor(st.st_rdev))
    if got != (d.major, d.minor):
        raise NvhookError(f"device {d.host_path} is {got[0]}:{got[1]}, expected {d.major}:{d.minor}")


def _apply(edits: ContainerEdits, root: RootFS, src: _Sources, ldconfig: str) -> None:
    if edits.procfs:
        _procfs(root, edits)
        _mark("procfs")
    mounts = list(zip(edits.mounts, src.mounts))
    for kind in EARLY_KINDS:
        _mounts(root, [(m, s) for m, s in mounts if m.kind == kind])
        _mark(kind)
    for ln in edits.symlinks:
        root.symlink(ln.target, ln.link)
    _mark("symlinks")
    folders = list(edits.ldconfig_folders)
    if edits.cuda_compat:
        folders = _cuda_compat(root, edits, folders)
        _mark("compat")
    for kind in LATE_KINDS:
        _mounts(root, [(m, s) for m, s in mounts if m.kind == kind])
    known = EARLY_KINDS + LATE_KINDS + ("procfs-gpu", "devdir", RUNTIME_LIBRARY)
    _mounts(root, [(m, s) for m, s in mounts if m.kind not in known])
    _mark("late mounts")
    devices = list(zip(edits.device_nodes, src.devices))
    # A live /dev directory (devdir) brings its nodes itself: theirs are not made
    live = tuple(m.container_path + "/" for m, _ in mounts if m.kind == "devdir")
    devices = [(d, s) for d, s in devices if not d.path.startswith(live)]
    _mounts(root, [(m, s) for m, s in mounts      # (the host's own, in the host's /dev: kept)
                   if m.kind == "devdir" and not root.is_same(m.container_path, s.st)])
    for kind in DEVICE_KINDS:
        _devices(root, [(d, s) for d, s in devices if d.kind == kind])
        if kind == "gpu":
            _gpu_procfs(root, edits, src)
            _mounts(root, [(m, s) for m, s in mounts if m.kind == "procfs-gpu"])
    _devices(root, [(d, s) for d, s in devices if d.kind not in DEVICE_KINDS])
    _mark("devices")
    if folders:
        from libinject.apply import ldconfig as ldc
        # ours, and those the runtime mounted (a CDI spec's): their host sources, or
        # the files at their container paths
        libraries, opened = [], []
        try:
            for m, s in mounts:
                if m.kind == RUNTIME_LIBRARY and s.fd < 0:
                    fd = _image_library(root, m.container_path)
                    if fd is None:
                        continue
                    opened.append(fd)
                    libraries.append((m.container_path, fd))
                elif m.kind in ("library", RUNTIME_LIBRARY):
                    libraries.append((m.container_path, s.fd))
            ldc.update(root, folders, exec_fd=src.ldconfig_fd, ldconfig=ldconfig, mark=_mark,
                       libraries=libraries, links=edits.symlinks)
        finally:
            for fd in opened:
                os.close(fd)


def _image_library(root: RootFS, path: str) -> int | None:
    """O_PATH fd of the regular file at `path` in the rootfs (the runtime's mount of a
    driver library, at createRuntime and createContainer), or None: not there, or not a
    regular file (never a symlink followed, nothing on procfs/sysfs). Only its ELF
    header is read (ldcache_merge, bounded by its size); a file the merge does not
    find for a planned link makes it fall back to ldconfig."""
    try:
        fd = root.resolve(path, os.O_PATH | os.O_NOFOLLOW)
    except (OSError, NvhookError):
        return None
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and fs_type(fd) not in (native.PROC_SUPER_MAGIC, native.SYSFS_MAGIC):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _mounts(root: RootFS, items: list[tuple[MountEdit, _Source]]) -> None:
    root.expect_mounts([(m.container_path, s.fd, s.st) for m, s in items])  # written ahead at once
    for m, s in items:
        attrs, recursive = mount_attrs(m.options)
        try:
            root.bind_tree(s.fd, s.st, m.container_path, attrs, recursive=recursive,
                           expect=EXPECT.get(m.kind), source=m.host_path)
        except OnHostMount as e:
            if m.kind not in OPTIONAL_KINDS:
                raise
            # (the persistenced/fabricmanager sockets, the MPS pipe dir: CUDA works
            # without them, as with --no-persistenced; never written into a volume)
            notes.append(f"skipped {m.container_path}: {e}")


def _devices(root: RootFS, items: list[tuple[DeviceEdit, _Source]]) -> None:
    # A privileged container given the host's /dev has the driver's very nodes there:
    # nothing to make or mount (NVIDIA's cli binds each onto itself); the cgroup step
    # still allows them.
    items = [(d, s) for d, s in items if not root.is_same(d.path, s.st)]
    root.expect_mounts([(d.path, s.fd, s.st) for d, s in items])  # written ahead at once
    for d, s in items:
        try:
            root.bind_tree(s.fd, s.st, d.path, DEV_ATTRS, source=d.host_path)
        except OnHostMount as e:
            raise OnHostMount(f"{d.path}: the container's /dev is not its own (the host's /dev "
                              f"bound in?) and has no node {d.host_path} of the driver's; refusing "
                              f"to make one there ({e})") from None


def _procfs(root: RootFS, edits: ContainerEdits) -> None:
    """Read-only tmpfs over /proc/driver/nvidia with the planned files, and empty
    gpus/<busid> directories for the selected GPUs' entries (bound later)."""
    p = edits.procfs
    assert p is not None
    files = {name.lstrip("/"): data.encode() for name, data in p.files.items()}
    # the bound files' targets: empty files made with the tmpfs (it is read-only after)
    files.update((rel, b"") for _, rel in p.bound_files)
    dirs = tuple(rel for _, rel in p.binds())
    tfd = _procfs_target(root, p.path)
    try:
        root.tmpfs(p.path, files=files, dirs=dirs, allow_proc=True, target_fd=tfd)
    finally:
        os.close(tfd)


def _procfs_target(root: RootFS, path: str) -> int:
    found = root.lookup(path)
    if found is not None:
        fd, st = found
        if not stat.S_ISDIR(st.st_mode):
            os.close(fd)
            raise NvhookError(f"{path} in the rootfs is not a directory")
        return fd
    parts = split(path)
    for i in range(len(parts) - 1, 0, -1):
        anc = "/" + "/".join(parts[:i])
        got = root.lookup(anc)
        if got is None:
            continue
        afd, _ = got
        try:
            if fs_type(afd) != native.PROC_SUPER_MAGIC:
                break
            # The container's real procfs (runc mounts it before prestart) without a
            # loaded nvidia module (simulated hosts): procfs cannot get new entries,
            # so cover the parent (never /proc itself) with a tmpfs holding the path.
            if i < 2:
                raise NvhookError(f"cannot create {path}: the container's procfs has no {anc}")
            root.tmpfs(anc, dirs=("/".join(parts[i:]),), allow_proc=True, target_fd=afd)
        finally:
            os.close(afd)
        try:
            return root.resolve(path)
        except OSError as e:
            raise NvhookError(f"{path} in the rootfs: {os.strerror(e.errno)}") from None
    return root.target(path, is_dir=True)


def _gpu_procfs(root: RootFS, edits: ContainerEdits, src: _Sources) -> None:
    if not edits.procfs:
        return
    binds = edits.procfs.all_binds()
    root.expect_mounts([(f"{edits.procfs.path}/{rel}", s.fd, s.st)
                        for (_, rel, _), s in zip(binds, src.gpu_dirs)])
    for (host_path, rel, is_dir), s in zip(binds, src.gpu_dirs):
        root.bind_tree(s.fd, s.st, f"{edits.procfs.path}/{rel}", PROC_ATTRS,
                       expect="dir" if is_dir else "file", source=host_path)


def _version(v: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(x) for x in v.split("."))
    except ValueError:
        return None


def _cuda_compat(root: RootFS, edits: ContainerEdits, folders: list[str]) -> list[str]:
    """The image's CUDA forward-compat libraries, when newer than the driver. Only
    regular files (lstat; the image's symlinks are never followed) directly in the
    compat directory, which itself resolves inside the rootfs."""
    cc = edits.cuda_compat
    assert cc is not None
    if cc.mode not in ("mount", "ldconfig"):
        return folders
    try:
        dfd = root.resolve(cc.container_dir, os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        return folders
    try:
        regular = {}
        for name in os.listdir(dfd):
            if any(name.startswith(p) for p in COMPAT_LIBS):
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode):
                    regular[name] = st
        versions = {v: n[len("libcuda.so."):] for n in regular if n.startswith("libcuda.so.")
                    if (v := _version(n[len("libcuda.so."):])) and len(v) > 1}
        if not versions:
            return folders
        best = max(versions)
        if best[0] <= cc.driver_major:
            return folders
        if cc.mode == "ldconfig":
            return [cc.container_dir] + [f for f in folders if f != cc.container_dir]
        suffix = ".so." + versions[best]
        for name in sorted(n for n in regular if n.endswith(suffix)):
            fd = openat2(dfd, name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC,
                         native.RESOLVE_NO_SYMLINKS | native.RESOLVE_BENEATH)
            try:
                st = os.fstat(fd)    # the file we will mount, not the name we listed
                if not stat.S_ISREG(st.st_mode):
                    raise NvhookError(f"{cc.container_dir}/{name} is not a regular file")
                tree = native.open_tree(fd, "", native.OPEN_TREE_CLONE | native.OPEN_TREE_CLOEXEC
                                        | native.AT_EMPTY_PATH)
            finally:
                os.close(fd)
            try:
                root.bind_tree(tree, st, f"{edits.lib_dir}/{name}",
                               mount_attrs(LIB_OPTS)[0], expect="file",
                               source=f"{cc.container_dir}/{name}")
            except BaseException:
                os.close(tree)
                raise
        return folders
    finally:
        os.close(dfd)
