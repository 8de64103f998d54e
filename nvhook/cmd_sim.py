"""nvhook sim: build simulated GPU hosts (and plain container rootfs dirs) for tests and demos.

    nvhook sim profiles
    nvhook sim create [--profile NAME | --profile-file FILE] DIR
    nvhook sim rootfs [--layout debian|rpm] [--vulkan] DIR
    nvhook sim enter ROOT -- CMD [ARGS...]   (CMD sees ROOT's GPUs at the host's paths)
    nvhook sim mig ROOT --gpu MINOR (--create PROFILE | --destroy GI[:CI])
"""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    sub = parser.add_subparsers(dest="sim_command", metavar="ACTION", required=True)
    sub.add_parser("profiles", help="list the built-in profiles")
    create = sub.add_parser("create", help="build a simulated GPU host (a driver root) in DIR")
    which = create.add_mutually_exclusive_group()
    which.add_argument("--profile", metavar="NAME", help="built-in profile (default a100x8)")
    which.add_argument("--profile-file", metavar="FILE", help="JSON profile file")
    create.add_argument("dir", metavar="DIR", help="where to build it (must not exist, or be empty)")
    rootfs = sub.add_parser("rootfs", help="build a busybox+glibc container rootfs in DIR")
    rootfs.add_argument("--layout", choices=("debian", "rpm"), default="debian",
                        help="library layout: debian (lib/x86_64-linux-gnu) or rpm (lib64)")
    rootfs.add_argument("--vulkan", action="store_true",
                        help="also copy this host's Vulkan loader (libvulkan.so.1) into the image")
    rootfs.add_argument("dir", metavar="DIR")
    enter = sub.add_parser("enter", help="run CMD in a private mount namespace where ROOT's driver files, "
                                         "/proc, /sys and /dev entries sit over the host's (for NVIDIA's tools)")
    enter.add_argument("root", metavar="ROOT", help="a simulated host (sim create)")
    enter.add_argument("cmd", metavar="CMD", nargs=argparse.REMAINDER, help="the command (after --)")
    mig = sub.add_parser("mig", help="create or destroy a MIG device of a simulated host's GPU in MIG mode "
                                     "(as nvidia-smi mig -cgi/-cci, -dci/-dgi)")
    mig.add_argument("root", metavar="ROOT", help="a simulated host (sim create)")
    mig.add_argument("--gpu", type=int, required=True, metavar="MINOR", help="the GPU (/dev/nvidia<MINOR>)")
    act = mig.add_mutually_exclusive_group(required=True)
    act.add_argument("--create", metavar="PROFILE", help="a MIG device of this profile (1g.10gb, 3g.40gb, ...)")
    act.add_argument("--destroy", metavar="GI[:CI]", help="the MIG device of GPU instance GI, compute instance CI (0)")


def run(args: argparse.Namespace) -> int:
    if args.sim_command == "profiles":
        from libinject.sim.profile import list_profiles, load_profile

        names = list_profiles()
        width = max(len(n) for n in names)
        for n in names:
            print(f"{n:<{width}}  {load_profile(n).summary()}")
        return 0
    if args.sim_command == "create":
        from libinject.sim.build import create_host

        path = create_host(args.dir, profile=args.profile, profile_file=args.profile_file)
        print(path)
        return 0
    if args.sim_command == "rootfs":
        from libinject.sim.rootfs import build_rootfs

        print(build_rootfs(args.dir, lib_layout=args.layout, vulkan=args.vulkan))
        return 0
    if args.sim_command == "enter":
        from libinject.sim.enter import enter

        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        return enter(args.root, cmd)
    if args.sim_command == "mig":
        from libinject.errors import NvhookError
        from libinject.sim.mig import change

        destroy = None
        if args.destroy is not None:
            gi, _, ci = args.destroy.partition(":")
            if not (gi.isdigit() and (ci or "0").isdigit()):
                raise NvhookError(f"sim mig: --destroy {args.destroy!r}: expected GI or GI:CI")
            destroy = (int(gi), int(ci or "0"))
        dev = change(args.root, args.gpu, create=args.create, destroy=destroy)
        print(f"{'created' if args.create else 'destroyed'} gi {dev.gi} ci {dev.ci} {dev.name} {dev.uuid}")
        return 0
    return 2
