"""`nvhook system create-dev-char-symlinks`: NVIDIA's device nodes get /dev/char/MAJ:MIN
links (as `nvidia-ctk system create-dev-char-symlinks`), so that `systemctl daemon-reload`
keeps them in running containers' device cgroups (libinject.linux.devchar)."""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    sub = parser.add_subparsers(dest="system_command", metavar="SUBCOMMAND", required=True)
    p = sub.add_parser("create-dev-char-symlinks",
                       help="create /dev/char/MAJ:MIN links to NVIDIA's device nodes")
    p.add_argument("--dev-char-path", default="/dev/char", help="where the links go (default /dev/char)")
    p.add_argument("--driver-root", "--dev-root", dest="driver_root", default="/",
                   help="root whose dev/ holds the nodes and whose proc/ describes the driver (default /)")
    p.add_argument("--create-all", action="store_true",
                   help="first create the driver's missing device nodes (as load-kmods does)")
    p.add_argument("--load-kernel-modules", action="store_true",
                   help="first modprobe nvidia, nvidia-uvm, nvidia-modeset (host driver only)")
    p.add_argument("--watch", action="store_true",
                   help="keep running, linking nodes as they appear (checks every 2 s)")
    p.add_argument("--dry-run", action="store_true", help="print what would be done, change nothing")


def _once(args, say) -> None:
    from libinject.linux import devchar, devnodes

    root = args.driver_root
    if args.load_kernel_modules and not args.dry_run:
        devnodes.load_modules(root, say)
    if args.create_all:
        if args.dry_run:
            import os

            for name, major, minor, _mode in devnodes.wanted(root):
                if not os.path.lexists(os.path.join(root, "dev", name)):
                    say(f"would create {os.path.join(root, 'dev', name)} ({major}:{minor})")
        else:
            for made in devnodes.create_nodes(root):
                say(f"created {made}")
    for link, target in devchar.create_links(devchar.nodes(root), args.dev_char_path, args.dry_run):
        say(f"{'would link' if args.dry_run else 'linked'} {link} -> {target}")


def run(args: argparse.Namespace) -> int:
    import os
    import sys

    from libinject.errors import NvhookError

    if os.geteuid() != 0 and not args.dry_run:
        raise NvhookError("system create-dev-char-symlinks: needs root (try --dry-run)")
    if not os.path.isdir(args.driver_root):
        raise NvhookError(f"--driver-root {args.driver_root}: not a directory")

    def say(msg: str) -> None:
        print(msg, file=sys.stderr if msg.startswith("load-kmods:") else sys.stdout, flush=True)

    _once(args, say)
    if args.watch:
        import time

        while True:     # a stop signal ends it (KeyboardInterrupt: 130; SIGTERM: default)
            time.sleep(2)
            _once(args, say)
    return 0
