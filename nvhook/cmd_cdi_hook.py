"""nvhook cdi-hook createRuntime | createContainer (every step a spec's edits need, in one
call) and, for specs written before, create-symlinks | update-ldcache | mask-procfs.

What each does: libinject.runtime.cdi_hooks. This module only describes their flags for
argparse; cdi_hooks.parse_argv takes the usual spelling without it (the CLI and the hook
service both use that one first).
"""
from __future__ import annotations

import argparse


def _links(p: argparse.ArgumentParser) -> None:
    p.add_argument("--link", action="append", default=[], metavar="TARGET::LINK",
                   help="make LINK (a container path) a symlink to TARGET")


def _ldcache(p: argparse.ArgumentParser) -> None:
    p.add_argument("--folder", action="append", default=[], metavar="DIR",
                   help="a container folder to add to the loader's search path")
    p.add_argument("--ldconfig", default="@/sbin/ldconfig",
                   help="ldconfig to run: @PATH = host path (default @/sbin/ldconfig)")


def _procfs(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--procfs-dir", required=required, default="",
                   help="the host's /proc/driver/nvidia: mask the container's to its GPUs")
    p.add_argument("--mig-minors", default="",
                   help="the host's nvidia-caps mig-minors file (default: beside --procfs-dir)")


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.description = ("The hook CDI specs call (container state on stdin): `cdi-hook STAGE` does "
                     "every step in one call, at the stage its hook entry names.")
    sub = p.add_subparsers(dest="hook", metavar="HOOK", required=True)
    stages = []
    for stage, where in (("createRuntime", "in the runtime's namespaces (the hook service can take it)"),
                         ("createContainer", "in the container's mount namespace")):
        q = sub.add_parser(stage, help=f"mask /proc/driver/nvidia, make symlinks, update the ld "
                                       f"cache: as a {stage} hook, {where}")
        _procfs(q, False)
        _links(q)
        _ldcache(q)
        q.add_argument("--library", action="append", default=[], metavar="HOST::CONTAINER",
                       help="a library the spec mounts into a --folder (its host file is read "
                            "for the ld cache)")
        q.add_argument("--cuda-compat-driver-major", default="", metavar="N",
                       help="the driver's major version: the image's CUDA forward-compat libcuda "
                            "(/usr/local/cuda/compat) goes first in its ld cache where newer")
        stages.append(q)
    s = sub.add_parser("create-symlinks", help="(older specs) create symlinks in the container")
    _links(s)
    u = sub.add_parser("update-ldcache", help="(older specs) update the container's ld cache")
    _ldcache(u)
    m = sub.add_parser("mask-procfs", help="(older specs) mask /proc/driver/nvidia to the container's GPUs")
    _procfs(m, True)
    for q in (s, u, m, *stages):
        q.add_argument("--rootfs", default="",
                       help="the container rootfs (older hooks only; default: from the state on stdin)")


def run(args: argparse.Namespace) -> int:
    from libinject.runtime import cdi_hooks

    return cdi_hooks.run(args)
