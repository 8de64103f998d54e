"""What discovery finds in a driver root besides its libraries' selection: binaries,
firmware, IPC paths, and the control device nodes' names; each next to its check of a
snapshot's claim (libinject.discover.snapshot.verify). The root is "/" on a normal host,
so a path under it could be any host file: a claim holds only if discovery could have
found that very file at a name it looks for."""
from __future__ import annotations

import os

from libinject.constants import FABRICMANAGER_SOCKET, PERSISTENCED_SOCKET
from libinject.errors import NvhookError

MPS_PIPE_DIR = "/tmp/nvidia-mps"
# Control device nodes under dev/, in order, with the capability that injects them.
CONTROL_DEVICES = (("nvidiactl", ""), ("nvidia-uvm", "compute"), ("nvidia-uvm-tools", "compute"),
                   ("nvidia-modeset", "display"))


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
