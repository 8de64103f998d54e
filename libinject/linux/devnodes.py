"""`load-kmods`: load NVIDIA's kernel modules and create the driver's missing device
nodes, as nvidia-container-cli does through the setuid nvidia-modprobe, without one.

- modules: `modprobe nvidia`, `nvidia-uvm`, `nvidia-modeset`, only where the driver is the
  running kernel's (dev_root "/") and the module is not loaded yet; a failure is a note,
  not an error (NVIDIA's cli warns and goes on).
- nodes under DEV_ROOT/dev: nvidiactl (195:255), nvidia<N> (195:N, each GPU the driver
  lists), nvidia-uvm (uvm:0), nvidia-uvm-tools (uvm:1), nvidia-modeset (195:254, when that
  module is loaded), nvidia-caps/nvidia-cap<M> (per the driver's capability files). Majors
  come from DEV_ROOT/proc/devices; mode/uid/gid from the driver's params (DeviceFile*),
  the caps' modes from their capability files.

Safety: the dev dirs are opened by fd without following a link and must be root's and
writable by no one else; each node is made under a temporary name in that dir fd and
hard-linked to its name (link(2) never replaces nor follows what is there), so a name
that exists as anything but the right device is refused, never overwritten or followed.
"""
from __future__ import annotations

import os
import stat

from libinject.errors import NvhookError
from libinject.linux import safedir

NVIDIA_MAJOR = 195          # fixed by the driver (NV_MAJOR_DEVICE_NUMBER)
CTL_MINOR = 255
MODESET_MINOR = 254
MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset")
MODPROBE = ("/sbin/modprobe", "/usr/sbin/modprobe")
_MAX_READ = 1 << 20


def _read(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, _MAX_READ).decode("utf-8", "replace")
    finally:
        os.close(fd)


def _fields(text: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def char_majors(text: str | None) -> dict[str, int]:
    """/proc/devices' character majors by name."""
    majors: dict[str, int] = {}
    in_chars = False
    for line in (text or "").splitlines():
        if line.startswith("Character devices"):
            in_chars = True
        elif line.startswith("Block devices"):
            in_chars = False
        elif in_chars:
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit():
                majors.setdefault(parts[1], int(parts[0]))
    return majors


def load_modules(dev_root: str, note) -> None:
    """modprobe NVIDIA's modules into the running kernel (only for the host's own driver)."""
    if os.path.realpath(dev_root) != "/":
        return
    prog = next((p for p in MODPROBE if os.access(p, os.X_OK)), None)
    for mod in MODULES:
        if os.path.isdir(f"/sys/module/{mod.replace('-', '_')}"):
            continue
        if prog is None:
            note(f"load-kmods: cannot load {mod}: no modprobe in {', '.join(MODPROBE)}")
            continue
        import subprocess   # not on the hook's usual path (modules loaded)

        try:
            r = subprocess.run([prog, mod], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, timeout=30, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
            if r.returncode:
                note(f"load-kmods: modprobe {mod} failed: {r.stderr.decode(errors='replace').strip()[:200]}")
        except (OSError, subprocess.TimeoutExpired) as e:
            note(f"load-kmods: modprobe {mod} failed: {e}")


def wanted(dev_root: str) -> list[tuple[str, int, int, int]]:
    """(name under dev/, major, minor, mode) of each node the driver under dev_root has."""
    proc = os.path.join(dev_root, "proc")
    if _read(os.path.join(proc, "driver/nvidia/version")) is None:
        return []       # no NVIDIA driver there: nothing of ours to create
    majors = char_majors(_read(os.path.join(proc, "devices")))
    params = _fields(_read(os.path.join(proc, "driver/nvidia/params")))
    mode = _int(params.get("DeviceFileMode"), 0o666) & 0o777
    nodes: list[tuple[str, int, int, int]] = []
    nv = majors.get("nvidia-frontend", majors.get("nvidia"))
    if nv is not None:
        nodes.append(("nvidiactl", nv, CTL_MINOR, mode))
        gpus = os.path.join(proc, "driver/nvidia/gpus")
        for bus in sorted(_listdir(gpus)):
            minor = _int(_fields(_read(os.path.join(gpus, bus, "information"))).get("Device Minor"), -1)
            if 0 <= minor < CTL_MINOR - 1:
                nodes.append((f"nvidia{minor}", nv, minor, mode))
        if os.path.isdir(os.path.join(dev_root, "sys/module/nvidia_modeset")):
            nodes.append(("nvidia-modeset", nv, MODESET_MINOR, mode))
    uvm = majors.get("nvidia-uvm")
    if uvm is not None:
        nodes += [("nvidia-uvm", uvm, 0, mode), ("nvidia-uvm-tools", uvm, 1, mode)]
    caps = majors.get("nvidia-caps")
    if caps is not None:
        for path in _cap_files(os.path.join(proc, "driver/nvidia/capabilities")):
            f = _fields(_read(path))
            minor = _int(f.get("DeviceFileMinor"), -1)
            if minor >= 0:
                nodes.append((f"nvidia-caps/nvidia-cap{minor}", caps, minor,
                              _int(f.get("DeviceFileMode"), 0o444) & 0o777))
    return nodes


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _cap_files(top: str, depth: int = 0) -> list[str]:
    out: list[str] = []
    if depth > 6:
        return out
    for name in sorted(_listdir(top)):
        path = os.path.join(top, name)
        if os.path.islink(path):
            continue
        if os.path.isdir(path):
            out += _cap_files(path, depth + 1)
        elif name in ("config", "monitor", "access"):
            out.append(path)
    return out


def _open_dir(parent: int | None, name: str, path: str, create: bool = False) -> int:
    """A dev dir by fd, never through a link, root's and writable by no one else."""
    fd = safedir.open_root_subdir(parent, name, path, prefix="load-kmods: ", create=create,
                                  refusal="no device node is made there")
    assert fd is not None
    return fd


def _make(dfd: int, name: str, path: str, major: int, minor: int, mode: int, uid: int, gid: int) -> bool:
    """Make one node (True) or find it right (False); anything else there is refused."""
    rdev = os.makedev(major, minor)
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None:
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == rdev:
            return False
        raise NvhookError(f"load-kmods: {path}: exists and is not character device {major}:{minor}; not replaced")
    tmp = f".nvhook-{name}.{os.getpid()}"
    os.mknod(tmp, stat.S_IFCHR | 0o600, rdev, dir_fd=dfd)
    try:
        os.chown(tmp, uid, gid, dir_fd=dfd, follow_symlinks=False)
        os.chmod(tmp, mode, dir_fd=dfd)     # the dir is root's alone: tmp is still ours
        try:
            os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
        except FileExistsError:     # made meanwhile (another start): take it if it is right
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if not (stat.S_ISCHR(st.st_mode) and st.st_rdev == rdev):
                raise NvhookError(f"load-kmods: {path}: exists and is not character device "
                                  f"{major}:{minor}; not replaced") from None
            return False
    finally:
        os.unlink(tmp, dir_fd=dfd)
    return True


def create_nodes(dev_root: str, only: set[str] | None = None) -> list[str]:
    """Create the driver's missing nodes under dev_root/dev; the paths made.
    only: names (relative to dev/) to limit it to."""
    nodes = [n for n in wanted(dev_root) if only is None or n[0] in only]
    if not nodes:
        return []
    params = _fields(_read(os.path.join(dev_root, "proc/driver/nvidia/params")))
    uid, gid = _int(params.get("DeviceFileUID"), 0), _int(params.get("DeviceFileGID"), 0)
    made: list[str] = []
    root = os.open(dev_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # trusted (driver root)
    try:
        dev = _open_dir(root, "dev", os.path.join(dev_root, "dev"))
        try:
            caps = None
            for name, major, minor, mode in nodes:
                sub, _, base = name.rpartition("/")
                if sub:
                    if caps is None:
                        caps = _open_dir(dev, sub, os.path.join(dev_root, "dev", sub), create=True)
                    dfd = caps
                else:
                    dfd = dev
                path = os.path.join(dev_root, "dev", name)
                if _make(dfd, base, path, major, minor, mode, uid, gid):
                    made.append(path)
            if caps is not None:
                os.close(caps)
        finally:
            os.close(dev)
    finally:
        os.close(root)
    return made


def prepare(dev_root: str, note) -> list[str]:
    """load-kmods: modules, then nodes; the nodes made."""
    load_modules(dev_root, note)
    try:
        return create_nodes(dev_root)
    except OSError as e:
        raise NvhookError(f"load-kmods: cannot create device nodes under {dev_root}/dev: {e.strerror}") from None
