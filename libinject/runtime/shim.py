"""The runtime shim (nvidia-container-runtime's job): edit config.json on `create`,
then exec the real low-level runtime with the arguments unchanged.

Every command but `create` goes straight to the runtime (exec, no parsing beyond
finding the command). On `create`, the bundle's config.json (--bundle/-b, default
the cwd) is rewritten atomically (temp file in the bundle + rename) according to the
mode in config.toml ([nvidia-container-runtime] mode):
- legacy: add our OCI prestart hook once (the compiled front .venv/bin/nvhook-hook
  when installed, else `nvhook prestart`); it does the work at container start.
- cdi: devices requested by `cdi.k8s.io/*` annotations (modes.cdi.annotation-prefixes)
  or else by NVIDIA_VISIBLE_DEVICES; unqualified ids ("0", "all", "GPU-..") name
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

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

from libinject.errors import NvhookError

# runc/crun global options that take a value (the command is the first non-option).
_GLOBAL_VALUED = {"--log", "--log-format", "--root", "--criu", "--rootless", "--cgroup-manager"}
_CREATE_VALUED = {"--bundle", "-b", "--console-socket", "--pid-file", "--preserve-fds"}
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MODES = ("legacy", "cdi", "csv", "auto")
LEGACY_HOOK_NAMES = ("nvhook-hook", "nvidia-container-runtime-hook")


@dataclass
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


class Log:
    """Our lines in runc's log file, in runc's format (containerd reads it)."""

    def __init__(self, path: str, fmt: str = "text", debug: bool = False, extra: str = ""):
        self.paths = [p for p in (path, extra) if p and p != "/dev/null"]
        self.json = fmt == "json"
        self.debug_on = debug

    def _write(self, level: str, msg: str) -> None:
        t = time.time()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1e6) % 1000000:06d}Z"
        msg = f"nvhook-runtime: {msg}"
        if self.json:
            line = json.dumps({"level": level, "msg": msg, "time": stamp})
        else:
            line = f"time={json.dumps(stamp)} level={level} msg={json.dumps(msg)}"
        for p in self.paths:
            try:
                fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
                try:
                    os.write(fd, (line + "\n").encode())
                finally:
                    os.close(fd)
            except OSError:
                pass   # a log we cannot write never fails the container

    def info(self, msg: str) -> None:
        self._write("info", msg)

    def debug(self, msg: str) -> None:
        if self.debug_on:
            self._write("debug", msg)

    def error(self, msg: str) -> None:
        self._write("error", msg)


def find_runtime(runtimes: Sequence[str], path: str | None = None) -> str:
    """The first of `runtimes` that exists (a path, or a name looked up in PATH),
    never ourselves."""
    me = {os.path.realpath(p) for p in (sys.argv[0], shutil.which("nvhook-runtime") or "") if p}
    search = path if path is not None else os.environ.get("PATH") or DEFAULT_PATH
    for r in runtimes:
        cand = r if "/" in r else shutil.which(r, path=search)
        if cand and os.access(cand, os.X_OK) and os.path.realpath(cand) not in me:
            return cand
    raise NvhookError(f"no low-level runtime found (tried {', '.join(runtimes)})")


# --- modes ------------------------------------------------------------------------------

def container_env(spec: dict[str, Any]) -> dict[str, str]:
    from libinject.request.oci_spec import container_env as env

    return env(spec)


def requested_devices(spec: dict[str, Any], cfg) -> tuple[list[str], str]:
    """(device requests, where from): CDI annotations win over NVIDIA_VISIBLE_DEVICES."""
    cdi_cfg = cfg.runtime.modes.cdi
    ann = spec.get("annotations") or {}
    from_ann: list[str] = []
    for key in sorted(ann):
        if any(key.startswith(p) for p in cdi_cfg.annotation_prefixes) and isinstance(ann[key], str):
            from_ann += [v.strip() for v in ann[key].split(",") if v.strip()]
    if from_ann:
        return from_ann, "annotations"
    value = container_env(spec).get("NVIDIA_VISIBLE_DEVICES")
    if value is None:
        return [], "env"
    devs = [v.strip() for v in value.split(",") if v.strip()]
    if any(d.lower() in ("void", "none") for d in devs) or not devs:
        return [], "env"
    return devs, "env"


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


def legacy_hook() -> dict[str, Any]:
    """The prestart hook entry: the compiled front beside our interpreter if built."""
    bindir = os.path.dirname(os.path.abspath(sys.executable))
    front = os.path.join(bindir, "nvhook-hook")
    env = [f"PATH={DEFAULT_PATH}"]
    for k in ("NVHOOK_CONFIG", "XDG_CONFIG_HOME"):
        if os.environ.get(k):
            env.append(f"{k}={os.environ[k]}")
    if os.access(front, os.X_OK):
        return {"path": front, "args": ["nvhook-hook", "prestart"], "env": env}
    from libinject.apply.cdi import default_hook_path

    return {"path": default_hook_path(), "args": ["nvhook", "prestart"], "env": env}


def add_legacy_hook(spec: dict[str, Any], log: Log) -> bool:
    hook = legacy_hook()
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
    from libinject.apply import spec as apply_spec
    from libinject.apply import cdi
    from libinject.apply import cdi_validate

    if not devices:
        log.info("cdi: no devices requested")
        return False
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
    from libinject.apply import spec as apply_spec
    from libinject.apply import cdi
    from libinject.plan import csv as csv_mode

    if not devices:
        log.info("csv: not a GPU container")
        return False
    spec_dir = cfg.runtime.modes.csv.mount_spec_path
    root = cfg.cli.root or "/"
    edits = csv_mode.edits(csv_mode.read_dir(spec_dir), root)
    # /proc/driver/nvidia masked to the container's devices as in the other modes
    # (NVIDIA's csv mode leaves it alone), when the driver root has one.
    procfs_dir = os.path.join(root, "proc/driver/nvidia")
    hook = cdi.HookOptions(path=cdi.default_hook_path(),
                           ldconfig=cfg.cli.ldconfig or "@/sbin/ldconfig",
                           env=_hook_env(),
                           procfs_dir=procfs_dir if os.path.isdir(procfs_dir) else "")
    apply_spec.apply_cdi(spec, [cdi.to_cdi(edits, hook, procfs=bool(hook.procfs_dir))])
    log.info(f"csv: {len(edits.device_nodes)} devices, {len(edits.mounts)} mounts, "
             f"{len(edits.symlinks)} symlinks from {spec_dir}")
    return True


def _hook_env() -> tuple[str, ...]:
    env = [f"PATH={DEFAULT_PATH}"]
    for k in ("NVHOOK_CONFIG", "XDG_CONFIG_HOME"):
        if os.environ.get(k):
            env.append(f"{k}={os.environ[k]}")
    return tuple(env)


def modify(spec: dict[str, Any], cfg, log: Log) -> bool:
    """Edit spec for the configured mode; True if it changed."""
    devices, source = requested_devices(spec, cfg)
    mode = resolve_mode(cfg.runtime.mode, devices)
    log.debug(f"mode {cfg.runtime.mode} -> {mode}; devices {devices or 'none'} from {source}")
    if mode == "legacy":
        return add_legacy_hook(spec, log)
    if mode == "cdi":
        return apply_cdi_mode(spec, devices, cfg, log)
    return apply_csv_mode(spec, devices, cfg, log)


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
    cdi.write_atomic(path, json.dumps(spec, indent=None, separators=(",", ":")), mode)
    log.debug(f"rewrote {path}")
    return True


def main(argv: Sequence[str]) -> int:
    """`nvhook runtime ARGS` / nvhook-runtime: never returns on success (exec)."""
    from libinject import config as _config

    args = parse_args(argv)
    cfg = _config.load(None)
    log = Log(args.log, args.log_format, args.debug or cfg.runtime.log_level == "debug",
              extra=cfg.runtime.debug)
    runtime = find_runtime(cfg.runtime.runtimes)
    if args.command == "create":
        try:
            rewrite_bundle(args.bundle, cfg, log)
        except NvhookError as e:
            log.error(str(e))
            raise
    log.debug(f"exec {runtime} {' '.join(argv)}")
    os.execv(runtime, [runtime, *argv])
    return 127  # not reached
