"""The CDI hook's request, from the container's OCI config (config.json, data: it can
only choose for itself): which of the driver's device nodes the container was given, and
which libraries the runtime bind-mounted into the hook's library folders (the CDI spec's
mounts). The hook entry's own flags (the spec's hook argv, the admin's) come with it
(libinject.runtime.cdi_hooks.parse_argv); discovery (the host's /proc/driver/nvidia,
libinject.discover.procfs) and the plan (libinject.plan.cdi_hook) follow, as they follow
the prestart hook's request (libinject.pipeline)."""
from __future__ import annotations

import os

from libinject.constants import CAPS_DIR, NVIDIA_MAJOR

CAPS_NODE = f"{CAPS_DIR}/nvidia-cap"
MAX_SPEC_MOUNTS = 4096      # of a container's config.json mounts looked at (a real one: ~60)


def allowed(rules: list, typ: str, major, minor) -> bool:
    """The OCI device cgroup verdict for a node: the last matching rule wins."""
    verdict = False
    for r in rules:
        if r.get("type", "a") not in ("a", typ):
            continue
        if r.get("major") is not None and r.get("major") != major:
            continue
        if r.get("minor") is not None and r.get("minor") != minor:
            continue
        access = r.get("access", "rwm") or ""
        if "r" in access or "w" in access:
            verdict = bool(r.get("allow"))
    return verdict


def _gpu_node(d: dict) -> bool:
    return (d.get("major") == NVIDIA_MAJOR and isinstance(d.get("path"), str)
            and d["path"].removeprefix("/dev/nvidia").isdigit())


def given_devices(spec: dict) -> tuple[set, set]:
    """(GPU minors, nvidia-caps minors) of the nodes in linux.devices that the
    container's cgroup rules (linux.resources.devices) let it open."""
    linux = spec.get("linux") or {}
    rules = [r for r in (linux.get("resources") or {}).get("devices") or () if isinstance(r, dict)]
    devs = [d for d in linux.get("devices") or ()
            if isinstance(d, dict) and allowed(rules, d.get("type", "c"), d.get("major"), d.get("minor"))]
    gpus = {d.get("minor") for d in devs if _gpu_node(d)}
    caps = {d.get("minor") for d in devs if isinstance(d.get("path"), str) and d["path"].startswith(CAPS_NODE)}
    return gpus, caps


def gpu_nodes(spec: dict) -> set:
    """The minors of every /dev/nvidia<N> in linux.devices (cgroup rules aside)."""
    return {d.get("minor") for d in (spec.get("linux") or {}).get("devices") or ()
            if isinstance(d, dict) and _gpu_node(d)}


def runtime_libraries(spec: dict, folders: tuple[str, ...]) -> tuple[str, ...]:
    """The container paths of the runtime's bind mounts into `folders` (the CDI spec's
    library mounts, as the engine put them in the container's config), by container path
    alone. The hook reads them where the runtime mounted them (at createRuntime and
    createContainer the mounts are made), so the spec need not list them again
    (`--library`, ~30 arguments of host::container paths that podman parses on every
    start). The config is the container's, so it chooses only which files *of the
    container* get ld cache entries, as a user's own volume into a library dir gets one
    from ldconfig; their ELF headers are read bounded, by fd, regular files only."""
    inside = {f.rstrip("/") for f in folders}
    out: dict[str, None] = {}
    mounts = spec.get("mounts")
    for m in mounts[:MAX_SPEC_MOUNTS] if isinstance(mounts, list) else ():
        if not isinstance(m, dict):
            continue
        dest, opts = m.get("destination"), m.get("options")
        bind = m.get("type") == "bind" or (isinstance(opts, list) and ("bind" in opts or "rbind" in opts))
        if not bind or not isinstance(dest, str) or not dest.startswith("/") or "\0" in dest:
            continue
        dest = os.path.normpath(dest)
        if os.path.dirname(dest) in inside:
            out.setdefault(dest)
    return tuple(out)
