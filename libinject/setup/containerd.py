"""The `containerd` target: a CRI runtime `nvidia` (io.containerd.runc.v2 running
nvhook's shim as its BinaryName) in containerd's config.toml, as NVIDIA's
`nvidia-ctk runtime configure --runtime=containerd` does.

Config versions 2 (containerd 1.x) and 3 (2.x) name the CRI plugin differently:
  v2: plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia
  v3: plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia
A new or empty file is written as version 2 (which both 1.x and 2.x read). A new
runtime starts as a copy of the `runc` runtime's settings when there is one (e.g.
SystemdCgroup), then runtime_type = "io.containerd.runc.v2" and options.BinaryName =
this install's nvhook-runtime. set_as_default: containerd.default_runtime_name =
"nvidia"; cdi: enable_cdi = true on the CRI plugin, and cdi_spec_dirs (/etc/cdi,
/var/run/cdi) unless the file names its own (CDI needs containerd >= 1.7).
Version 1 configs are refused (`containerd config migrate` converts them).

When the main file's `imports` names a glob that a file 99-nvhook.toml in that
directory matches (e.g. "/etc/containerd/conf.d/*.toml"), the change goes into that
drop-in and the main file is left as it is. containerd 1.x replaces a plugin's whole
section with an import's (2.x merges them), so a new drop-in starts with the CRI
plugin's section as the main file and the other imported files (in containerd's
order) have it, then gets ours: re-run `nvhook setup containerd` after editing that
section elsewhere. An earlier nvhook kept the drop-in's backup in the directory above
it (a glob such as conf.d/* would import a backup beside it); now it is in the store
like every other. Imports of imported files are not followed.
"""
from __future__ import annotations

import fnmatch
import glob
import os
from typing import Sequence

from libinject.errors import NvhookError
from libinject.setup import tomldoc
from libinject.setup.install import Target, edit_file, nothing_to_undo, venv_program

CONFIG = "/etc/containerd/config.toml"
DROP_IN = "99-nvhook.toml"
PLUGINS = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
NEW_VERSION = 2
RUNTIME = "nvidia"
RUNTIME_TYPE = "io.containerd.runc.v2"
CDI_SPEC_DIRS = ["/etc/cdi", "/var/run/cdi"]
HEADER = ("written by `nvhook setup containerd`; `nvhook setup containerd --undo` removes it",)
RESTART = "restart containerd for it to take effect (`systemctl restart containerd`)"
_GLOB = frozenset("*?[")


def version_of(doc, path: str) -> int:
    """The config version (a new or empty file: NEW_VERSION)."""
    if not doc.keys():
        return NEW_VERSION
    v = tomldoc._plain(doc.get("version", 1))
    if not isinstance(v, int) or isinstance(v, bool):
        raise NvhookError(f"{path}: version is not an integer; nothing changed")
    if v not in PLUGINS:
        raise NvhookError(f"{path}: containerd config version {v} is not supported (2 or 3; "
                          "`containerd config migrate` converts older ones); nothing changed")
    return v


def drop_in_path(doc, main: str) -> str | None:
    """The drop-in the main config's imports would read, or None."""
    imports = tomldoc._plain(doc.get("imports", []))
    if not isinstance(imports, list):
        return None
    for imp in imports:
        if not isinstance(imp, str) or not imp:
            continue
        pattern = os.path.join(os.path.dirname(main), imp)      # relative: to the main file
        d, base = os.path.split(pattern)
        if _GLOB & set(base) and not _GLOB & set(d) and fnmatch.fnmatchcase(DROP_IN, base):
            return os.path.join(d, DROP_IN)
    return None


def _imported(doc, main: str, skip: str) -> list[str]:
    """The files the main config's imports name, in containerd's order, less `skip`."""
    out: list[str] = []
    for imp in tomldoc._plain(doc.get("imports", [])) or ():
        if not isinstance(imp, str) or not imp:
            continue
        pattern = os.path.join(os.path.dirname(main), imp)
        paths = sorted(glob.glob(pattern)) if _GLOB & set(pattern) else [pattern]
        out += [p for p in paths if os.path.abspath(p) != skip and os.path.isfile(p) and p not in out]
    return out


def _merge(into: dict, other: dict) -> None:
    for k, v in other.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def configure(doc, version: int, path: str, shim: str, *, set_as_default: bool, cdi: bool,
              container_annotations: Sequence[str] = (), cdi_spec_dirs: Sequence[str] | None = None) -> None:
    """Put the nvidia runtime (and the default and CDI keys) into doc.
    container_annotations: patterns the runtime's container_annotations must hold (put
    first, the file's others kept after them, as nvidia-ctk does); cdi_spec_dirs: the
    CRI plugin's spec dirs to write (a spec elsewhere than the defaults)."""
    import tomlkit

    cri = ["plugins", PLUGINS[version]]
    section = tomldoc.table(doc, [*cri, "containerd"], path)
    runtimes = tomldoc.table(doc, [*cri, "containerd", "runtimes"], path)
    default = tomldoc._plain(section.get("default_runtime_name", "runc"))
    if default == "runc" and "runc" not in runtimes:
        # containerd's built-in runc exists only while the file defines no runtimes:
        # once ours is there, runc (still the default) must be written out too, or the
        # CRI plugin does not load ("no corresponding runtime ... runc").
        runtimes.append("runc", tomlkit.item({"runtime_type": RUNTIME_TYPE}))
    if RUNTIME not in runtimes and isinstance(runtimes.get("runc"), dict):
        runtimes.append(RUNTIME, tomlkit.item(tomldoc._plain(runtimes["runc"])))
    nv = tomldoc.table(runtimes, [RUNTIME], path)
    tomldoc.put(nv, "runtime_type", RUNTIME_TYPE)
    tomldoc.put(tomldoc.table(nv, ["options"], path), "BinaryName", shim)
    if container_annotations:
        have = tomldoc._plain(nv.get("container_annotations", []))
        have = [a for a in have if isinstance(a, str)] if isinstance(have, list) else []
        tomldoc.put(nv, "container_annotations",
                    [*container_annotations, *(a for a in have if a not in container_annotations)])
    if set_as_default:
        tomldoc.put(tomldoc.table(doc, [*cri, "containerd"], path), "default_runtime_name", RUNTIME)
    if cdi:
        plugin = tomldoc.table(doc, cri, path)
        tomldoc.put(plugin, "enable_cdi", True)
        if "cdi_spec_dirs" not in plugin and cdi_spec_dirs is None:
            plugin["cdi_spec_dirs"] = list(CDI_SPEC_DIRS)
    if cdi_spec_dirs is not None:
        tomldoc.put(tomldoc.table(doc, cri, path), "cdi_spec_dirs", list(cdi_spec_dirs))


def setup(config: str = CONFIG, *, set_as_default: bool = False, cdi: bool = False,
          dry_run: bool = False, undo: bool = False, backup_dir: str | None = None,
          container_annotations: Sequence[str] = (), cdi_spec_dirs: Sequence[str] | None = None) -> str:
    """Configure (or undo) containerd for nvhook; the text to show (configure says what
    container_annotations and cdi_spec_dirs do)."""
    main = Target(config, store=backup_dir, fmt="toml")
    cur = main.read()
    if cur is not None and cur.kind == "link":
        raise NvhookError(f"{main.path} is a symlink: name the file it points to with --config")
    doc = tomldoc.parse(cur.data if cur is not None else None, main.path)
    version = version_of(doc, main.path)
    drop = drop_in_path(doc, main.path)
    drop_target = (Target(drop, os.path.dirname(os.path.dirname(drop)), store=backup_dir, make_dirs=True, fmt="toml")
                   if drop else None)
    if undo:
        done = [t for t in (drop_target, main) if t is not None and t.has_backup()]
        if not done:
            return nothing_to_undo(main.path)
        text = "".join(edit_file(t, None, dry_run=dry_run, undo=True)[1] for t in done)
        return text + ("" if dry_run else RESTART + "\n")
    shim = venv_program("nvhook-runtime")
    if drop_target is None:
        def edit(data: bytes | None) -> bytes:
            d = tomldoc.parse(data, main.path)
            if not d.keys():
                d.add("version", NEW_VERSION)
            configure(d, version, main.path, shim, set_as_default=set_as_default, cdi=cdi,
                      container_annotations=container_annotations, cdi_spec_dirs=cdi_spec_dirs)
            return tomldoc.dumps(d)
        target = main
    else:
        def edit(data: bytes | None) -> bytes:
            import tomlkit

            d = tomldoc.parse(data, drop_target.path)
            if not d.keys():
                tomldoc.header(d, HEADER)
                d.add("version", version)
            cri = ["plugins", PLUGINS[version]]
            if PLUGINS[version] not in (d.get("plugins") or {}):
                seed: dict = {}
                for part in [doc, *(tomldoc.parse(_read(p), p) for p in _imported(doc, main.path, drop_target.path))]:
                    section = tomldoc._plain(part).get("plugins", {}).get(PLUGINS[version])
                    if isinstance(section, dict):
                        _merge(seed, section)
                if seed:
                    tomldoc.table(d, cri[:1], drop_target.path).append(cri[1], tomlkit.item(seed))
            configure(d, version, drop_target.path, shim, set_as_default=set_as_default, cdi=cdi,
                      container_annotations=container_annotations, cdi_spec_dirs=cdi_spec_dirs)
            return tomldoc.dumps(d)
        target = drop_target
    changed, text = edit_file(target, edit, dry_run=dry_run)
    if drop_target is not None and not dry_run:
        text += f"(the main config {main.path} imports it; left as it is)\n"
    if changed and not dry_run:
        text += RESTART + "\n"
    return text


def _read(path: str) -> bytes:
    from libinject.setup.install import MAX_FILE

    try:
        with open(path, "rb") as f:
            return f.read(MAX_FILE + 1)
    except OSError as e:
        raise NvhookError(f"{path}: {e.strerror}") from None
