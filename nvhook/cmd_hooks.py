"""nvhook hooks print|install: the hooks.d configs for CRI-O and podman."""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.description = ("Print or install an OCI hooks.d config (1.0.0) that runs nvhook as the "
                     "prestart hook of every container (default) or of annotated ones only.")
    p.add_argument("action", choices=("print", "install"))
    p.add_argument("--dir", default=None,
                   help="hooks directory (install; default /usr/share/containers/oci/hooks.d)")
    p.add_argument("--hook-path", metavar="P", help="hook executable (default: nvhook-hook next to this python)")
    p.add_argument("--annotation", action="store_true",
                   help="run only for containers with a cdi.k8s.io/* annotation naming nvidia.com/gpu devices")
    p.add_argument("--hook-config", metavar="FILE", help="config.toml the hook reads (default: its own lookup)")
    p.add_argument("--socket", metavar="P", dest="hook_socket",
                   help="the hook service's socket the hook tries (nvhook serve --socket P; default: its own)")


def run(args: argparse.Namespace) -> int:
    from libinject.runtime import hooksd as hookinstall

    variant = "annotation" if args.annotation else "always"
    config = args.hook_config or args.config   # `nvhook --config X hooks ...`: the hook reads X
    socket = args.hook_socket or args.socket   # likewise `nvhook --socket P hooks ...`
    if args.action == "print":
        path = args.hook_path or hookinstall.default_hook_path()
        print(hookinstall.dumps(hookinstall.render(variant, path, config, socket)), end="")
        return 0
    target = hookinstall.install(args.dir or hookinstall.DEFAULT_DIR, variant, args.hook_path, config,
                                 socket)
    print(target)
    return 0
