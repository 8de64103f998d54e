"""`nvhook info`: the driver and GPUs of the host, as `nvidia-container-cli info` prints them."""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="output in CSV format")
    fmt.add_argument("--json", action="store_true", help="output JSON")
    parser.add_argument("--mig", action="store_true",
                        help="also the MIG devices (nvidia-container-cli info prints none; --json always has them)")


def driver_from_args(args: argparse.Namespace):
    """discover() with the global options over config.toml's (libinject.config)."""
    from libinject import config

    cfg = config.load(getattr(args, "config", None))
    return cfg.discover_options(root=getattr(args, "root", None), ldcache=getattr(args, "ldcache", None),
                                user=getattr(args, "user", None)).discover()


def render_text(info, mig: bool = False) -> str:
    row = "{:<15} {}\n"
    out = [row.format("NVRM version:", info.driver_version), row.format("CUDA version:", info.cuda_version)]
    for g in info.gpus:
        out.append("\n")
        for label, value in (("Device Index:", g.index), ("Device Minor:", g.minor), ("Model:", g.name),
                             ("Brand:", g.brand), ("GPU UUID:", g.uuid), ("Bus Location:", g.bus_id),
                             ("Architecture:", f"{g.cc[0]}.{g.cc[1]}")):
            out.append(row.format(label, value))
        # nvidia-container-cli prints no MIG devices (cli/info.c): with --mig ours follow
        # their GPU, same layout.
        for m in (g.mig_devices if mig else ()):
            out.append(row.format("MIG Device:", f"{g.index}:{m.index} {m.uuid} {m.name} (GI {m.gi}, CI {m.ci})"))
    return "".join(out)


def render_csv(info, mig: bool = False) -> str:
    out = [f"NVRM version,CUDA version\n{info.driver_version},{info.cuda_version}\n",
           "\nDevice Index,Device Minor,Model,Brand,GPU UUID,Bus Location,Architecture\n"]
    for g in info.gpus:
        out.append(f"{g.index},{g.minor},{g.name},{g.brand},{g.uuid},{g.bus_id},{g.cc[0]}.{g.cc[1]}\n")
    migs = [(g, m) for g in info.gpus for m in g.mig_devices] if mig else []
    if migs:
        out.append("\nDevice Index,MIG Index,MIG UUID,Profile,GPU Instance,Compute Instance\n")
        for g, m in migs:
            out.append(f"{g.index},{m.index},{m.uuid},{m.name},{m.gi},{m.ci}\n")
    return "".join(out)


def render_json(driver) -> str:
    import json

    from libinject.record import asdict

    info = asdict(driver.info)
    info = {"root": driver.root, **info}
    return json.dumps(info, indent=2) + "\n"


def run(args: argparse.Namespace) -> int:
    import sys

    driver = driver_from_args(args)
    if args.json:
        sys.stdout.write(render_json(driver))
    elif args.csv:
        sys.stdout.write(render_csv(driver.info, args.mig))
    else:
        sys.stdout.write(render_text(driver.info, args.mig))
    return 0
