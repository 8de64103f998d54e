"""`nvhook list`: the files and devices a container would get, as `nvidia-container-cli list`.

Text: one path per line, as seen from the driver root ("/usr/lib/...", "/dev/nvidia0"),
in nvidia-container-cli's order: driver device nodes, GPU nodes, MIG access files and
nodes, IMEX channels, MIG config/monitor, binaries, libraries, 32-bit libraries, IPC,
firmware; then what nvidia-container-cli does not list: with --graphics, the selected
GPUs' DRM nodes and the graphics and display files (ICD/vendor files, X modules).
--json: the same items with host paths and details.
"""
from __future__ import annotations

import argparse

MIG_CAPS = "/proc/driver/nvidia/capabilities"


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    a = parser.add_argument
    a("-d", "--device", action="append", metavar="IDS", help="device UUID(s), index(es), bus ids, MIG ids to list")
    a("-l", "--libraries", action="store_true", help="list driver libraries")
    a("-b", "--binaries", action="store_true", help="list driver binaries")
    a("-i", "--ipcs", action="store_true", help="list driver IPCs")
    a("-f", "--firmwares", action="store_true", help="list driver firmwares")
    a("-g", "--graphics", action="store_true",
      help="list graphics/display files (ICD and vendor files, X modules) and the devices' DRM nodes")
    a("--compat32", action="store_true", help="include 32-bit libraries")
    a("--mig-config", action="append", metavar="IDS", help="MIG devices to list config capabilities files for")
    a("--mig-monitor", action="append", metavar="IDS", help="MIG devices to list monitor capabilities files for")
    a("--imex-channel", action="append", metavar="IDS", help="IMEX channel id(s) to list")
    a("--no-persistenced", action="store_true", help="leave out the nvidia-persistenced socket")
    a("--no-fabricmanager", action="store_true", help="leave out the nvidia-fabricmanager socket")
    a("--no-gsp-firmware", action="store_true", help="leave out GSP firmware")
    a("--json", action="store_true", help="output JSON with host paths and details")


def _join(values: list[str] | None) -> str | None:
    return ",".join(values) if values else None


def items(driver, args: argparse.Namespace) -> list[dict]:
    """What `list` shows, in order: dicts with kind, path (inside the root), host_path.
    Devices are rendered from libinject.plan.select's Selection, the planner's own answer."""
    from libinject.discover import libraries as L
    from libinject.plan import select as S
    from libinject.plan.planner import ipc_socket
    from libinject.constants import FABRICMANAGER_SOCKET, PERSISTENCED_SOCKET

    devices, mig_config, mig_monitor = _join(args.device), _join(args.mig_config), _join(args.mig_monitor)
    imex = _join(args.imex_channel)
    libs, bins, ipcs, fw, compat32 = args.libraries, args.binaries, args.ipcs, args.firmwares, args.compat32
    graphics = args.graphics
    modifiers = (compat32, args.no_persistenced, args.no_fabricmanager, args.no_gsp_firmware)
    if not any((devices, mig_config, mig_monitor, libs, bins, ipcs, fw, graphics, *modifiers)):
        # Nothing asked for (or only IMEX channels): everything, for all devices. Any other
        # option, a modifier such as --compat32 included, lists only what it selects:
        # nothing for modifiers alone (nvidia-container-cli cli/list.c: everything only
        # when argc is 1, or 2 with --imex-channel).
        # The graphics files and DRM nodes, which nvidia-container-cli never lists, only
        # with --graphics.
        devices, libs, bins, ipcs, fw, compat32 = "all", True, True, True, True, True
    if args.no_gsp_firmware:
        fw = False

    sel = S.resolve(driver, devices, mig_config=mig_config, mig_monitor=mig_monitor)
    imex_listed = S.imex_channel_requests(driver, imex)
    caps = {n.minor: n for n in driver.cap_devices}
    minors = driver.mig_minors
    out: list[dict] = []

    def node(n, kind="device", **extra):
        out.append({"kind": kind, "path": n.container_path, "host_path": n.path, "major": n.major,
                    "minor": n.minor, "capability": n.capability, **extra})

    def cap_node(minor: int | None, **extra):
        if minor is None:
            return
        n = caps.get(minor)
        host = n.path if n else None
        out.append({"kind": "mig-device", "path": f"/dev/nvidia-caps/nvidia-cap{minor}", "host_path": host,
                    "major": n.major if n else None, "minor": minor, **extra})

    def proc(path: str, **extra):
        out.append({"kind": "mig-proc", "path": path, "host_path": driver.dev_root.rstrip("/") + path, **extra})

    if devices is not None:
        for n in driver.control_devices:
            node(n)
        nodes = {n.container_path: n for n in driver.gpu_devices}
        for g in sel.gpus:
            n = nodes.get(f"/dev/nvidia{g.minor}")
            if n:
                node(n, kind="gpu-device", gpu=g.index, uuid=g.uuid)
        for g, m in sel.mig_access:
            gi = f"{MIG_CAPS}/gpu{g.minor}/mig/gi{m.gi}"
            ci = f"{gi}/ci{m.ci}"
            who = {"gpu": g.index, "mig": m.index, "uuid": m.uuid}
            proc(f"{gi}/access", **who)
            proc(f"{ci}/access", **who)
            cap_node(m.gi_access_minor, **who)
            cap_node(m.ci_access_minor, **who)
    for channel, n in imex_listed:
        if n is not None:
            node(n, kind="imex-channel", channel=channel)
        else:   # listed as nvidia-container-cli lists it; injecting it would fail
            out.append({"kind": "imex-channel", "path": S.IMEX_CHANNEL_PATH.format(channel), "host_path": None,
                        "channel": channel})
    for what, gpus in sel.mig_caps:
        if not gpus:   # (cli/list.c: only when a visible GPU is MIG capable)
            continue
        proc(f"{MIG_CAPS}/mig/{what}", mig=what)
        cap_node(minors.get(what), mig=what)
        for g in gpus:
            # the GPU's capability dir, NV_GPU_CAPS_PATH (what nvidia-container-cli lists)
            proc(f"{MIG_CAPS}/gpu{g.minor}", mig=what, gpu=g.index)
            out.append({"kind": "mig-dir", "path": "/dev/nvidia-caps",
                        "host_path": driver.dev_root.rstrip("/") + "/dev/nvidia-caps", "mig": what})
            for key, minor in S.mig_minors_of(driver, g):
                cap_node(minor, mig=what, gpu=g.index, name=key)
    if bins:
        for b in driver.binaries:
            out.append({"kind": "binary", "path": L.inside(driver.root, b.path), "host_path": b.path,
                        "capability": b.capability})
    if libs:
        for want32 in (False, True):
            if want32 and not compat32:
                continue
            for lib in driver.libraries:
                if lib.compat32 == want32:
                    out.append({"kind": "library", "path": L.inside(driver.root, lib.path), "host_path": lib.path,
                                "soname": lib.soname, "capability": lib.capability, "arch": lib.arch,
                                "extra": lib.extra})
    if ipcs:
        for f in driver.ipcs:
            sock = ipc_socket(f.container_path)
            if (args.no_persistenced and sock == PERSISTENCED_SOCKET
                    or args.no_fabricmanager and sock == FABRICMANAGER_SOCKET):
                continue
            out.append({"kind": "ipc", "path": L.inside(driver.root, f.path), "host_path": f.path,
                        "capability": f.capability})
    if fw:
        for f in driver.firmware:
            out.append({"kind": "firmware", "path": f.container_path, "host_path": f.path})
    if graphics:
        if devices is not None:
            buses = {g.bus_id: g.index for g in sel.whole_gpus}
            for d in driver.drm_devices:
                if d.bus_id in buses:
                    node(d.node, kind="drm-device", gpu=buses[d.bus_id], by_path=d.by_path or None)
        for f in driver.graphics_files:
            out.append({"kind": "graphics", "path": f.container_path, "host_path": f.path,
                        "capability": f.capability})
    return out


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from nvhook.cmd_info import driver_from_args

    driver = driver_from_args(args)
    listed = items(driver, args)
    if args.json:
        doc = {"root": driver.root, "dev_root": driver.dev_root, "driver_version": driver.info.driver_version,
               "cuda_version": driver.info.cuda_version, "library_source": driver.library_source,
               "items": listed}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write("".join(f"{i['path']}\n" for i in listed))
    return 0
