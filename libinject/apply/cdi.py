"""CDI (Container Device Interface) specs: ContainerEdits <-> CDI, generate, load, resolve.

One pipeline (README "Layout"): `cdi generate` discovers the driver once, plans each
device with libinject.plan.planner exactly as the hook would (a Request per device), and
serialises those ContainerEdits. What every device's plan shares (libraries, binaries,
firmware, IPC, control devices, symlinks, ldconfig) goes to the spec-level
containerEdits; what is left per device (its /dev/nvidiaN, MIG capability nodes) goes
to the device. Beside the GPU spec, as nvidia-ctk's --mode: an IMEX channel spec
(nvidia.com/imex-channel=<N>) and a MIG capability spec (nvidia.com/mig-caps=config,
=monitor), their nodes planned as the hook plans NVIDIA_IMEX_CHANNELS and
NVIDIA_MIG_CONFIG_DEVICES / NVIDIA_MIG_MONITOR_DEVICES; and, asked for, the driver-only
device nvidia.com/gpu=none (NVIDIA_VISIBLE_DEVICES=none).

What a CDI spec cannot say directly becomes ONE hook entry calling our own `nvhook
cdi-hook createRuntime` (explicit env; libinject.runtime.cdi_hooks): the /proc/driver/nvidia
masking (`--procfs-dir`: runc refuses OCI mounts under /proc, so a spec cannot mount it;
the hook picks the GPU dirs from the container's own device list, so one spec-level hook
serves every device combination), symlinks (`--link TARGET::LINK`) and the ld cache
(`--folder DIR`), all in one call. At createRuntime the runtime runs it in its own
namespaces, where `nvhook serve` can take it (the front hands it over as it hands over
the prestart hook); `--hook-stage createContainer` makes it a createContainer hook for
engines that run createRuntime hooks elsewhere. Specs written before have three hooks
(mask-procfs, create-symlinks, update-ldcache): still accepted.
Cgroup rules follow from deviceNodes (runtimes add an allow rule per node).

The lowest cdiVersion the content needs is emitted (podman 4.3.1 reads only
0.3.0-0.5.0), following specs-go/version.go: mount `type` -> 0.4.0; deviceNode
`hostPath` or a device name not starting with a letter -> 0.5.0; annotations or a dot
in the class -> 0.6.0; intelRdt/additionalGids -> 0.7.0; netDevices -> 1.1.0.
"""
from __future__ import annotations

import os
import posixpath

from libinject.constants import ALL_CAPABILITIES, SAFE_PATH
from libinject.linux import atomic
from libinject.plan import compat as _compat
from libinject.plan.edits import ContainerEdits, DeviceEdit, MountEdit, SymlinkEdit
from libinject.errors import NvhookError
from libinject.record import field, record, replace

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, Sequence

DEFAULT_VENDOR = "nvidia.com"
DEFAULT_CLASS = "gpu"
DEFAULT_KIND = f"{DEFAULT_VENDOR}/{DEFAULT_CLASS}"
DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
# What a spec holds unless asked otherwise: every capability but compat32, as nvidia-ctk's
# spec (no 32-bit libraries). They are a third of its mounts, links and hook arguments,
# and every CDI start pays for them (podman parses the whole spec on each start, runc
# makes each mount's target): `--capabilities all` puts them in.
DEFAULT_CAPABILITIES = tuple(c for c in ALL_CAPABILITIES if c != "compat32")
STRATEGIES = ("index", "uuid", "type-index")
HOOK_ENV = (f"PATH={SAFE_PATH}",)
HOOK_STAGE = "createRuntime"            # where `nvhook serve` can take the hook
HOOK_STAGES = ("createRuntime", "createContainer")
# nvidia-ctk does the same: a container that got its GPUs by CDI must not get them again
# from a legacy hook that is also installed.
SPEC_ENV = ("NVIDIA_VISIBLE_DEVICES=void",)
KNOWN_VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0",
                  "1.0.0", "1.1.0")


def version_key(v: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in v.lstrip("v").split("."))
    except ValueError:
        return (-1,)


# --- ContainerEdits -> CDI containerEdits ------------------------------------------------

def default_hook_path() -> str:
    """What CDI hooks run: the compiled front (nvhook-hook) beside this interpreter, else
    the one on PATH. Never the Python console script: a runtime runs CDI hooks with an
    environment the container may have chosen, and the front starts Python isolated."""
    from libinject.installpath import program

    cand = program("nvhook-hook")
    if os.access(cand, os.X_OK):
        return cand
    import shutil

    found = shutil.which("nvhook-hook")
    if found:
        return os.path.abspath(found)
    raise NvhookError("cannot find nvhook-hook (the isolated front) for CDI hooks (use --hook-path)")


class NoDevices(NvhookError):
    """The host has nothing this mode makes a device of: no spec can be made (a CDI
    spec needs at least one device; nvidia-ctk cdi generate fails there too)."""


@record(frozen=True)
class HookOptions:
    path: str                                  # absolute path of nvhook-hook (the front)
    env: tuple[str, ...] = HOOK_ENV
    ldconfig: str = "@/sbin/ldconfig"
    procfs_dir: str = ""                       # host /proc/driver/nvidia ("" = no masking)
    config: str = ""                           # --config passed to the hooks ("" = default)
    stage: str = HOOK_STAGE                    # the hook entry's hookName (HOOK_STAGES)
    socket: str = ""                           # --socket: the hook service ("" = the front's default)
    # The driver's major version: the hook puts the image's CUDA forward-compat libcuda
    # (/usr/local/cuda/compat) first where it is newer (NVIDIA's enable-cuda-compat
    # hook, --host-driver-version). 0: no such step.
    cuda_compat_major: int = 0


def check_hook_options(opts: HookOptions) -> None:
    if opts.stage not in HOOK_STAGES:
        raise NvhookError(f"invalid hook stage {opts.stage!r} (one of {', '.join(HOOK_STAGES)})")
    if opts.socket and opts.socket != "none" and not opts.socket.startswith("/"):
        raise NvhookError(f"hook service socket must be an absolute path: {opts.socket}")


def hook_socket(cfg, given: str | None = None) -> str:
    """The --socket a spec's hook is given: `given`, else the config's [nvhook] socket
    when it is not the front's own default ("": none needed)."""
    from libinject.constants import SERVE_SOCKET

    if given:
        return given
    sock = cfg.nvhook.socket
    return "" if not sock or sock == SERVE_SOCKET else sock


def _hook(opts: HookOptions, *args: str) -> dict[str, Any]:
    argv = ["nvhook-hook"]
    if opts.config:
        argv += ["--config", opts.config]
    if opts.socket:
        argv += ["--socket", opts.socket]
    return {"hookName": opts.stage, "path": opts.path, "args": [*argv, "cdi-hook", opts.stage, *args],
            "env": list(opts.env)}


def device_node(d: DeviceEdit) -> dict[str, Any]:
    out: dict[str, Any] = {"path": d.path}
    if d.host_path and d.host_path != d.path:
        out["hostPath"] = d.host_path
    out.update(type=d.type, major=d.major, minor=d.minor, permissions=d.permissions)
    return out


def mount(m: MountEdit) -> dict[str, Any]:
    # No "type": a bind mount needs none (runc takes "bind" from the options) and the
    # field would raise the cdiVersion to 0.4.0.
    return {"hostPath": m.host_path, "containerPath": m.container_path, "options": list(m.options)}


def _under_proc(path: str) -> bool:
    return posixpath.normpath(path).startswith("/proc/")


def edits_hook(opts: HookOptions, *, procfs: bool = False, links: Sequence[SymlinkEdit] = (),
               folders: Sequence[str] = ()) -> dict[str, Any] | None:
    """The one hook entry doing every step asked for (None: no step): the procfs mask,
    the symlinks, the ld cache (applied in the live applier's order whatever the
    order of the flags). The libraries the spec mounts into the ld cache's folders are
    not listed again: the hook finds them among the container's bind mounts and merges
    them into the image's cache in-process (libinject.request.cdi_hook.runtime_libraries,
    libinject.apply.ldcache_merge) instead of running ldconfig."""
    args: list[str] = []
    if procfs and opts.procfs_dir:
        args += ["--procfs-dir", opts.procfs_dir]
    for s in links:
        args += ["--link", f"{s.target}::{s.link}"]
    if folders:
        if opts.ldconfig != "@/sbin/ldconfig":
            args += ["--ldconfig", opts.ldconfig]
        for f in folders:
            args += ["--folder", f]
        if opts.cuda_compat_major:
            args += ["--cuda-compat-driver-major", str(opts.cuda_compat_major)]
    return _hook(opts, *args) if args else None


def to_cdi(edits: ContainerEdits, opts: HookOptions, *, env: Sequence[str] = (),
           procfs: bool = False) -> dict[str, Any]:
    """CDI containerEdits for ContainerEdits (empty lists left out): what a spec cannot
    say (procfs, symlinks, the ld cache) in one hook entry, then the edits' own hooks."""
    out: dict[str, Any] = {}
    all_env = [*env, *edits.env]
    if all_env:
        out["env"] = list(dict.fromkeys(all_env))
    if edits.device_nodes:
        out["deviceNodes"] = [device_node(d) for d in edits.device_nodes]
    # Mounts under /proc (MIG capability files) are the mask-procfs hook's: runc
    # refuses OCI mounts inside /proc.
    mounts = [mount(m) for m in edits.mounts if not _under_proc(m.container_path)]
    if mounts:
        out["mounts"] = mounts
    hooks: list[dict[str, Any]] = []
    ours = edits_hook(opts, procfs=procfs, links=edits.symlinks, folders=edits.ldconfig_folders)
    if ours is not None:
        hooks.append(ours)
    for h in edits.hooks:
        hooks.append({"hookName": h.stage, "path": h.path, "args": list(h.args),
                      "env": list(h.env or opts.env)})
    if hooks:
        out["hooks"] = hooks
    return out


def subtract(edits: ContainerEdits, base: ContainerEdits) -> ContainerEdits:
    """What `edits` adds to `base` (per-device edits over the spec-level ones)."""
    def minus(a: tuple, b: tuple) -> tuple:
        bs = set(b)
        return tuple(x for x in a if x not in bs)

    return ContainerEdits(
        env=minus(edits.env, base.env),
        device_nodes=minus(edits.device_nodes, base.device_nodes),
        mounts=minus(edits.mounts, base.mounts),
        symlinks=minus(edits.symlinks, base.symlinks),
        procfs=None,
        ldconfig_folders=minus(edits.ldconfig_folders, base.ldconfig_folders),
        cgroup_rules=minus(edits.cgroup_rules, base.cgroup_rules),
        hooks=minus(edits.hooks, base.hooks),
        cuda_compat=None,
        lib_dir=edits.lib_dir,
    )


# --- generate ----------------------------------------------------------------------------

# What `cdi generate --mode` makes, as nvidia-ctk's modes (pkg/nvcdi/mode.go) and the class
# each defaults to (pkg/nvcdi/options.go getClassOrDefault): "gpu" is nvidia-ctk's nvml
# mode (every GPU and MIG device), "imex" one device per IMEX channel
# (pkg/nvcdi/lib-imex.go), "mig-caps" the MIG "config" and "monitor" capability devices
# (toolkit 1.20, pkg/nvcdi/lib-mig-caps.go).
MODES = {"gpu": DEFAULT_CLASS, "imex": "imex-channel", "mig-caps": "mig-caps"}
MODE_ALIASES = {"nvml": "gpu", "auto": "gpu"}
NONE_DEVICE = "none"
MIG_CAPS = ("config", "monitor")


def mode_of(name: str) -> str:
    mode = MODE_ALIASES.get(name.strip().lower(), name.strip().lower())
    if mode not in MODES:
        raise NvhookError(f"invalid mode {name!r} (allowed: {', '.join(MODES)})")
    return mode


@record(frozen=True)
class DeviceId:
    """One CDI device: its names under the chosen strategies and its selection id."""
    select: str                                # NVIDIA_VISIBLE_DEVICES-style id for plan()
    names: tuple[str, ...]


def check_strategies(strategies: Sequence[str]) -> None:
    bad = [s for s in strategies if s not in STRATEGIES]
    if bad or not strategies:
        raise NvhookError(f"invalid device-name-strategy {','.join(bad) or '(none)'} "
                          f"(allowed: {','.join(STRATEGIES)})")


def device_ids(info, strategies: Sequence[str]) -> list[DeviceId]:
    """Every GPU and MIG device, named by each strategy: index "0" / "0:1",
    uuid "GPU-.." / "MIG-..", type-index "gpu0" / "mig0:1". A GPU in MIG mode is no
    device of its own (nvidia-ctk, pkg/nvcdi/lib-nvml.go: only its MIG devices are), with
    or without MIG devices."""
    check_strategies(strategies)
    out: list[DeviceId] = []
    for g in info.gpus:
        if g.mig_enabled:
            continue
        names = {"index": str(g.index), "uuid": g.uuid, "type-index": f"gpu{g.index}"}
        out.append(DeviceId(str(g.index), tuple(dict.fromkeys(names[s] for s in strategies))))
    for g in info.gpus:
        for m in g.mig_devices:
            idx = f"{g.index}:{m.index}"
            names = {"index": idx, "uuid": m.uuid, "type-index": f"mig{idx}"}
            out.append(DeviceId(idx, tuple(dict.fromkeys(names[s] for s in strategies))))
    return out


def _tokens(ids: Iterable[str]) -> list[str]:
    return [t.strip() for i in ids for t in i.split(",") if t.strip()]


def check_device_ids(ids: Iterable[str]) -> list[str]:
    """--device-id's ids as a list; "none" stands alone or beside others, "void" is no id."""
    toks = _tokens(ids)
    if not toks:
        raise NvhookError("invalid device-id: empty list (all, none or device ids)")
    for t in toks:
        if t.lower() == "void":
            raise NvhookError("invalid device-id void (all, none or device ids)")
    return toks


def select_ids(info, strategies: Sequence[str], ids: Sequence[str]) -> tuple[list[DeviceId], bool, bool]:
    """(the GPU/MIG devices --device-id asks for, whether it asks for every one, whether
    it asks for the driver-only "none" device). Ids are NVIDIA_VISIBLE_DEVICES ids (index,
    GPU-/MIG- UUID, PCI bus id, <gpu>:<mig>) or "all"; the devices keep the host's order."""
    from libinject.plan import select as _select

    every = device_ids(info, strategies)
    toks = check_device_ids(ids)
    want_none = any(t.lower() == NONE_DEVICE for t in toks)
    rest = [t for t in toks if t.lower() != NONE_DEVICE]
    if any(t.lower() == "all" for t in rest):
        return every, True, want_none
    keys = set()
    for t in rest:
        for s in _select.select(info, t):
            if s.mig is None and s.gpu.mig_enabled:
                raise NvhookError(f"device {t}: GPU {s.gpu.index} is in MIG mode: its MIG devices "
                                  f"({s.gpu.index}:<n>, MIG-<uuid>) are the devices")
            keys.add(s.gpu.index if s.mig is None else f"{s.gpu.index}:{s.mig.index}")
    chosen = [d for d in every if (int(d.select) if d.select.isdigit() else d.select) in keys]
    return chosen, len(chosen) == len(every), want_none


def _consumer_host(driver) -> bool:
    """Whether every GPU of the host is one forward compat does not support (the spec's
    hook is common to all its devices: a mixed host keeps NVIDIA's behaviour)."""
    gpus = driver.info.gpus
    return bool(gpus) and len(_compat.consumer(gpus)) == len(gpus)


def _planner(driver, capabilities: Iterable[str], lib_dir: str | None, lib32_dir: str | None):
    """plan(**request fields) -> ContainerEdits, as the hook would plan that request."""
    from libinject.plan import planner as _plan
    from libinject.request.model import Request

    kw = {"lib_dir": lib_dir or _plan.DEBIAN_LIB_DIRS[0],
          "lib32_dir": lib32_dir or _plan.DEBIAN_LIB_DIRS[1]}
    caps = frozenset(capabilities)

    def plan(**request: Any) -> ContainerEdits:
        # cuda-compat needs the image; a spec has none (documented limitation).
        return _plan.plan(Request(capabilities=caps, cuda_compat_mode="disabled", **request),
                          driver, **kw)

    return plan


def _spec(vendor: str, cls: str, devices: list[dict[str, Any]],
          edits: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"cdiVersion": "", "kind": f"{vendor}/{cls}", "devices": devices,
                            "containerEdits": edits}
    check_kind(spec["kind"])
    spec["cdiVersion"] = minimum_version(spec)
    return spec


def _with_all(devices: list[dict[str, Any]], nodes: Iterable[DeviceEdit], hook: HookOptions,
              all_device: bool) -> list[dict[str, Any]]:
    """The devices, then (unless all_device is false) "all" with every node of them."""
    if all_device and devices:
        devices.append({"name": "all", "containerEdits": to_cdi(
            ContainerEdits(device_nodes=tuple(dict.fromkeys(nodes))), hook)})
    return devices


def generate(driver, *, vendor: str = DEFAULT_VENDOR, cls: str | None = None,
             strategies: Sequence[str] = ("index", "uuid"),
             capabilities: Iterable[str] = DEFAULT_CAPABILITIES, hook: HookOptions,
             lib_dir: str | None = None, lib32_dir: str | None = None,
             mask_procfs: bool = True, mode: str = "gpu",
             devices: Sequence[str] = ("all",), all_device: bool = True) -> dict[str, Any]:
    """The CDI spec (a dict) of one mode (MODES): "gpu" (default), for every GPU and MIG
    device of `driver` (or those `devices` names; "none": the driver-only device), plus
    "all"; "imex", a device per IMEX channel plus "all"; "mig-caps", the MIG "config" and
    "monitor" capability devices plus "all". `all_device` false: no "all" device."""
    mode = mode_of(mode)
    cls = cls or MODES[mode]
    check_hook_options(hook)
    plan = _planner(driver, capabilities, lib_dir, lib32_dir)
    if mode == "imex":
        return _imex_spec(driver, plan, vendor, cls, hook, all_device)
    if mode == "mig-caps":
        return _mig_caps_spec(driver, plan, vendor, cls, hook, all_device)

    base = plan(devices="none")
    major = driver.info.driver_version.split(".", 1)[0]
    # (a host of consumer GPUs only: forward compat cannot work there, libinject.plan.compat)
    if major.isdigit() and not hook.cuda_compat_major and not _consumer_host(driver):
        hook = replace(hook, cuda_compat_major=int(major))
    if mask_procfs and base.procfs is not None and driver.procfs_dir:
        hook = replace(hook, procfs_dir=driver.procfs_dir)
    else:
        hook = replace(hook, procfs_dir="")
    ids, every, want_none = select_ids(driver.info, strategies, devices)
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    # "all": the plan for every device when every device is asked for, else for those asked
    # (on a MIG host that is not the planner's "all", which takes GPUs in MIG mode whole).
    whole = every and not any(g.mig_enabled for g in driver.info.gpus)
    merged = DeviceId("all" if whole else ",".join(d.select for d in ids), ("all",))
    # nvidia-ctk: asking for "none" leaves the "all" device out (generate.go validateFlags);
    # here only when "none" is all that is asked for.
    with_all = all_device and not (want_none and not ids)
    for d in [*ids, merged] if ids and with_all else ids:
        edits = to_cdi(subtract(plan(devices=d.select), base), hook)
        if not edits:
            raise NvhookError(f"device {d.select}: its plan adds nothing to the driver's")
        for name in d.names:
            if name in seen:
                continue
            seen.add(name)
            out.append({"name": name, "containerEdits": edits})
    if want_none:
        out.append({"name": NONE_DEVICE, "containerEdits": none_edits(base, hook)})
    if not out:
        raise NoDevices("no GPUs found: a CDI spec needs at least one device")
    return _spec(vendor, cls, out, to_cdi(base, hook, env=SPEC_ENV, procfs=True))


def none_edits(base: ContainerEdits, hook: HookOptions) -> dict[str, Any]:
    """The driver-only device (nvidia-ctk --device-id none, NVIDIA_VISIBLE_DEVICES=none):
    the driver's files are the spec-level edits every device of the spec gets, and no GPU.
    A CDI device may not have empty edits, so it names the driver's control nodes
    (/dev/nvidiactl, /dev/nvidia-uvm, ...) again: runtimes replace a node already added
    for the same path, so the container gets them once."""
    control = tuple(d for d in base.device_nodes if d.kind == "control")
    if control:
        return to_cdi(ContainerEdits(device_nodes=control), hook)
    return {"env": list(SPEC_ENV)}


def _imex_spec(driver, plan, vendor: str, cls: str, hook: HookOptions,
               all_device: bool) -> dict[str, Any]:
    """nvidia-ctk --mode imex (pkg/nvcdi/lib-imex.go): a device per channel, named by its
    number, with its node /dev/nvidia-caps-imex-channels/channel<N>; spec-level edits only
    NVIDIA_VISIBLE_DEVICES=void (the driver comes from the GPU spec). The nodes are the
    planner's (Request.imex_channels), so type, major, minor and access are the hook's."""
    base = plan(devices="none")
    nodes = [d for d in subtract(plan(devices="none", imex_channels="all"), base).device_nodes
             if d.kind == "imex"]
    if not nodes:
        root = driver.dev_root or driver.root
        raise NoDevices(f"no IMEX channels found ({os.path.join(root, 'dev/nvidia-caps-imex-channels')}"
                          "/channel*): a CDI spec needs at least one device")
    out = [{"name": d.path.rsplit("channel", 1)[1],
            "containerEdits": to_cdi(ContainerEdits(device_nodes=(d,)), hook)} for d in nodes]
    return _spec(vendor, cls, _with_all(out, nodes, hook, all_device), {"env": list(SPEC_ENV)})


def _mig_caps_spec(driver, plan, vendor: str, cls: str, hook: HookOptions,
                   all_device: bool) -> dict[str, Any]:
    """nvidia-ctk --mode mig-caps (toolkit 1.20, pkg/nvcdi/lib-mig-caps.go): devices
    "config" and "monitor", each the node of that MIG capability
    (/dev/nvidia-caps/nvidia-cap<minor>, minor from mig-minors). Planned as the hook plans
    --mig-config / --mig-monitor all for every GPU; the planner also allows, by cgroup
    rule only, every MIG minor of the MIG-capable GPUs (upstream's
    setup_mig_minor_cgroups), which CDI cannot say (a runtime allows the nodes a device
    lists): the device carries the capability node only, as nvidia-ctk's does."""
    every = plan(devices="all")
    out: list[dict[str, Any]] = []
    nodes: list[DeviceEdit] = []
    for key in MIG_CAPS:
        if key not in driver.mig_minors:
            continue
        edits = subtract(plan(devices="all", **{f"mig_{key}": "all"}), every)
        mine = tuple(d for d in edits.device_nodes if d.kind == "mig")
        if mine:
            nodes += mine
            out.append({"name": key, "containerEdits": to_cdi(ContainerEdits(device_nodes=mine), hook)})
    if not out:
        raise NoDevices("no MIG capability devices (config, monitor): "
                          "the host is not MIG capable")
    return _spec(vendor, cls, _with_all(out, nodes, hook, all_device), {"env": list(SPEC_ENV)})


# --- versions and names ------------------------------------------------------------------

def _items(v: Any) -> list:
    """A field that should be a list, if it is one (a spec being validated may say
    anything: its wrong types are the schema's to report)."""
    return v if isinstance(v, list) else []


def _edits_of(spec: dict[str, Any]) -> list[dict[str, Any]]:
    out = [spec.get("containerEdits") or {}]
    for d in _items(spec.get("devices")):
        if isinstance(d, dict):
            out.append(d.get("containerEdits") or {})
    return [e for e in out if isinstance(e, dict)]


def minimum_version(spec: dict[str, Any]) -> str:
    """The lowest cdiVersion whose fields cover the spec (specs-go/version.go)."""
    edits = _edits_of(spec)
    devices = [d for d in _items(spec.get("devices")) if isinstance(d, dict)]
    if any(_items(e.get("netDevices")) for e in edits):
        return "1.1.0"
    if any(isinstance(e.get("intelRdt"), dict) or _items(e.get("additionalGids")) for e in edits):
        return "0.7.0"
    _, cls = parse_qualifier(str(spec.get("kind", "")))
    if any(isinstance(o.get("annotations"), dict) and o["annotations"] for o in [spec, *devices]) \
            or "." in cls:
        return "0.6.0"
    # v0.5.0 allowed device names that start with a digit.
    if any(str(d.get("name", ""))[:1] and not _is_letter(str(d.get("name"))[0]) for d in devices):
        return "0.5.0"
    if any(isinstance(n, dict) and n.get("hostPath") for e in edits for n in _items(e.get("deviceNodes"))):
        return "0.5.0"
    if any(isinstance(m, dict) and m.get("type") for e in edits for m in _items(e.get("mounts"))):
        return "0.4.0"
    return "0.3.0"


def _is_letter(c: str) -> bool:
    return ("a" <= c <= "z") or ("A" <= c <= "Z")


def _is_alnum(c: str) -> bool:
    return _is_letter(c) or "0" <= c <= "9"


def vendor_or_class_error(name: str, what: str) -> str | None:
    """pkg/parser: letters first, alphanumeric last, [A-Za-z0-9_.-] between."""
    if not name:
        return f"invalid {what}: empty name"
    if not _is_letter(name[0]):
        return f"invalid {what} {name!r}: should start with a letter"
    for c in name[1:-1]:
        if not (_is_alnum(c) or c in "_-."):
            return f"invalid {what} {name!r}: invalid character {c!r}"
    if not _is_alnum(name[-1]):
        return f"invalid {what} {name!r}: should end with a letter or digit"
    limit = 253 if what == "vendor" else 63
    if len(name) > limit:
        return f"invalid {what} {name!r}: longer than {limit} characters"
    return None


def device_name_error(name: str) -> str | None:
    """pkg/parser: alphanumeric first and last, [A-Za-z0-9_.:-] between."""
    if not name:
        return "invalid (empty) device name"
    if not _is_alnum(name[0]):
        return f"invalid device name {name!r}: should start with a letter or digit"
    for c in name[1:-1]:
        if not (_is_alnum(c) or c in "_-.:"):
            return f"invalid device name {name!r}: invalid character {c!r}"
    if not _is_alnum(name[-1]):
        return f"invalid device name {name!r}: should end with a letter or digit"
    return None


def parse_qualifier(kind: str) -> tuple[str, str]:
    """"vendor/class" -> (vendor, class); ("", kind) when it is not one."""
    vendor, sep, cls = kind.partition("/")
    if not sep or not vendor or not cls:
        return "", kind
    return vendor, cls


def check_kind(kind: str) -> tuple[str, str]:
    vendor, cls = parse_qualifier(kind)
    if not vendor:
        raise NvhookError(f"invalid CDI kind {kind!r}: expected vendor/class")
    err = vendor_or_class_error(vendor, "vendor") or vendor_or_class_error(cls, "class")
    if err:
        raise NvhookError(f"invalid CDI kind {kind!r}: {err}")
    return vendor, cls


def parse_device(name: str) -> tuple[str, str, str] | None:
    """"vendor/class=name" -> (vendor, class, name); None when not a valid qualified name."""
    if not name or name[0] == "/":
        return None
    qual, sep, dev = name.partition("=")
    if not sep or not qual or not dev:
        return None
    vendor, cls = parse_qualifier(qual)
    if not vendor or vendor_or_class_error(vendor, "vendor") or vendor_or_class_error(cls, "class") \
            or device_name_error(dev):
        return None
    return vendor, cls, dev


def is_qualified(name: str) -> bool:
    return parse_device(name) is not None


# --- serialisation -----------------------------------------------------------------------

def dump(spec: dict[str, Any], fmt: str = "json") -> str:
    if fmt == "json":
        import json     # (the runtime shim's `create` imports this module: json only here)

        return json.dumps(spec, indent=2) + "\n"
    if fmt == "yaml":
        import yaml

        class NoAliases(yaml.SafeDumper):
            # devices sharing one edits object: write each out, no &id/*id (readers vary)
            def ignore_aliases(self, data: Any) -> bool:
                return True

        return yaml.dump(spec, Dumper=NoAliases, sort_keys=False, default_flow_style=False)
    raise NvhookError(f"invalid format {fmt!r} (json or yaml)")


def format_of(path: str, default: str = "json") -> str:
    ext = os.path.splitext(path)[1].lower()
    return {".json": "json", ".yaml": "yaml", ".yml": "yaml"}.get(ext, default)


def write_atomic(path: str, data: str, mode: int = 0o644, durable: bool = True) -> None:
    """Write a spec atomically (libinject.linux.atomic): a runtime scanning the spec
    dir never sees a half-written spec. durable: fsync'ed (atomic.write_at)."""
    path = os.path.abspath(path)
    d = os.path.dirname(path)
    if not os.path.isdir(d):
        raise NvhookError(f"cannot write {path}: directory {d} does not exist")
    try:
        atomic.write_atomic(path, data.encode(), mode, durable)
    except OSError as e:
        raise NvhookError(f"cannot write {path}: {e.strerror}") from None


MAX_SPEC_BYTES = 64 << 20


def load_file(path: str) -> dict[str, Any]:
    """A spec file (.json or .yaml; YAML is a superset of JSON) as a dict."""
    from libinject.linux.files import read_bounded

    return loads(read_bounded(path, MAX_SPEC_BYTES, "CDI spec") or b"", path)


def loads(data: bytes, path: str) -> dict[str, Any]:
    """A spec file's bytes (read from path: its name says JSON or YAML) as a dict."""
    if format_of(path, "yaml") == "json":
        from libinject.request.oci_state import loads_json

        obj = loads_json(data, f"CDI spec {path}")
    else:
        obj = _load_yaml(data, path)
    if not isinstance(obj, dict):
        raise NvhookError(f"CDI spec {path} is not a mapping")
    return obj


def _load_yaml(data: bytes, path: str) -> Any:
    """YAML without aliases (an alias bomb expands exponentially in whatever walks the
    result; CDI specs have no use for them) and without deep nesting."""
    import yaml

    class Loader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                raise yaml.YAMLError("aliases are not supported")
            return super().compose_node(parent, index)

    try:
        return yaml.load(data, Loader=Loader)  # noqa: S506 - a SafeLoader
    except RecursionError:
        raise NvhookError(f"CDI spec {path} is nested too deeply") from None
    except (yaml.YAMLError, UnicodeDecodeError, ValueError) as e:
        msg = str(e).replace("\n", " ")
        raise NvhookError(f"CDI spec {path} does not parse: {msg}") from None


# --- spec dirs and resolution ------------------------------------------------------------

@record
class LoadedSpec:
    path: str
    priority: int                               # index of its dir; later dirs win
    spec: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.spec.get("kind", ""))


@record
class Registry:
    """Devices from the spec dirs, as the CDI cache resolves them (pkg/cdi/cache.go):
    a later dir overrides an earlier one; the same device twice in one dir is a
    conflict and the device is dropped."""
    specs: list[LoadedSpec] = field(default_factory=list)
    devices: dict[str, tuple[LoadedSpec, dict[str, Any]]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def resolve(self, names: Sequence[str]) -> tuple[list[dict[str, Any]], list[str]]:
        """The containerEdits to apply for qualified names, in the cache's order (each
        spec's edits before its first device's), and the unresolvable names."""
        out: list[dict[str, Any]] = []
        missing: list[str] = []
        used: set[int] = set()
        for name in dict.fromkeys(names):
            hit = self.devices.get(name)
            if hit is None:
                missing.append(name)
                continue
            spec, dev = hit
            if id(spec) not in used:
                used.add(id(spec))
                if spec.spec.get("containerEdits"):
                    out.append(spec.spec["containerEdits"])
            out.append(dev.get("containerEdits") or {})
        return out, missing


def scan(spec_dirs: Sequence[str], *, validate: Callable[[dict, str], list[str]] | None = None) -> Registry:
    """Load every *.json / *.yaml spec in the dirs (lexical order in a dir)."""
    reg = Registry()
    conflicts: set[str] = set()
    for prio, d in enumerate(spec_dirs):
        try:
            names = sorted(os.listdir(d))
        except FileNotFoundError:
            continue
        except OSError as e:
            reg.errors.append(f"{d}: {e.strerror}")
            continue
        for n in names:
            if os.path.splitext(n)[1] not in (".json", ".yaml"):
                continue
            path = os.path.join(d, n)
            if not os.path.isfile(path):
                continue
            try:
                spec = load_file(path)
            except NvhookError as e:
                reg.errors.append(str(e))
                continue
            problems = validate(spec, path) if validate else []
            if problems:
                reg.errors.append(f"{path}: {problems[0]}")
                continue
            loaded = LoadedSpec(path, prio, spec)
            reg.specs.append(loaded)
            for dev in spec.get("devices") or ():
                qname = f"{loaded.kind}={dev.get('name')}"
                old = reg.devices.get(qname)
                if old is not None and old[0].priority == prio:
                    reg.errors.append(f"conflicting device {qname!r} (specs {old[0].path!r}, {path!r})")
                    conflicts.add(qname)
                    continue
                reg.devices[qname] = (loaded, dev)
    for q in conflicts:
        reg.devices.pop(q, None)
    return reg


def qualify(ids: Iterable[str], default_kind: str = DEFAULT_KIND) -> list[str]:
    """Device requests -> qualified CDI names: an unqualified id ("0", "all",
    "GPU-...") goes under the default kind; none/void/empty are dropped."""
    out: list[str] = []
    for i in ids:
        i = i.strip()
        if not i or i.lower() in ("none", "void"):
            continue
        out.append(i if "=" in i else f"{default_kind}={i}")
    return list(dict.fromkeys(out))
