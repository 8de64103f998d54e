"""nvhook setup TARGET: put nvhook in place on this node, one target at a time.

    nvhook [--config FILE] setup service [--unit-dir DIR] [--dry-run] [--undo] [--no-start]
    nvhook setup docker [--config FILE] [--hook-dir DIR] [--set-as-default] [--cdi] [--dry-run] [--undo]
    nvhook setup containerd [--config FILE] [--set-as-default] [--cdi] [--dry-run] [--undo]
    nvhook setup crio [--config FILE] [--set-as-default] [--dry-run] [--undo]
    nvhook [--config C] [--root R] setup podman [--config FILE] [--dry-run] [--undo]
    nvhook [--config C] [--root R] setup auto [--dry-run] [--json] [--undo] [--containerd-config FILE] ...

The work is libinject.setup's (one module per target, the shared install / backup /
undo / diff mechanics in libinject.setup.install); this module is argparse and output.
A target's --config is the engine's file (its standard path by default); the global
--config before `setup` is nvhook's own config.toml (passed on to the unit, and to
the hooks of podman's CDI spec). Every target takes --backup-dir DIR: where what was
there before is kept (libinject.setup.store; default /var/lib/nvhook/setup). Errors:
one `nvhook:` line, non-zero, nothing changed.
"""
from __future__ import annotations

import argparse
import sys

# Where systemd is, and the systemctl the service target runs (tests point these elsewhere).
SYSTEMD_RUNNING = "/run/systemd/system"
SYSTEMD_UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system",
                     "/usr/lib/systemd/system", "/lib/systemd/system")
SYSTEMCTL: str | None = None    # None: `systemctl` on SAFE_PATH
SYSTEMCTL_TIMEOUT = 60.0


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.description = "Put nvhook in place on this node: one subcommand per target."
    sub = p.add_subparsers(dest="target", metavar="TARGET", required=True)
    for target, (helptext, add, _) in TARGETS.items():
        add(sub.add_parser(target, help=helptext, description=helptext))


def run(args: argparse.Namespace) -> int:
    import os

    from libinject.errors import NvhookError

    # Every target but the pod's question reads root's files and keeps sealed backups in
    # a root-only store: said once, up front, rather than a "Permission denied" on the way.
    if os.geteuid() != 0 and args.target != "k8s-removed":
        raise NvhookError(f"setup {args.target} needs root (it edits the engines' files and keeps "
                          "their backups in a root-only store), --dry-run too: run it as root; nothing changed")
    text = TARGETS[args.target][2](args)
    # --json: stdout is the JSON object alone (a script parses it); no advice line after it
    if args.target in HOOK_TARGETS and not (args.undo or args.dry_run or getattr(args, "json", False)):
        text += _service_status(args)
    sys.stdout.write(text)
    return getattr(args, "exit_code", 0)


# The targets whose GPU containers go through the hook, which the service makes fast.
HOOK_TARGETS = ("docker", "containerd", "crio", "auto")


def _service_status(args: argparse.Namespace) -> str:
    """Whether GPU containers will be served: a line for the user, after the set-up."""
    from libinject import config as _config
    from libinject.errors import NvhookError
    from libinject.runtime.serve.listen import serving

    try:
        sock = _config.load(args.config).nvhook.socket
    except NvhookError:
        return ""
    if serving(sock):
        return f"the hook service answers on {sock}: GPU containers are served\n"
    return (f"the hook service is not running ({sock}): GPU containers take the exec'd hook, "
            "about twice as slow; `nvhook setup service` installs and starts it\n")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true",
                   help="show the change as a unified diff and change nothing")
    p.add_argument("--undo", action="store_true",
                   help="put back what was there before the first run")
    p.add_argument("--backup-dir", metavar="DIR",
                   help="where what was there before the first run is kept, sealed (default "
                        "/var/lib/nvhook/setup; must be root's alone)")


def _engine_file(p: argparse.ArgumentParser, default: str, what: str) -> None:
    p.add_argument("--config", dest="engine_config", metavar="FILE", default=default,
                   help=f"{what} (default {default})")


# -- service: the systemd unit of `nvhook serve` -------------------------------------------

def _service_arguments(p: argparse.ArgumentParser) -> None:
    from libinject.setup.service import UNIT_DIR

    _common(p)
    p.add_argument("--unit-dir", metavar="DIR", default=UNIT_DIR,
                   help=f"where the unit goes (default {UNIT_DIR})")
    p.add_argument("--no-start", action="store_true",
                   help="write (or undo) the unit and reload systemd, but do not enable, "
                        "start, stop or restart the service")
    p.add_argument("--cdi-refresh", action="store_true",
                   help="also nvhook-cdi-refresh.service (`nvhook cdi refresh --watch`: keeps "
                        "/var/run/cdi/nvidia.yaml current)")


def _systemctl(argv: list[str], timeout: float) -> str:
    from libinject.setup.service import systemctl

    return systemctl(argv, timeout, exe=SYSTEMCTL)


def _service(args: argparse.Namespace) -> str:
    from libinject.setup import service

    systemd = service.Systemd(running=SYSTEMD_RUNNING, unit_dirs=tuple(SYSTEMD_UNIT_DIRS),
                              systemctl=lambda argv, timeout: _systemctl(argv, timeout),
                              reload_timeout=SYSTEMCTL_TIMEOUT)
    units = [service.UNIT] + ([service.REFRESH_UNIT] if args.cdi_refresh else [])
    return "".join(service.setup(args.unit_dir, config=args.config, dry_run=args.dry_run, undo=args.undo,
                                 no_start=args.no_start, systemd=systemd, backup_dir=args.backup_dir,
                                 unit=unit) for unit in units)


# -- the engines -----------------------------------------------------------------------------

def _docker_arguments(p: argparse.ArgumentParser) -> None:
    from libinject.setup.docker import DAEMON_JSON, HOOK_DIR, HOOK_NAME

    _common(p)
    _engine_file(p, DAEMON_JSON, "dockerd's daemon.json")
    p.add_argument("--hook-dir", metavar="DIR", default=HOOK_DIR,
                   help=f"where {HOOK_NAME} (for `docker run --gpus`) is linked to nvhook's "
                        f"hook (default {HOOK_DIR}; must be on dockerd's PATH)")
    p.add_argument("--set-as-default", action="store_true",
                   help="make nvidia dockerd's default runtime")
    p.add_argument("--cdi", action="store_true", help="turn on Docker's CDI feature (features.cdi)")


def _docker(args: argparse.Namespace) -> str:
    from libinject.setup import docker

    return docker.setup(args.engine_config, hook_dir=args.hook_dir, set_as_default=args.set_as_default,
                        cdi=args.cdi, dry_run=args.dry_run, undo=args.undo, backup_dir=args.backup_dir)


def _containerd_arguments(p: argparse.ArgumentParser) -> None:
    from libinject.setup.containerd import CONFIG

    _common(p)
    _engine_file(p, CONFIG, "containerd's config.toml (version 2 or 3)")
    p.add_argument("--set-as-default", action="store_true",
                   help="make nvidia the CRI plugin's default runtime (default_runtime_name)")
    p.add_argument("--cdi", action="store_true",
                   help="turn on the CRI plugin's CDI support (enable_cdi, cdi_spec_dirs)")


def _containerd(args: argparse.Namespace) -> str:
    from libinject.setup import containerd

    return containerd.setup(args.engine_config, set_as_default=args.set_as_default, cdi=args.cdi,
                            dry_run=args.dry_run, undo=args.undo, backup_dir=args.backup_dir)


def _crio_arguments(p: argparse.ArgumentParser) -> None:
    from libinject.setup.crio import DROP_IN

    _common(p)
    _engine_file(p, DROP_IN, "the CRI-O drop-in to write")
    p.add_argument("--set-as-default", action="store_true",
                   help="make nvidia CRI-O's default runtime (default_runtime)")


def _crio(args: argparse.Namespace) -> str:
    from libinject.setup import crio

    return crio.setup(args.engine_config, set_as_default=args.set_as_default, dry_run=args.dry_run,
                      undo=args.undo, backup_dir=args.backup_dir, nvhook_config=args.config)


def _podman_arguments(p: argparse.ArgumentParser) -> None:
    from libinject.setup.podman import SPEC

    _common(p)
    _engine_file(p, SPEC, "the CDI spec to write (.json for JSON, else YAML)")


def _podman(args: argparse.Namespace) -> str:
    from libinject.setup import podman

    return podman.setup(args.engine_config, nvhook_config=args.config, root=args.root,
                        ldcache=args.ldcache, user=args.user, dry_run=args.dry_run, undo=args.undo,
                        backup_dir=args.backup_dir)


def _auto_arguments(p: argparse.ArgumentParser) -> None:
    from libinject.apply.cdi_refresh import DEFAULT_OUTPUT
    from libinject.setup import containerd, crio, docker
    from libinject.setup.auto import HOOKS_DIR

    _common(p)
    p.add_argument("--json", action="store_true",
                   help="print what was found and decided (and the changes) as JSON")
    p.add_argument("--containerd-config", metavar="FILE", default=containerd.CONFIG,
                   help=f"containerd's config.toml (default {containerd.CONFIG})")
    p.add_argument("--containerd-bin", metavar="PATH", help="containerd (default: on PATH)")
    p.add_argument("--crio-drop-in", metavar="FILE", default=crio.DROP_IN,
                   help=f"the CRI-O drop-in to write (default {crio.DROP_IN})")
    p.add_argument("--crio-config", metavar="FILE",
                   help="crio.conf that `crio config` reads (default: CRI-O's own)")
    p.add_argument("--crio-bin", metavar="PATH", help="crio (default: on PATH)")
    p.add_argument("--hooks-dir", metavar="DIR", default=HOOKS_DIR,
                   help=f"CRI-O's hooks.d, for CRI-O without CDI (default {HOOKS_DIR})")
    p.add_argument("--docker-config", metavar="FILE", default=docker.DAEMON_JSON,
                   help=f"dockerd's daemon.json (default {docker.DAEMON_JSON})")
    p.add_argument("--hook-dir", "--docker-hook-dir", dest="docker_hook_dir", metavar="DIR",
                   default=docker.HOOK_DIR,
                   help=f"where `docker run --gpus`'s hook is linked, as `setup docker --hook-dir` "
                        f"(default {docker.HOOK_DIR}; must be on dockerd's PATH)")
    p.add_argument("--dockerd-bin", metavar="PATH", help="dockerd (default: on PATH)")
    p.add_argument("--docker-bin", metavar="PATH", help="docker, for `docker info` (default: on PATH)")
    p.add_argument("--restart-engines", action="store_true",
                   help="make each engine whose config changed take it through the host's systemd "
                        "(containerd, CRI-O: systemctl restart; dockerd: systemctl reload, SIGHUP), and "
                        "say so; an engine whose restart failed is tried again by the next run")
    p.add_argument("--cdi-spec", metavar="FILE", default=DEFAULT_OUTPUT,
                   help=f"the CDI spec to write when an engine will apply CDI (default {DEFAULT_OUTPUT}, "
                        "the one `nvhook cdi refresh` keeps current)")


def _auto(args: argparse.Namespace) -> str:
    from libinject.setup import auto

    paths = auto.Paths(containerd_config=args.containerd_config, containerd_bin=args.containerd_bin,
                       crio_drop_in=args.crio_drop_in, crio_config=args.crio_config,
                       crio_bin=args.crio_bin, docker_config=args.docker_config,
                       docker_hook_dir=args.docker_hook_dir, dockerd_bin=args.dockerd_bin,
                       docker_bin=args.docker_bin, hooks_dir=args.hooks_dir, cdi_spec=args.cdi_spec,
                       backup_dir=args.backup_dir)
    import os

    from libinject.errors import NvhookError

    restart = (auto.Restarter(lambda argv, timeout: _systemctl(argv, timeout), os.path.isdir(SYSTEMD_RUNNING))
               if args.restart_engines else None)
    text = auto.setup(paths, config=args.config, root=args.root, ldcache=args.ldcache, user=args.user,
                      dry_run=args.dry_run, undo_=args.undo, as_json=args.json, restart=restart)
    if restart is not None and restart.failed:
        # The files are written (and said so); the engine that did not restart is the error.
        sys.stdout.write(text)
        raise NvhookError("; ".join(restart.failed))
    return text


# -- k8s-removed: the DaemonSet pod's preStop question ---------------------------------------

KEEP = 3    # k8s-removed's exit status for "the set-up stays" (1 is an error: it stays too)


def _k8s_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--daemonset", metavar="NAMESPACE/NAME", required=True,
                   help="nvhook's DaemonSet (the pod's own)")
    p.add_argument("--node", metavar="NAME", required=True, help="this node (the pod's spec.nodeName)")
    p.add_argument("--api-server", metavar="URL",
                   help="the API server (default https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)")
    p.add_argument("--token-file", metavar="FILE", help="bearer token (default: the pod's service-account token)")
    p.add_argument("--ca-file", metavar="FILE", help="the API server's CA (default: the service account's ca.crt)")


def _k8s(args: argparse.Namespace) -> str:
    from libinject.setup import k8s

    undo, why = k8s.removed(args.daemonset, args.node, server=args.api_server, token_file=args.token_file,
                            ca_file=args.ca_file)
    args.exit_code = 0 if undo else KEEP
    return f"{'undo the set-up' if undo else 'keep the set-up'}: {why}\n"


# target -> (help, add its arguments, run it: the text to show)
TARGETS = {
    "service": ("install the systemd unit that runs `nvhook serve` (the warm hook service) "
                "and start it", _service_arguments, _service),
    "docker": ("add the nvidia runtime (nvhook's shim) to dockerd's daemon.json and link "
               "the hook `docker run --gpus` runs", _docker_arguments, _docker),
    "containerd": ("add the nvidia runtime (nvhook's shim) to containerd's CRI plugin",
                   _containerd_arguments, _containerd),
    "crio": ("add the nvidia runtime handler (nvhook's shim) to CRI-O with a drop-in",
             _crio_arguments, _crio),
    "podman": ("write the CDI spec podman (and CRI-O, containerd, Docker with CDI on) "
               "applies; no runtime change", _podman_arguments, _podman),
    "auto": ("detect the engines here and their CDI support, then set each up to match "
             "(native CDI, or nvhook's runtime in cdi mode, or the hooks.d hook); not the "
             "systemd unit", _auto_arguments, _auto),
    "k8s-removed": ("exit 0 when nvhook's DaemonSet is gone or no longer selects this node (undo "
                    "the set-up), 3 when a new pod will follow (an update, eviction: keep it); "
                    "asks the API server", _k8s_arguments, _k8s),
}
