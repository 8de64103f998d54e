"""Command-line entry point.

Only the chosen subcommand's module is imported (the hook's start-up time is on
every container start). Each command module defines
    def add_arguments(parser: argparse.ArgumentParser, name: str) -> None
    def run(args: argparse.Namespace) -> int     (args.command is the name)
or, to take its argv unparsed (the runtime shim), RAW = True and
    def run_raw(argv: list[str]) -> int
and keeps heavy imports inside run().
"""
from __future__ import annotations

import sys

from libinject.constants import HOOK_STAGES
from libinject.runtime.hook import GLOBAL_VALUED, parse_argv

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

# name -> module; the hook stages share one module.
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("nvhook.cmd_list", "list the driver files and devices that would be injected"),
    "info": ("nvhook.cmd_info", "show the driver and GPUs of the host"),
    "configure": ("nvhook.cmd_configure", "inject GPUs into a container rootfs"),
    "prestart": ("nvhook.cmd_hook", "OCI hook stage (state JSON on stdin)"),
    "createContainer": ("nvhook.cmd_hook", "OCI hook stage (state JSON on stdin)"),
    "poststart": ("nvhook.cmd_hook", "OCI hook stage (does nothing)"),
    "poststop": ("nvhook.cmd_hook", "OCI hook stage (does nothing)"),
    "hooks": ("nvhook.cmd_hooks", "print or install the hooks.d configs for CRI-O and podman"),
    "cdi": ("nvhook.cmd_cdi", "generate, list and validate CDI specs"),
    "cdi-hook": ("nvhook.cmd_cdi_hook", "the hook CDI specs call (createRuntime: every step in one call)"),
    "runtime": ("nvhook.cmd_runtime", "runtime shim in front of runc/crun"),
    "sim": ("nvhook.cmd_sim", "build simulated GPU hosts"),
    "serve": ("nvhook.cmd_serve", "serve the OCI hook from a warm process (optional)"),
    "setup": ("nvhook.cmd_setup", "put nvhook in place on this node: the serve unit, docker, containerd, crio, podman"),
    "system": ("nvhook.cmd_system", "host tasks: create-dev-char-symlinks (keep GPUs across systemctl daemon-reload)"),
    "doctor": ("nvhook.cmd_doctor", "check this node's set-up: driver, fronts, service, engines, CDI specs, kernel"),
}

def _module(name: str):
    # __import__, not importlib: importing importlib costs the hook ~0.8 ms
    __import__(name)
    return sys.modules[name]


def _global_parser() -> argparse.ArgumentParser:
    import argparse

    p = argparse.ArgumentParser(
        prog="nvhook",
        description="GPU container toolkit: OCI hook, injection, CDI, simulated GPU hosts.",
    )
    p.add_argument("--root", help="driver root (default: from config, else /)")
    p.add_argument("--ldcache", help="ld.so.cache to read, relative to the driver root")
    p.add_argument("--user", help="UID[:GID] to run discovery as")
    p.add_argument("--debug", metavar="FILE", help="append a debug log to FILE")
    p.add_argument("--load-kmods", action="store_true", help="before a GPU start: modprobe NVIDIA's modules (host driver only) and create missing /dev/nvidia* nodes (config: load-kmods)")
    p.add_argument("--config", help="config.toml path (default: $XDG_CONFIG_HOME or /etc; "
                                    "hook stages: /etc only)")
    p.add_argument("--socket", metavar="PATH", help="hook stages: the `nvhook serve` socket the "
                                                   "compiled front tries ('none': never)")
    return p


def _find_command(argv: list[str]) -> str | None:
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in GLOBAL_VALUED:
            i += 2
            continue
        if a.startswith("-"):
            i += 1
            continue
        return a
    return None


# Commands a runtime runs as hooks, where the environment may be the container's.
HOOK_COMMANDS = (*HOOK_STAGES, "cdi-hook")


def _isolate(argv: list[str]) -> None:
    """A hook run as the Python console script (not `python -I`, so the environment
    chose its import path and more) is re-exec'd through the compiled front, which
    starts Python isolated with a clean environment; without a front, refused."""
    import os

    front = os.path.join(os.path.dirname(sys.executable), "nvhook-hook")
    if os.access(front, os.X_OK):
        os.execv(front, [front, *argv])
    from libinject.errors import NvhookError

    raise NvhookError(f"hooks must run through the isolated front {front} (make venv builds it)")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not sys.flags.isolated and argv and _find_command(argv) in HOOK_COMMANDS:
        return _run_guarded(_isolate, argv)
    # A hook stage as runtimes call it skips argparse (start-up time); anything unusual
    # goes through argparse, which parses and reports it.
    hook = parse_argv(argv) if argv and (argv[-1] in HOOK_STAGES or "cdi-hook" in argv) else None
    if hook is not None:
        return _run_guarded(_module(COMMANDS[hook.command][0]).run, hook)
    name = _find_command(argv)
    if name is None and argv in (["--version"], ["-V"]):
        from libinject import __version__

        print(f"nvhook {__version__}")
        return 0
    if name in COMMANDS:
        module = _module(COMMANDS[name][0])
        if getattr(module, "RAW", False):
            # The runtime shim takes runc's own flags (--root, --log ...) untouched, and
            # engines run it for every container: no argparse (~7 ms with its re).
            return _run_guarded(module.run_raw, argv[argv.index(name) + 1:])
    parser = _global_parser()
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    if name not in COMMANDS:
        for cmd, (_, helptext) in COMMANDS.items():
            sub.add_parser(cmd, help=helptext)
        if name is None:
            parser.print_help(sys.stderr)
            return 2
        parser.parse_args(argv)  # reports the unknown command and exits 2
        return 2
    helptext = COMMANDS[name][1]
    module.add_arguments(sub.add_parser(name, help=helptext), name)
    args = parser.parse_args(argv)
    return _run_guarded(module.run, args)


def _run_guarded(fn, arg) -> int:
    from libinject.errors import NvhookError, report

    try:
        return int(fn(arg) or 0)
    except NvhookError as e:
        report(e)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a bug: still one line, never a traceback
        report(f"internal error: {type(e).__name__}: {e}")
        return 70
