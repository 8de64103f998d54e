"""The host's /proc/driver/nvidia as a container's masked copy needs it.

The one reader of it: discovery keeps what it read in the Driver (Driver.procfs,
Driver.gpu_procfs), so the planner stays a pure function, and the CDI mask-procfs hook,
which runs at container start without a Driver, reads through the same function.
What is read: `params`, `version` and `registry` (copied into the container's tmpfs;
missing ones skipped, as upstream), the MIG capability files asked for
(capabilities/..., NVML in the container reads the caps minors there), and the
gpus/<busid> directories with the "Device Minor" of each.
"""
from __future__ import annotations

import os

from libinject.errors import NvhookError
from libinject.record import field, record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable

FILES = ("params", "version", "registry")
LIMIT = 1 << 20         # procfs files are small; a bound keeps a strange one from filling memory


@record(frozen=True)
class HostProcfs:
    files: dict[str, str] = field(default_factory=dict)          # rel path -> text
    gpus: dict[str, int | None] = field(default_factory=dict)    # gpus/<name> -> Device Minor
    models: dict[str, str] = field(default_factory=dict)         # gpus/<name> -> Model ("": none)


def _read_bytes(path: str) -> bytes:
    chunks: list[bytes] = []
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        # procfs sizes say 0: read to EOF in chunks (one LIMIT-sized buffer per small
        # file would cost more than the read)
        left = LIMIT
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_text(path: str) -> str | None:
    """The file's text (surrogateescape: bytes kept as they are); None if it is missing."""
    try:
        data = _read_bytes(path)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except OSError as e:
        raise NvhookError(f"cannot read {path}: {e.strerror}") from None
    return data.decode("utf-8", "surrogateescape")


def read_table(path: str) -> str | None:
    """A table such as nvidia-caps/mig-minors (~100 KB: all of it, up to LIMIT); None if
    it cannot be read (no MIG support: an empty table)."""
    try:
        return _read_bytes(path).decode("utf-8", "replace")
    except OSError:
        return None


def cap_rel(key: str) -> str:
    """Where the mig-minors table's `key` has its file under /proc/driver/nvidia:
    "config" -> "capabilities/mig/config", "gpu0/gi1/ci0/access" ->
    "capabilities/gpu0/mig/gi1/ci0/access"."""
    gpu, sep, rest = key.partition("/")
    return f"capabilities/{gpu}/mig/{rest}" if sep else f"capabilities/mig/{key}"


def device_minor(text: str | None) -> int | None:
    """The "Device Minor:" of a gpus/<busid>/information text."""
    for line in (text or "").splitlines():
        k, sep, v = line.partition(":")
        if sep and k.strip() == "Device Minor":
            v = v.strip()
            return int(v) if v.isascii() and v.isdigit() else None
    return None


def _model(text: str) -> str:
    """The "Model:" of a gpus/<busid>/information text ("" if none)."""
    return next((v.strip() for k, _, v in (ln.partition(":") for ln in text.splitlines())
                 if k.strip() == "Model"), "")


def read(procfs_dir: str, cap_keys: Iterable[str] = ()) -> HostProcfs:
    """params/version/registry and the capability files of `cap_keys` (mig-minors table
    names) by their path under procfs_dir, and the gpus/ dirs. Missing files are
    skipped; other read errors are an NvhookError."""
    files: dict[str, str] = {}
    if not procfs_dir:
        return HostProcfs()
    for rel in (*FILES, *dict.fromkeys(cap_rel(k) for k in cap_keys)):
        text = read_text(os.path.join(procfs_dir, rel))
        if text is not None:
            files[rel] = text
    gpus: dict[str, int | None] = {}
    models: dict[str, str] = {}
    try:
        with os.scandir(os.path.join(procfs_dir, "gpus")) as it:
            names = sorted(e.name for e in it if e.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        names = []
    except OSError as e:
        raise NvhookError(f"cannot read {procfs_dir}/gpus: {e.strerror}") from None
    for name in names:
        try:
            text = read_text(os.path.join(procfs_dir, "gpus", name, "information")) or ""
        except NvhookError:
            text = ""
        gpus[name], models[name] = device_minor(text), _model(text)
    return HostProcfs(files, gpus, models)


def gpu_entry(names: Iterable[str], bus_id: str) -> str | None:
    """Which gpus/ dir is the GPU's: like upstream, the 32-bit PCI domain form first
    ("00000000:07:00.0"), then the 16-bit one ("0000:07:00.0")."""
    domain, _, rest = bus_id.partition(":")
    try:
        short = f"{int(domain, 16):04x}:{rest.lower()}"
    except ValueError:
        short = None
    have = set(names)
    for name in (bus_id.lower(), short):
        if name in have:
            return name
    return None


def for_container(procfs_dir: str, cap_minors: Iterable[int], mig_minors: str = "") -> tuple[HostProcfs, list[str]]:
    """What a container's /proc/driver/nvidia mask needs of the host's, without a Driver
    (the CDI hook): read(), with the capability files of the nvidia-caps minors it was
    given, named by the mig-minors table (`mig_minors`, or nvidia-caps/mig-minors beside
    procfs_dir); and those files' table keys."""
    from libinject.discover.migminors import read_mig_minors

    caps = set(cap_minors)
    keys: list[str] = []
    if caps:
        table = mig_minors or os.path.join(os.path.dirname(procfs_dir.rstrip("/")),
                                           "nvidia-caps", "mig-minors")
        keys = [key for key, minor in read_mig_minors(table).items() if minor in caps]
    return read(procfs_dir, keys), keys


def gpu_models(procfs_dir: str, minors: Iterable[int], host: HostProcfs | None = None) -> list[str]:
    """The "Model:" of each of the host's gpus/*/information whose Device Minor is one
    of `minors` (none where there is no gpus/ dir); from `host` where read() already
    read them."""
    want = set(minors)
    if host is not None:
        return [host.models.get(name, "") for name, minor in sorted(host.gpus.items()) if minor in want]
    gpus = os.path.join(procfs_dir, "gpus")
    try:
        names = sorted(os.listdir(gpus))
    except OSError:
        return []
    out = []
    for name in names:
        text = read_text(os.path.join(gpus, name, "information")) or ""
        if device_minor(text) in want:
            out.append(_model(text))
    return out
