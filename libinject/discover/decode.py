"""JSON -> the discovery model (libinject.discover.model), strictly.

What comes back as JSON (a snapshot file, the NVML child's answer) decides which
device nodes and host files a container gets, so nothing is taken on trust: every
object must have exactly its fields (NVML's answer: the fields it sends), each of its
type (an int is not a bool nor a string of digits), numbers in range, paths absolute
and normal, GPUs and MIG devices in index order with unique minors. Anything else is
Invalid (a ValueError) naming where, never an object that fails later.
"""
from __future__ import annotations

import posixpath

from libinject.discover import model
from libinject.record import fields

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

MINOR_MAX = 1 << 20             # the kernel's MINORBITS
MAJOR_MAX = 1 << 12
GPU_MINOR_MAX = 255             # /dev/nvidia0..254; 255 is nvidiactl
_LOWER_HEX = "0123456789abcdef"


def _is_bus_id(s: str) -> bool:
    """Whether `s` fullmatches [0-9a-f]{8}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7] (hand-written:
    `re` costs the hook ~8 ms to import; ASCII lowercase hex only)."""
    return (len(s) == 16 and s[8] == ":" and s[11] == ":" and s[14] == "."
            and s[15] in "01234567" and not (s[:8] + s[9:11] + s[12:14]).strip(_LOWER_HEX))


class Invalid(ValueError):
    pass


_FIELDS: dict[type, frozenset[str]] = {}
if TYPE_CHECKING:
    Where = Any     # "info", or (parent, ".field") / (parent, index): formatted only for an error


def _w(where: Where) -> str:
    if not isinstance(where, tuple):
        return str(where)
    parent, part = where
    return _w(parent) + (f"[{part}]" if isinstance(part, int) else
                         f"[{part}]" if part.startswith("'") else part)


def _type(v: Any, t: type, where: Where) -> Any:
    if type(v) is not t:        # exact: True is not an int here, nor "1"
        raise Invalid(f"{_w(where)}: expected {t.__name__}, got {type(v).__name__}")
    return v


def _int(v: Any, where: Where, hi: int = 1 << 63) -> int:
    if type(v) is int and 0 <= v < hi:      # the common case first: this runs ~1000x per load
        return v
    _type(v, int, where)
    raise Invalid(f"{_w(where)}: {v} out of range [0, {hi})")


def _str(v: Any, where: Where) -> str:
    if type(v) is str and "\0" not in v:
        return v
    _type(v, str, where)
    raise Invalid(f"{_w(where)}: NUL in string")


def _path(v: Any, where: Where) -> str:
    if type(v) is str and v[:1] == "/" and v[1:2] != "/" and "\0" not in v and posixpath.normpath(v) == v:
        return v
    _str(v, where)
    raise Invalid(f"{_w(where)}: {v[:80]!r} is not an absolute normal path")


def _opt_int(v: Any, where: Where, hi: int = 1 << 63) -> int | None:
    return None if v is None else _int(v, where, hi)


def _list(v: Any, where: Where, item: Callable[[Any, Where], Any]) -> tuple:
    _type(v, list, where)
    return tuple(item(x, (where, i)) for i, x in enumerate(v))


def _obj(v: Any, where: Where, cls: type, optional: frozenset[str] = frozenset()) -> dict:
    """v as a dict with exactly cls's fields (those in `optional` may be absent)."""
    _type(v, dict, where)
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = frozenset(f.name for f in fields(cls))
    if len(v) == len(names) and names.issuperset(v):
        return v
    extra = set(v) - names
    missing = names - set(v) - optional
    if extra or missing:
        what = f"unknown field {sorted(map(str, extra))[0]!r}" if extra else f"missing field {sorted(missing)[0]!r}"
        raise Invalid(f"{_w(where)}: {what}")
    return v


def _str_dict(v: Any, where: Where, value: Callable[[Any, Where], Any]) -> dict:
    _type(v, dict, where)
    return {_str(k, (where, " key")): value(x, (where, repr(k))) for k, x in v.items()}


def _minor_dict(v: Any, where: Where) -> dict[str, int]:
    """name -> minor (the mig-minors table: ~1000 entries on a MIG host, checked on
    every warm start, so the common case is checked in bulk)."""
    _type(v, dict, where)
    if not v or ({*map(type, v)} == {str} and "\0" not in "".join(v) and {*map(type, v.values())} == {int}
                 and min(v.values()) >= 0 and max(v.values()) < MINOR_MAX):
        return dict(v)
    return _str_dict(v, where, lambda x, w: _int(x, w, MINOR_MAX))     # names the culprit


# ----------------------------------------------------------------------------- model

def mig_device(v: Any, where: Where, nvml: bool = False) -> model.MigDevice:
    d = _obj(v, where, model.MigDevice,
             frozenset({"gi_access_minor", "ci_access_minor"}) if nvml else frozenset())
    return model.MigDevice(
        index=_int(d["index"], (where, ".index")), uuid=_str(d["uuid"], (where, ".uuid")),
        gi=_int(d["gi"], (where, ".gi"), 1 << 16), ci=_int(d["ci"], (where, ".ci"), 1 << 16),
        name=_str(d["name"], (where, ".name")),
        memory_total=_int(d["memory_total"], (where, ".memory_total")),
        gi_access_minor=_opt_int(d.get("gi_access_minor"), (where, ".gi_access_minor"), MINOR_MAX),
        ci_access_minor=_opt_int(d.get("ci_access_minor"), (where, ".ci_access_minor"), MINOR_MAX))


def gpu(v: Any, where: Where, nvml: bool = False) -> model.Gpu:
    d = _obj(v, where, model.Gpu)
    cc = _list(d["cc"], (where, ".cc"), lambda x, w: _int(x, w, 1 << 16))
    if len(cc) != 2:
        raise Invalid(f"{_w(where)}.cc: expected [major, minor]")
    bus_id = _bus_id(d["bus_id"], (where, ".bus_id"))
    migs = _list(d["mig_devices"], (where, ".mig_devices"), lambda x, w: mig_device(x, w, nvml))
    if [m.index for m in migs] != list(range(len(migs))):
        raise Invalid(f"{_w(where)}.mig_devices: not in index order")
    if len({(m.gi, m.ci) for m in migs}) != len(migs) or len({m.uuid for m in migs}) != len(migs):
        raise Invalid(f"{_w(where)}.mig_devices: duplicate instance or UUID")
    return model.Gpu(
        index=_int(d["index"], (where, ".index")),
        minor=_int(d["minor"], (where, ".minor"), GPU_MINOR_MAX),
        uuid=_str(d["uuid"], (where, ".uuid")), name=_str(d["name"], (where, ".name")),
        brand=_str(d["brand"], (where, ".brand")), bus_id=bus_id, cc=cc,
        architecture=_str(d["architecture"], (where, ".architecture")),
        memory_total=_int(d["memory_total"], (where, ".memory_total")),
        mig_enabled=_type(d["mig_enabled"], bool, (where, ".mig_enabled")),
        mig_devices=migs, mig_capable=_type(d["mig_capable"], bool, (where, ".mig_capable")))


def driver_info(v: Any, where: Where = "info", nvml: bool = False) -> model.DriverInfo:
    """nvml: NVML's answer (MIG devices without their caps minors, filled in later)."""
    d = _obj(v, where, model.DriverInfo)
    gpus = _list(d["gpus"], (where, ".gpus"), lambda x, w: gpu(x, w, nvml))
    if [g.index for g in gpus] != list(range(len(gpus))):
        raise Invalid(f"{_w(where)}.gpus: not in index order")
    for attr in ("minor", "bus_id", "uuid"):
        if len({getattr(g, attr) for g in gpus}) != len(gpus):
            raise Invalid(f"{_w(where)}.gpus: duplicate {attr}")
    return model.DriverInfo(driver_version=_str(d["driver_version"], (where, ".driver_version")),
                            cuda_version=_str(d["cuda_version"], (where, ".cuda_version")), gpus=gpus)


def _library(v: Any, where: Where) -> model.Library:
    d = _obj(v, where, model.Library)
    return model.Library(path=_path(d["path"], (where, ".path")),
                         soname=None if d["soname"] is None else _str(d["soname"], (where, ".soname")),
                         capability=_str(d["capability"], (where, ".capability")),
                         arch=_str(d["arch"], (where, ".arch")),
                         extra=_type(d["extra"], bool, (where, ".extra")))


def _host_file(v: Any, where: Where) -> model.HostFile:
    d = _obj(v, where, model.HostFile)
    return model.HostFile(path=_path(d["path"], (where, ".path")),
                          container_path=_path(d["container_path"], (where, ".container_path")),
                          capability=_str(d["capability"], (where, ".capability")),
                          kind=_str(d["kind"], (where, ".kind")))


def _node(v: Any, where: Where) -> model.DeviceNode:
    d = _obj(v, where, model.DeviceNode)
    return model.DeviceNode(path=_path(d["path"], (where, ".path")),
                            container_path=_path(d["container_path"], (where, ".container_path")),
                            major=_int(d["major"], (where, ".major"), MAJOR_MAX),
                            minor=_int(d["minor"], (where, ".minor"), MINOR_MAX),
                            capability=_str(d["capability"], (where, ".capability")))


def _bus_id(v: Any, where: Where) -> str:
    bus_id = _str(v, where)
    if not _is_bus_id(bus_id):
        raise Invalid(f"{_w(where)}: {bus_id[:40]!r} is not a PCI bus id")
    return bus_id


def _drm(v: Any, where: Where) -> model.DrmNode:
    d = _obj(v, where, model.DrmNode)
    by_path = _str(d["by_path"], (where, ".by_path"))
    if by_path:
        _path(by_path, (where, ".by_path"))
    return model.DrmNode(bus_id=_bus_id(d["bus_id"], (where, ".bus_id")), node=_node(d["node"], (where, ".node")),
                         by_path=by_path)


def driver(v: Any) -> model.Driver:
    """A Driver from record.asdict(driver) (after a JSON round trip)."""
    d = _obj(v, "snapshot", model.Driver)

    def many(key: str, item: Callable[[Any, Where], Any]) -> tuple:
        return _list(d[key], key, item)

    procfs_dir = _str(d["procfs_dir"], "procfs_dir")
    if procfs_dir:
        _path(procfs_dir, "procfs_dir")
    return model.Driver(
        root=_path(d["root"], "root"), dev_root=_path(d["dev_root"], "dev_root"),
        info=driver_info(d["info"]),
        libraries=many("libraries", _library), binaries=many("binaries", _host_file),
        firmware=many("firmware", _host_file), ipcs=many("ipcs", _host_file),
        graphics_files=many("graphics_files", _host_file), drm_devices=many("drm_devices", _drm),
        control_devices=many("control_devices", _node), gpu_devices=many("gpu_devices", _node),
        mig_minors=_minor_dict(d["mig_minors"], "mig_minors"),
        imex_channels=many("imex_channels", _node), cap_devices=many("cap_devices", _node),
        procfs_dir=procfs_dir, library_source=_str(d["library_source"], "library_source"),
        procfs=_str_dict(d["procfs"], "procfs", _type_str),
        gpu_procfs=_str_dict(d["gpu_procfs"], "gpu_procfs", _name),
    )


def _type_str(v: Any, where: Where) -> str:
    return _type(v, str, where)         # procfs texts: any characters


def _name(v: Any, where: Where) -> str:
    _str(v, where)
    if not v or "/" in v or v in (".", ".."):
        raise Invalid(f"{_w(where)}: {v[:40]!r} is not a file name")
    return v
