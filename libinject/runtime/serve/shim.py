"""`nvhook serve`'s side of the runtime shim's `create` (csrc/shimfront.c).

The shim's front execs the low-level runtime itself for every command but `create`; a
`create` it cannot pass on as it is (a GPU container, --debug, a config naming runtimes
or a log level) is the shim's work: the bundle's config.json rewritten for the mode
(libinject.runtime.shim), which an exec'd `nvhook runtime` pays Python's start-up for.
The front asks the service first: a worker runs libinject.runtime.shim.prepare(), the
very function the exec'd shim runs, and answers with the runtime to exec; the front
execs it with its argv unchanged (as it does for the pass-through commands).

The request (libinject.runtime.serve.protocol carries it like the hook's; one message):
  b"NVSHIM1\\0" then items, each b"<kind><value>\\0":
    a  the front's argv, one item each (argv[0] the front's name, then runc's arguments)
    c  the front's cwd (absolute): a relative --bundle, NVHOOK_CONFIG or --log is
       taken from there, as in the exec'd shim
    F  the config file the front found in its environment ($NVHOOK_CONFIG: must exist)
    f  ... or ${XDG_CONFIG_HOME:-/etc}/nvidia-container-runtime/config.toml (defaults
       if absent): libinject.config.config_path's rule, applied by the front
    p  the front's PATH (absent: unset), where the runtime is looked up
    x  the front's own path (/proc/self/exe): never the runtime (find_runtime's `also`)
    u  the front's umask, in octal (the files the shim creates: runc's log)
  with SCM_RIGHTS [its mount ns, its pid ns] (no state: the bundle is found from argv).
The reply is the hook's b"S" + int32 status + text: status 0, the text is the runtime's
absolute path, a NUL, then anything the shim wrote to stderr; else the shim's one line.

Trust: the environment these come from is the engine's (the exec'd shim reads the
same), and the service serves only uid-0 peers in its own mount and pid namespaces
(libinject.runtime.serve.peer): the cwd, paths and PATH the front names mean there what
they mean to the front, and a peer could run `nvhook runtime` itself with any of them.
What the service cannot vouch for is what it finds there: the bundle's config.json is
the container's spec, read and written by the same guarded code as the exec'd shim's
(oci_state.load_config's bounds and checks, the atomic write through an O_NOFOLLOW
directory fd). What differs from the exec'd shim is the process: the worker keeps the
capabilities the hook keeps (the file ones included), runs under the hook's memory
ceiling (libinject.runtime.ceiling), as uid and gid 0, in the cwd and umask the front
named and with PATH its environment's.
"""
from __future__ import annotations

import os

from libinject.constants import SAFE_PATH
from libinject.record import record

MAGIC = b"NVSHIM1"
NFDS = 2                        # the front's mount and pid namespaces
_ONCE = {b"c": "cwd", b"F": "config", b"f": "config", b"p": "path", b"x": "front", b"u": "umask"}


@record(frozen=True)
class ShimRequest:
    argv: tuple[str, ...]       # the front's argv: its name, then runc's arguments
    cwd: str
    config: str                 # the config file, as config_path() finds it ...
    required: bool              # ... and whether it must exist
    front: str
    umask: int
    path: str | None = None


def parse(items: list[bytes]) -> ShimRequest:
    """The items of a shim request (after MAGIC); ValueError if it is not one we serve:
    a `create` with every item once."""
    from libinject.runtime.shim import parse_args

    argv: list[str] = []
    got: dict[str, str] = {}
    required = False
    for item in items:
        kind, value = item[:1], item[1:].decode()
        if kind == b"a":
            argv.append(value)
        elif kind in _ONCE and _ONCE[kind] not in got:
            got[_ONCE[kind]] = value
            required = required or kind == b"F"
        else:
            raise ValueError("unknown or repeated item")
    if set(got) - {"path"} != {"cwd", "config", "front", "umask"}:
        raise ValueError("items missing")
    if not (got["cwd"].startswith("/") and got["front"].startswith("/") and got["config"]):
        raise ValueError("cwd and front must be absolute, config not empty")
    umask = int(got["umask"], 8)
    if not 0 <= umask <= 0o777:
        raise ValueError("umask out of range")
    if len(argv) < 2 or parse_args(argv[1:]).command != "create":
        raise ValueError("not a create")
    return ShimRequest(tuple(argv), got["cwd"], got["config"], required, got["front"], umask,
                       got.get("path"))


def enter(req: ShimRequest) -> str:
    """Put this worker where the exec'd shim would be: the front's cwd, its umask, its
    PATH. "" if done, else why not (the request is declined: the front execs the shim)."""
    try:
        os.chdir(req.cwd)
    except OSError as e:
        return f"cwd {req.cwd}: {e.strerror}"
    os.umask(req.umask)
    # (the exec'd shim's environment is the engine's: of it, the shim reads PATH, and
    # the config's location, which the front resolved)
    os.environ["PATH"] = req.path or SAFE_PATH
    return ""


def handle(req: ShimRequest) -> tuple[int, bytes]:
    """The shim's work for the request, in a worker whose stdout and stderr go back to
    the front: (status, what goes before that text in the reply: the runtime and a NUL
    when the status is 0). Errors are the exec'd shim's (nvhook.cli's): one line, 1 for
    ours, 70 for a bug."""
    from libinject.errors import NvhookError, report
    from libinject.runtime import shim

    try:
        runtime = shim.prepare(req.argv[1:], (req.config, req.required), req.path or SAFE_PATH,
                               (req.front,))
    except NvhookError as e:
        report(e)
        return 1, b""
    except Exception as e:  # noqa: BLE001 - a bug: still one line
        report(f"internal error: {type(e).__name__}: {e}")
        return 70, b""
    return 0, os.fsencode(runtime) + b"\0"
