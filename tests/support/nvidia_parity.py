"""nvhook beside NVIDIA's own answers (issue 31): the semantic view of a CDI spec and of
`list`, and the deliberate differences (README, "Where nvhook differs") applied to
NVIDIA's side, so that what is left to compare must be equal.

NVIDIA's answers are checked in under tests/data/nvidia/<profile>/, made by
scripts/nvidia-parity from the binaries in ../shared/anchors on the simulated hosts
(run by hand; `make test` does not need the binaries). The simulated root's path is
written there as ROOT_TOKEN.
"""
from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data" / "nvidia"
ROOT_TOKEN = "@ROOT@"
# The parity profiles: built-in ones, and an IMEX host from a profile file.
PROFILES = ("a100x8", "h100x8-mig", "rtx4090x1", "t4x1", "imex")
IMEX_PROFILE = DATA / "imex-profile.json"
LIB = "/usr/lib/x86_64-linux-gnu"


def expected(profile: str, name: str, root: str) -> str:
    """A checked-in NVIDIA answer with the simulated root put back."""
    return (DATA / profile / name).read_text().replace(ROOT_TOKEN, root.rstrip("/"))


def _links(edits: dict) -> list[str]:
    out = []
    for h in edits.get("hooks") or ():
        a = h.get("args") or []
        out += [a[i + 1] for i, x in enumerate(a[:-1]) if x == "--link"]
    return sorted(out)


def _nodes(edits: dict) -> list[list]:
    """(path, host path): the node a container gets, and from where. Type, mode and
    permissions are README rows (rw, not rwm); major/minor are the host node's."""
    return sorted([d["path"], d.get("hostPath", d["path"])] for d in edits.get("deviceNodes") or ())


def cdi_view(spec: dict) -> dict:
    """What a CDI spec gives a container, hook spelling aside (README: one cdi-hook
    entry for NVIDIA's create-symlinks, update-ldcache, ... hooks)."""
    top = spec["containerEdits"]
    return {
        "kind": spec["kind"],
        "env": sorted(top.get("env") or ()),
        "nodes": _nodes(top),
        "mounts": sorted([m["hostPath"], m["containerPath"]] for m in top.get("mounts") or ()),
        "links": _links(top),
        "devices": {d["name"]: {"nodes": _nodes(d["containerEdits"]), "links": _links(d["containerEdits"])}
                    for d in spec["devices"]},
    }


def nvidia_cdi_as_nvhook(view: dict, root: str, *, imex: bool = False) -> dict:
    """NVIDIA's CDI view with README's CDI rows applied:
    - `NVIDIA_CTK_LIBCUDA_DIR` (its enable-cuda-compat hook's input; nvhook's hook flag);
    - Vulkan ICD and layer files mounted at their host path, not under /etc/vulkan;
    - libGLX_indirect.so.0 links to libGLX_nvidia.so.0 (the SONAME), not the versioned file;
    - nv-fabricmanager is in the spec where the host has it;
    - libnvidia-sandboxutils (host-side: how nvidia-ctk finds a GPU's files) is not, as
      the hook does not give it (a CDI container is the hook's container);
    - --mode imex: class imex-channel (nvidia-ctk keeps gpu, whose device "0" then names
      both GPU 0 and channel 0)."""
    v = json.loads(json.dumps(view))
    v["env"] = [e for e in v["env"] if not e.startswith("NVIDIA_CTK_LIBCUDA_DIR=")]
    mounts = []
    for host, cpath in v["mounts"]:
        if "/libnvidia-sandboxutils.so." in cpath:
            continue
        if cpath.startswith("/etc/vulkan/"):
            rel = host[len(root.rstrip("/")):]
            cpath = rel if rel.startswith("/") else cpath
        mounts.append([host, cpath])
    fm = Path(root, "usr/bin/nv-fabricmanager")
    if fm.is_file() and not imex:
        mounts.append([str(fm), "/usr/bin/nv-fabricmanager"])
    v["mounts"] = sorted(mounts)
    v["links"] = sorted(f"libGLX_nvidia.so.0::{link}" if link.endswith("/libGLX_indirect.so.0") else f"{t}::{link}"
                        for t, link in (x.split("::", 1) for x in v["links"])
                        if not link.endswith("/libnvidia-sandboxutils.so.1"))
    # nvidia-ctk names the DRM by-path links with --dev-root in front (a container path
    # under the simulated root); on a host the dev root is "/" and the name is the same.
    r = root.rstrip("/")
    for dev in v["devices"].values():
        dev["links"] = sorted(x.replace("::" + r + "/", "::/") for x in dev["links"])
    if imex:
        v["kind"] = v["kind"].rsplit("/", 1)[0] + "/imex-channel"
    return v


# What nvhook's spec has beyond nvidia-ctk 1.20's on a graphics host (README rows): the
# EGL xcb/xlib platform (library and loader file; 1.20 knows gbm and wayland only), the
# driver's application profile files, and the SONAME link of each EGL platform library.
CDI_EXTRA_MOUNTS = ("libnvidia-egl-xcb.so.", "libnvidia-egl-xlib.so.", "20_nvidia_xcb.json", "20_nvidia_xlib.json",
                    "nvidia-application-profiles-")


def nvhook_cdi_without_rows(view: dict) -> dict:
    v = json.loads(json.dumps(view))
    v["mounts"] = [m for m in v["mounts"] if not m[1].rsplit("/", 1)[-1].startswith(CDI_EXTRA_MOUNTS)
                   and not m[1].endswith(CDI_EXTRA_MOUNTS)]
    v["links"] = [x for x in v["links"] if not x.startswith("libnvidia-egl-")]
    return v


# `list` (README row): the driver libraries outside nvidia-container-cli's fixed lists
# that the hook injects too (nvidia-ctk's spec has them): the EGL platform and Vulkan
# producer libraries of graphics hosts. (Graphics files and DRM nodes: only with
# --graphics, which the cli does not have.)
LIST_EXTRA_PREFIXES = (f"{LIB}/libnvidia-egl-", f"{LIB}/libnvidia-vulkan-producer.so.")


def list_view(text: str, root: str) -> list[str]:
    """`list` output as container paths, in order, README's extra libraries left out."""
    r = root.rstrip("/")
    out = []
    for line in text.splitlines():
        p = line[len(r):] if line.startswith(r + "/") else line
        if not p.startswith(LIST_EXTRA_PREFIXES):
            out.append(p)
    return out


def nvidia_list_as_nvhook(paths: list[str], root: str) -> list[str]:
    """NVIDIA's `list` with README's rows applied: /dev/nvidia-modeset only where the
    node exists."""
    have_modeset = Path(root, "dev/nvidia-modeset").exists()
    return [p for p in paths if p != "/dev/nvidia-modeset" or have_modeset]
