"""Driver snapshots: discovery's result, reused while it provably still holds.

NVML costs a process start and a library load (~60-100 ms) on every container start;
the driver and its devices rarely change. discover() writes what it found to
<dir>/<hash of root, dev root, ldcache>.json together with a fingerprint of every
input that could change the answer, and reads it back only when the fingerprint of
the host now is equal. The fingerprint holds, read fresh each time:
  - the driver's version, params and registry files and the boot id (driver reload,
    module parameters, reboot);
  - dev/nvidia*, dev/nvidia-caps/*, dev/nvidia-caps-imex-channels/*, dev/dri/*,
    dev/dri/by-path/*: names, rdev, inode and times (GPUs appearing/going, MIG, IMEX
    and DRM nodes; a DRM node comes and goes with its sysfs entry);
  - proc/driver/nvidia/gpus/*: every file's contents (GPU set and state), and
    proc/driver/nvidia/capabilities/**, nvidia-caps/mig-minors: contents (MIG layout);
  - the ld.so.cache (inode, size, mtime), the library, binary, firmware and graphics
    (ICD, X module) directories and the IPC paths (stat), and CUDA_MPS_PIPE_DIRECTORY.
Contents rather than times where files are small, so a rewrite within one clock
tick is still seen.

A snapshot never changes which devices a container gets. Snapshot files and their
directory must belong to us and not be writable by others; beyond that:
  - sealed: a keyed BLAKE2b MAC over fingerprint and body, with a random key
    (KEY_NAME, 0600, made with O_EXCL + link) kept apart from the snapshots of the
    default dir: in KEY_DIR (/var/lib/nvhook), not under /run, so a root process that
    can write the host's /run (a container given it as a volume: not trusted) cannot
    seal a snapshot, and the fields nothing on the host can confirm (MIG UUIDs, library
    paths, names) are ours. A snapshot dir an admin chose keeps its key beside it (the
    admin chose where it lives). Any edit made without the key (by hand, a stray tool,
    corruption, that peer) and any file not written by save() fail;
  - decoded strictly (libinject.discover.decode): exact fields and types, ranges,
    absolute paths, GPUs in index order with unique minors;
  - cross-checked against what the fingerprint just read, which holds even against
    a writer that has the key: every device node's rdev, each GPU's minor and UUID
    against its gpus/<busid>/information, its gpus/ dir, the MIG minors against the
    mig-minors table, the procfs texts against the files; and every host file is one
    discovery would find, at a name it looks for (a library: an entry of the root's
    ld.so.cache, or of the library dirs' search; a binary: <a PATH dir>/<its name>;
    firmware: in lib/firmware/nvidia/<version>; IPC: the driver's sockets and the MPS
    pipe dir; graphics: libinject.discover.graphics.could_find), resolved in the root
    now, so a writer with the key can only leave files out, never add a host file.
Anything wrong: the snapshot is discarded (a log line), discovery runs again and
rewrites it; never an exception for the user. save() prunes the directory (KEEP
newest snapshots, none from an earlier boot or older than MAX_AGE, stale temp files).
"""
from __future__ import annotations

import os
import stat
import time

from libinject import hostkey, jsonc
from libinject.constants import SNAPSHOT_DIR, SNAPSHOT_KEY_DIR
from libinject.discover import decode
from libinject.discover import procfs as _procfs
from libinject.linux import atomic
from libinject.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

try:
    from _operator import _compare_digest   # hmac.compare_digest, without OpenSSL (~2 ms)
except ImportError:  # pragma: no cover
    from hmac import compare_digest as _compare_digest

FORMAT = 3              # 2: sealed; Driver.procfs and Driver.gpu_procfs; 3: graphics files, DRM nodes
DEFAULT_DIR = SNAPSHOT_DIR
KEY_DIR = SNAPSHOT_KEY_DIR
KEY_NAME = hostkey.SNAPSHOT_KEY
KEY_BYTES = hostkey.KEY_BYTES
MAX_BYTES = 16 << 20    # a snapshot is ~100 KB; a bigger file is not one of ours
KEEP = 8                # snapshots kept per directory (one per driver root/dev root/ldcache)
MAX_AGE = 7 * 86400     # seconds: an unused driver root's snapshot goes (a used one is rewritten)
TMP_AGE = 600           # seconds: a temp file this old is a crashed writer's
_SMALL = 1 << 16
_SNAP_NAME = r"driver-[0-9a-f]{32}\.json"
_TMP_NAME = r"\.(?:driver-[0-9a-f]{32}\.json|snapshot\.key)\.tmp-\d+-[0-9a-f]{8}"  # (re: only when pruning)

if TYPE_CHECKING:
    Log = Callable[[str], None]


def _read(path: str) -> str | None:
    # os.read, not open(): io's wrapper adds fstat, ioctl and lseek calls to each of the
    # dozens of small files a fingerprint reads
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return None
    try:
        chunks, left = [], _SMALL
        while left > 0 and (chunk := os.read(fd, left)):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _text(path: str) -> str | None | tuple:
    """A procfs text exactly as discovery reads it (libinject.discover.procfs), so the
    two compare equal; an unreadable file is a marker that equals no text."""
    try:
        return _procfs.read_text(path)
    except Exception as e:  # NvhookError: the fingerprint itself never fails
        return ("unreadable", str(e))


def _st(path: str) -> list | None:
    try:
        s = os.stat(path)
    except OSError:
        return None
    return [s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_mode]


def _dev_listing(path: str, prefix: str = "") -> dict[str, tuple] | None:
    """name -> (ino, rdev, mode, mtime, ctime) of the entries (not followed)."""
    out = {}
    try:
        with os.scandir(path) as it:
            for e in it:
                if not e.name.startswith(prefix):
                    continue
                try:
                    s = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                out[e.name] = (s.st_ino, s.st_rdev, s.st_mode, s.st_mtime_ns, s.st_ctime_ns)
    except OSError:
        return None
    return dict(sorted(out.items()))


def _walk(path: str, read: Callable[[str], Any], out: dict | None = None, rel: str = "",
          depth: int = 0) -> dict[str, Any] | None:
    """rel path -> contents of every file under path (dirs: rel + "/" -> None)."""
    if out is None:
        out = {}
    try:
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        return None if depth == 0 else out
    for e in entries:
        if len(out) > 20000 or depth > 8:
            break
        name = rel + e.name
        if e.is_dir(follow_symlinks=False):
            out[name + "/"] = None
            _walk(e.path, read, out, name + "/", depth + 1)
        else:
            out[name] = read(e.path)
    return out


def _blake2b(**kw):
    try:
        from _blake2 import blake2b  # hashlib would load OpenSSL first (~2 ms)
    except ImportError:  # pragma: no cover
        from hashlib import blake2b
    return blake2b(**kw)


@record
class HostView:
    """What the fingerprint read of the host: hashed into the key, and kept to check a
    snapshot's device facts against (no second read)."""
    root: str
    dev_root: str
    ldcache: str                # host path of the ld.so.cache discovery reads
    procfs: bool                # proc/driver/nvidia is a directory
    version: Any
    params: Any
    registry: Any
    mig_minors: str | None
    dev: dict | None            # dev/nvidia*
    caps: dict | None           # dev/nvidia-caps/*
    imex: dict | None           # dev/nvidia-caps-imex-channels/*
    dri: dict | None            # dev/dri/*
    dri_paths: dict | None      # dev/dri/by-path/*
    gpus: dict | None           # proc/driver/nvidia/gpus/**
    capabilities: dict | None   # proc/driver/nvidia/capabilities/**


def view(root: str, dev_root: str, ldcache: str | None = None) -> HostView:
    """ldcache: the cache's host path (None: the root's etc/ld.so.cache)."""
    drv = os.path.join(dev_root, "proc/driver/nvidia")
    dev = os.path.join(dev_root, "dev")
    return HostView(
        root=root, dev_root=dev_root, ldcache=ldcache or os.path.join(root, "etc/ld.so.cache"),
        procfs=os.path.isdir(drv),
        version=_text(os.path.join(drv, "version")),
        params=_text(os.path.join(drv, "params")),
        registry=_text(os.path.join(drv, "registry")),
        mig_minors=_procfs.read_table(os.path.join(dev_root, "proc/driver/nvidia-caps/mig-minors")),
        dev=_dev_listing(dev, "nvidia"),
        caps=_dev_listing(os.path.join(dev, "nvidia-caps")),
        imex=_dev_listing(os.path.join(dev, "nvidia-caps-imex-channels")),
        dri=_dev_listing(os.path.join(dev, "dri")),
        dri_paths=_dev_listing(os.path.join(dev, "dri/by-path")),
        gpus=_walk(os.path.join(drv, "gpus"), _read),
        capabilities=_walk(os.path.join(drv, "capabilities"), _text),
    )


# The last fingerprint this process computed (a service's workers inherit the server's):
# (material, mig-minors table, digest). Material equal to it, compared value by value
# (every position always holds the same types: str, int, bool, None, and lists, tuples
# and dicts of them), has the same digest: hashing it again (repr() of ~12 KB, BLAKE2b
# of ~110 KB) would be ~0.45 ms of every served start. Anything unequal is hashed
# afresh. Only this process's own reads go in; what probe() returns shares them, and
# nothing modifies a HostView's contents.
_last: tuple | None = None


def probe(root: str, dev_root: str, ldcache: str | None, watch_dirs: list[str]) -> tuple[str, HostView]:
    """(fingerprint, what it was computed from)."""
    global _last
    v = view(root, dev_root, ldcache)
    material = [
        FORMAT, root, dev_root, ldcache,
        os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
        _read("/proc/sys/kernel/random/boot_id"),
        v.procfs, v.version, v.params, v.registry, v.dev, v.caps, v.imex, v.dri, v.dri_paths,
        v.gpus, v.capabilities,
        _st(ldcache) if ldcache else None,
        [[d, _st(os.path.join(root, d))] for d in watch_dirs],
    ]
    last = _last
    if last is not None and last[1] == v.mig_minors and last[0] == material:
        return last[2], v
    h = _blake2b(digest_size=24)
    h.update(repr(material).encode(errors="surrogateescape"))
    # The mig-minors table (~100 KB) as its bytes, length first: repr() would cost more.
    table = (v.mig_minors or "").encode(errors="surrogateescape")
    h.update(b"\0%d:%d\0" % (v.mig_minors is None, len(table)))
    h.update(table)
    digest = h.hexdigest()
    _last = (material, v.mig_minors, digest)
    return digest, v


def fingerprint(root: str, dev_root: str, ldcache: str | None, watch_dirs: list[str]) -> str:
    """A digest of everything discovery's answer depends on (stat and small reads)."""
    return probe(root, dev_root, ldcache, watch_dirs)[0]


def path_for(directory: str, root: str, dev_root: str, ldcache: str | None) -> str:
    h = _blake2b(digest_size=24)
    h.update(repr([root, dev_root, ldcache]).encode())
    return os.path.join(directory, f"driver-{h.hexdigest()[:32]}.json")


def _trusted(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


# ----------------------------------------------------------------------------- the seal

def _mac(mac_key: bytes, key: bytes, body: bytes) -> bytes:
    h = _blake2b(digest_size=32, key=mac_key, person=b"nvhook-snapshot")
    h.update(key + b"\n" + body)
    return h.hexdigest().encode()


def seal(key: str, body: bytes, mac_key: bytes) -> bytes:
    """The snapshot file: the fingerprint, the MAC of fingerprint and body, the body."""
    k = key.encode()
    return k + b"\n" + _mac(mac_key, k, body) + b"\n" + body


def _key_at(dfd: int) -> bytes | None:
    return hostkey.key_at(dfd, KEY_NAME)


def key_dir(directory: str) -> str:
    """Where the key of the snapshots in `directory` lives: KEY_DIR for the default
    snapshot dir (under /run), else beside them."""
    return KEY_DIR if os.path.abspath(directory) == os.path.abspath(DEFAULT_DIR) else directory


def read_key(directory: str) -> bytes | None:
    """The key of the snapshots in `directory` (None: none usable)."""
    try:
        dfd = atomic.open_dir(key_dir(directory))
    except OSError:
        return None
    try:
        return _key_at(dfd)
    finally:
        os.close(dfd)


def own_key(directory: str) -> bytes:
    """The key of the snapshots in `directory`, made if there is none (its directory
    too: root-only; an unusable one is replaced: snapshots are a cache). OSError when
    it cannot be."""
    return hostkey.own_key(key_dir(directory), KEY_NAME, replace_unusable=True)


def _trusted_key(directory: str) -> bytes | None:
    """The key in `directory` if the directory is ours alone (None otherwise)."""
    try:
        dfd = atomic.open_dir(directory)
    except OSError:
        return None
    try:
        return _key_at(dfd) if _trusted(os.fstat(dfd)) else None
    finally:
        os.close(dfd)


# ----------------------------------------------------------------------------- load

class _Bad(Exception):
    """A snapshot to discard, and why."""


def load(path: str, key: str, host: HostView | None = None, log: Log | None = None):
    """The snapshot's Driver if it is ours, current (its fingerprint equals `key`),
    sealed with the directory's key, well-formed and consistent with the host (`host`:
    what the fingerprint read; None: looked at now); else None. A snapshot that is
    there and current but fails a check is reported to `log`. Never raises."""
    try:
        return _load(path, key, host)
    except Exception as e:  # whatever it was: discard and rediscover, never fail the user
        if log is not None:
            why = str(e) if isinstance(e, _Bad) else f"{type(e).__name__}: {e}"
            log(f"discovery snapshot {path} discarded ({why[:300]}); rediscovering")
        return None


def _load(path: str, key: str, host: HostView | None):
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
            raise _Bad("the directory is not ours alone")
        try:
            fd = os.open(os.path.basename(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                         | os.O_NONBLOCK, dir_fd=dfd)
        except FileNotFoundError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not _trusted(st):
                raise _Bad("not a regular file of ours that only we may write")
            with os.fdopen(fd, "rb", closefd=False) as f:
                first = f.readline(len(key) + 2)
                if first.rstrip(b"\n") != key.encode():
                    return None         # stale (or another format): simply replaced
                mac = f.readline(80).rstrip(b"\n")
                body = f.read(MAX_BYTES + 1)
        finally:
            os.close(fd)
        directory = os.path.dirname(path) or "."
        kdir = key_dir(directory)
        mac_key = _key_at(dfd) if kdir == directory else _trusted_key(kdir)
    finally:
        os.close(dfd)
    if len(body) > MAX_BYTES:
        raise _Bad(f"larger than {MAX_BYTES} bytes")
    if mac_key is None:
        raise _Bad(f"no usable key {KEY_NAME} in {kdir}")
    if not _compare_digest(mac, _mac(mac_key, key.encode(), body)):
        raise _Bad("seal does not match (edited, damaged or not written by nvhook)")
    try:
        driver = decode.driver(jsonc.loads(body))
    except decode.Invalid as e:
        raise _Bad(str(e)) from None
    verify(driver, host or view(driver.root, driver.dev_root))
    return driver


# ----------------------------------------------------------------------------- cross-check

def _need(ok: bool, why: str) -> None:
    if not ok:
        raise _Bad(why)


def _nodes_now(listing: dict | None, directory: str, container_dir: str,
               wanted: list[tuple[str, str]]):
    """The DeviceNodes discovery would find now for `wanted` (name, capability), in
    that order, from the listing the fingerprint read (a symlink is followed, as
    discovery's stat does)."""
    from libinject.discover.model import DeviceNode

    out = []
    for name, cap in wanted:
        entry = (listing or {}).get(name)
        if entry is None:
            continue
        path = os.path.join(directory, name)
        _, rdev, mode = entry[:3]
        if stat.S_ISLNK(mode):
            try:
                s = os.stat(path)
            except OSError:
                continue
            rdev, mode = s.st_rdev, s.st_mode
        if stat.S_ISCHR(mode):
            out.append(DeviceNode(path, f"{container_dir}/{name}", os.major(rdev), os.minor(rdev), cap))
    return tuple(out)


def _numbered(listing: dict | None, prefix: str) -> list[tuple[str, str]]:
    found = sorted((int(n[len(prefix):]), n) for n in (listing or {})
                   if n.startswith(prefix) and n[len(prefix):].isascii() and n[len(prefix):].isdigit())
    return [(n, "") for _, n in found]


def verify(driver, host: HostView) -> None:
    """Raise _Bad unless the snapshot's device facts are the host's, as `host` (the
    fingerprint's reading) shows them: what discovery would conclude from them now."""
    from libinject.discover import hostfiles as D
    from libinject.discover.hostfiles import CONTROL_DEVICES
    from libinject.discover.migminors import mig_minors_for

    _need(driver.root == host.root and driver.dev_root == host.dev_root,
          f"made for root {driver.root[:200]}, dev root {driver.dev_root[:200]}")
    gpus = driver.info.gpus
    # Each GPU: its gpus/ dir, and the kernel's own word on its minor and UUID there.
    procfs_dir = os.path.join(host.dev_root, "proc/driver/nvidia")
    _need(driver.procfs_dir == (procfs_dir if host.procfs else ""), f"procfs dir {driver.procfs_dir[:200]!r}")
    tree = host.gpus if driver.procfs_dir else None
    dirs = [n[:-1] for n in tree or {} if n.endswith("/") and "/" not in n[:-1]]
    want_dirs = {}
    for g in gpus:
        name = _procfs.gpu_entry(dirs, g.bus_id)
        if name is None:
            # The driver makes a gpus/<bus> entry for each of its GPUs: a GPU without one
            # has a bus id nothing confirms (e.g. another device's, to get its DRM nodes).
            _need(not driver.procfs_dir, f"GPU {g.index} has no gpus/ entry for its bus id")
            continue
        want_dirs[g.bus_id] = name
        info = (tree or {}).get(f"{name}/information")
        _need(_procfs.device_minor(info) == g.minor,
              f"GPU {g.index} minor {g.minor} is not the Device Minor in gpus/{name}/information")
        uuid = _field(info, "GPU UUID")
        _need(not uuid.startswith("GPU-") or uuid == g.uuid,
              f"GPU {g.index} UUID is not the one in gpus/{name}/information")
    _need(driver.gpu_procfs == want_dirs, "GPU procfs dirs differ from gpus/")

    dev = os.path.join(host.dev_root, "dev")
    _need(driver.control_devices == _nodes_now(host.dev, dev, "/dev", list(CONTROL_DEVICES)),
          "control device nodes differ from dev/")
    _need(driver.gpu_devices == _nodes_now(host.dev, dev, "/dev", [(f"nvidia{g.minor}", "") for g in gpus]),
          "GPU device nodes differ from dev/nvidia<minor>")
    _need(driver.cap_devices == _nodes_now(host.caps, os.path.join(dev, "nvidia-caps"), "/dev/nvidia-caps",
                                           _numbered(host.caps, "nvidia-cap")),
          "MIG capability nodes differ from dev/nvidia-caps")
    _need(driver.imex_channels == _nodes_now(
        host.imex, os.path.join(dev, "nvidia-caps-imex-channels"), "/dev/nvidia-caps-imex-channels",
        _numbered(host.imex, "channel")), "IMEX channel nodes differ from dev/nvidia-caps-imex-channels")
    from libinject.discover import graphics
    if host.dri:    # a few readlinks and stats, only on hosts with DRM nodes
        _need(driver.drm_devices == graphics.drm_nodes(host.dev_root, gpus), "DRM nodes differ from dev/dri")
    else:
        _need(not driver.drm_devices, "DRM nodes but no dev/dri")

    # Host files: under the root is not enough (the root is "/" on a normal host), so
    # each must be one discovery would find, at a name it looks for.
    root, ver = host.root, driver.info.driver_version
    _need(D.could_find_libraries(root, host.ldcache, ver, driver.libraries, driver.library_source),
          "libraries are not ones discovery finds in the driver root's ld.so.cache or library dirs")
    _need(D.could_find_binaries(root, driver.binaries), "binaries are not the driver root's")
    _need(D.could_find_firmware(root, ver, driver.firmware), "firmware files are not the driver root's")
    _need(D.could_find_ipcs(root, driver.ipcs), "IPC paths are not the driver's sockets or MPS pipe dir")
    _need(graphics.could_find(root, ver, driver.graphics_files), "graphics files are not the driver root's")

    # MIG: the table the driver publishes now, and the minors of each MIG device in it.
    table = mig_minors_for(host.mig_minors or "", gpus)
    _need(driver.mig_minors == table, "MIG minors differ from nvidia-caps/mig-minors")
    keys = ["config", "monitor"]
    for g in gpus:
        for m in g.mig_devices:
            gi, ci = f"gpu{g.minor}/gi{m.gi}/access", f"gpu{g.minor}/gi{m.gi}/ci{m.ci}/access"
            _need(m.gi_access_minor == table.get(gi) and m.ci_access_minor == table.get(ci),
                  f"MIG device {g.index}:{m.index} minors differ from nvidia-caps/mig-minors")
            keys += [gi, ci]

    # The masked procfs's texts: the files as they are now.
    want: dict[str, Any] = {}
    if driver.procfs_dir:
        for name, text in (("params", host.params), ("version", host.version), ("registry", host.registry)):
            if text is not None:
                want[name] = text
        caps = host.capabilities or {}
        for k in keys:
            rel = _procfs.cap_rel(k)
            text = caps.get(rel[len("capabilities/"):])
            if text is not None:
                want[rel] = text
    _need(driver.procfs == want, "procfs texts differ from proc/driver/nvidia")


def _field(text: str | None, name: str) -> str:
    for line in (text or "").splitlines():
        k, sep, v = line.partition(":")
        if sep and k.strip() == name:
            return v.strip()
    return ""


# ----------------------------------------------------------------------------- save

def save(path: str, key: str, driver) -> bool:
    """Writes atomically, sealed, then prunes the directory; False (and nothing left
    behind) if the dir is not usable."""
    from libinject.record import asdict

    directory = os.path.dirname(path) or "."
    body = jsonc.dumps(asdict(driver)).encode()
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        # Checked through the fd it is written through (never a symlink).
        dfd = atomic.open_dir(directory)
        try:
            if not _trusted(os.fstat(dfd)):
                return False
            atomic.write_at(dfd, os.path.basename(path), seal(key, body, own_key(directory)), 0o600)
            prune(dfd, os.path.basename(path))
        finally:
            os.close(dfd)
        return True
    except OSError:
        return False


def prune(dfd: int, current: str = "") -> None:
    """Bound the directory: remove our snapshots from before this boot (their boot id
    is gone) or older than MAX_AGE, all but the KEEP newest, and temp files older than
    TMP_AGE (a crashed writer's). Only regular files of ours with our names."""
    import re

    now = time.time()
    booted = now - time.clock_gettime(time.CLOCK_BOOTTIME)
    snaps = []
    try:
        with os.scandir(dfd) as it:
            entries = [(e.name, e.stat(follow_symlinks=False)) for e in it
                       if e.name != current and (re.fullmatch(_SNAP_NAME, e.name) or re.fullmatch(_TMP_NAME, e.name))]
    except OSError:
        return
    doomed = []
    for name, st in entries:
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            continue
        if name.startswith("."):
            if now - st.st_mtime > TMP_AGE:
                doomed.append(name)
        elif st.st_mtime < booted - 1 or now - st.st_mtime > MAX_AGE:
            doomed.append(name)
        else:
            snaps.append((st.st_mtime_ns, name))
    snaps.sort(reverse=True)
    doomed += [name for _, name in snaps[max(KEEP - (1 if current else 0), 0):]]
    for name in doomed:
        try:
            os.unlink(name, dir_fd=dfd)
        except OSError:
            pass


def driver_from_dict(d: dict):
    """A Driver from record.asdict(driver) after a JSON round trip, checked field
    by field (libinject.discover.decode); raises ValueError if anything is off."""
    return decode.driver(d)
