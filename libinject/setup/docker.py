"""The `docker` target: dockerd's daemon.json gets the runtime `nvidia` (nvhook's shim),
and the name Docker's `--gpus` looks for its hook under is linked to nvhook's front.

daemon.json (/etc/docker/daemon.json): `runtimes.nvidia.path` = this install's
nvhook-runtime (other keys of that runtime, e.g. runtimeArgs, are kept); with
set_as_default `default-runtime: "nvidia"`; with cdi `features.cdi: true` (Docker >= 25
applies CDI devices: `--device nvidia.com/gpu=0`). Every other key is kept in its
order; the file's indent is kept (4 spaces for a new file, as Docker's docs write
it), and a file already as wanted is left byte-identical. A file that is not a JSON
object is an error and nothing changes.

`docker run --gpus` (no runtime change needed) adds a prestart hook that dockerd finds
as `nvidia-container-runtime-hook` on its PATH when it starts: a symlink of that name
in hook_dir (/usr/local/bin) to this install's nvhook-hook (the isolated front). An
entry of that name that is not ours is left alone (and said so); undo removes the link
only if it is ours.
"""
from __future__ import annotations

import json
import os

from libinject.errors import NvhookError
from libinject.setup.install import Entry, Target, edit_file, open_dir, unlink, venv_program
from libinject.setup.jsondoc import indent, parse

DAEMON_JSON = "/etc/docker/daemon.json"
HOOK_DIR = "/usr/local/bin"
HOOK_NAME = "nvidia-container-runtime-hook"
RUNTIME = "nvidia"
RESTART = "restart dockerd for it to take effect (`systemctl restart docker`)"


def edit(data: bytes | None, path: str, shim: str, *, set_as_default: bool = False,
         cdi: bool = False) -> bytes:
    """daemon.json's bytes with the nvidia runtime (and the default and CDI keys)."""
    old = parse(data, path)
    text = (data or b"").decode("utf-8")        # valid: parse() read it
    doc = json.loads(json.dumps(old))           # a deep copy, key order kept
    runtimes = doc.setdefault("runtimes", {})
    if not isinstance(runtimes, dict):
        raise NvhookError(f"{path}: \"runtimes\" is not an object; nothing changed")
    nv = runtimes.get(RUNTIME)
    if not isinstance(nv, dict):
        nv = runtimes[RUNTIME] = {}
    nv["path"] = shim
    if set_as_default:
        doc["default-runtime"] = RUNTIME
    if cdi:
        features = doc.setdefault("features", {})
        if not isinstance(features, dict):
            raise NvhookError(f"{path}: \"features\" is not an object; nothing changed")
        features["cdi"] = True
    if doc == old and data is not None and text.strip():
        return data
    out = json.dumps(doc, indent=indent(text), ensure_ascii=False)
    return (out + ("\n" if text.endswith("\n") or not text.strip() else "")).encode("utf-8")


def _link(hook_dir: str, front: str, *, dry_run: bool, undo: bool) -> str:
    """The --gpus hook name in hook_dir: linked to front (or, undoing, removed if ours)."""
    path = os.path.join(os.path.abspath(hook_dir), HOOK_NAME)
    dfd = open_dir(os.path.abspath(hook_dir), "hook directory")
    try:
        cur = Entry.read(dfd, HOOK_NAME, path)
        ours = cur is not None and cur.kind == "link" and os.fsdecode(cur.data) == front
        if undo:
            if not ours:
                return "" if cur is None else f"kept {path}: not nvhook's\n"
            if not dry_run:
                unlink(dfd, HOOK_NAME)
            return f"{'would remove' if dry_run else 'removed'} {path}\n"
        if ours:
            return f"unchanged: {path}\n"
        if cur is not None:
            what = f"a symlink to {os.fsdecode(cur.data)}" if cur.kind == "link" else "a file"
            return (f"kept {path}: not nvhook's ({what}); `docker run --gpus` runs that hook, "
                    f"not nvhook's\n")
        if not dry_run:
            Entry("link", os.fsencode(front)).put(dfd, HOOK_NAME)
        return (f"{'would link' if dry_run else 'linked'} {path} -> {front} "
                f"(`docker run --gpus`; dockerd finds it on its PATH when it starts)\n")
    finally:
        os.close(dfd)


def setup(config: str = DAEMON_JSON, *, hook_dir: str = HOOK_DIR, set_as_default: bool = False,
          cdi: bool = False, dry_run: bool = False, undo: bool = False,
          backup_dir: str | None = None) -> str:
    """Configure (or undo) dockerd for nvhook; the text to show (backup_dir: the
    store's, default libinject.setup.store.STORE_DIR)."""
    target = Target(config, store=backup_dir, make_dirs=True, fmt="json")
    shim = None if undo else venv_program("nvhook-runtime")
    front = venv_program("nvhook-hook", check=not undo)
    changed, text = edit_file(target, lambda data: edit(data, target.path, shim,
                                                         set_as_default=set_as_default, cdi=cdi),
                              dry_run=dry_run, undo=undo)
    text += _link(hook_dir, front, dry_run=dry_run, undo=undo)
    if changed and not dry_run:
        text += RESTART + "\n"
    return text
