"""nvhook cdi generate | refresh | list | validate.

generate: discover the driver once, plan every GPU / MIG device (and "all") with the
same planner as the hook, and write the CDI spec (libinject.apply.cdi); atomically to
--output, or to stdout. --mode picks what the spec holds, as nvidia-ctk's modes: gpu
(nvidia.com/gpu), imex (nvidia.com/imex-channel) and mig-caps (nvidia.com/mig-caps);
several modes write several files (the first --output, the others with ".<class>" before
its extension, as nvidia-ctk names the specs it splits off).
refresh: the same spec, written to --output (default /var/run/cdi/nvidia.yaml) only
when its bytes change; --watch keeps it current as the driver and its GPUs change
(kernel uevents, and a fingerprint check every --interval s: libinject.apply.cdi_refresh).
list: the qualified device names the spec dirs offer, resolved as the CDI cache does
(later dir wins; the same device twice in one dir is a conflict: reported, dropped).
validate: the official schema plus what it misses (libinject.apply.cdi_validate).
"""
from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    from libinject.apply.cdi_refresh import (DEFAULT_DEBOUNCE, DEFAULT_INTERVAL, DEFAULT_MIG_INTERVAL,
                                             DEFAULT_OUTPUT)

    p.description = "Generate, refresh, list and validate CDI specs."
    sub = p.add_subparsers(dest="cdi_command", metavar="SUBCOMMAND", required=True)
    g = sub.add_parser(
        "generate", help="write a CDI spec for this host's GPUs",
        description="Write a CDI spec for this host: with --mode gpu (the default) a device per "
                    "GPU and MIG device under each naming strategy, plus 'all'; --mode imex a "
                    "device per IMEX channel (nvidia.com/imex-channel=<N>), plus 'all'; --mode "
                    "mig-caps the MIG capability devices nvidia.com/mig-caps=config and =monitor, "
                    "plus 'all'. Each device is planned as the hook plans that request.")
    g.add_argument("--output", "-o", default="",
                   help="spec file to write (default: stdout); with several modes, the first "
                        "mode's, and each other mode's is this name with '.<class>' before "
                        "the extension (nvidia.yaml -> nvidia.imex-channel.yaml)")
    _spec_arguments(g)
    g.add_argument("--mode", action="append", default=[], metavar="MODE[,MODE]",
                   help="what to generate (repeat or comma list): gpu (GPUs and MIG devices; "
                        "alias nvml), imex (IMEX channels), mig-caps (MIG config/monitor "
                        "capabilities); default gpu")
    r = sub.add_parser(
        "refresh", help="rewrite the CDI spec if the driver or GPUs changed (--watch: keep it current)",
        description="Generate the CDI spec (as `cdi generate`) and write it atomically to "
                    "--output only if its content changed (else the file, mtime included, is "
                    "left alone); prints 'updated FILE' or 'unchanged FILE'. Discovery's "
                    "snapshot is re-warmed on the way. --watch: go on, and refresh whenever the "
                    "discovery fingerprint changes: checked shortly after kernel uevents for "
                    "nvidia modules, PCI/DRM devices and nvidia* device nodes (netlink, "
                    "pyroute2: the nvhook[refresh] extra), and every --interval seconds "
                    "regardless (changes without a uevent: /dev nodes made by nvidia-modprobe, "
                    "simulated hosts). SIGTERM stops it.")
    r.add_argument("--output", "-o", default=DEFAULT_OUTPUT,
                   help=f"spec file to keep current (default {DEFAULT_OUTPUT})")
    _spec_arguments(r)
    r.add_argument("--mode", action="append", default=[], metavar="MODE",
                   help="what the spec holds: gpu (default), imex or mig-caps (one mode: "
                        "one file to keep current)")
    r.add_argument("--watch", action="store_true",
                   help="keep running: refresh when uevents or the periodic check show a change")
    r.add_argument("--interval", type=float, default=DEFAULT_INTERVAL, metavar="SECONDS",
                   help=f"--watch: check the discovery fingerprint this often even without a "
                        f"uevent (default {DEFAULT_INTERVAL:g})")
    r.add_argument("--debounce", type=float, default=DEFAULT_DEBOUNCE, metavar="SECONDS",
                   help=f"--watch: after a burst of uevents, wait this long for quiet "
                        f"(default {DEFAULT_DEBOUNCE:g})")
    r.add_argument("--mig-interval", type=float, default=DEFAULT_MIG_INTERVAL, metavar="SECONDS",
                   help=f"--watch: on a MIG-capable host, check this often (MIG instances made or "
                        f"destroyed send no uevent; default {DEFAULT_MIG_INTERVAL:g})")
    r.add_argument("--no-uevents", action="store_true",
                   help="--watch: do not listen to uevents (periodic checks only)")
    l_ = sub.add_parser("list", help="list the CDI devices in the spec dirs")
    l_.add_argument("--spec-dir", action="append", default=[],
                    help="spec dir (repeatable; later wins; default /etc/cdi /var/run/cdi)")
    v = sub.add_parser("validate", help="validate CDI spec files")
    v.add_argument("files", nargs="+", metavar="FILE")
    v.add_argument("--quiet", "-q", action="store_true", help="print only problems")


def _spec_arguments(g: argparse.ArgumentParser) -> None:
    """What the spec contains: shared by generate and refresh."""
    g.add_argument("--format", choices=("json", "yaml"), default=None,
                   help="output format (default: from --output's extension, else json)")
    g.add_argument("--vendor", default="nvidia.com", help="CDI vendor (default nvidia.com)")
    g.add_argument("--class", dest="cls", default=None,
                   help="CDI class (default: gpu; imex-channel with --mode imex; mig-caps with "
                        "--mode mig-caps); one mode only")
    g.add_argument("--device-name-strategy", action="append", default=[],
                   help="index, uuid, type-index (repeat or comma list; default index,uuid)")
    g.add_argument("--driver-root", default=None,
                   help="driver root (default: --root, else the config's, else /)")
    g.add_argument("--dev-root", default=None, help="where dev/ and proc/ are read (default: driver root)")
    g.add_argument("--capabilities", default=None,
                   help="driver capabilities to include (as NVIDIA_DRIVER_CAPABILITIES; default "
                        "all but compat32, as nvidia-ctk: 'all' adds the 32-bit libraries)")
    g.add_argument("--lib-dir", default=None,
                   help="container library dir (default /usr/lib/x86_64-linux-gnu)")
    g.add_argument("--hook-path", default=None,
                   help="nvhook executable the spec's hooks run (default: this one)")
    g.add_argument("--no-mask-procfs", action="store_true",
                   help="leave /proc/driver/nvidia unmasked")
    g.add_argument("--hook-stage", choices=("createRuntime", "createContainer"), default="createRuntime",
                   help="the stage of the spec's hook (default createRuntime: run in the runtime's "
                        "namespaces, where `nvhook serve` takes it; createContainer: for engines "
                        "that run createRuntime hooks elsewhere, never served)")
    g.add_argument("--hook-socket", default=None, metavar="PATH",
                   help="the hook service's socket the spec's hook tries ('none': never; default: "
                        "the config's [nvhook] socket)")
    g.add_argument("--device-id", "--device-ids", dest="device_id", action="append", default=[],
                   metavar="IDS",
                   help="gpu mode: the devices to generate (repeat or comma list): all (default), "
                        "GPU/MIG indexes, UUIDs or PCI bus ids, and 'none', the driver-only "
                        "device nvidia.com/gpu=none (driver libraries, binaries and control "
                        "nodes, no GPU); 'none' alone also leaves out 'all', as nvidia-ctk")
    g.add_argument("--no-all-device", action="store_true",
                   help="do not generate the 'all' device")


def run(args: argparse.Namespace) -> int:
    return {"generate": _generate, "refresh": _refresh, "list": _list,
            "validate": _validate}[args.cdi_command](args)


def _modes(args: argparse.Namespace) -> list[str]:
    """--mode's modes, in order (default gpu)."""
    from libinject.apply import cdi
    from libinject.errors import NvhookError

    modes = [cdi.mode_of(m) for v in args.mode for m in v.split(",") if m.strip()] or ["gpu"]
    if len(set(modes)) != len(modes):
        raise NvhookError(f"invalid mode {','.join(modes)}: a mode given twice")
    return modes


def _spec_maker(args: argparse.Namespace):
    """(discovery options, [(file infix, render(driver) -> spec text)] one per mode) from
    the command line and the config; every option is checked here, before anything is
    discovered."""
    from libinject import config
    from libinject.apply import cdi
    from libinject.constants import ALL_CAPABILITIES
    from libinject.errors import NvhookError
    from libinject.record import replace

    cfg = config.load(args.config)
    options = cfg.discover_options(root=args.driver_root or args.root, ldcache=args.ldcache,
                                   user=args.user)
    if args.dev_root:
        options = replace(options, dev_root=args.dev_root)
    strategies = [s.strip() for v in (args.device_name_strategy or ["index,uuid"])
                  for s in v.split(",") if s.strip()]
    cdi.check_strategies(strategies)
    caps = ({c.strip() for c in args.capabilities.split(",") if c.strip()}
            if args.capabilities is not None else set(cdi.DEFAULT_CAPABILITIES))
    bad = caps - {"all", *ALL_CAPABILITIES}
    if bad:
        raise NvhookError(f"unknown capability {','.join(sorted(bad))} "
                          f"(allowed: all,{','.join(ALL_CAPABILITIES)})")
    modes = _modes(args)
    if args.cls is not None and len(modes) > 1:
        raise NvhookError("--class names one spec's class: give one --mode with it")
    device_ids = cdi.check_device_ids(args.device_id or ["all"])
    if args.device_id and "gpu" not in modes:
        raise NvhookError("--device-id selects GPU devices: it needs --mode gpu")
    classes = {m: args.cls or cdi.MODES[m] for m in modes}
    for m in modes:
        cdi.check_kind(f"{args.vendor}/{classes[m]}")
    fmt = args.format or (cdi.format_of(args.output) if args.output else "json")
    hook = cdi.HookOptions(path=args.hook_path or cdi.default_hook_path(),
                           ldconfig=cfg.cli.ldconfig or "@/sbin/ldconfig",
                           config=args.config or "", stage=args.hook_stage,
                           socket=cdi.hook_socket(cfg, args.hook_socket))
    cdi.check_hook_options(hook)

    def renderer(mode: str):
        def render(driver) -> str:
            spec = cdi.generate(driver, vendor=args.vendor, cls=classes[mode], strategies=strategies,
                                capabilities=caps, hook=hook, lib_dir=args.lib_dir,
                                mask_procfs=not args.no_mask_procfs, mode=mode,
                                devices=device_ids, all_device=not args.no_all_device)
            return cdi.dump(spec, fmt)
        return render

    return options, [("" if i == 0 else f".{classes[m]}", renderer(m)) for i, m in enumerate(modes)]


def output_name(path: str, infix: str) -> str:
    """path with infix before its extension (nvidia-ctk's generatedSpecs.updateFilename)."""
    import os

    if not infix:
        return path
    ext = os.path.splitext(os.path.basename(path))[1]
    return path[:len(path) - len(ext)] + infix + ext


def _generate(args: argparse.Namespace) -> int:
    from libinject.apply import cdi
    from libinject.errors import NvhookError

    options, renders = _spec_maker(args)
    if len(renders) > 1 and not args.output:
        raise NvhookError("several modes write several specs: give --output")
    driver = options.discover()
    texts = [(output_name(args.output, infix), render(driver)) for infix, render in renders]
    if not args.output:
        sys.stdout.write(texts[0][1])
        return 0
    for path, text in texts:        # every spec rendered before any is written
        cdi.write_atomic(path, text)
    return 0


def _refresh(args: argparse.Namespace) -> int:
    import os

    from libinject.apply import cdi_refresh
    from libinject.errors import NvhookError

    if not args.output:
        raise NvhookError("--output must name a file")
    if args.watch:
        cdi_refresh.check_timing(args.interval, args.debounce, args.mig_interval)
    options, renders = _spec_maker(args)
    if len(renders) > 1:
        raise NvhookError("refresh keeps one spec current: give one --mode")
    render = renders[0][1]
    if args.output == cdi_refresh.DEFAULT_OUTPUT:
        try:    # the runtimes' spec dir, as nvidia-cdi-refresh makes it
            os.makedirs(os.path.dirname(args.output), mode=0o755, exist_ok=True)
        except OSError:
            pass    # check_output says why
    output = cdi_refresh.check_output(args.output)

    def say(line: str) -> None:
        print(line, flush=True)

    from libinject import config

    path, _required = config.config_path(args.config, None)
    seen = [_config_stamp(path)]

    def reload():
        # The config as edited since (its fixed, root-owned path: what the unit runs with),
        # checked like the first: a bad edit is reported, the previous one kept
        now = _config_stamp(path)
        if now == seen[0]:
            return None
        seen[0] = now
        options, renders = _spec_maker(args)
        return options, renders[0][1]

    refresher = cdi_refresh.Refresher(output, options, render, reload=reload)
    if not args.watch:
        say(f"{'updated' if refresher.refresh() else 'unchanged'} {output}")
        return 0
    return cdi_refresh.watch(refresher, interval=args.interval, debounce=args.debounce,
                             uevents=not args.no_uevents, say=say, mig_interval=args.mig_interval)


def _config_stamp(path: str) -> tuple | None:
    """What changes when the config file is edited or replaced (None: there is none)."""
    import os

    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _list(args: argparse.Namespace) -> int:
    from libinject.apply import cdi
    from libinject.apply import cdi_validate

    dirs = args.spec_dir or list(cdi.DEFAULT_SPEC_DIRS)
    reg = cdi.scan(dirs, validate=lambda spec, path: cdi_validate.validate(spec))
    for name in sorted(reg.devices):
        print(name)
    from libinject.errors import report

    for e in reg.errors:
        report(e)
    return 1 if reg.errors else 0


def _validate(args: argparse.Namespace) -> int:
    from libinject.apply import cdi_validate

    bad = 0
    for path in args.files:
        problems = cdi_validate.validate_file(path)
        if problems:
            bad += 1
            for p in problems:
                print(f"{path}: {p}")
        elif not args.quiet:
            print(f"{path}: ok")
    return 1 if bad else 0
