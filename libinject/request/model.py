"""What a container asks for, whatever path it came by (CLI flags, OCI env, CDI).

Built by pure functions (libinject.request.oci_spec for the hook and the shim,
libinject.request.cli_flags for `nvhook configure`); consumed by the planner. Who
discovery runs as is not part of it: that is host configuration (DiscoverOptions).
"""
from __future__ import annotations

from libinject.record import record


@record(frozen=True)
class Request:
    devices: str | None = None          # selection grammar ("all", "0,1", "GPU-..", "0:1", "MIG-.."); "none" = driver only; None = not a GPU container
    capabilities: frozenset[str] = frozenset({"utility", "compute"})
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
