"""The runtime shim (nvidia-container-runtime's job): edit config.json on `create`,
then exec the real low-level runtime with the arguments unchanged.

Every command but `create` goes straight to the runtime (exec, no parsing beyond
finding the command). On `create`, the bundle's config.json (--bundle/-b, default
the cwd) is rewritten atomically (temp file in the bundle + rename) according to the
mode in config.toml ([nvidia-container-runtime] mode):
- legacy: add our OCI prestart hook once (the compiled front .venv/bin/nvhook-hook
  when installed, else `nvhook prestart`); it does the work at container start.
- cdi: the devices the spec asks for, read as the hook reads them
  (libinject.request.oci_spec: volume mounts when accepted, `cdi.k8s.io/*` annotations
  (modes.cdi.annotation-prefixes), the swarm-resource variables or NVIDIA_VISIBLE_DEVICES,
  the unprivileged-envvar policy, legacy CUDA_VERSION images); unqualified ids ("0", "all", "GPU-..") name
  devices of modes.cdi.default-kind; the edits of those devices and of their specs
  (modes.cdi.spec-dirs) are applied as podman would (libinject.apply.spec), device
  cgroup rules included. An unknown device fails the create, changing nothing.
- csv: the files listed in modes.csv.mount-spec-path (libinject.plan.csv), for
  containers that ask for GPUs; /proc/driver/nvidia masked as in cdi mode when the
  driver root has one (NVIDIA's csv mode does not).
- auto: cdi when every requested device is a qualified CDI name, else legacy.
Decisions are logged to runc's --log in its --log-format (json|text); debug lines
only with --debug.
"""
from __future__ import annotations

import os
import sys

from libinject import jsonc
from libinject.constants import SAFE_PATH
from libinject.errors import NvhookError
from libinject.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Sequence

# runc/crun global options that take a value (the command is the first non-option).
_GLOBAL_VALUED = {"--log", "--log-format", "--root", "--criu", "--rootless", "--cgroup-manager"}
_CREATE_VALUED = {"--bundle", "-b", "--console-socket", "--pid-file", "--preserve-fds"}
MODES = ("legacy", "cdi", "csv", "auto")
LEGACY_HOOK_NAMES = ("nvhook-hook", "nvidia-container-runtime-hook")


@record
class RuncArgs:
    argv: list[str]
    command: str | None = None
    bundle: str = ""
    log: str = ""
    log_format: str = "text"
    debug: bool = False
    container_id: str = ""


def _flag(a: str) -> tuple[str, str | None]:
    """"--log=x" -> ("--log", "x"); "-log" (Go flag style) -> "--log"."""
    name, eq, val = a.partition("=")
    if name.startswith("-") and not name.startswith("--") and len(name) > 2:
        name = "-" + name
    return name, (val if eq else None)


def parse_args(argv: Sequence[str]) -> RuncArgs:
    out = RuncArgs(list(argv))
    i = 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("-"):
            out.command = a
            i += 1
            break
        name, val = _flag(a)
        if name in _GLOBAL_VALUED:
            if val is None:
                i += 1
                val = argv[i] if i < len(argv) else ""
            if name == "--log":
                out.log = val
            elif name == "--log-format":
                out.log_format = val
        elif name == "--debug":
            out.debug = True
        i += 1
    if out.command == "create":
        while i < len(argv):
            a = argv[i]
            name, val = _flag(a)
            if a == "--":
                if i + 1 < len(argv):
                    out.container_id = argv[i + 1]
                break
            if name in _CREATE_VALUED:
                if val is None:
                    i += 1
                    val = argv[i] if i < len(argv) else ""
                if name in ("--bundle", "-b"):
                    out.bundle = val
            elif not a.startswith("-") and not out.container_id:
                out.container_id = a
            i += 1
    return out


def Log(path: str, fmt: str = "text", debug: bool = False, extra: str = ""):
    """Our lines in runc's log file, in runc's format (containerd reads it), and in
    [nvidia-container-runtime] debug."""
    from libinject.log import Log as _Log

    return _Log(path, extra, level="debug" if debug else "info",
                fmt="json" if fmt == "json" else "text", prefix="nvhook-runtime: ")


def _which(name: str, path: str) -> str | None:
    """shutil.which(name, path=path) (an executable file, not a directory), without
    importing shutil (~2 ms of every `create`)."""
    for d in path.split(os.pathsep):
        cand = os.path.join(d, name)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def find_runtime(runtimes: Sequence[str], path: str | None = None, also: Sequence[str] = ()) -> str:
    """The first of `runtimes` that exists (an absolute path, or a name looked up in the
    absolute entries of PATH: `path`, else our environment's), never ourselves: not the
    compiled front beside our interpreter nor one on PATH, nor any of `also` (the front
    that asked `nvhook serve`), by inode (a symlink or hard link to it would exec us in
    a loop)."""
    raw = path if path is not None else os.environ.get("PATH") or SAFE_PATH
    me = set()
    for p in (sys.argv[0], os.path.join(os.path.dirname(sys.executable), "nvhook-runtime"),
              _which("nvhook-runtime", raw) or "", *also):
        try:
            st = os.stat(p)
            me.add((st.st_dev, st.st_ino))
        except (OSError, ValueError):
            pass
    search = os.pathsep.join(d for d in raw.split(os.pathsep) if d.startswith("/"))
    for r in runtimes:
        cand = (r if r.startswith("/") else None) if "/" in r else _which(r, search)
        if not cand or not os.access(cand, os.X_OK):
            continue
        try:
            st = os.stat(cand)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) not in me:
            return cand
    raise NvhookError(f"no low-level runtime found (tried {', '.join(runtimes)})")


# --- modes ------------------------------------------------------------------------------

def requested_devices(spec: dict[str, Any], cfg, say=None) -> tuple[list[str], str]:
    """(device requests, where from), by the hook's own reading of the spec
    (libinject.request.oci_spec.requested_devices): the same sources, precedence and
    policy. "none" asks for no device here (our CDI specs have no driver-only device)."""
    from libinject.request.oci_spec import requested_devices as asked

    found = asked(spec, cfg, say)
    if found is None:
        return [], "none"
    ids, source = found
    if source != "annotations" and ids == ("none",):
        return [], source
    return list(ids), source


def resolve_mode(mode: str, devices: Sequence[str]) -> str:
    from libinject.apply import cdi

    if mode not in MODES:
        raise NvhookError(f"invalid [nvidia-container-runtime] mode {mode!r} "
                          f"(one of {', '.join(MODES)})")
    if mode != "auto":
        return mode
    if devices and all(cdi.is_qualified(d) for d in devices):
        return "cdi"
    return "legacy"


def legacy_hook(config: str = "", socket: str = "") -> dict[str, Any]:
    """The prestart hook entry: the compiled front (it starts Python isolated), told the
    shim's own config file and the service's socket, where not the defaults, by
    argument (a hook never reads its environment)."""
    from libinject.apply.cdi import default_hook_path

    args = (["nvhook-hook"] + (["--config", config] if config else [])
            + (["--socket", socket] if socket else []) + ["prestart"])
    return {"path": default_hook_path(), "args": args, "env": [f"PATH={SAFE_PATH}"]}


def add_legacy_hook(spec: dict[str, Any], log: Log, config: str = "", socket: str = "") -> bool:
    hook = legacy_hook(config, socket)
    hooks = spec.setdefault("hooks", {}).setdefault("prestart", [])
    for h in hooks:
        p = str(h.get("path", ""))
        if p == hook["path"] or os.path.basename(p) in LEGACY_HOOK_NAMES:
            log.info(f"legacy: prestart hook {p} already present")
            return False
    hooks.append(hook)
    log.info(f"legacy: added prestart hook {hook['path']}")
    return True


def apply_cdi_mode(spec: dict[str, Any], devices: Sequence[str], cfg, log: Log) -> bool:
    from libinject.apply import cdi, cdi_validate, spec as apply_spec

    names = cdi.qualify(devices, cfg.runtime.modes.cdi.default_kind)
    dirs = list(cfg.runtime.modes.cdi.spec_dirs)
    reg = cdi.scan(dirs, validate=lambda s, p: cdi_validate.semantic_errors(s))
    for e in reg.errors:
        log.debug(f"cdi: {e}")
    edits, missing = reg.resolve(names)
    if missing:
        raise NvhookError(f"unresolvable CDI devices {', '.join(missing)}")
    apply_spec.apply_cdi(spec, edits)
    log.info(f"cdi: applied {', '.join(names)} from {', '.join(dirs)}")
    return True


def apply_csv_mode(spec: dict[str, Any], devices: Sequence[str], cfg, log: Log) -> bool:
    from libinject.apply import cdi, spec as apply_spec
    from libinject.plan import csv as csv_mode

    spec_dir = cfg.runtime.modes.csv.mount_spec_path
    root = cfg.cli.root or "/"
    edits = csv_mode.edits(csv_mode.read_dir(spec_dir), root)
    # /proc/driver/nvidia masked to the container's devices as in the other modes
    # (NVIDIA's csv mode leaves it alone), when the driver root has one.
    procfs_dir = os.path.join(root, "proc/driver/nvidia")
    hook = cdi.HookOptions(path=cdi.default_hook_path(),
                           ldconfig=cfg.cli.ldconfig or "@/sbin/ldconfig",
                           config=_explicit_config(cfg), socket=cdi.hook_socket(cfg),
                           procfs_dir=procfs_dir if os.path.isdir(procfs_dir) else "")
    apply_spec.apply_cdi(spec, [cdi.to_cdi(edits, hook, procfs=bool(hook.procfs_dir))])
    log.info(f"csv: {len(edits.device_nodes)} devices, {len(edits.mounts)} mounts, "
             f"{len(edits.symlinks)} symlinks from {spec_dir}")
    return True


def _explicit_config(cfg) -> str:
    """The shim's config file, for hooks to be given by --config: "" when it is the
    default one (or none), which the hook reads by itself."""
    from libinject.config import config_path

    default, _ = config_path(None, {})
    return os.path.abspath(cfg.source) if cfg.source and cfg.source != default else ""


def modify(spec: dict[str, Any], cfg, log: Log) -> bool:
    """Edit spec for the configured mode; True if it changed."""
    devices, source = requested_devices(spec, cfg, log.debug)
    mode = resolve_mode(cfg.runtime.mode, devices)
    log.debug(f"mode {cfg.runtime.mode} -> {mode}; devices {devices or 'none'} from {source}")
    if mode == "legacy":
        from libinject.apply.cdi import hook_socket

        return add_legacy_hook(spec, log, _explicit_config(cfg), hook_socket(cfg))
    if not devices:
        log.info(f"{mode}: no devices requested")
        return False
    return (apply_cdi_mode if mode == "cdi" else apply_csv_mode)(spec, devices, cfg, log)


# --- the create rewrite -----------------------------------------------------------------

def rewrite_bundle(bundle: str, cfg, log: Log) -> bool:
    from libinject.apply import cdi
    from libinject.request import oci_state

    bundle = os.path.abspath(bundle or ".")
    spec = oci_state.load_config(bundle)
    if not modify(spec, cfg, log):
        return False
    path = os.path.join(bundle, "config.json")
    try:
        mode = os.stat(path).st_mode & 0o7777
    except OSError:
        mode = 0o644
    # Not fsync'ed (durable=False: two fsyncs cost ~4-9 ms on a disk): the runtime we
    # exec reads it a moment later, and after a crash the container is gone anyway.
    cdi.write_atomic(path, jsonc.dumps(spec, compact=True), mode, durable=False)
    log.debug(f"rewrote {path}")
    return True


def prepare(argv: Sequence[str], config: tuple[str, bool], path: str | None = None,
            also: Sequence[str] = ()) -> str:
    """All the shim does but the exec: the runtime to exec (find_runtime(path, also)),
    and on `create` the bundle rewritten for config = (path, required) as
    libinject.config.config_path finds it. The exec'd shim (main) and `nvhook serve`
    for the shim's front (libinject.runtime.serve.shim) both run this: one code path."""
    from libinject import config as _config

    args = parse_args(argv)
    cfg = _config.load_at(*config)
    log = Log(args.log, args.log_format, args.debug or cfg.runtime.log_level == "debug",
              extra=cfg.runtime.debug)
    from libinject.runtime.serve import fallback

    fallback.note(log, args.command or "runtime")     # (the exec'd shim only)
    runtime = find_runtime(cfg.runtime.runtimes, path, also)
    if args.command == "create":
        try:
            rewrite_bundle(args.bundle, cfg, log)
        except NvhookError as e:
            log.error(str(e))
            raise
    log.debug(f"exec {runtime} {' '.join(argv)}")
    return runtime


def main(argv: Sequence[str]) -> int:
    """`nvhook runtime ARGS` / nvhook-runtime: never returns on success (exec)."""
    from libinject.config import config_path

    runtime = prepare(argv, config_path(None, os.environ))
    if parse_args(argv).command is None and ("--version" in argv or "-v" in argv):
        # As NVIDIA's shim: ours first, then the runtime's own (the exec prints it)
        from libinject import __version__

        sys.stdout.write(f"nvhook-runtime version {__version__}\n\n")
        sys.stdout.flush()
    os.execv(runtime, [runtime, *argv])
    return 127  # not reached
