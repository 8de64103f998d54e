"""What a container asks for, whatever path it came by (CLI flags, OCI env, CDI).

Built by pure functions (libinject.request.oci_spec for the hook and the shim,
libinject.request.cli_flags for `nvhook configure`); consumed by the planner. Who
discovery runs as is not part of it: that is host configuration (DiscoverOptions).
"""
from __future__ import annotations

from libinject.record import fields, record


@record(frozen=True)
class Request:
    devices: str | None = None          # selection grammar ("all", "0,1", "GPU-..", "0:1", "MIG-.."); "none" = driver only; None = not a GPU container
    capabilities: frozenset[str] = frozenset({"utility", "compute"})
    # "display" named (NVIDIA_DRIVER_CAPABILITIES, --display), not come by through "all":
    # the host must have /dev/nvidia-modeset, as for NVIDIA (nvc_info.c always lists the
    # node; mounting it fails without it). Through "all" display takes it where it exists.
    modeset_required: bool = False
    requirements: tuple[str, ...] = ()  # each an NVIDIA_REQUIRE_* expression (space = OR, comma = AND)
    disable_require: bool = False
    mig_config: str | None = None       # device selection for MIG config capability
    mig_monitor: str | None = None
    imex_channels: str | None = None    # comma list of channel ids, or "all"
    no_cgroups: bool = False
    no_devbind: bool = False
    no_persistenced: bool = False
    no_fabricmanager: bool = False
    no_gsp_firmware: bool = False
    cuda_compat_mode: str = "ldconfig"  # "mount" | "ldconfig" | "disabled"
    ldconfig: str = "@/sbin/ldconfig"   # "@PATH" = host path; otherwise a path inside the container


def to_json(request: Request) -> dict:
    """request as JSON values (lists for its tuple and set fields)."""
    return {f.name: sorted(v) if isinstance(v, frozenset) else list(v) if isinstance(v, tuple) else v
            for f in fields(Request) for v in (getattr(request, f.name),)}


def from_json(d: object) -> Request:
    """to_json()'s inverse; ValueError for anything to_json() does not make (each field
    has its default's type: str (or None where that is the default), bool, a tuple
    or a set of str)."""
    if type(d) is not dict or not set(d) <= _NAMES:
        raise ValueError("not a request")
    values = {}
    for f in fields(Request):
        if f.name not in d:
            continue
        v, default = d[f.name], f.default
        if isinstance(default, (tuple, frozenset)):
            if type(v) is not list or not all(type(x) is str for x in v):
                raise ValueError(f"request field {f.name}")
            v = type(default)(v)
        elif type(default) is bool:
            if type(v) is not bool:
                raise ValueError(f"request field {f.name}")
        elif not (type(v) is str or v is None is default):
            raise ValueError(f"request field {f.name}")
        values[f.name] = v
    return Request(**values)


_NAMES = frozenset(f.name for f in fields(Request))
