"""The OCI hook: one container's whole job, for the exec'd hook and the hook service.

  state (stdin) -> <bundle>/config.json -> Request (libinject.request.oci_spec, pure)
        -> libinject.pipeline.configure (discover, plan, apply live) with the container pid.

The runtime runs `nvhook [global options] STAGE` (normally through csrc/hookfront.c, which
skips Python for containers that cannot want a GPU); `nvhook serve` workers call handle()
with what the front handed them. Isolation (CVE-2025-23266): runc runs a createContainer
hook whose entry has no env with the *container's* environment, so no setting is ever
taken from the environment here: the config is --config from the hook entry, else the
fixed default path, and must be root-owned (libinject.config.load(trusted=True)). The
front starts `python -I` with an explicit environment; the cwd is left for "/" before
anything else and every child gets an explicit env. The container's env is data read
from config.json.

A container that wants no GPU exits 0 having imported libinject.jsonc, the state/request modules
and the config reader only. Errors: one line on stderr ("nvhook: ..."), exit 1, so the
runtime's create fails with it.

Rootless engines (podman or Docker run by a user) run the runtime, and so this hook, in a
user namespace. The device cgroup cannot be set there: it needs CAP_SYS_ADMIN (v1
devices.allow) or CAP_BPF (v2 device programs) in the initial user namespace, and the
engine has no cgroup of its own to delegate on a v1 host. So a GPU container is refused
there with one line that points to CDI (which podman applies itself, rootless too) and to
NVIDIA's rootless set-up, `no-cgroups = true`: with it the hook does the rest (mounts,
nodes bound from the host, procfs mask, ld cache) as NVIDIA's legacy hook does, with no
device cgroup. A container that wants no GPU (a CDI spec from `nvhook cdi generate` sets
NVIDIA_VISIBLE_DEVICES=void) exits 0. The config is read there too: host root shows as
the overflow uid, which counts as root for the file and its directories (the hook holds
no more than the rootless user's own rights there: a config can make it do nothing that
user could not).
"""
from __future__ import annotations

import os
import sys

from libinject.constants import CONFIGURE_STAGES, HOOK_STAGES

# Global options that take a value (nvhook's CLI shares this list). --socket is the
# compiled front's (which hook service to use); Python takes it and ignores it.
GLOBAL_VALUED = ("--root", "--ldcache", "--user", "--debug", "--config", "--socket")
CDI_HOOK = "cdi-hook"       # the command CDI specs' hook entries run


class HookArgs:
    """A hook call's global options and stage, shaped as argparse's Namespace (the CLI
    passes one of those instead). Not types.SimpleNamespace: importing types is ~0.4 ms."""

    def __init__(self, **kw: object) -> None:
        self.__dict__.update(kw)


def parse_argv(argv: list[str]) -> HookArgs | None:
    """A hook as runtimes call it (`[--config F] [--debug F] ... STAGE`, or `[...]
    cdi-hook STAGE FLAGS...` as `cdi generate` writes it: libinject.runtime.cdi_hooks),
    parsed without argparse (building it is ~15 ms of the exec'd hook's start-up).
    Anything else (--opt=value, -h, a typo) gives None: the CLI's argparse parses and
    reports it, and the hook service declines it (the front then execs the CLI)."""
    ns = HookArgs(root=None, ldcache=None, user=None, debug=None, load_kmods=False,
                         config=None, socket=None, command=None)
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in GLOBAL_VALUED and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            setattr(ns, a[2:].replace("-", "_"), argv[i + 1])
            i += 2
        elif a == "--load-kmods":
            ns.load_kmods = True
            i += 1
        else:
            break
    rest = argv[i:]
    if len(rest) == 1 and rest[0] in HOOK_STAGES:
        ns.command = rest[0]
        return ns
    if rest[:1] == [CDI_HOOK]:
        from libinject.runtime import cdi_hooks

        ns.command = CDI_HOOK
        return cdi_hooks.parse_argv(rest[1:], ns)
    return None


def served_stage(args: HookArgs | None) -> str | None:
    """The stage a parsed hook call runs at, where the hook service can take it (the
    runtime's namespaces): "prestart", "cdi-hook createRuntime"; else None."""
    if args is None:
        return None
    if args.command == "prestart":
        return "prestart"
    if args.command == CDI_HOOK and getattr(args, "hook", None) == "createRuntime":
        return f"{CDI_HOOK} createRuntime"
    return None


# What a GPU container is told to use instead, where the hook cannot serve it.
CDI_ADVICE = ("use CDI instead: as root `nvhook cdi generate --output /etc/cdi/nvidia.yaml`, "
              "then `podman run --device nvidia.com/gpu=0 ...`")


def unprivileged(userns: bool, no_cgroups: bool = False) -> str | None:
    """Why this process cannot give a container GPUs (None: it may be able to). In a
    user namespace only with no-cgroups (NVIDIA's rootless set-up): no device cgroup."""
    if userns and not no_cgroups:
        return ("the hook runs in a user namespace (a rootless engine, or a container's own user "
                "namespace at createContainer), where no device cgroup can be set (NVIDIA's "
                "rootless set-up: no-cgroups = true in [nvidia-container-cli])")
    if os.geteuid() != 0:
        return f"the hook runs as uid {os.geteuid()}, not root"
    return None


def run(args) -> int:
    """The exec path: the state on stdin, the cwd the front reports."""
    from libinject.runtime.front import start_cwd

    cwd = start_cwd()
    os.chdir("/")
    stage = args.command
    from libinject.errors import NvhookError, report
    from libinject.request.oci_state import read_state_bytes

    if stage not in CONFIGURE_STAGES:
        try:
            read_state_bytes(sys.stdin.buffer)  # drain: a runtime writing the state must not get EPIPE
        except (NvhookError, OSError, ValueError):
            pass
        return 0
    try:
        data = read_state_bytes(sys.stdin.buffer)   # with a deadline: never a hang
    except NvhookError as e:
        report(e)
        return 1
    except (OSError, ValueError) as e:
        report(f"cannot read the container state: {e}")
        return 1
    return handle(stage, data, args, cwd=cwd)


def handle(stage: str, state: bytes, args, *, cwd: str | None, discover=None, plan=None) -> int:
    """The hook's whole job for one container, for both paths: the exec'd Python (run)
    and a `nvhook serve` worker (libinject.runtime.serve.worker). Errors: one line on stderr
    ("nvhook: ..."), exit status 1.

    state: the state JSON as read from stdin (at most MAX_STATE_BYTES + 1 bytes);
    args: the global options (parse_argv's); cwd: where the runtime started the hook
    (a relative bundle is taken from there); discover: libinject.discover.driver.discover
    or a stand-in (the service's cache); plan: libinject.plan.planner.plan or a stand-in
    (the service's)."""
    from libinject.errors import NvhookError, report

    try:
        return _handle(stage, state, args, cwd, discover, plan)
    except NvhookError as e:
        report(e)
        return 1


def _handle(stage, data, args, cwd, discover, plan) -> int:
    from libinject import config as config_mod
    from libinject.errors import NvhookError
    from libinject.linux.proc import in_user_namespace
    from libinject.log import Log
    from libinject.request import oci_state
    from libinject.request.oci_spec import request_from_spec

    for opt in ("debug", "config", "root"):     # (--ldcache is inside the driver root)
        value = getattr(args, opt, None)
        if value and not value.startswith("/"):
            # relative to what? the runtime's cwd is the bundle (or the rootfs)
            what = "log file" if opt == "debug" else opt
            raise NvhookError(f"--{opt} {value}: the hook's {what} must be an absolute path")
    log = Log(args.debug or "", level="debug")
    userns = in_user_namespace()
    try:
        # In a user namespace host root shows as the overflow uid (module doc).
        cfg = config_mod.load(args.config, {}, trusted=True, userns=userns)
        log = Log(args.debug or cfg.log_file(), level="debug" if args.debug else cfg.log_level())
        from libinject.runtime.serve import fallback

        fallback.note(log, stage)       # (the exec'd hook only: a worker's env has no such thing)
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
        why = unprivileged(userns, request.no_cgroups)
        if why:
            raise NvhookError(f"{stage}: cannot give this container GPUs: {why}; {CDI_ADVICE}")
        # The image's data comes next: what it can cost this process (the exec'd hook, or
        # a served worker: one start each) is bounded, and an OOM kill takes this start,
        # not the runtime, the service or a bystander.
        from libinject.runtime.ceiling import contain

        contain()
        return _configure(stage, state, spec, bundle, request, cfg, args, log, discover, plan,
                          userns=userns)
    except NvhookError as e:
        log.error(f"{stage}: {e}")
        raise
    except Exception as e:  # a bug or an unexpected OS error: still one line for the runtime
        import traceback

        log.error(f"{stage}: {traceback.format_exc()}")
        raise NvhookError(f"{stage} hook failed: {type(e).__name__}: {e}") from None


def _configure(stage, state, spec, bundle, request, cfg, args, log, discover=None, plan=None,
               userns: bool = False) -> int:
    from libinject.pipeline import configure
    from libinject.request import oci_state

    options = cfg.discover_options(root=args.root, ldcache=args.ldcache, user=args.user)
    if userns:
        # Rootless, no-cgroups (_handle refused anything else): where the CDI hook finds
        # the container's namespaces there, checked, with a /run of our own for the
        # journal (libinject.runtime.cdi_hooks' docstring); the apply in a worker, born
        # in the container's pid namespace at prestart. The driver is found first: the
        # NVML child must be born in our pid namespace (it checks its parent).
        from libinject.runtime import cdi_hooks

        driver = options.discover(discover, log=log.info)
        discover = lambda *a, **kw: driver  # noqa: E731
        if stage == "createContainer":
            pid = cdi_hooks.rootless_target()
        else:
            pid, _ = cdi_hooks.container_target(state, "self", where=stage)
    else:
        pid = oci_state.container_pid(state, stage)
    rootfs = oci_state.rootfs_path(spec, bundle)
    if not os.path.isdir(rootfs):
        from libinject.errors import NvhookError

        raise NvhookError(f"rootfs {rootfs} is not a directory")
    log.info(f"{stage}: configuring pid={pid} rootfs={rootfs} devices={request.devices} "
             f"capabilities={','.join(sorted(request.capabilities))}")
    configure(request, rootfs, pid=pid, options=options, log=log.info, discover_fn=discover,
              plan_fn=plan, in_process=not userns, owner=state.id,
              # a user namespace can neither modprobe nor mknod: the host's nodes are taken as they are
              load_kmods=not userns and bool(args.load_kmods or cfg.cli.load_kmods))
    log.info(f"{stage}: done")
    return 0
