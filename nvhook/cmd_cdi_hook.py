"""nvhook cdi-hook create-symlinks | update-ldcache | mask-procfs: hooks CDI specs call.

What each does: libinject.runtime.cdi_hooks. This module only parses their flags.
"""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.description = "Hooks run by CDI specs (createContainer stage; container state on stdin)."
    sub = p.add_subparsers(dest="hook", metavar="HOOK", required=True)
    s = sub.add_parser("create-symlinks", help="create symlinks in the container")
    s.add_argument("--link", action="append", default=[], metavar="TARGET::LINK",
                   help="make LINK (a container path) a symlink to TARGET")
    u = sub.add_parser("update-ldcache", help="update the container's ld cache")
    u.add_argument("--folder", action="append", default=[], metavar="DIR",
                   help="a container folder to add to the loader's search path")
    u.add_argument("--ldconfig", default="@/sbin/ldconfig",
                   help="ldconfig to run: @PATH = host path (default @/sbin/ldconfig)")
    m = sub.add_parser("mask-procfs", help="mask /proc/driver/nvidia to the container's GPUs")
    m.add_argument("--procfs-dir", required=True, help="the host's /proc/driver/nvidia")
    m.add_argument("--mig-minors", default="",
                   help="the host's nvidia-caps mig-minors file (default: beside --procfs-dir)")
    for q in (s, u, m):
        q.add_argument("--rootfs", default="",
                       help="the container rootfs (default: from the state on stdin)")


def run(args: argparse.Namespace) -> int:
    from libinject.runtime import cdi_hooks

    return cdi_hooks.run(args)
