"""The OCI state a runtime gives a hook on stdin, and the bundle it points at.

Runtimes differ (tests/test_oci_state.py has each variant): runc says ociVersion "1.0.2-dev", crun "1.0" and adds
`root`; status is creating/created/starting/running/stopped depending on runtime and
stage; pid is the host pid in prestart, 1 (runc) or 0 (crun) in createContainer and
absent in poststop. Old runc (before 17.06) wrote `bundlePath` instead of `bundle`.
All of that is accepted; anything that is not such an object is an NvhookError.

Both documents come from outside nvhook and are checked once, here, before anything
reads them (loads_json, check_spec): JSON nested deeper than MAX_DEPTH, a string or key
with a NUL or a lone surrogate ("\ud800" escapes), and a field nvhook reads with the
wrong JSON type are refused with one line naming the field. Readers then take values
through field(), which checks the type again (specs built in memory, the shim's).

stdin: a runtime writes the state and closes the pipe as it starts the hook, so the
state is read until EOF within STATE_TIMEOUT seconds; a stdin nobody writes to or
closes (a FIFO, a tty) is an error, not a hang (read_state_bytes).

Only libinject.jsonc is imported (not json): this is on the hook's path for every container.
"""
from __future__ import annotations

import os

from libinject import jsonc
from libinject.errors import NvhookError
from libinject.record import field, record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, BinaryIO

MAX_STATE_BYTES = 1 << 20           # a state is a few hundred bytes; annotations make it more
MAX_CONFIG_BYTES = 16 << 20         # config.json: env and mounts, never megabytes
STATUSES = ("creating", "created", "starting", "running", "stopped", "paused")
# Seconds for stdin to give the whole state and EOF: runtimes write it as they start the
# hook (runc: from memory, at once); only nobody writing takes longer.
STATE_TIMEOUT = 10.0
MAX_DEPTH = 64                      # real specs nest under 10 levels (linux.seccomp...args)
PID_MAX = 1 << 22                   # the kernel's PID_MAX_LIMIT

# What nvhook reads of config.json (hook, shim, spec applier, cdi hooks) and its JSON
# type; null is absent, as Go's encoding/json reads it. "a[].b": b of each item of a.
_HOOK_STAGES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
SPEC_FIELDS: tuple[tuple[str, str], ...] = (
    ("ociVersion", "string"), ("process", "object"), ("process.env", "strings"),
    ("process.args", "strings"), ("process.capabilities", "strings|object"),
    *((f"process.capabilities.{s}", "strings")
      for s in ("bounding", "effective", "inheritable", "permitted", "ambient")),
    ("process.user", "object"), ("process.user.additionalGids", "list"),
    ("root", "object"), ("root.path", "string"),
    ("mounts", "objects"), ("mounts[].destination", "string"), ("mounts[].source", "string"),
    ("mounts[].type", "string"), ("mounts[].options", "strings"),
    ("annotations", "string_map"), ("hooks", "object"),
    *((f"hooks.{s}", "objects") for s in _HOOK_STAGES),
    ("linux", "object"), ("linux.devices", "objects"), ("linux.resources", "object"),
    ("linux.resources.devices", "objects"), ("linux.netDevices", "object"),
)
_KIND_TEXT = {"object": "an object", "string": "a string", "list": "a list", "strings": "a list of strings",
              "objects": "a list of objects", "string_map": "an object of strings",
              "strings|object": "a list of strings or an object"}


@record(frozen=True)
class State:
    oci_version: str
    id: str
    status: str
    bundle: str
    pid: int = 0
    annotations: dict[str, str] = field(default_factory=dict)
    root: str | None = None         # crun: the rootfs path


def _jtype(v: Any) -> str:
    if isinstance(v, dict):
        return "an object"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, bool):
        return "a boolean"
    return "null" if v is None else "a number"


def _bad_string(s: str) -> str | None:
    """Why s cannot be passed on (to paths, env, logs), or None."""
    if "\0" in s:
        return "contains a NUL byte"
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            return "contains a lone surrogate (not UTF-8)"
    return None


def _key_text(k: object) -> str:
    if isinstance(k, int):
        return f"[{k}]"
    text = str(k)
    return "." + (text if len(text) <= 40 and text.isprintable() else repr(text[:40]) + "...")


def _path_text(path: tuple | None) -> str:
    parts: list[str] = []
    while path:
        path, key = path
        parts.append(_key_text(key))
    return "".join(reversed(parts)).lstrip(".") or "the top level"


def _check_tree(obj: Any, what: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH and strings or keys with a NUL or a lone
    surrogate, anywhere in obj; iterative, so no depth can exhaust the stack."""
    stack: list[tuple[Any, int, tuple | None]] = [(obj, 1, None)]
    while stack:
        v, depth, path = stack.pop()
        if isinstance(v, str):
            bad = _bad_string(v)
            if bad:
                raise NvhookError(f"{what}: {_path_text(path)} {bad}")
        elif isinstance(v, (dict, list)):
            if depth > MAX_DEPTH:
                raise NvhookError(f"{what} is nested more than {MAX_DEPTH} levels deep")
            for k, x in (v.items() if isinstance(v, dict) else enumerate(v)):
                bad = _bad_string(k) if isinstance(k, str) else None
                if bad:
                    raise NvhookError(f"{what}: a key in {_path_text(path)} {bad}")
                stack.append((x, depth + 1, (path, k)))


def loads_json(data: bytes | str, what: str) -> Any:
    """JSON text as Python values, NvhookError naming `what` for anything that is not
    sane JSON (syntax, nesting, NUL bytes, lone surrogates, a 5000-digit number)."""
    try:
        obj = jsonc.loads(data)
    except RecursionError:
        raise NvhookError(f"{what} is nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as e:     # JSONDecodeError, UnicodeDecodeError, int digit limit
        msg = "a number has too many digits" if "integer string conversion" in str(e) else str(e)
        raise NvhookError(f"{what} is not valid JSON: {msg}") from None
    if isinstance(data, (bytes, bytearray)) and b"\\u" not in data:
        # Strict UTF-8 bytes without a \u escape hold no NUL (strict JSON has no raw
        # control characters in strings) and no lone surrogate (the decoder refuses
        # their UTF-8 forms): only the depth is left to check.
        if data.count(b"[") + data.count(b"{") > MAX_DEPTH:
            _check_depth(obj, what)
    else:
        _check_tree(obj, what)
    return obj


def _check_depth(obj: Any, what: str) -> None:
    """_check_tree's depth check alone: only lists and objects are walked."""
    stack: list[tuple[Any, int]] = [(obj, 1)] if isinstance(obj, (dict, list)) else []
    while stack:
        v, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise NvhookError(f"{what} is nested more than {MAX_DEPTH} levels deep")
        for x in (v.values() if isinstance(v, dict) else v):
            if isinstance(x, (dict, list)):
                stack.append((x, depth + 1))


def _mismatch(v: Any, kind: str) -> tuple[str, Any, str] | None:
    """None if v is of kind, else (where in v: "" or "[2]" or ".key", the bad value, expected)."""
    if kind == "strings|object":
        return None if isinstance(v, dict) else _mismatch(v, "strings")
    if kind in ("object", "string", "list"):
        want = {"object": dict, "string": str, "list": list}[kind]
        return None if isinstance(v, want) else ("", v, _KIND_TEXT[kind])
    if kind in ("strings", "objects"):
        if not isinstance(v, list):
            return "", v, _KIND_TEXT[kind]
        want, text = (str, "a string") if kind == "strings" else (dict, "an object")
        for i, x in enumerate(v):
            if not isinstance(x, want):
                return f"[{i}]", x, text
        return None
    if kind == "string_map":
        if not isinstance(v, dict):
            return "", v, _KIND_TEXT[kind]
        for k, x in v.items():
            if not isinstance(x, str):
                return _key_text(k), x, "a string"
        return None
    raise AssertionError(f"unknown JSON kind {kind}")  # a bug in SPEC_FIELDS


def field(obj: Any, path: str, kind: str, what: str = "OCI spec", prefix: str = "") -> Any:
    """The value at dotted `path` in obj, checked to be of `kind` (see SPEC_FIELDS): None
    when it or a parent is absent or null; NvhookError naming the path when it or a
    parent has another type. The one way the spec's values are read."""
    cur = obj
    done = prefix
    for key in path.split("."):
        if not isinstance(cur, dict):
            raise NvhookError(f"{what}: {done or 'the top level'} is {_jtype(cur)}, expected an object")
        cur = cur.get(key)
        done = f"{done}.{key}" if done else key
        if cur is None:
            return None
    bad = _mismatch(cur, kind)
    if bad is not None:
        sub, value, expected = bad
        raise NvhookError(f"{what}: {done}{sub} is {_jtype(value)}, expected {expected}")
    return cur


def _walk(obj: Any, keys: tuple[str, ...]) -> tuple[bool, Any]:
    """field()'s walk without its messages: (False, _) where field() raises for a
    parent that is not an object, else (True, the value or None)."""
    cur = obj
    for key in keys:
        if not isinstance(cur, dict):
            return False, None
        cur = cur.get(key)
        if cur is None:
            return True, None
    return True, cur


# SPEC_FIELDS split once: (keys, keys of each list item or None, kind)
_SPEC_KEYS = tuple((tuple(head.split(".")), tuple(tail.split(".")) if sep else None, kind)
                   for (head, sep, tail), kind in ((p.partition("[]."), k) for p, k in SPEC_FIELDS))


def _spec_ok(spec: dict[str, Any]) -> bool:
    """Whether check_spec() finds nothing (the common case, without building its messages)."""
    for keys, item_keys, kind in _SPEC_KEYS:
        ok, v = _walk(spec, keys)
        if not ok:
            return False
        if item_keys is None:
            if v is not None and _mismatch(v, kind) is not None:
                return False
            continue
        if v is None:
            continue
        if _mismatch(v, "objects") is not None:
            return False
        for item in v:
            ok, x = _walk(item, item_keys)
            if not ok or (x is not None and _mismatch(x, kind) is not None):
                return False
    return True


def check_spec(spec: dict[str, Any], what: str = "OCI spec") -> None:
    """Every field in SPEC_FIELDS has its type (or is absent); NvhookError naming the first that has not."""
    if _spec_ok(spec):
        return
    for path, kind in SPEC_FIELDS:
        head, sep, tail = path.partition("[].")
        if not sep:
            field(spec, path, kind, what)
            continue
        for i, item in enumerate(field(spec, head, "objects", what) or ()):
            field(item, tail, kind, what, prefix=f"{head}[{i}]")


def read_state_bytes(stream: BinaryIO, timeout: float = STATE_TIMEOUT) -> bytes:
    """The state on stream (the hook's stdin) up to EOF, at most MAX_STATE_BYTES + 1 bytes
    (the caller reports "too large"). A runtime writes the state and closes stdin as it
    starts the hook; no EOF within `timeout` seconds (a FIFO or tty nobody writes, a
    writer that never closes) is an NvhookError, never a hang."""
    import select
    import time

    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):   # an in-memory stream: nothing to wait for
        return stream.read(MAX_STATE_BYTES + 1)
    deadline = time.monotonic() + timeout
    poller = select.poll()
    poller.register(fd, select.POLLIN)               # POLLHUP/POLLERR are always reported
    chunks: list[bytes] = []
    n = 0
    while n <= MAX_STATE_BYTES:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(max(1, int(left * 1000))):
            raise NvhookError(f"container state on stdin: no end of input within {timeout:g}s "
                              "(the runtime writes it and closes stdin)")
        try:
            b = os.read(fd, MAX_STATE_BYTES + 1 - n)
        except BlockingIOError:                      # a non-blocking stdin with nothing yet
            continue
        except OSError as e:
            raise NvhookError(f"cannot read the container state on stdin: {e.strerror}") from None
        if not b:
            break
        chunks.append(b)
        n += len(b)
    return b"".join(chunks)


def read_state(stream: BinaryIO) -> State:
    """Read and parse the state from stream (the hook's stdin), at most MAX_STATE_BYTES."""
    data = read_state_bytes(stream)
    if len(data) > MAX_STATE_BYTES:
        raise NvhookError(f"container state on stdin is larger than {MAX_STATE_BYTES} bytes")
    return parse_state(data)


def parse_state(data: bytes | str) -> State:
    if not data or not data.strip():
        raise NvhookError("no container state on stdin (run as an OCI hook)")
    obj = loads_json(data, "container state")
    if not isinstance(obj, dict):
        raise NvhookError("container state is not a JSON object")

    def string(key: str, required: bool = True) -> str:
        v = obj.get(key)
        if v is None and not required:
            return ""
        if not isinstance(v, str):
            what = "missing" if v is None else f"not a string: {v!r}"
            raise NvhookError(f"container state: {key} {what}")
        return v

    bundle = obj.get("bundle") or obj.get("bundlePath")
    if not isinstance(bundle, str) or not bundle:
        raise NvhookError("container state: bundle missing")
    status = string("status")
    if status not in STATUSES:
        raise NvhookError(f"container state: unknown status {status!r}")
    pid = obj.get("pid", 0)
    if pid is None:
        pid = 0
    if isinstance(pid, bool) or not isinstance(pid, int) or pid < 0:
        raise NvhookError(f"container state: pid is not a non-negative integer: {pid!r}"[:200])
    if pid > PID_MAX:
        raise NvhookError(f"container state: pid {pid} is out of range (at most {PID_MAX})"[:200])
    annotations = obj.get("annotations")
    if annotations is None:
        annotations = {}
    if not isinstance(annotations, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()):
        raise NvhookError("container state: annotations is not a string map")
    root = obj.get("root")
    if root is not None and not isinstance(root, str):
        raise NvhookError("container state: root is not a string")
    return State(oci_version=string("ociVersion"), id=string("id"), status=status,
                 bundle=bundle, pid=pid, annotations=annotations, root=root)


def bundle_dir(state: State, cwd: str | None = None) -> str:
    """The bundle as an absolute path; a relative one is taken from the hook's start cwd."""
    if os.path.isabs(state.bundle):
        return os.path.normpath(state.bundle)
    if not cwd:
        raise NvhookError(f"container state: bundle {state.bundle!r} is relative and the cwd is unknown")
    return os.path.normpath(os.path.join(cwd, state.bundle))


def load_config(bundle: str) -> dict[str, Any]:
    """<bundle>/config.json as a dict, at most MAX_CONFIG_BYTES."""
    path = os.path.join(bundle, "config.json")
    from libinject.linux.files import read_bounded

    data = read_bounded(path, MAX_CONFIG_BYTES, "OCI spec")
    spec = loads_json(data, f"OCI spec {path}")
    if not isinstance(spec, dict):
        raise NvhookError(f"OCI spec {path} is not a JSON object")
    # As NVIDIA's hook: these must be there for the spec to mean anything.
    if not isinstance(spec.get("ociVersion"), str):
        raise NvhookError(f"OCI spec {path}: ociVersion missing")
    if not isinstance(spec.get("process"), dict):
        raise NvhookError(f"OCI spec {path}: process missing")
    root = spec.get("root")
    if not isinstance(root, dict) or not isinstance(root.get("path"), str) or not root["path"]:
        raise NvhookError(f"OCI spec {path}: root.path missing")
    check_spec(spec, f"OCI spec {path}")
    return spec


def rootfs_path(spec: dict[str, Any], bundle: str) -> str:
    """root.path, relative to the bundle when not absolute."""
    return os.path.normpath(os.path.join(bundle, spec["root"]["path"]))


def container_pid(state: State, stage: str) -> int:
    """The pid whose namespaces and cgroup are the container's, as this process sees /proc.

    prestart (runc, crun): the state's pid is the host pid of the container's init.
    createContainer: runc says 1 (container pid namespace) and crun 0, but the hook then
    runs inside the container's namespaces and cgroup, so our own pid stands in for it;
    /proc/self names it as the mounted /proc counts (os.getpid() counts in our pid ns).
    Being our own pid is what tells libinject.apply.cgroups to reach the cgroup through
    a private mount, never through the container's mounts we then see.
    """
    if stage == "createContainer":
        try:
            return int(os.readlink("/proc/self"))
        except (OSError, ValueError):
            raise NvhookError("createContainer: cannot find own pid in /proc") from None
    if state.pid <= 0:
        raise NvhookError(f"{stage}: container state has no pid (status {state.status})")
    return state.pid
