"""Driver snapshots: discovery's result, reused while it provably still holds.

NVML costs a process start and a library load (~60-100 ms) on every container start;
the driver and its devices rarely change. discover() writes what it found to
<dir>/<hash of root, dev root, ldcache>.json together with a fingerprint of every
input that could change the answer, and reads it back only when the fingerprint of
the host now is equal. The fingerprint holds, read fresh each time:
  - the driver version file and the boot id (driver reload, reboot);
  - dev/nvidia*, dev/nvidia-caps/*, dev/nvidia-caps-imex-channels/*: names, rdev,
    inode and times (GPUs appearing/going, MIG and IMEX nodes);
  - proc/driver/nvidia/gpus/*: every file's contents (GPU set and state), and
    proc/driver/nvidia/capabilities/**, nvidia-caps/mig-minors: contents (MIG layout);
  - the ld.so.cache (inode, size, mtime), the library, binary and firmware
    directories and the IPC paths (stat), and CUDA_MPS_PIPE_DIRECTORY.
Contents rather than times where files are small, so a rewrite within one clock
tick is still seen. Snapshot files must belong to us and not be writable by
others (they decide what gets mounted into containers).
"""
from __future__ import annotations

import json
import os
import stat

from libinject.constants import SNAPSHOT_DIR
from libinject.linux import atomic

FORMAT = 1
DEFAULT_DIR = SNAPSHOT_DIR
_SMALL = 1 << 16


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(_SMALL).decode(errors="replace")
    except OSError:
        return None


def _st(path: str) -> list | None:
    try:
        s = os.stat(path)
    except OSError:
        return None
    return [s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_mode]


def _dev_listing(path: str, prefix: str = "") -> list:
    out = []
    try:
        with os.scandir(path) as it:
            for e in it:
                if not e.name.startswith(prefix):
                    continue
                try:
                    s = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                out.append([e.name, s.st_ino, s.st_rdev, s.st_mode, s.st_mtime_ns, s.st_ctime_ns])
    except OSError:
        return [None]
    out.sort()
    return out


def _tree_contents(path: str, out: list | None = None, depth: int = 0) -> list:
    """Names of every dir and file under path, with the contents of the files."""
    if out is None:
        out = []
    try:
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        out.append(None)
        return out
    for e in entries:
        if len(out) > 20000 or depth > 8:
            break
        if e.is_dir(follow_symlinks=False):
            out.append(e.name + "/")
            _tree_contents(e.path, out, depth + 1)
            out.append("..")
        else:
            out.append(e.name)
            out.append(_read(e.path))
    return out


def _blake2b():
    try:
        from _blake2 import blake2b  # hashlib would load OpenSSL first (~2 ms)
    except ImportError:  # pragma: no cover
        from hashlib import blake2b
    return blake2b(digest_size=24)


def fingerprint(root: str, dev_root: str, ldcache: str | None, watch_dirs: list[str]) -> str:
    """A digest of everything discovery's answer depends on (stat and small reads)."""
    h = _blake2b()
    h.update(repr(_material(root, dev_root, ldcache, watch_dirs)).encode())
    return h.hexdigest()


def _material(root: str, dev_root: str, ldcache: str | None, watch_dirs: list[str]) -> list:
    drv = os.path.join(dev_root, "proc/driver/nvidia")
    return [
        FORMAT, root, dev_root, ldcache,
        os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
        _read("/proc/sys/kernel/random/boot_id"),
        _read(os.path.join(drv, "version")),
        _read(os.path.join(dev_root, "proc/driver/nvidia-caps/mig-minors")),
        _dev_listing(os.path.join(dev_root, "dev"), "nvidia"),
        _dev_listing(os.path.join(dev_root, "dev/nvidia-caps")),
        _dev_listing(os.path.join(dev_root, "dev/nvidia-caps-imex-channels")),
        _tree_contents(os.path.join(drv, "gpus")),
        _tree_contents(os.path.join(drv, "capabilities")),
        _st(ldcache) if ldcache else None,
        [[d, _st(os.path.join(root, d))] for d in watch_dirs],
    ]


def path_for(directory: str, root: str, dev_root: str, ldcache: str | None) -> str:
    h = _blake2b()
    h.update(repr([root, dev_root, ldcache]).encode())
    return os.path.join(directory, f"driver-{h.hexdigest()[:32]}.json")


def _trusted(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def load(path: str, key: str):
    """The snapshot's Driver if it is ours and its fingerprint equals `key`, else None.

    File format: the fingerprint on the first line, then the Driver as JSON, so a
    stale snapshot is rejected without parsing it."""
    # The directory is opened (never followed if a symlink) and checked through its
    # fd, and the file opened relative to that fd: what is checked is what is read,
    # whatever is renamed or swapped in between.
    try:
        dfd = os.open(os.path.dirname(path) or ".",
                      os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not _trusted(os.fstat(dfd)):
            return None
        fd = os.open(os.path.basename(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                     | os.O_NONBLOCK, dir_fd=dfd)
    except OSError:
        return None
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _trusted(st):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            if f.readline().rstrip(b"\n") != key.encode():
                return None
            data = json.loads(f.read())
        return driver_from_dict(data)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    finally:
        os.close(fd)


def save(path: str, key: str, driver) -> bool:
    """Writes atomically; False (and nothing left behind) if the dir is not usable."""
    import dataclasses

    directory = os.path.dirname(path) or "."
    data = (key + "\n" + json.dumps(dataclasses.asdict(driver))).encode()
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        # Checked through the fd it is written through (never a symlink).
        dfd = atomic.open_dir(directory)
        try:
            if not _trusted(os.fstat(dfd)):
                return False
            atomic.write_at(dfd, os.path.basename(path), data, 0o600)
        finally:
            os.close(dfd)
        return True
    except OSError:
        return False


def driver_from_dict(d: dict):
    from libinject.discover import model
    from libinject.discover.nvml import info_from_dict

    def nodes(items):
        return tuple(model.DeviceNode(**n) for n in items)

    def files(items):
        return tuple(model.HostFile(**h) for h in items)

    info = d["info"]
    for g in info["gpus"]:  # asdict keeps the field names nvml.info_from_dict reads
        g.setdefault("mig_capable", False)
    return model.Driver(
        root=d["root"], dev_root=d["dev_root"], info=info_from_dict(info),
        libraries=tuple(model.Library(**lib) for lib in d["libraries"]),
        binaries=files(d["binaries"]), firmware=files(d["firmware"]), ipcs=files(d["ipcs"]),
        control_devices=nodes(d["control_devices"]), gpu_devices=nodes(d["gpu_devices"]),
        mig_minors={str(k): int(v) for k, v in d["mig_minors"].items()},
        imex_channels=nodes(d["imex_channels"]), cap_devices=nodes(d.get("cap_devices", ())),
        procfs_dir=d["procfs_dir"], library_source=d["library_source"],
    )
