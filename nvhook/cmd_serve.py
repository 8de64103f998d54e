"""nvhook serve: the warm hook service (libinject.runtime.serve).

The compiled hook front (csrc/hookfront.c) hands GPU containers to it over a unix
socket and execs Python itself when nothing listens there, so running it is optional:
it only takes Python's start-up and imports off every GPU container's start.

    nvhook [--config FILE] serve [--socket PATH] [--no-warm] [--timeout S] [-v]

Socket: --socket, else [nvhook] socket (default /run/nvhook/hook.sock); the front
connects to its hook entry's `--socket`, else the same default. Each request reads its
own config (the hook entry's --config, else the default path), as the exec'd hook
would; this command's config gives the socket, the timeout and what to warm. Discovery
is warmed before the socket appears, so no front waits on a service still starting.
Runs in the foreground (systemd: `nvhook setup service` installs
libinject/setup/units/nvhook-serve.service); SIGTERM stops it after the requests in flight. One line
per event on stderr. Under systemd (Type=notify, $NOTIFY_SOCKET: the front passes it on
for this command only) it says READY=1 once warm and listening, STOPPING=1 on SIGTERM.
"""
from __future__ import annotations

import argparse
import os
import sys

from libinject.constants import SERVE_SOCKET


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.description = ("Serve the OCI hook from a warm process: the compiled hook front hands "
                     "GPU containers to it and falls back to running Python when it is not there.")
    p.add_argument("--socket", help="unix socket to listen on (default: [nvhook] socket, "
                                    f"{SERVE_SOCKET})")
    p.add_argument("--timeout", type=float, help="seconds one request may take before its "
                                                  "worker is killed (default: [nvhook] serve-timeout, 60)")
    p.add_argument("--no-warm", action="store_true",
                   help="do not discover the driver at start (the first container does)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="log what each request asks for (argv, cwd, env names)")


def run(args: argparse.Namespace) -> int:
    os.chdir("/")
    os.umask(0o077)
    _std_fds_open()
    from libinject import config as config_mod
    from libinject.errors import NvhookError
    from libinject.runtime.sdnotify import Notifier
    from libinject.runtime.serve.server import Server

    cfg = config_mod.load(args.config)
    path = args.socket or cfg.nvhook.socket
    timeout = args.timeout if args.timeout is not None else cfg.nvhook.serve_timeout
    if not path or not os.path.isabs(path):
        raise NvhookError(f"socket path must be absolute: {path!r}")
    if args.timeout is not None:    # the config's serve-timeout was checked when parsed
        timeout = config_mod.check_seconds(args.timeout, "--timeout")
    if os.geteuid() != 0:
        raise NvhookError("nvhook serve must run as root (the hook does)")
    notify = Notifier.from_environ()     # out of the environment: children never see it
    server = Server(path, timeout=timeout, log_fd=os.dup(2), verbose=args.verbose, notify=notify)
    notify.log = server.log
    if notify.why():
        server.log(f"warning: {notify.why()}")
    if not sys.flags.isolated:
        server.log("warning: not running isolated (python -I); start it as `nvhook-hook serve`, "
                   "which execs python -I with a clean environment")
    warm = None
    if not args.no_warm and cfg.nvhook.snapshot:   # snapshot = false: nothing is kept anyway
        warm = cfg.discover_options(root=args.root, ldcache=args.ldcache, user=args.user)
    server.start(warm)
    server.serve_forever()
    return 0


def _std_fds_open() -> None:
    # Received fds must never land on 0-2 (a worker dup2()s its output memfd there).
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            nul = os.open("/dev/null", os.O_RDWR)
            if nul != fd:
                os.dup2(nul, fd)
                os.close(nul)
