"""The live applier: make ContainerEdits real in a container's rootfs (DESIGN.md §5).

Work happens in a forked child, so the caller keeps its mount namespace and its
capabilities:
  1. in the caller's (host) mount namespace, open every host source as a detached
     mount (open_tree OPEN_TREE_CLONE) and check it (device nodes: char device with the
     planned major:minor); open the host's ldconfig;
  2. with a pid, enter the container's mount namespace (runc's prestart hook runs in
     the runtime's namespace, where the container's /dev tmpfs is invisible);
  3. drop capabilities the rest does not need;
  4. in order: procfs tmpfs, binaries, libraries, symlinks, CUDA compat, firmware, IPC,
     control devices, per-GPU devices and their procfs entries, MIG, IMEX, ldconfig;
     every container path through safefs.RootFS, every step journaled;
  5. report to the parent, which applies the cgroup rules (they need the host's view of
     the cgroup tree) and then tells the child to commit or roll back.
Any failure undoes everything done so far and raises NvhookError with one line.
"""
from __future__ import annotations

import json
import os
import select
import signal
import stat
import time
from dataclasses import dataclass, field

from libinject import native
from libinject.edits import ContainerEdits, DeviceEdit, MountEdit
from libinject.errors import NvhookError
from libinject.safefs import (Journal, RootFS, fs_type, limit_capabilities, mount_attrs, open_host,
                              openat2, proc_fd, split)

TIMEOUT = 120.0
LIB_OPTS = ("ro", "nosuid", "nodev")
DEV_ATTRS = native.MOUNT_ATTR_NOSUID | native.MOUNT_ATTR_NOEXEC
PROC_ATTRS = (native.MOUNT_ATTR_RDONLY | native.MOUNT_ATTR_NOSUID | native.MOUNT_ATTR_NODEV
              | native.MOUNT_ATTR_NOEXEC)
# mounts by kind, in the order they are applied; symlinks and compat go after libraries
EARLY_KINDS = ("binary", "library")
LATE_KINDS = ("firmware", "ipc")
EXPECT = {"binary": "file", "library": "file", "firmware": "file", "ipc": None,
          "procfs-gpu": "dir"}
DEVICE_KINDS = ("control", "gpu", "mig", "imex")
COMPAT_LIBS = ("libcuda.so.", "libcudadebugger.so.", "libnvidia-nvvm.so.",
               "libnvidia-ptxjitcompiler.so.", "libnvidia-pkcs11", "libnvidia-gpucomp.so.")


def _caps_kept() -> set[int]:
    import prctl
    return {prctl.CAP_SYS_ADMIN, prctl.CAP_SYS_CHROOT, prctl.CAP_CHOWN, prctl.CAP_FOWNER,
            prctl.CAP_DAC_OVERRIDE, prctl.CAP_DAC_READ_SEARCH, prctl.CAP_SETUID,
            prctl.CAP_SETGID, prctl.CAP_SETPCAP, prctl.CAP_KILL}


@dataclass
class _Source:
    fd: int
    st: os.stat_result


@dataclass
class _Sources:
    """Host sources opened before entering the container's namespace."""
    mounts: list[_Source] = field(default_factory=list)
    devices: list[_Source] = field(default_factory=list)
    gpu_dirs: list[_Source] = field(default_factory=list)
    ldconfig_fd: int | None = None


def apply(edits: ContainerEdits, rootfs: str, *, pid: int | None = None,
          ldconfig: str = "@/sbin/ldconfig", no_cgroups: bool = False,
          timeout: float = TIMEOUT) -> list[str]:
    """Apply edits to rootfs (in pid's mount namespace when pid is given), all or
    nothing. Returns the container paths mounted, in order."""
    nsfd = None
    if pid is not None:
        try:
            nsfd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise NvhookError(f"container process {pid}: {os.strerror(e.errno)}") from None
    rep_r, rep_w = os.pipe2(os.O_CLOEXEC)
    cmd_r, cmd_w = os.pipe2(os.O_CLOEXEC)
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            os.close(rep_r)
            os.close(cmd_w)
            code = _child(edits, rootfs, nsfd, ldconfig, rep_w, cmd_r)
        finally:
            os._exit(code)
    os.close(rep_w)
    os.close(cmd_r)
    if nsfd is not None:
        os.close(nsfd)
    reader = _Reader(rep_r)
    undo = None
    try:
        report = reader.get(timeout, child)
        if not report.get("ok"):
            raise NvhookError(report.get("error", "apply failed"))
        if edits.cgroup_rules and pid is not None and not no_cgroups:
            try:
                from libinject import cgroups
                undo = cgroups.allow_devices(pid, edits.cgroup_rules)
            except Exception as e:  # noqa: BLE001 - any failure rolls the mounts back
                os.write(cmd_w, b"rollback\n")
                back = reader.get(timeout, child)
                extra = f" ({back['error']})" if not back.get("ok") else ""
                msg = str(e) if isinstance(e, NvhookError) else f"{type(e).__name__}: {e}"
                raise NvhookError(f"cgroup device rules: {msg}{extra}") from None
        os.write(cmd_w, b"commit\n")
        done = reader.get(timeout, child)
        if not done.get("ok"):
            raise NvhookError(done.get("error", "apply failed"))
        return list(report.get("mounts", []))
    except BaseException:
        if undo is not None:
            try:
                undo.undo()
            except Exception:  # noqa: BLE001 - the original error is the one to show
                pass
        raise
    finally:
        os.close(cmd_w)
        reader.close()
        _reap(child)


class _Reader:
    """JSON lines from the child, with a deadline; a dead or hung child is an error."""

    def __init__(self, fd: int):
        self.fd, self.buf = fd, b""

    def get(self, timeout: float, child: int) -> dict:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(child, signal.SIGKILL)
                raise NvhookError(f"applying edits timed out after {timeout:g}s; "
                                  "the container may be left partly configured")
            r, _, _ = select.select([self.fd], [], [], left)
            if r:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    raise NvhookError("applying edits failed: worker process died")
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        os.close(self.fd)


def _reap(child: int) -> None:
    try:
        os.waitpid(child, 0)
    except ChildProcessError:
        pass


def _send(fd: int, msg: dict) -> None:
    data = (json.dumps(msg) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


# -- the child ---------------------------------------------------------------------
def _child(edits: ContainerEdits, rootfs: str, nsfd: int | None, ldconfig: str,
           rep: int, cmd: int) -> int:  # pragma: no cover - runs in the child
    journal = Journal()
    err = None
    try:
        # Everything imported before setns: after it, the container's namespace may
        # not show this Python's files at all (a container that already pivoted).
        import prctl  # noqa: F401
        from libinject import ldconfig as _  # noqa: F401
        os.umask(0o022)
        src = _open_sources(edits, ldconfig)
        proc_fd()                       # the host's /proc, for after setns
        host_id = _identity(rootfs)
        if nsfd is not None:
            native.setns(nsfd, native.CLONE_NEWNS)
            os.close(nsfd)
            os.chdir("/")
            rootfs = _container_rootfs(rootfs, host_id)
        limit_capabilities(_caps_kept())
        root = RootFS(rootfs, journal)
        _apply(edits, root, src, ldconfig)
    except NvhookError as e:
        err = str(e)
    except OSError as e:
        why = os.strerror(e.errno) if e.errno else str(e)
        err = f"{e.filename + ': ' if e.filename else ''}{why}"
    except Exception as e:  # noqa: BLE001 - reported to the parent as one line
        err = f"internal error: {type(e).__name__}: {e}"
    if err is not None:
        left = journal.rollback()
        if left:
            err += f" (undo incomplete: {'; '.join(left)})"
        _send(rep, {"ok": False, "error": err})
        return 1
    _send(rep, {"ok": True, "mounts": journal.mounts})
    try:
        verdict = os.read(cmd, 64).strip()
    except OSError:
        verdict = b""
    if verdict == b"commit":
        journal.commit()
        _send(rep, {"ok": True})
        return 0
    left = journal.rollback()   # rollback asked for, or the parent went away
    _send(rep, {"ok": not left, "error": f"undo incomplete: {'; '.join(left)}"})
    return 0


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
    """Everything on the host side, opened in the host's mount namespace."""
    src = _Sources()
    for m in edits.mounts:
        _, recursive = mount_attrs(m.options)
        src.mounts.append(_open(m.host_path, f"{m.kind} {m.host_path}", recursive))
    for d in edits.device_nodes:
        s = _open(d.host_path, f"device {d.host_path}")
        _check_device(d, s.st)
        src.devices.append(s)
    if edits.procfs:
        for host_dir, name in edits.procfs.gpu_dirs:
            s = _open(host_dir, f"procfs entry {host_dir}")
            if not stat.S_ISDIR(s.st.st_mode):
                raise NvhookError(f"procfs entry {host_dir} is not a directory")
            src.gpu_dirs.append(s)
    if ldconfig.startswith("@") and (edits.ldconfig_folders or edits.cuda_compat):
        from libinject.ldconfig import open_ldconfig
        src.ldconfig_fd = open_ldconfig(ldconfig)
    return src


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
    mounts = list(zip(edits.mounts, src.mounts))
    for kind in EARLY_KINDS:
        _mounts(root, [(m, s) for m, s in mounts if m.kind == kind])
    for ln in edits.symlinks:
        root.symlink(ln.target, ln.link)
    folders = list(edits.ldconfig_folders)
    if edits.cuda_compat:
        folders = _cuda_compat(root, edits, folders)
    for kind in LATE_KINDS:
        _mounts(root, [(m, s) for m, s in mounts if m.kind == kind])
    known = EARLY_KINDS + LATE_KINDS + ("procfs-gpu",)
    _mounts(root, [(m, s) for m, s in mounts if m.kind not in known])
    devices = list(zip(edits.device_nodes, src.devices))
    for kind in DEVICE_KINDS:
        _devices(root, [(d, s) for d, s in devices if d.kind == kind])
        if kind == "gpu":
            _gpu_procfs(root, edits, src)
            _mounts(root, [(m, s) for m, s in mounts if m.kind == "procfs-gpu"])
    _devices(root, [(d, s) for d, s in devices if d.kind not in DEVICE_KINDS])
    if folders:
        from libinject import ldconfig as ldc
        ldc.update(root, folders, exec_fd=src.ldconfig_fd, ldconfig=ldconfig)


def _mounts(root: RootFS, items: list[tuple[MountEdit, _Source]]) -> None:
    for m, s in items:
        attrs, recursive = mount_attrs(m.options)
        root.bind_tree(s.fd, s.st, m.container_path, attrs, recursive=recursive,
                       expect=EXPECT.get(m.kind), source=m.host_path)


def _devices(root: RootFS, items: list[tuple[DeviceEdit, _Source]]) -> None:
    for d, s in items:
        root.bind_tree(s.fd, s.st, d.path, DEV_ATTRS, source=d.host_path)


def _procfs(root: RootFS, edits: ContainerEdits) -> None:
    """Read-only tmpfs over /proc/driver/nvidia with the planned files, and empty
    gpus/<busid> directories for the selected GPUs' entries (bound later)."""
    p = edits.procfs
    assert p is not None
    files = {name.lstrip("/"): data.encode() for name, data in p.files.items()}
    dirs = tuple(f"gpus/{name}" for _, name in p.gpu_dirs)
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
    for (host_dir, name), s in zip(edits.procfs.gpu_dirs, src.gpu_dirs):
        root.bind_tree(s.fd, s.st, f"{edits.procfs.path}/gpus/{name}", PROC_ATTRS,
                       expect="dir", source=host_dir)


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
