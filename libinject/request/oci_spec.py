"""OCI spec + config -> Request: what a container asks for.

Pure: no I/O, no imports beyond the Request type. Mirrors nvidia-container-runtime-hook
(container_config.go and internal/config/image). One builder for every consumer: the
hook (request_from_spec) and the runtime shim (requested_devices) read the same devices
from the same spec.

- devices, first that gives any: `/dev/null` volume mounts under
  /var/run/nvidia-container-devices (only when accept-nvidia-visible-devices-as-volume-mounts);
  CDI annotations with a configured prefix (`cdi.k8s.io/*: nvidia.com/gpu=1`; the hook
  takes the names of the default kind, the shim's cdi mode all of them; the
  annotation-gated hooks.d config relies on it); the swarm-resource variables if the image
  sets any of them, else NVIDIA_VISIBLE_DEVICES. An unprivileged container's own request
  (env or CDI annotations) is ignored unless accept-nvidia-visible-devices-envvar-when-unprivileged
  (default true); volume mounts are exempt, as in NVIDIA's hook (an orchestrator's grant).
  void / empty / unset -> not a GPU container (None); with a legacy CUDA_VERSION image,
  unset means all. Among several values void > none > all > a list.
- capabilities: unset -> utility,compute; `all` -> every supported; a legacy image with
  the variable unset -> every supported; an unknown or unsupported one is an error.
- requirements: every NVIDIA_REQUIRE_* but JETPACK, ordered by variable name, plus
  cuda>=MAJOR.MINOR for a legacy image; none when disabled (config or NVIDIA_DISABLE_REQUIRE).
- MIG config/monitor: privileged containers only (CAP_SYS_ADMIN in the bounding set).
- IMEX channels, as NVIDIA's toolkit (internal/config/image/cuda_image.go,
  ImexChannelRequests): from volume mounts /var/run/nvidia-container-devices/imex/<id>
  first (when those are accepted), else NVIDIA_IMEX_CHANNELS, taken from an unprivileged
  container only with accept-nvidia-visible-devices-envvar-when-unprivileged (else
  ignored); "all" from the environment asks for nothing.
Every value is read through libinject.request.oci_state.field, so a field of the wrong
JSON type is an NvhookError naming it, never a TypeError (load_config checked the file
already; specs built in memory get the same check here).
"""
from __future__ import annotations

import posixpath

from libinject.errors import NvhookError
from libinject.request.model import Request
from libinject.request.oci_state import field

from libinject.constants import DEFAULT_CAPABILITIES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DEVICES_ROOT = "/var/run/nvidia-container-devices"
VISIBLE = "NVIDIA_VISIBLE_DEVICES"
CAPS = "NVIDIA_DRIVER_CAPABILITIES"
REQUIRE_PREFIX = "NVIDIA_REQUIRE_"
REQUIRE_CUDA = "NVIDIA_REQUIRE_CUDA"
REQUIRE_JETPACK = "NVIDIA_REQUIRE_JETPACK"
DISABLE_REQUIRE = "NVIDIA_DISABLE_REQUIRE"
CUDA_VERSION = "CUDA_VERSION"
MIG_CONFIG = "NVIDIA_MIG_CONFIG_DEVICES"
MIG_MONITOR = "NVIDIA_MIG_MONITOR_DEVICES"
IMEX = "NVIDIA_IMEX_CHANNELS"
CAP_SYS_ADMIN = "CAP_SYS_ADMIN"
# Go's strconv.ParseBool, which NVIDIA uses for NVIDIA_DISABLE_REQUIRE.
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_DIGITS = "0123456789"
_SEMVER_TAG = _DIGITS + "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz.-"


def _semver(s: str) -> tuple[str, str | None, str | None] | None:
    """Go's semver as NVIDIA applies it to CUDA_VERSION: vMAJOR[.MINOR[.PATCH]][-pre][+build].
    The groups (major, minor, patch) of a fullmatch of, with re.ASCII,
      v?(0|[1-9]\\d*)(?:\\.(0|[1-9]\\d*)(?:\\.(0|[1-9]\\d*))?)?(?:-[0-9A-Za-z.-]+)?(?:\\+[0-9A-Za-z.-]+)?
    or None; by hand, as `re` costs the hook ~8 ms to import. ASCII digits only, as Go's:
    str.isdigit() would also take "١٢". Neither the core nor the pre-release holds a "+",
    nor the core a "-", so the first "+" and then the first "-" split it unambiguously."""
    if s[:1] == "v":
        s = s[1:]
    s, plus, build = s.partition("+")
    if plus and (not build or build.strip(_SEMVER_TAG)):
        return None
    core, minus, pre = s.partition("-")
    if minus and (not pre or pre.strip(_SEMVER_TAG)):
        return None
    nums = core.split(".")
    if len(nums) > 3:
        return None
    for n in nums:
        if not n or n.strip(_DIGITS) or (n[0] == "0" and len(n) > 1):
            return None
    nums += [None] * (3 - len(nums))
    return nums[0], nums[1], nums[2]


def _show(value: str, limit: int = 64) -> str:
    """value for an error line: a container's value may be megabytes long."""
    return value if len(value) <= limit else value[:limit] + "..."


def container_env(spec: dict[str, Any]) -> dict[str, str]:
    """process.env as a dict (a later entry wins, as in NVIDIA's hook)."""
    env: dict[str, str] = {}
    for item in field(spec, "process.env", "strings") or ():
        if "=" in item:
            k, v = item.split("=", 1)
            env[k] = v
    return env


def is_privileged(spec: dict[str, Any]) -> bool:
    """CAP_SYS_ADMIN in the bounding set (a bare list for pre-rc5 specs)."""
    caps = field(spec, "process.capabilities", "strings|object")
    if isinstance(caps, list):
        return CAP_SYS_ADMIN in caps
    if isinstance(caps, dict):
        return CAP_SYS_ADMIN in (field(caps, "bounding", "strings", prefix="process.capabilities") or ())
    return False


def is_legacy(env: dict[str, str]) -> bool:
    return bool(env.get(CUDA_VERSION)) and not env.get(REQUIRE_CUDA)


def wants_gpu(spec: dict[str, Any], config) -> bool:
    """Whether the container asks for GPUs at all (the hook's early exit)."""
    env = container_env(spec)
    return _devices(spec, env, config, is_privileged(spec)) is not None


def requested_devices(spec: dict[str, Any], config, say=None) -> tuple[tuple[str, ...], str] | None:
    """(device ids as the container wrote them, where from: "mounts", "annotations" or
    "env"), or None for a container that wants no GPU. Annotation ids are CDI names
    ("nvidia.com/gpu=0", any kind); the others are selection ids, "all" or "none"
    after NVIDIA's precedence (void > none > all > the list)."""
    return _requested(spec, container_env(spec), config, is_privileged(spec), say or (lambda m: None))


def request_from_spec(spec: dict[str, Any], config, log=None) -> Request | None:
    """The container's Request, or None for a container that wants no GPU.

    config is a libinject.config.Config; log(msg) receives one line per decision.
    """
    say = log or (lambda msg: None)
    env = container_env(spec)
    privileged = is_privileged(spec)
    devices = _devices(spec, env, config, privileged, say)
    if devices is None:
        say("not a GPU container")
        return None
    legacy = is_legacy(env)
    mig_config = _privileged_only(env, MIG_CONFIG, privileged)
    mig_monitor = _privileged_only(env, MIG_MONITOR, privileged)
    imex = _imex(spec, env, config, privileged, say)
    caps = _capabilities(env, config, legacy)
    disable = config.disable_require or env.get(DISABLE_REQUIRE, "") in _TRUE
    requirements = () if disable else _requirements(env, legacy)
    say(f"devices={devices} capabilities={','.join(sorted(caps))} privileged={privileged}"
        f" legacy={legacy} requirements={list(requirements)} disable_require={disable}")
    named = {c.strip() for c in env.get(CAPS, "").split(",")}
    return Request(
        devices=devices,
        capabilities=caps,
        modeset_required="display" in caps and "display" in named and "all" not in named,
        requirements=requirements,
        disable_require=disable,
        mig_config=mig_config,
        mig_monitor=mig_monitor,
        imex_channels=imex,
        no_cgroups=config.cli.no_cgroups,
        cuda_compat_mode=config.runtime.modes.legacy.cuda_compat_mode,
        ldconfig=config.cli.ldconfig,
    )


def _devices(spec, env, config, privileged, say=lambda m: None) -> str | None:
    """The hook's selection string (libinject.plan.select's grammar), or None."""
    asked = _requested(spec, env, config, privileged, say)
    if asked is None:
        return None
    ids, source = asked
    if source == "annotations":
        kind = config.runtime.modes.cdi.default_kind + "="
        ids = tuple(i[len(kind):] for i in ids if i.startswith(kind) and i[len(kind):])
        if not ids:
            say(f"CDI annotations name no {kind[:-1]} device")
            return None
        return _special(list(ids))
    return ",".join(ids)


def _requested(spec, env, config, privileged, say) -> tuple[tuple[str, ...], str] | None:
    found = _requested_any(spec, env, config, say)
    if found is None:
        return None
    # What the container wrote itself (its env, its annotations) counts for an unprivileged
    # container only when the config accepts it. Volume mounts are exempt, as in NVIDIA's
    # hook: they are the way an orchestrator (the device plugin's volume-mounts strategy)
    # grants devices when container-chosen requests are not accepted.
    if (found[1] != "mounts" and not privileged
            and not config.accept_nvidia_visible_devices_envvar_when_unprivileged):
        what = "CDI annotations" if found[1] == "annotations" else "NVIDIA_VISIBLE_DEVICES"
        say(f"ignoring {what} in an unprivileged container "
            "(accept-nvidia-visible-devices-envvar-when-unprivileged = false)")
        return None
    return found


def _requested_any(spec, env, config, say) -> tuple[tuple[str, ...], str] | None:
    if "void" in (t.strip() for t in env.get(VISIBLE, "").split(",")):
        # void wins over everything, CDI annotations included: it is what a CDI spec
        # (ours, nvidia-ctk's) sets for the devices it gives, so an engine that applied
        # the annotations itself (CRI-O >= 1.23) gets no second injection from the hook
        say(f"{VISIBLE}=void: nothing to do (the devices, if any, came through CDI)")
        return None
    if config.accept_nvidia_visible_devices_as_volume_mounts:
        found = devices_from_mounts(field(spec, "mounts", "objects") or ())
        if found:
            say(f"devices from volume mounts: {','.join(found)}")
            return _listed(found, "mounts")
    found = annotation_devices(field(spec, "annotations", "string_map"), config)
    if found:
        say(f"devices from CDI annotations: {','.join(found)}")
        return tuple(found), "annotations"
    swarm = [v for v in config.swarm_resource_envvars() if v in env]
    names = swarm or [VISIBLE]
    tokens = [t.strip() for n in names for t in env.get(n, "").split(",") if t.strip()]
    if not tokens:
        if not any(n in env for n in names) and is_legacy(env):
            tokens = ["all"]  # legacy image, variable unset: all GPUs
        else:
            return None
    return _listed(tokens, "env")


def _listed(tokens: list[str], source: str) -> tuple[tuple[str, ...], str] | None:
    special = _special(tokens)
    if special is None:
        return None
    return tuple(special.split(",")), source


def _special(tokens: list[str]) -> str | None:
    """void > none > all > the list itself (NVIDIA's NewVisibleDevices)."""
    if "void" in tokens or "" in tokens:
        return None
    if "none" in tokens:
        return "none"
    if "all" in tokens:
        return "all"
    return ",".join(tokens)


IMEX_MOUNT_PREFIX = "imex/"


def _imex(spec, env, config, privileged: bool, say=lambda m: None) -> str | None:
    """The IMEX channels asked for, NVIDIA's way (module docstring), or None."""
    if config.accept_nvidia_visible_devices_as_volume_mounts:
        found = imex_from_mounts(field(spec, "mounts", "objects") or ())
        if found:
            say(f"IMEX channels from volume mounts: {','.join(found)}")
            return ",".join(found)
    tokens = [t.strip() for t in env.get(IMEX, "").split(",") if t.strip()]
    if not tokens or tokens == ["all"]:
        return None
    if privileged or config.accept_nvidia_visible_devices_envvar_when_unprivileged:
        return ",".join(tokens)
    say(f"ignoring {IMEX} in an unprivileged container")
    return None


def imex_from_mounts(mounts) -> list[str]:
    """IMEX channel ids from `/dev/null` mounted at /var/run/nvidia-container-devices/imex/<id>."""
    return [d[len(IMEX_MOUNT_PREFIX):] for d in _mounted(mounts)
            if d.startswith(IMEX_MOUNT_PREFIX) and d[len(IMEX_MOUNT_PREFIX):]]


def devices_from_mounts(mounts) -> list[str]:
    """Device ids from `/dev/null` mounted at /var/run/nvidia-container-devices/<id>
    (an imex/<id> there is an IMEX channel request, not a device)."""
    return [d for d in _mounted(mounts) if not d.startswith(IMEX_MOUNT_PREFIX)]


def _mounted(mounts) -> list[str]:
    """What follows /var/run/nvidia-container-devices/ in each /dev/null mount there."""
    out: list[str] = []
    for i, m in enumerate(mounts):
        source = field(m, "source", "string", prefix=f"mounts[{i}]")
        if source is None or posixpath.normpath(source) != "/dev/null":
            continue
        dest = posixpath.normpath(field(m, "destination", "string", prefix=f"mounts[{i}]") or "")
        if not dest.startswith(DEVICES_ROOT):
            continue
        dev = dest[len(DEVICES_ROOT):].lstrip("/")
        if dev:
            out.append(dev)
    return out


def annotation_devices(annotations, config) -> list[str]:
    """CDI device names from annotations with a configured prefix, values
    "nvidia.com/gpu=0,nvidia.com/gpu=GPU-..." (keys sorted for a stable order)."""
    if not isinstance(annotations, dict):
        return []
    prefixes = config.runtime.modes.cdi.annotation_prefixes
    out: list[str] = []
    for key in sorted(k for k in annotations if isinstance(k, str)):
        value = annotations[key]
        if not any(key.startswith(p) for p in prefixes) or not isinstance(value, str):
            continue
        out += [item.strip() for item in value.split(",") if item.strip()]
    return out


def _privileged_only(env: dict[str, str], name: str, privileged: bool) -> str | None:
    value = env.get(name, "")
    if not value:
        return None
    if not privileged:
        raise NvhookError(f"cannot set {name} in non privileged container")
    return value


def _capabilities(env: dict[str, str], config, legacy: bool) -> frozenset[str]:
    supported = config.supported_capabilities()
    if CAPS not in env and legacy:
        return supported
    value = env.get(CAPS, "")
    if not value:
        return DEFAULT_CAPABILITIES & supported
    asked = {c.strip() for c in value.split(",") if c.strip()}
    if "all" in asked:
        return supported
    unknown = asked - supported
    if unknown:
        raise NvhookError(
            f"unsupported capabilities found in {CAPS}={_show(value)} "
            f"(allowed: {','.join(sorted(supported))})")
    return frozenset(asked)


def _requirements(env: dict[str, str], legacy: bool) -> tuple[str, ...]:
    reqs = [env[k] for k in sorted(env)
            if k.startswith(REQUIRE_PREFIX) and not k.startswith(REQUIRE_JETPACK) and env[k].strip()]
    if legacy:
        reqs.append(f"cuda>={legacy_cuda_version(env[CUDA_VERSION])}")
    return tuple(reqs)


def legacy_cuda_version(version: str) -> str:
    """CUDA_VERSION "10.0.130" -> "10.0" (as Go's semver.MajorMinor)."""
    m = _semver(version.strip())
    if not m:
        raise NvhookError(f"invalid {CUDA_VERSION}={_show(version)}: not a version")
    return f"{m[0]}.{m[1] or 0}"
