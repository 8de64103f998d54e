"""The OCI-spec applier: make edits part of a bundle's config.json before `create`.

Used by the runtime shim (cdi and csv modes). It does to the config dict what the CDI
library does in podman/containerd (pkg/cdi/container-edits.go Apply), so a container
made by the shim and one made by podman from the same spec are the same:
- env: "NAME=value" replaces an entry of the same NAME, else is appended;
- deviceNodes: linux.devices entry (replacing one at the same path; uid/gid from
  process.user when not given) and a linux.resources.devices allow rule for b/c
  nodes (permissions "" = rwm, "none" = no access); type/major/minor missing -> read
  from the host node;
- mounts: replace any mount at the same destination, then order all mounts by depth
  (stable) so a parent is mounted before what goes inside it;
- hooks: appended to their stage; additionalGids (non-zero) to process.user;
  intelRdt and netDevices set.
ContainerEdits (the planner's) go through libinject.apply.cdi.to_cdi first: one conversion,
so the shim's csv mode and `cdi generate` describe edits the same way.
"""
from __future__ import annotations

import os
import posixpath
import stat

from libinject.constants import OCI_HOOK_STAGES
from libinject.errors import NvhookError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterable


def apply_cdi(config: dict[str, Any], edits_list: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Apply CDI containerEdits objects, in order, to an OCI config dict (in place)."""
    from libinject.apply.cdi_validate import edits_errors

    edits_list = [e for e in edits_list if e]
    for e in edits_list:
        problems = edits_errors(e)
        if problems:
            raise NvhookError(f"invalid CDI edits: {problems[0]}")
    for e in edits_list:
        _env(config, e.get("env") or ())
        for d in e.get("deviceNodes") or ():
            _device(config, d)
        for n in e.get("netDevices") or ():
            config.setdefault("linux", {}).setdefault("netDevices", {})[n["hostInterfaceName"]] = {
                "name": n["name"]}
        if e.get("mounts"):
            for m in e["mounts"]:
                _mount(config, m)
            _sort_mounts(config)
        for h in e.get("hooks") or ():
            _hook(config, h)
        if e.get("intelRdt") is not None:
            config.setdefault("linux", {})["intelRdt"] = dict(e["intelRdt"])
        for gid in e.get("additionalGids") or ():
            if gid:
                user = config.setdefault("process", {}).setdefault("user", {"uid": 0, "gid": 0})
                gids = user.setdefault("additionalGids", [])
                if gid not in gids:
                    gids.append(gid)
    return config


def _env(config: dict[str, Any], env: Iterable[str]) -> None:
    proc = config.setdefault("process", {})
    cur: list[str] = list(proc.get("env") or [])
    for item in env:
        name = item.split("=", 1)[0]
        for i, old in enumerate(cur):
            if old.split("=", 1)[0] == name:
                cur[i] = item
                break
        else:
            cur.append(item)
    proc["env"] = cur


def _fill(d: dict[str, Any]) -> tuple[str, int, int]:
    typ, major, minor = d.get("type") or "", int(d.get("major") or 0), int(d.get("minor") or 0)
    if typ and (major != 0 or typ == "p"):
        return typ, major, minor
    host = d.get("hostPath") or d["path"]
    try:
        st = os.stat(host)
    except OSError as e:
        raise NvhookError(f"CDI device node {host}: {e.strerror}") from None
    if stat.S_ISCHR(st.st_mode):
        typ = "c"
    elif stat.S_ISBLK(st.st_mode):
        typ = "b"
    elif stat.S_ISFIFO(st.st_mode):
        typ = "p"
    else:
        raise NvhookError(f"CDI device node {host} is not a device")
    return typ, os.major(st.st_rdev), os.minor(st.st_rdev)


def _device(config: dict[str, Any], d: dict[str, Any]) -> None:
    typ, major, minor = _fill(d)
    dev: dict[str, Any] = {"path": d["path"], "type": typ, "major": major, "minor": minor}
    if d.get("fileMode") is not None:
        dev["fileMode"] = d["fileMode"]
    user = (config.get("process") or {}).get("user") or {}
    for k in ("uid", "gid"):
        if d.get(k) is not None:
            dev[k] = d[k]
        elif isinstance(user.get(k), int) and user[k] > 0:
            dev[k] = user[k]
    linux = config.setdefault("linux", {})
    devices = [x for x in linux.get("devices") or () if x.get("path") != dev["path"]]
    devices.append(dev)
    linux["devices"] = devices
    if typ in ("b", "c"):
        access = d.get("permissions") or "rwm"
        if access == "none":
            access = ""
        rules = linux.setdefault("resources", {}).setdefault("devices", [])
        rules.append({"allow": True, "type": typ, "major": major, "minor": minor, "access": access})


def _mount(config: dict[str, Any], m: dict[str, Any]) -> None:
    dest = m["containerPath"]
    mounts = [x for x in config.get("mounts") or () if x.get("destination") != dest]
    new: dict[str, Any] = {"destination": dest, "source": m["hostPath"]}
    if m.get("type"):
        new["type"] = m["type"]
    if m.get("options"):
        new["options"] = list(m["options"])
    mounts.append(new)
    config["mounts"] = mounts


def _sort_mounts(config: dict[str, Any]) -> None:
    def parts(m: dict[str, Any]) -> int:
        return posixpath.normpath(str(m.get("destination", ""))).count("/")

    config["mounts"] = sorted(config.get("mounts") or [], key=parts)


def _hook(config: dict[str, Any], h: dict[str, Any]) -> None:
    stage = h["hookName"]
    if stage not in OCI_HOOK_STAGES:
        raise NvhookError(f"unknown hook name {stage!r}")
    oci: dict[str, Any] = {"path": h["path"]}
    for k in ("args", "env"):
        if h.get(k):
            oci[k] = list(h[k])
    if h.get("timeout") is not None:
        oci["timeout"] = h["timeout"]
    config.setdefault("hooks", {}).setdefault(stage, []).append(oci)
