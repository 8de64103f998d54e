"""What a driver root offers: driver, GPUs, MIG devices, files and device nodes.

Read-only, for any driver root ("/", "/run/nvidia/driver", a simulated host).
Fast path: a snapshot (libinject.discover.snapshot) reused while its fingerprint of the host
still matches; otherwise the slow path asks NVML in a child process and looks the
files up, then writes a new snapshot. Heavy modules are imported only on the slow path.
"""
from __future__ import annotations

import os

from libinject.constants import FABRICMANAGER_SOCKET, PERSISTENCED_SOCKET
from libinject.discover import snapshot as _snap
from libinject.errors import NvhookError
from libinject.discover.model import Driver

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

DEFAULT_LDCACHE = "/etc/ld.so.cache"
MIG_MINORS = "proc/driver/nvidia-caps/mig-minors"   # under the dev root
MPS_PIPE_DIR = "/tmp/nvidia-mps"
# Control device nodes under dev/, in order, with the capability that injects them.
CONTROL_DEVICES = (("nvidiactl", ""), ("nvidia-uvm", "compute"), ("nvidia-uvm-tools", "compute"),
                   ("nvidia-modeset", "display"))


def _watch_dirs() -> list[str]:
    from libinject.discover import graphics
    from libinject.discover import libraries as L

    return [*L.SEARCH_DIRS_64, *L.SEARCH_DIRS_32, *L.BIN_DIRS, "lib/firmware/nvidia",
            "run/nvidia-persistenced", "run/nvidia-fabricmanager", "run",
            (os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_PIPE_DIR).lstrip("/"),
            *graphics.watch_dirs()]


_WATCH: list[str] | None = None  # computed once per process


def _check_root(root: str) -> str:
    # The admin's root may be a symlink (/run/nvidia/driver often is); resolve it once
    # here, since apply opens host sources without following any symlink.
    root = os.path.realpath(root)
    try:
        os.listdir(root)
    except OSError as e:
        raise NvhookError(f"cannot read driver root {root}: {e.strerror}") from None
    return root


def _join(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def discover(root: str = "/", *, ldcache: str | None = None, dev_root: str | None = None,
             nvml_timeout: float = 10.0, user: tuple[int, int] | None = None,
             snapshot: bool = True, snapshot_dir: str | None = None,
             log: Callable[[str], None] | None = None) -> Driver:
    """Discover the driver under `root`.

    ldcache: cache path inside the root (default /etc/ld.so.cache); given explicitly,
    it must parse. dev_root: where dev/ and proc/ are read (default: root).
    user: (uid, gid) NVML runs as; None = 65534:65534 (nobody), without capabilities.
    snapshot: reuse/write a snapshot under snapshot_dir (default /run/nvhook/snapshots).
    log: gets a line when a snapshot is discarded as bad (it is then rebuilt)."""
    global _WATCH
    root = _check_root(root)
    dev_root = os.path.realpath(dev_root) if dev_root else root
    cache = _join(root, ldcache or DEFAULT_LDCACHE)
    if not snapshot:
        return _discover(root, dev_root, cache, ldcache is not None, nvml_timeout, user)
    if _WATCH is None:
        _WATCH = _watch_dirs()
    path = _snap.path_for(snapshot_dir or _snap.DEFAULT_DIR, root, dev_root, cache)
    # The fingerprint is taken before discovering: a change during discovery makes
    # the snapshot stale, never stale data current.
    key, host = _snap.probe(root, dev_root, cache, _WATCH)
    driver = _snap.load(path, key, host, log)
    if driver is None:
        driver = _discover(root, dev_root, cache, ldcache is not None, nvml_timeout, user)
        _snap.save(path, key, driver)
    return driver


# ----------------------------------------------------------------------------- slow path

def library_entries(root: str, cache: str, explicit: bool):
    """(ld.so.cache entries or search results, how they were found)."""
    from libinject.discover import ldcache as LC
    from libinject.discover import libraries as L

    reason = "no ld.so.cache"
    if os.path.exists(cache) or explicit:
        try:
            entries = LC.load(cache)
        except NvhookError as e:
            if explicit:
                raise
            reason = f"unusable ld.so.cache: {e}"
        else:
            if any(e.name.startswith("libnvidia-ml.so") for e in entries):
                return entries, f"ldcache {cache}"
            if explicit:
                raise NvhookError(f"{cache}: no NVIDIA driver libraries in this ld.so.cache")
            reason = f"no driver libraries in {cache}"
    dirs = [*L.SEARCH_DIRS_64, *L.SEARCH_DIRS_32]
    entries = LC.search(root, dirs, L.maybe_driver_library)
    found = sorted({os.path.dirname(e.path) for e in entries})
    return entries, f"search {':'.join(found) or '(nothing found)'} ({reason})"


def _nvml_path(root: str, entries) -> str | None:
    from libinject.discover import libraries as L

    for e in entries:
        if e.name == "libnvidia-ml.so.1" and e.arch in L.NATIVE_ARCHES and not e.hwcaps_subdir:
            p = L.resolve(root, e.path)
            if p and os.path.isfile(p):
                return p
    return None


def _device(host: str, container_path: str, capability: str = ""):
    import stat

    from libinject.discover.model import DeviceNode

    try:
        st = os.stat(host)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        return None
    return DeviceNode(host, container_path, os.major(st.st_rdev), os.minor(st.st_rdev), capability)


def _numbered(dirpath: str, prefix: str, container_dir: str) -> list:
    try:
        names = os.listdir(dirpath)
    except OSError:
        return []
    found = []
    for name in names:
        num = name[len(prefix):]
        if name.startswith(prefix) and num.isdigit():
            node = _device(os.path.join(dirpath, name), f"{container_dir}/{name}")
            if node:
                found.append((int(num), node))
    return [n for _, n in sorted(found)]


def parse_mig_minors(text: str) -> dict[str, int]:
    """The whole mig-minors table: "config 1", "gpu0/gi1/access 12" ... -> {name: minor}
    (the CDI mask-procfs hook, tests; discovery keeps a part: mig_minors_for);
    malformed lines are skipped."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isascii() and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def read_mig_minors(path: str) -> dict[str, int]:
    """proc/driver/nvidia-caps/mig-minors as a table; a missing or unreadable file is
    an empty table."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse_mig_minors(f.read())
    except OSError:
        return {}


_MIG_MEMO: tuple = ()           # (text, minors, table): the warm service checks the same text often


# The ASCII whitespace (str.isspace(), \s) other than " ", "\t" and "\n".
_OTHER_ASCII_SPACE = ("\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f")


def _mig_lines(block: str, needle: str) -> list[tuple[str, str]]:
    """re.findall(rf"(?m)^({needle}\\S*)[ \\t]+([0-9]+)[ \\t]*$", block), by hand (`re` costs
    the hook ~8 ms to import), `needle` taken literally (it is "gpu<int>/": no metacharacter).
    No part of that pattern matches a newline, so a match is one whole line ("\\n"-split,
    "$" is before a "\\n" or at the end): the needle; the rest of its non-whitespace run
    (\\S: not str.isspace(), as str.split() has it); one or more spaces or tabs; ASCII
    digits; spaces or tabs. Any other whitespace ("\\r", "\\v", U+00A0...) fails the line."""
    lines = block.split("\n")
    if block.isascii() and not any(c in block for c in _OTHER_ASCII_SPACE):
        # The kernel's table: " " and "\t" are the only whitespace in a line, so a line
        # matches iff it starts with the needle and splits into a name and ASCII digits.
        split = [line.split() for line in lines if line.startswith(needle)]
        return [(p[0], p[1]) for p in split if len(p) == 2 and p[1].isdigit()]
    pairs = []
    for line in lines:
        if not line.startswith(needle):
            continue
        name = line.split(None, 1)[0]       # starts with the needle: not whitespace
        rest = line[len(name):]
        digits = rest.lstrip(" \t")
        if len(digits) == len(rest):        # no space or tab after the name
            continue
        digits = digits.rstrip(" \t")
        if digits and not digits.strip("0123456789"):
            pairs.append((name, digits))
    return pairs


def mig_minors_for(text: str, gpus) -> dict[str, int]:
    """The part of the mig-minors table (it covers every possible GPU: 32 x 135 lines)
    a plan can use: "config", "monitor" and the `gpus`' own entries. Discovery and the
    snapshot check (every warm start) both use this, so it works at C speed: a GPU's
    lines are one block of the table, found with find/rfind and parsed line by line.
    As in the kernel's table, a line is "name minor" from its first column; malformed
    lines are skipped, a repeated name keeps its last minor."""
    global _MIG_MEMO
    minors = tuple(g.minor for g in gpus)
    if _MIG_MEMO and _MIG_MEMO[1] == minors and _MIG_MEMO[0] == text:
        return dict(_MIG_MEMO[2])
    out: dict[str, int] = {}
    t = "\n" + text
    for name in ("config", "monitor"):      # the last good line, as a full parse has it
        i = len(t)
        while (i := t.rfind("\n" + name, 0, i)) >= 0:
            j = t.find("\n", i + 1)
            parts = t[i + 1:len(t) if j < 0 else j].split()
            if len(parts) == 2 and parts[0] == name and parts[1].isascii() and parts[1].isdigit():
                out[name] = int(parts[1])
                break
    for minor in minors:
        needle = f"gpu{minor}/"
        first = text.find(needle)
        if first < 0:
            continue
        end = text.find("\n", text.rfind(needle))
        block = text[max(first - 1, 0):len(text) if end < 0 else end]
        out.update({name: int(minor) for name, minor in _mig_lines(block, needle)})
    _MIG_MEMO = (text, minors, out)
    return dict(out)


def _discover(root: str, dev_root: str, cache: str, explicit_cache: bool,
              timeout: float, user: tuple[int, int] | None) -> Driver:
    from libinject.discover import graphics
    from libinject.discover import libraries as L
    from libinject.discover import model
    from libinject.discover import nvml
    from libinject.discover.procfs import gpu_entry as procfs_entry
    from libinject.discover.procfs import read as read_procfs
    from libinject.discover.procfs import read_table
    from libinject.record import replace

    entries, source = library_entries(root, cache, explicit_cache)
    libpath = _nvml_path(root, entries)
    if libpath is None:
        raise NvhookError(f"NVML not found under driver root {root}: no libnvidia-ml.so.1 ({source})")
    info = nvml.query(root, libpath, timeout=timeout, user=user)

    mig_minors = mig_minors_for(read_table(os.path.join(dev_root, MIG_MINORS)) or "", info.gpus)
    gpus = []
    for g in info.gpus:
        migs = tuple(replace(
            m, gi_access_minor=mig_minors.get(f"gpu{g.minor}/gi{m.gi}/access"),
            ci_access_minor=mig_minors.get(f"gpu{g.minor}/gi{m.gi}/ci{m.ci}/access"))
            for m in g.mig_devices)
        gpus.append(replace(g, mig_devices=migs))
    info = replace(info, gpus=tuple(gpus))
    ver = info.driver_version

    libs = L.select(entries, root, ver)

    binaries = find_binaries(root)
    firmware = find_firmware(root, ver)
    ipcs = find_ipcs(root)

    dev = os.path.join(dev_root, "dev")
    control = [n for n in (_device(os.path.join(dev, name), f"/dev/{name}", cap)
                           for name, cap in CONTROL_DEVICES) if n]
    gpu_nodes = [n for n in (_device(os.path.join(dev, f"nvidia{g.minor}"), f"/dev/nvidia{g.minor}")
                             for g in info.gpus) if n]
    procfs = os.path.join(dev_root, "proc/driver/nvidia")
    if not os.path.isdir(procfs):
        procfs = ""
    # What the masked procfs copies, read now so that planning reads nothing: the MIG
    # capability files of config/monitor and of every MIG device (what a plan can pick).
    cap_keys = ["config", "monitor"]
    for g in info.gpus:
        for m in g.mig_devices:
            cap_keys += [f"gpu{g.minor}/gi{m.gi}/access", f"gpu{g.minor}/gi{m.gi}/ci{m.ci}/access"]
    host_procfs = read_procfs(procfs, cap_keys)
    gpu_procfs = {g.bus_id: name for g in info.gpus
                  if (name := procfs_entry(host_procfs.gpus, g.bus_id)) is not None}
    graphics_files, drm = graphics.discover(root, dev_root, ver, info.gpus)
    return Driver(
        root=root, dev_root=dev_root, info=info, libraries=tuple(libs),
        binaries=tuple(binaries), firmware=tuple(firmware), ipcs=tuple(ipcs),
        graphics_files=graphics_files, drm_devices=drm,
        control_devices=tuple(control), gpu_devices=tuple(gpu_nodes), mig_minors=mig_minors,
        imex_channels=tuple(_numbered(os.path.join(dev, "nvidia-caps-imex-channels"), "channel",
                                      "/dev/nvidia-caps-imex-channels")),
        cap_devices=tuple(_numbered(os.path.join(dev, "nvidia-caps"), "nvidia-cap", "/dev/nvidia-caps")),
        procfs_dir=procfs, library_source=source,
        procfs=host_procfs.files, gpu_procfs=gpu_procfs,
    )


# ----------------------------------------------------------------------------- host files
# What discovery finds, each next to its check of a snapshot's claim (snapshot.verify):
# the root is "/" on a normal host, so a path under it could be any host file. A claim
# holds only if discovery could have found that very file at a name it looks for.

def could_find_libraries(root: str, cache: str, version: str, libs, source: str) -> bool:
    """Whether discovery could have found `libs`, from `source`: the ld.so.cache when
    library_entries() would use it (read only for the entries of the libraries' SONAMEs
    and NVML's: ~0.1 ms, not ~2 ms), else the search of the library dirs."""
    from libinject.discover import ldcache as LC
    from libinject.discover import libraries as L

    try:
        keys = tuple(dict.fromkeys(os.fsencode(lib.soname) + b"\0" for lib in libs))
    except (TypeError, UnicodeError):       # no SONAME, or one no file name has
        return False
    entries = None
    if os.path.exists(cache):
        try:
            entries = LC.load(cache, (b"libnvidia-ml.so", *keys))
        except NvhookError:
            pass
        else:
            if not any(e.name.startswith("libnvidia-ml.so") for e in entries):
                entries = None
    if entries is not None:
        return source == f"ldcache {cache}" and L.could_find(root, version, libs, entries)
    return source.startswith("search ") and L.could_find(root, version, libs, _searched(root, libs))


def _searched(root: str, libs) -> list:
    """The entries LC.search() would make in the library dirs for files of the names of
    `libs` (each dir listed once, as the search does)."""
    from libinject.discover import ldcache as LC
    from libinject.discover import libraries as L

    names = {os.path.basename(lib.path) for lib in libs}
    out = []
    for d in (*L.SEARCH_DIRS_64, *L.SEARCH_DIRS_32):
        try:
            here = names.intersection(os.listdir(os.path.join(root, d)))
        except OSError:
            continue
        out += [e for name in sorted(here) if (e := LC.search_entry(root, d, name, L.maybe_driver_library))]
    return out


def find_binaries(root: str) -> list:
    """Each of BINARIES: the first found in BIN_DIRS, an executable regular file that is
    not a script."""
    from libinject.discover import libraries as L
    from libinject.discover import model

    out = []
    for name, cap in L.BINARIES:
        for d in L.BIN_DIRS:
            p = L.resolve(root, f"/{d}/{name}")
            if p and os.path.isfile(p) and os.access(p, os.X_OK) and not _is_script(p):
                out.append(model.HostFile(p, f"/usr/bin/{name}", cap, "binary"))
                break
    return out


def _is_script(path: str) -> bool:
    """A `#!` file: a host's wrapper (cloud images put `exec /usr/local/nvidia/bin/...`
    scripts in /usr/bin), not the driver's program: inside a container it would exec a
    path that is not there, so the search goes on to the real one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return os.pread(fd, 2, 0) == b"#!"
    except OSError:
        return False
    finally:
        os.close(fd)


def could_find_binaries(root: str, files) -> bool:
    """Whether find_binaries() could have found `files`: each one of BINARIES, with its
    capability, once, its host path what /<a BIN_DIR>/<name> resolves to in the root (the
    dir it is in first: one resolve, unless it is reached by a link), executable."""
    from libinject.discover import libraries as L

    wanted = {f"/usr/bin/{name}": (name, cap) for name, cap in L.BINARIES}
    real_of = L.Resolver(root).file         # resolved, and a regular file
    seen = set()
    for f in files:
        want = wanted.get(f.container_path)
        if f.kind != "binary" or want is None or want[1] != f.capability or f.container_path in seen:
            return False
        seen.add(f.container_path)
        here = L.inside(root, os.path.dirname(f.path)).strip("/")
        dirs = (here, *L.BIN_DIRS) if here in L.BIN_DIRS else L.BIN_DIRS
        if not any(real_of(f"/{d}/{want[0]}") == f.path for d in dirs) or not os.access(f.path, os.X_OK):
            return False
    return True


def find_firmware(root: str, version: str) -> list:
    """The GSP firmware: lib/firmware/nvidia/<version>/gsp*.bin, by name."""
    import glob

    from libinject.discover import libraries as L
    from libinject.discover import model

    fwdir = L.resolve(root, f"/lib/firmware/nvidia/{version}")
    if not fwdir:
        return []
    return [model.HostFile(p, f"/lib/firmware/nvidia/{version}/{os.path.basename(p)}", "", "firmware")
            for p in sorted(glob.glob(os.path.join(glob.escape(fwdir), "gsp*.bin")))]


def could_find_firmware(root: str, version: str, files) -> bool:
    """Whether find_firmware() could have found `files`: each an entry gsp*.bin (as glob
    matches it; no `re`: ~8 ms of the hook's start) of the directory
    lib/firmware/nvidia/<version> resolves to, at that name in the container, once."""
    from libinject.discover import libraries as L

    if not files:
        return True
    fwdir = L.resolve(root, f"/lib/firmware/nvidia/{version}")
    seen = set()
    for f in files:
        name = f.path.rpartition("/")[2]
        if (fwdir is None or f.kind != "firmware" or f.capability != "" or f.path in seen
                or f.path != os.path.join(fwdir, name)
                or not (name.startswith("gsp") and name.endswith(".bin") and len(name) >= 7)
                or f.container_path != f"/lib/firmware/nvidia/{version}/{name}"
                or not os.path.lexists(f.path)):
            return False
        seen.add(f.path)
    return True


def _ipc_paths() -> tuple[tuple[str, str], ...]:
    """The IPC paths discovery looks for, with their capabilities (the MPS pipe dir is
    nvhook's own environment's, as nvidia-container-cli has it; never a container's)."""
    mps = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_PIPE_DIR
    return ((PERSISTENCED_SOCKET, "utility"), (FABRICMANAGER_SOCKET, "utility"), (mps, "compute"))


def find_ipcs(root: str) -> list:
    from libinject.discover import libraries as L
    from libinject.discover import model

    out = []
    for path, cap in _ipc_paths():
        p = L.resolve(root, path)
        if p and _root_owned(p):
            out.append(model.HostFile(p, L.inside(root, p), cap, "ipc"))
    return out


def could_find_ipcs(root: str, files) -> bool:
    """Whether find_ipcs() could have found `files`: each what one of the IPC paths
    resolves to in the root (each path once), with its capability, at its own path in
    the container, root-owned as _root_owned() wants it."""
    from libinject.discover import libraries as L

    known = _ipc_paths()
    real: dict[int, str | None] = {}
    used: set[int] = set()
    for f in files:
        if f.kind != "ipc" or f.container_path != L.inside(root, f.path):
            return False
        for i, (path, cap) in enumerate(known):
            if i in used or cap != f.capability:
                continue
            if i not in real:
                real[i] = L.resolve(root, path)
            if real[i] == f.path:
                used.add(i)
                break
        else:
            return False
        if not _root_owned(f.path):
            return False
    return True


def _root_owned(path: str) -> bool:
    """IPC paths get bind-mounted read-write into containers: take one only when root
    owns it and its directory, and others cannot swap it (a world-writable directory
    must be sticky). A /tmp/nvidia-mps made by an unprivileged user is not the driver's."""
    try:
        st = os.lstat(path)
        parent = os.stat(os.path.dirname(path))
    except OSError:
        return False
    if st.st_uid != 0 or parent.st_uid != 0:
        return False
    return not parent.st_mode & 0o002 or bool(parent.st_mode & 0o1000)
