"""Validate CDI specs: the official JSON schema, plus what the schema misses.

The schema (libinject/apply/cdi_schema, a copy of the upstream draft-07 files) checks types
and required fields only. What the Go loader (pkg/cdi, specs-go) also enforces, and
this module adds:
- unknown fields (the Go loader decodes strictly; the schema allows anything extra);
- env entries "NAME=value" (the schema's `env.items` says "ref", not "$ref", so it
  checks nothing), in containerEdits and in hooks;
- `fileMode` (missing from the schema's DeviceNode) must be a non-negative integer;
- names: kind "vendor/class", device names (pkg/parser grammar), duplicate devices,
  at least one device, no device with empty edits;
- cdiVersion: a released version, and not lower than the content needs;
- hooks: a known stage name, an absolute path, timeout > 0;
- device nodes: type b/c/u/p, non-negative major/minor, permissions from "rwm" or "none";
- mounts: non-empty hostPath and containerPath.
"""
from __future__ import annotations

import json
import posixpath
from functools import lru_cache
from importlib import resources

from libinject.apply import cdi
from libinject.constants import OCI_HOOK_STAGES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DEVICE_TYPES = ("", "b", "c", "u", "p")
FIELDS = {
    "spec": {"cdiVersion", "kind", "annotations", "devices", "containerEdits"},
    "device": {"name", "annotations", "containerEdits"},
    "edits": {"env", "deviceNodes", "mounts", "hooks", "intelRdt", "additionalGids", "netDevices"},
    "deviceNode": {"path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid",
                   "gid"},
    "mount": {"hostPath", "containerPath", "type", "options"},
    "hook": {"hookName", "path", "args", "env", "timeout"},
    "intelRdt": {"closID", "l3CacheSchema", "memBwSchema", "schemata", "enableMonitoring"},
    "netDevice": {"hostInterfaceName", "name"},
}


def schema_files() -> dict[str, Any]:
    """{"schema.json": ..., "defs.json": ...} from the package."""
    base = resources.files("libinject.apply.cdi_schema")
    return {n: json.loads(base.joinpath(n).read_text()) for n in ("schema.json", "defs.json")}


@lru_cache(maxsize=1)
def _validator():
    from jsonschema import Draft7Validator
    from referencing import Registry
    from referencing.jsonschema import DRAFT7

    files = schema_files()
    registry = Registry().with_resource("defs.json", DRAFT7.create_resource(files["defs.json"]))
    return Draft7Validator(files["schema.json"], registry=registry)


def _string_keys(spec: Any) -> Any:
    """The spec as the schema may see it: YAML allows keys that are not strings, and the
    schema's patternProperties (annotations) would raise on them. Only annotation maps
    are copied (with str() keys); semantic_errors reports such keys."""
    if not isinstance(spec, dict):
        return spec

    def fixed(holder: dict) -> dict:
        a = holder.get("annotations")
        if isinstance(a, dict) and not all(isinstance(k, str) for k in a):
            return {**holder, "annotations": {str(k): v for k, v in a.items()}}
        return holder

    spec = fixed(spec)
    devices = spec.get("devices")
    if isinstance(devices, list):
        spec = {**spec, "devices": [fixed(d) if isinstance(d, dict) else d for d in devices]}
    return spec


def schema_errors(spec: Any) -> list[str]:
    out = []
    errors = _validator().iter_errors(_string_keys(spec))
    for e in sorted(errors, key=lambda e: list(map(str, e.absolute_path))):
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        out.append(f"schema: {where}: {e.message}")
    return out


def _unknown(obj: Any, kind: str, where: str, out: list[str]) -> None:
    if isinstance(obj, dict):
        for k in obj:
            if k not in FIELDS[kind]:
                out.append(f"{where}: unknown field {k!r}")


def _list(v: Any) -> list:
    """A field that should be a list, if it is one (a wrong type: the schema reports it)."""
    return v if isinstance(v, list) else []


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _annotations(obj: dict, where: str, out: list[str]) -> None:
    a = obj.get("annotations")
    for k in a if isinstance(a, dict) else ():
        if not isinstance(k, str):
            out.append(f"{where}/annotations: key {k!r} is not a string")


def _env(env: Any, where: str, out: list[str], typed: bool = False) -> None:
    """typed: the schema checks these items' type (hooks' env); containerEdits' env it
    does not (its items say "ref", not "$ref")."""
    for i, v in enumerate(_list(env)):
        if not isinstance(v, str):
            if not typed:
                out.append(f"{where}/env/{i}: invalid environment variable {repr(v)[:80]} (want NAME=value)")
        elif v.find("=") <= 0:
            out.append(f"{where}/env/{i}: invalid environment variable {repr(v)[:80]} (want NAME=value)")


def _edits(e: Any, where: str, out: list[str]) -> None:
    if not isinstance(e, dict):
        return
    _unknown(e, "edits", where, out)
    _env(e.get("env"), where, out)
    # Each check below looks only at values of the type the schema wants: a value of
    # another type is the schema's one line, not a second one here (nor a TypeError).
    for i, n in enumerate(_list(e.get("deviceNodes"))):
        w = f"{where}/deviceNodes/{i}"
        if not isinstance(n, dict):
            continue
        _unknown(n, "deviceNode", w, out)
        if _str(n.get("path")) == "":
            out.append(f"{w}: empty device path")
        t = _str(n.get("type", ""))
        if t is not None and t not in DEVICE_TYPES:
            out.append(f"{w}: invalid device type {t!r} (b, c, u or p)")
        for k in ("major", "minor"):
            v = n.get(k)
            if isinstance(v, int) and v < 0:
                out.append(f"{w}: negative {k} {v}")
        fm = n.get("fileMode")
        if fm is not None and (isinstance(fm, bool) or not isinstance(fm, int) or fm < 0):
            out.append(f"{w}: fileMode must be a non-negative integer, not {fm!r}")
        p = n.get("permissions", "")
        if isinstance(p, str) and p not in ("", "none") and p.strip("rwm"):
            out.append(f"{w}: invalid permissions {p!r} (r, w, m or none)")
    for i, m in enumerate(_list(e.get("mounts"))):
        w = f"{where}/mounts/{i}"
        if not isinstance(m, dict):
            continue
        _unknown(m, "mount", w, out)
        if _str(m.get("hostPath")) == "":
            out.append(f"{w}: empty hostPath")
        if _str(m.get("containerPath")) == "":
            out.append(f"{w}: empty containerPath")
    for i, h in enumerate(_list(e.get("hooks"))):
        w = f"{where}/hooks/{i}"
        if not isinstance(h, dict):
            continue
        _unknown(h, "hook", w, out)
        name = _str(h.get("hookName"))
        if name is not None and name not in OCI_HOOK_STAGES:
            out.append(f"{w}: invalid hook name {h.get('hookName')!r} "
                       f"(one of {', '.join(OCI_HOOK_STAGES)})")
        path = h.get("path")
        if isinstance(path, str) and not posixpath.isabs(path):
            out.append(f"{w}: hook path {path!r} is not absolute")
        t = h.get("timeout")
        if isinstance(t, int) and not isinstance(t, bool) and t <= 0:
            out.append(f"{w}: timeout must be greater than zero")
        _env(h.get("env"), w, out, typed=True)
    rdt = e.get("intelRdt")
    if rdt is not None:
        _unknown(rdt, "intelRdt", f"{where}/intelRdt", out)
    for i, n in enumerate(_list(e.get("netDevices"))):
        _unknown(n, "netDevice", f"{where}/netDevices/{i}", out)
        if isinstance(n, dict) and "" in (_str(n.get("hostInterfaceName")), _str(n.get("name"))):
            out.append(f"{where}/netDevices/{i}: empty interface name")


def _blank(v: Any) -> bool:
    """An edits field that adds nothing (absent, or an empty list or object; a value of
    a wrong type is not blank: the schema reports it)."""
    return v is None or (isinstance(v, (list, dict)) and not v)


def semantic_errors(spec: Any) -> list[str]:
    """What the schema misses (see the module docstring)."""
    out: list[str] = []
    if not isinstance(spec, dict):
        return ["spec is not a mapping"]
    _unknown(spec, "spec", "(root)", out)
    _annotations(spec, "(root)", out)
    version = spec.get("cdiVersion")
    kind = spec.get("kind")
    if isinstance(kind, str):
        try:
            cdi.check_kind(kind)
        except Exception as e:
            out.append(f"kind: {e}")
    if isinstance(version, str):
        if version.lstrip("v") not in cdi.KNOWN_VERSIONS:
            out.append(f"cdiVersion: unknown version {version!r}")
        else:
            need = cdi.minimum_version(spec)
            if cdi.version_key(version) < cdi.version_key(need):
                out.append(f"cdiVersion: {version} is too low for this content (needs at least {need})")
    devices = spec.get("devices")
    if isinstance(devices, list):
        if not devices:
            out.append("devices: a spec needs at least one device")
        seen: set[str] = set()
        for i, d in enumerate(devices):
            if not isinstance(d, dict):
                continue
            w = f"devices/{i}"
            _unknown(d, "device", w, out)
            _annotations(d, w, out)
            name = d.get("name")
            if isinstance(name, str):
                err = cdi.device_name_error(name)
                if err:
                    out.append(f"{w}: {err}")
                if name in seen:
                    out.append(f"{w}: duplicate device name {name!r}")
                seen.add(name)
            edits = d.get("containerEdits")
            if isinstance(edits, dict) and all(_blank(edits.get(k)) for k in FIELDS["edits"]):
                out.append(f"{w}: empty device edits")
            _edits(edits, f"{w}/containerEdits", out)
    _edits(spec.get("containerEdits"), "containerEdits", out)
    return out


def edits_errors(edits: Any, where: str = "containerEdits") -> list[str]:
    """Problems in one containerEdits object (what the Go applier checks first)."""
    out: list[str] = []
    _edits(edits, where, out)
    return out


def validate(spec: Any) -> list[str]:
    """Every problem found, schema first; [] = valid."""
    return schema_errors(spec) + semantic_errors(spec)


def validate_file(path: str) -> list[str]:
    from libinject.errors import NvhookError

    try:
        spec = cdi.load_file(path)
    except NvhookError as e:
        return [str(e)]
    return validate(spec)
