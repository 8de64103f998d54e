"""Keep a container's GPUs across `systemctl daemon-reload`: tell systemd, runtime only,
that the container's scope allows the devices nvhook just allowed in its cgroup.

With the systemd cgroup driver (runc/crun --systemd-cgroup, containerd SystemdCgroup,
Docker's and Podman's systemd driver) the container lives in a transient scope
(docker-<id>.scope, cri-containerd-<id>.scope, libpod-<id>.scope, runc-<id>.scope ...)
whose device rules systemd rebuilds from the unit's DeviceAllow= on every reload: v1
devices.deny "a" then its list, v2 a new eBPF program. The runtime puts the spec's
devices there (as /dev/char/MAJ:MIN, runc's form, which systemd parses without a
stat); devices a hook added are not there, so a reload takes them away (NVML "Unknown
Error"). SetUnitProperties(runtime=true) adds ours: systemd re-applies the unit's rules
before it answers (we wait, bounded), and a transient unit's drop-in goes with the unit.

Which unit, and only that one (a container must not get a device granted to another
unit): the container's cgroup path (its init's /proc/PID/cgroup, the runtime's child
nvhook verified) must end in a scope name of systemd's form; systemd itself must say
that pid is in that very unit (GetUnitByPID, over its private socket, whose peer the
kernel vouches is PID 1 of our pid namespace, so the pid means the same to both); and
every process in that cgroup must be in the container's pid namespace (a spec that put
its container into another unit's cgroup shares it with that unit's processes). A
createContainer hook (we are then the container, in its pid namespace) tells nothing.
Anything else is a logged line, and the start goes on: without systemd or in time, the
container still has its devices until a reload.
"""
from __future__ import annotations

import os
import time

from libinject.apply import cgroups
from libinject.errors import NvhookError
from libinject.linux.files import read_bounded

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Sequence

    from libinject.plan.edits import CgroupRule

TIMEOUT = 2.0      # seconds for the whole exchange: a start waits at most this
# systemd's unit name characters (unit_name_is_valid); no `re` on the hook's path (~8 ms)
_UNIT_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789:-_.\\")


def _is_scope_name(name: str) -> bool:
    """A scope's name as systemd forms them: its characters, at most 256 in all."""
    return (name.endswith(".scope") and 6 < len(name) <= 256 and name != "init.scope"
            and all(c in _UNIT_CHARS for c in name))


def scope_of(text: str) -> str | None:
    """The scope a /proc/PID/cgroup text puts the process in, as systemd names it: the
    last part of the path of the hierarchy systemd tracks units on (unified, else
    name=systemd), when that is a scope; else None."""
    cg = cgroups.proc_cgroups(text)
    path = cg.get("")
    if (not path or path == "/") and cg.get("name=systemd"):
        path = cg["name=systemd"]
    if not path:
        return None
    leaf = path.rstrip("/").rsplit("/", 1)[-1]
    if leaf.startswith("_"):          # systemd's cgroup escape (cg_escape) of a unit name
        leaf = leaf[1:]
    return leaf if _is_scope_name(leaf) else None


def device_entries(rules: Sequence[CgroupRule]) -> list[tuple[str, str]]:
    """DeviceAllow= entries for rules, in runc's form: /dev/char/MAJ:MIN (or /dev/block)."""
    kinds = {"c": "char", "b": "block"}
    return [(f"/dev/{kinds[r.type]}/{r.major}:{r.minor}", r.access) for r in rules if r.type in kinds]


def _pidns(pid: int, proc_root: str) -> int:
    return os.stat(f"{proc_root}/{pid}/ns/pid").st_ino


def _only_container(pid: int, cgdir: str, proc_root: str) -> str | None:
    """None when every process in cgdir is pid or in pid's pid namespace; else why not.
    (At prestart the container's init is the only one: nothing else is looked at.
    Another process's namespace needs ptrace access: a worker without it refuses.)"""
    data = read_bounded(os.path.join(cgdir, "cgroup.procs"), 1 << 20, "cgroup process list")
    others = {int(p) for p in data.split()} - {pid}
    if not others:
        return None
    try:
        ns = _pidns(pid, proc_root)
    except OSError as e:
        return f"{cgdir} also holds process {min(others)}; the container's pid namespace: {e.strerror}"
    for p in sorted(others):
        try:
            if _pidns(p, proc_root) != ns:
                return f"{cgdir} also holds process {p}, not of the container"
        except FileNotFoundError:
            continue                  # gone meanwhile
        except OSError as e:
            return f"{cgdir} also holds process {p}: {e.strerror}"
    return None


def keep_across_reload(pid: int, rules: Sequence[CgroupRule], undo: cgroups.Undo, *,
                       proc_root: str = "/proc", timeout: float = TIMEOUT,
                       socket_path: str = "/run/systemd/private") -> str | None:
    """After cgroups.allow_devices(pid, rules) changed pid's cgroup (undo says where):
    add rules to the DeviceAllow= of the systemd scope holding pid. Never raises; returns
    a line for the log (None: not a systemd scope, nothing to say)."""
    cgdir = undo.v2_dir or undo.v1_dir
    entries = device_entries(rules)
    if cgdir is None or not entries or cgroups.is_self(pid, proc_root):
        return None
    try:
        data = read_bounded(f"{proc_root}/{pid}/cgroup", 1 << 20, "cgroup list")
        unit = scope_of(data.decode(errors="replace"))
        if unit is None:
            return None
        from libinject.linux import sdbus    # (only where there is a scope: socket's import)

        why = _only_container(pid, cgdir, proc_root)
        if why is not None:
            return f"systemd: {unit} not told of the devices: {why}"
        with sdbus.Systemd(time.monotonic() + timeout, socket_path) as sd:
            try:
                holder = sd.unit_by_pid(pid).rsplit("/", 1)[-1]
            except sdbus.BusError as e:
                if e.name != "org.freedesktop.systemd1.NoUnitForPID":
                    raise
                holder = "no unit"
            if holder != sdbus.unit_object_path(unit).rsplit("/", 1)[-1]:
                return f"systemd: {unit} not told of the devices: systemd has pid {pid} in {holder}"
            sd.allow_devices(unit, entries)
    except (NvhookError, OSError) as e:
        why = str(e) if isinstance(e, NvhookError) else f"{e.filename}: {e.strerror or e}"
        return f"systemd: the devices may not outlast a daemon-reload: {why}"
    return f"systemd: {unit} DeviceAllow= {' '.join(p for p, _ in entries)} (kept across daemon-reload)"
