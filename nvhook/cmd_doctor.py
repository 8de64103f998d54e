"""`nvhook doctor [--json]`: is this node set up to give containers GPUs through this
install? One line per check (OK / WARN / FAIL, with what to do); exit 1 on any FAIL."""
from __future__ import annotations

import argparse
import os
import sys


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    from libinject.setup.doctor import Paths

    d = Paths()
    p.description = __doc__.splitlines()[0].split(": ", 1)[1]
    p.add_argument("--json", action="store_true", help="the checks as JSON")
    p.add_argument("--docker-config", metavar="FILE", default=d.docker_config)
    p.add_argument("--containerd-config", metavar="FILE", default=d.containerd_config)
    p.add_argument("--docker-socket", metavar="SOCK", default=d.docker_socket,
                   help="where a running dockerd answers (default %(default)s)")
    p.add_argument("--containerd-socket", metavar="SOCK", default=d.containerd_socket,
                   help="where a running containerd answers (default %(default)s)")
    p.add_argument("--crio-drop-in", metavar="FILE", default=d.crio_drop_in)
    p.add_argument("--hooks-dir", metavar="DIR", default=d.hooks_dir)
    p.add_argument("--cdi-spec", metavar="FILE", action="append",
                   help=f"a CDI spec to check (repeatable; default {', '.join(d.cdi_specs)})")


def run(args: argparse.Namespace) -> int:
    from libinject.errors import NvhookError
    from libinject.setup import doctor

    if os.geteuid() != 0:
        raise NvhookError("doctor needs root (it asks NVML, reads the engines' files and the "
                          "service's socket as the hook does): run it as root")
    paths = doctor.Paths(docker_config=args.docker_config, containerd_config=args.containerd_config,
                         docker_socket=args.docker_socket, containerd_socket=args.containerd_socket,
                         crio_drop_in=args.crio_drop_in, hooks_dir=args.hooks_dir,
                         cdi_specs=tuple(args.cdi_spec) if args.cdi_spec else doctor.Paths().cdi_specs)
    checks = doctor.run(paths, config=args.config, root=args.root, ldcache=args.ldcache)
    sys.stdout.write(doctor.as_json(checks) if args.json else doctor.render(checks))
    return 1 if any(c.status == doctor.FAIL for c in checks) else 0
