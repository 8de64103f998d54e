"""nvhook configure: nvidia-container-cli configure's replacement.

flags -> Request (libinject.request.cli_flags) -> libinject.pipeline.configure (discover,
plan, apply live; the same pipeline as the hook). Discovery takes --root/--ldcache/--user
over config.toml's settings (--config, else the default path), as every command does.
Heavy imports stay inside run().
"""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.description = ("Configure a container with GPU support by exposing device drivers to it. "
                     "Enters the mount namespace of PID (or uses the caller's without --pid).")
    p.add_argument("--pid", "-p", metavar="PID", help="container PID")
    p.add_argument("--device", "-d", metavar="ID", action="append",
                   help="device UUID(s), index(es), PCI bus id(s) or MIG ids to isolate (repeatable, comma list)")
    p.add_argument("--require", "-r", metavar="EXPR", action="append", help="check container requirements (repeatable)")
    p.add_argument("--ldconfig", "-l", metavar="PATH", help="ldconfig to run (@PATH = a host path; default @/sbin/ldconfig)")
    p.add_argument("--compute", "-c", action="store_true", help="enable compute capability")
    p.add_argument("--utility", "-u", action="store_true", help="enable utility capability")
    p.add_argument("--video", "-v", action="store_true", help="enable video capability")
    p.add_argument("--graphics", "-g", action="store_true", help="enable graphics capability")
    p.add_argument("--display", "-D", action="store_true", help="enable display capability")
    p.add_argument("--ngx", "-n", action="store_true", help="enable ngx capability")
    p.add_argument("--compat32", action="store_true", help="enable 32bits compatibility")
    p.add_argument("--mig-config", metavar="ID", action="append", help="enable configuration of MIG devices")
    p.add_argument("--mig-monitor", metavar="ID", action="append", help="enable monitoring of MIG devices")
    p.add_argument("--imex-channel", metavar="ID", action="append", help="IMEX channel(s) to inject")
    p.add_argument("--no-cgroups", action="store_true", help="don't use cgroup enforcement")
    p.add_argument("--no-devbind", action="store_true", help="don't bind mount devices")
    p.add_argument("--no-persistenced", action="store_true", help="don't include the persistenced socket")
    p.add_argument("--no-fabricmanager", action="store_true", help="don't include the fabricmanager socket")
    p.add_argument("--no-gsp-firmware", action="store_true", help="don't include GSP firmware")
    p.add_argument("--cuda-compat-mode", metavar="MODE", choices=("mount", "ldconfig", "disabled"),
                   default="ldconfig", help="CUDA forward compat: mount, ldconfig (default) or disabled")
    p.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    p.add_argument("--json", action="store_true", help="print the edits as JSON")
    p.add_argument("rootfs", metavar="ROOTFS", help="container rootfs (absolute path)")


def run(args: argparse.Namespace) -> int:
    import os

    from libinject import config
    from libinject.errors import NvhookError
    from libinject.request import cli_flags

    rootfs = cli_flags.check_rootfs(args.rootfs)
    pid = cli_flags.check_pid(args.pid)
    request = cli_flags.build(args)
    if not os.path.isdir(rootfs):
        raise NvhookError(f"invalid rootfs directory: {rootfs}")
    try:    # the host's root by another name ("/tmp/link-to-root", "/tmp/x/.." with x -> /)
        is_root = os.path.samefile(rootfs, "/")
    except OSError:
        is_root = False     # gone since: the applier reports it
    if is_root:
        raise NvhookError("input error: invalid rootfs directory")
    cfg = config.load(args.config)
    options = cfg.discover_options(root=args.root, ldcache=args.ldcache, user=args.user)

    from libinject.log import Log
    from libinject.pipeline import configure

    log = Log(os.path.abspath(args.debug), level="debug", prefix="configure: ") if args.debug else None
    edits = configure(request, rootfs, pid=pid, options=options, dry_run=args.dry_run,
                      log=log.info if log else None, in_process=True,
                      load_kmods=bool(getattr(args, "load_kmods", False)))
    if args.json:
        import json

        print(json.dumps(edits.to_dict(), indent=2))
    elif args.dry_run:
        from libinject.plan.planner import describe

        print(describe(edits))
    return 0
