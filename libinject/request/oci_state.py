"""The OCI state a runtime gives a hook on stdin, and the bundle it points at.

Runtimes differ (tests/test_oci_state.py has each variant): runc says ociVersion "1.0.2-dev", crun "1.0" and adds
`root`; status is creating/created/starting/running/stopped depending on runtime and
stage; pid is the host pid in prestart, 1 (runc) or 0 (crun) in createContainer and
absent in poststop. Old runc (before 17.06) wrote `bundlePath` instead of `bundle`.
All of that is accepted; anything that is not such an object is an NvhookError.

Only json is imported: this is on the hook's path for every container.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from libinject.errors import NvhookError

MAX_STATE_BYTES = 1 << 20           # a state is a few hundred bytes; annotations make it more
MAX_CONFIG_BYTES = 16 << 20         # config.json: env and mounts, never megabytes
STATUSES = ("creating", "created", "starting", "running", "stopped", "paused")


@dataclass(frozen=True)
class State:
    oci_version: str
    id: str
    status: str
    bundle: str
    pid: int = 0
    annotations: dict[str, str] = field(default_factory=dict)
    root: str | None = None         # crun: the rootfs path


def read_state(stream: BinaryIO) -> State:
    """Read and parse the state from stream (the hook's stdin), at most MAX_STATE_BYTES."""
    data = stream.read(MAX_STATE_BYTES + 1)
    if len(data) > MAX_STATE_BYTES:
        raise NvhookError(f"container state on stdin is larger than {MAX_STATE_BYTES} bytes")
    return parse_state(data)


def parse_state(data: bytes | str) -> State:
    if not data or not data.strip():
        raise NvhookError("no container state on stdin (run as an OCI hook)")
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise NvhookError(f"container state is not valid JSON: {e}") from None
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
        raise NvhookError(f"container state: pid is not a non-negative integer: {pid!r}")
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
    try:
        spec = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise NvhookError(f"OCI spec {path} is not valid JSON: {e}") from None
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
    """
    if stage == "createContainer":
        try:
            return int(os.readlink("/proc/self"))
        except (OSError, ValueError):
            raise NvhookError("createContainer: cannot find own pid in /proc") from None
    if state.pid <= 0:
        raise NvhookError(f"{stage}: container state has no pid (status {state.status})")
    return state.pid
