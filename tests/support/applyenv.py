"""Helpers for the applier's tests (test_safefs.py, test_apply_live.py, test_hostile.py,
test_trust_rootfs_*.py): in_ns (run a function in a forked child with its own private mount
namespace), mountinfo (the product's parser; umount_under, for runtimes' leftovers),
try_apply (the applier's error and the mounts it left), tree snapshots to show that
nothing changed, and a hand-made driver root with the ContainerEdits a planner would make
for it.
"""
from __future__ import annotations

import os
import pickle
import socket
import stat
import subprocess
import threading
import traceback
from pathlib import Path

from libinject.errors import NvhookError
from libinject.linux import native
from libinject.linux.child import Child, collect
from libinject.linux.mountinfo import Mount
from libinject.linux.mountinfo import read as mountinfo   # noqa: F401 (for the tests)
from libinject.plan.edits import (CgroupRule, ContainerEdits, DeviceEdit, MountEdit, ProcfsEdit,
                                  SymlinkEdit)
from support.simhost import compile_lib as elf   # an ELF with a SONAME (ldconfig caches it)

LIBDIR = "/usr/lib/x86_64-linux-gnu"
HOST_LDCONFIG = "/sbin/ldconfig"
IN_NS_TIMEOUT = 120


def in_ns(fn, *args, **kw):
    """fn(*args) in a forked child inside a new private mount namespace; returns its
    (pickled) result or re-raises its exception. Nothing it mounts reaches the host.
    A child still running after IN_NS_TIMEOUT s is killed and TimeoutError raised."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.close(r)
        try:
            native.unshare(native.CLONE_NEWNS)
            native.mount(None, "/", None, native.MS_REC | native.MS_PRIVATE)
            res = ("ok", fn(*args, **kw), "")
        except BaseException as e:  # noqa: BLE001
            res = ("err", e, traceback.format_exc())
        try:
            data = pickle.dumps(res)
        except Exception:  # noqa: BLE001
            data = pickle.dumps(("err", RuntimeError(repr(res[1])), res[2]))
        with os.fdopen(w, "wb") as f:
            f.write(data)
        os._exit(0)
    os.close(w)
    try:
        with Child(pid) as child:
            code, (data,) = collect(child, [r], IN_NS_TIMEOUT, limit=1 << 30)
    except TimeoutError:    # collect killed and reaped it
        raise TimeoutError(f"in_ns({getattr(fn, '__name__', fn)}) did not finish "
                           f"within {IN_NS_TIMEOUT} s") from None
    finally:
        os.close(r)
    if code != 0:
        raise RuntimeError(f"in_ns({getattr(fn, '__name__', fn)}): its child exited with {code}")
    kind, val, tb = pickle.loads(data)
    if kind == "err":
        if tb and not isinstance(val, NvhookError):
            val.add_note(tb)
        raise val
    return val


def umount_under(top: Path | str) -> None:
    """Lazily unmount everything mounted at or below top in our namespace, deepest first
    (what a runtime left behind under its state dir)."""
    top = str(top)
    points = {m.mountpoint for m in mountinfo()
              if m.mountpoint == top or m.mountpoint.startswith(top + "/")}
    for mp in sorted(points, reverse=True):
        subprocess.run(["umount", "-l", mp], capture_output=True, timeout=60)


def new_mounts(before: list[Mount], after: list[Mount]) -> list[Mount]:
    ids = {m.id for m in before}
    return [m for m in after if m.id not in ids]


def try_apply(rootfs: Path, edits: ContainerEdits, **kw) -> tuple[str | None, list[Mount]]:
    """apply(edits, rootfs, **kw) here (in_ns it): the NvhookError's text (None if it
    succeeded) and the mounts it left in this namespace."""
    from libinject.apply.live import apply
    before = mountinfo()
    try:
        apply(edits, str(rootfs), **kw)
        err = None
    except NvhookError as e:
        err = str(e)
    return err, new_mounts(before, mountinfo())


def snapshot(top: Path, *, dir_mtimes: bool = True) -> dict:
    """Everything about a tree a hostile image might try to change. dir_mtimes=False
    for a rootfs we wrote into and rolled back (entries made and removed again)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            data = None
            if stat.S_ISREG(st.st_mode):
                data = open(p, "rb").read()
            elif stat.S_ISLNK(st.st_mode):
                data = os.readlink(p)
            mtime = st.st_mtime_ns if dir_mtimes or not stat.S_ISDIR(st.st_mode) else 0
            out[os.path.relpath(p, top)] = (st.st_mode, st.st_uid, mtime, data)
    st = os.lstat(top)
    out["."] = (st.st_mode, st.st_mtime_ns if dir_mtimes else 0)
    return out


def make_host(h: Path, *, ngpu: int = 4, nlibs: int = 12) -> ContainerEdits:
    """A hand-made driver root and the edits a planner would make for it: libraries,
    nvidia-smi, firmware, persistenced socket, device nodes (mknod 195:N), procfs."""
    lib = h / LIBDIR.lstrip("/")
    for d in (lib, h / "usr/bin", h / "dev", h / "lib/firmware/nvidia/550.54.14",
              h / "run/nvidia-persistenced"):
        d.mkdir(parents=True, exist_ok=True)
    libs = []
    for i in range(nlibs):
        p = lib / f"libnvidia-t{i}.so.550.54.14"
        p.write_text(f"lib{i}")
        libs.append(p)
    # one real ELF so ldconfig has something to cache
    elf(lib / "libnvidia-ml.so.550.54.14", "libnvidia-ml.so.1")
    (h / "usr/bin/nvidia-smi").write_text("#!/bin/sh\necho smi\n")
    os.chmod(h / "usr/bin/nvidia-smi", 0o755)
    fw = h / "lib/firmware/nvidia/550.54.14/gsp_ga10x.bin"
    fw.write_bytes(b"firmware")
    sock = h / "run/nvidia-persistenced/socket"
    if not sock.exists():
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(sock))
        s.close()
    devs = [DeviceEdit("/dev/nvidiactl", str(h / "dev/nvidiactl"), 195, 255, "control"),
            DeviceEdit("/dev/nvidia-uvm", str(h / "dev/nvidia-uvm"), 511, 0, "control")]
    devs += [DeviceEdit(f"/dev/nvidia{i}", str(h / f"dev/nvidia{i}"), 195, i, "gpu") for i in range(ngpu)]
    for d in devs:
        if not os.path.exists(d.host_path):
            os.mknod(d.host_path, 0o666 | stat.S_IFCHR, os.makedev(d.major, d.minor))
    gdirs = []
    for i in range(ngpu):
        g = h / f"proc/driver/nvidia/gpus/0000:0{i}:00.0"
        g.mkdir(parents=True, exist_ok=True)
        (g / "information").write_text(f"Model: sim gpu {i}\n")
        gdirs.append((str(g), f"0000:0{i}:00.0"))
    mounts = [MountEdit(str(h / "usr/bin/nvidia-smi"), "/usr/bin/nvidia-smi", "binary")]
    mounts += [MountEdit(str(p), f"{LIBDIR}/{p.name}", "library")
               for p in libs + [lib / "libnvidia-ml.so.550.54.14"]]
    mounts.append(MountEdit(str(fw), "/lib/firmware/nvidia/550.54.14/gsp_ga10x.bin", "firmware"))
    mounts.append(MountEdit(str(sock), "/run/nvidia-persistenced/socket", "ipc",
                            ("nosuid", "nodev", "noexec", "bind")))
    syms = [SymlinkEdit(p.name, f"{LIBDIR}/{p.name.split('.so')[0]}.so.1") for p in libs]
    syms += [SymlinkEdit("libnvidia-ml.so.550.54.14", f"{LIBDIR}/libnvidia-ml.so.1"),
             SymlinkEdit("libnvidia-ml.so.1", f"{LIBDIR}/libnvidia-ml.so")]
    return ContainerEdits(
        device_nodes=tuple(devs), mounts=tuple(mounts), symlinks=tuple(syms),
        procfs=ProcfsEdit(files={"params": "ModifyDeviceFiles: 0\n",
                                 "version": "NVRM version: 550.54.14\n", "registry": ""},
                          gpu_dirs=tuple(gdirs)),
        ldconfig_folders=(LIBDIR,),
        cgroup_rules=tuple(CgroupRule(d.major, d.minor) for d in devs))


def flipper(real: Path, target, stop: threading.Event, flips: list[int]) -> None:
    """Until stop: swap `real` (an image's directory) with a symlink to `target` (a host
    directory, or any link text) and back; counts the swaps in flips[0]. For race tests:
    run it in a thread while applies run."""
    away = real.with_name(real.name + ".away")
    while not stop.is_set():
        try:
            os.rename(real, away)
            os.symlink(str(target), real)
            os.unlink(real)
            os.rename(away, real)
            flips[0] += 1
        except OSError:
            if not os.path.lexists(real) and away.exists():
                os.rename(away, real)
            elif os.path.islink(real) and away.exists():
                os.unlink(real)
                os.rename(away, real)
