"""nvhook prestart | createContainer | poststart | poststop: the OCI hook.

The runtime runs it (normally through csrc/hookfront.c, which skips Python entirely for
containers that cannot want a GPU) with the container state on stdin:

  state -> <bundle>/config.json -> Request (libinject.request.oci_spec, pure)
        -> libinject.pipeline.configure (discover, plan, apply_live) with the container pid.

Isolation (CVE-2025-23266): the front starts `python -I` with an explicit environment;
here the cwd is left for "/" before anything else and every child gets an explicit env
(the pipeline's). The container's env is data read from config.json, never ours.

A container that wants no GPU exits 0 having imported json, the state/request modules
and the config reader only. Errors: one line on stderr ("nvhook: ..."), exit 1, so the
runtime's create fails with it.
"""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

NOOP_STAGES = ("poststart", "poststop")
LEVELS = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40}


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.description = f"OCI {name} hook: reads the container state JSON on stdin."


class HookLog:
    """One line per decision/action, appended to a file (no `logging`: start-up time).
    A log that cannot be written never fails the container."""

    def __init__(self, path: str, level: str, ident: str = "") -> None:
        self.path = "" if path in ("", "/dev/null") else path
        self.level = LEVELS.get(level.lower(), 20)
        self.ident = ident

    def _write(self, level: str, msg: str) -> None:
        if not self.path or LEVELS[level] < self.level:
            return
        import time

        t = time.time()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"
        line = f"{stamp} nvhook[{os.getpid()}] {level.upper()} {self.ident}{msg}".replace("\n", " ")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
            try:
                os.write(fd, (line + "\n").encode())
            finally:
                os.close(fd)
        except OSError:
            pass

    def debug(self, msg: str) -> None:
        self._write("debug", msg)

    def info(self, msg: str) -> None:
        self._write("info", msg)

    def error(self, msg: str) -> None:
        self._write("error", msg)


def _start_cwd() -> str | None:
    # hookfront chdirs to "/" before exec and tells us where the runtime started it.
    cwd = os.environ.get("NVHOOK_HOOK_CWD")
    if cwd:
        return cwd
    try:
        return os.getcwd()
    except OSError:
        return None


def run(args: argparse.Namespace) -> int:
    """The exec path: the state on stdin, the cwd the front reports."""
    cwd = _start_cwd()
    os.chdir("/")
    stage = args.command
    if stage in NOOP_STAGES:
        try:
            sys.stdin.buffer.read(1 << 20)  # drain: a runtime writing the state must not get EPERM
        except (OSError, ValueError):
            pass
        return 0
    from libinject.request.oci_state import MAX_STATE_BYTES

    try:
        data = sys.stdin.buffer.read(MAX_STATE_BYTES + 1)
    except (OSError, ValueError) as e:
        sys.stderr.write(f"nvhook: cannot read the container state: {e}\n")
        return 1
    return handle(stage, data, args, cwd=cwd)


def handle(stage: str, state: bytes, args: argparse.Namespace, *, cwd: str | None,
           environ: dict[str, str] | None = None, own_pid: int | None = None,
           discover=None) -> int:
    """The hook's whole job for one container, for both paths: the exec'd Python (run)
    and a `nvhook serve` worker (libinject.runtime.service). Errors: one line on stderr
    ("nvhook: ..."), exit status 1.

    state: the state JSON as read from stdin (at most MAX_STATE_BYTES + 1 bytes);
    args: the global options (config, debug); cwd: where the runtime started the hook
    (a relative bundle is taken from there); environ: where the config is looked up
    (default os.environ); own_pid: the hook process's pid as /proc counts it (the
    createContainer stage stands it in for the container; default: /proc/self);
    discover: libinject.discover.driver.discover or a stand-in (the server's cache)."""
    from libinject.errors import NvhookError

    try:
        return _handle(stage, state, args, cwd, environ, own_pid, discover)
    except NvhookError as e:
        sys.stderr.write(f"nvhook: {e}\n")
        sys.stderr.flush()
        return 1


def _handle(stage, data, args, cwd, environ, own_pid, discover) -> int:
    from libinject import config as config_mod
    from libinject.request import oci_state
    from libinject.errors import NvhookError
    from libinject.request.oci_spec import request_from_spec

    log = HookLog(args.debug or "", "debug")
    try:
        cfg = config_mod.load(args.config, environ)
        log = HookLog(args.debug or cfg.log_file(), "debug" if args.debug else cfg.log_level())
        if len(data) > oci_state.MAX_STATE_BYTES:
            raise NvhookError(f"container state on stdin is larger than {oci_state.MAX_STATE_BYTES} bytes")
        state = oci_state.parse_state(data)
        log.ident = f"{state.id[:12]}: "
        bundle = oci_state.bundle_dir(state, cwd)
        spec = oci_state.load_config(bundle)
        log.debug(f"{stage}: status={state.status} pid={state.pid} bundle={bundle} config={cfg.source or 'defaults'}")
        request = request_from_spec(spec, cfg, log.debug)
        if request is None:
            log.info(f"{stage}: not a GPU container, nothing to do")
            return 0
        return _configure(stage, state, spec, bundle, request, cfg, log, own_pid, discover)
    except NvhookError as e:
        log.error(f"{stage}: {e}")
        raise
    except Exception as e:  # a bug or an unexpected OS error: still one line for the runtime
        import traceback

        log.error(f"{stage}: {traceback.format_exc()}")
        raise NvhookError(f"{stage} hook failed: {type(e).__name__}: {e}") from None


def _configure(stage, state, spec, bundle, request, cfg, log: HookLog, own_pid=None,
               discover=None) -> int:
    from dataclasses import replace

    from libinject.request import oci_state
    from libinject.pipeline import configure

    if stage == "createContainer" and own_pid is not None:
        pid = own_pid   # served: the front's pid (it runs in the container's namespaces)
    else:
        pid = oci_state.container_pid(state, stage)
    rootfs = oci_state.rootfs_path(spec, bundle)
    if not os.path.isdir(rootfs):
        from libinject.errors import NvhookError

        raise NvhookError(f"rootfs {rootfs} is not a directory")
    user = _user(cfg.cli.user)
    if user is not None:
        request = replace(request, user=user)
    log.info(f"{stage}: configuring pid={pid} rootfs={rootfs} devices={request.devices} "
             f"capabilities={','.join(sorted(request.capabilities))}")
    configure(request, rootfs, pid=pid, root=cfg.cli.root or "/", ldcache=cfg.cli.ldcache,
              dev_root=cfg.nvhook.dev_root, nvml_timeout=cfg.nvhook.nvml_timeout,
              snapshot=cfg.nvhook.snapshot, snapshot_dir=cfg.nvhook.snapshot_dir,
              log=log.info, discover_fn=discover, in_process=True)
    log.info(f"{stage}: done")
    return 0


def _user(spec: str) -> tuple[int, int] | None:
    """[nvidia-container-cli] user: "UID[:GID]" or "name[:group]" (NVIDIA: "root:video")."""
    if not spec:
        return None
    from libinject.errors import NvhookError

    name, _, group = spec.partition(":")
    try:
        import grp
        import pwd

        if name.isdigit():
            uid = int(name)
            try:
                gid = pwd.getpwuid(uid).pw_gid
            except KeyError:
                gid = uid
        else:
            pw = pwd.getpwnam(name)
            uid, gid = pw.pw_uid, pw.pw_gid
        if group:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    except (KeyError, OverflowError):
        raise NvhookError(f"config: [nvidia-container-cli] user: unknown user or group {spec!r}") from None
    return uid, gid
