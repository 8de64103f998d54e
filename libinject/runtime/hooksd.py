"""hooks.d configs (the OCI hooks 1.0.0 format) for CRI-O and podman.

Two variants of one hook, installed one at a time (both would run it twice):
- "always": every container; the hook itself decides (its compiled front exits at once
  for containers that want no GPU);
- "annotation": only containers with a CDI annotation naming an nvidia.com/gpu device
  (`cdi.k8s.io/<x>: nvidia.com/gpu=1`), which the hook takes as the device list.

The repository's hooks.d/*.json are render(variant) with the placeholder path; a test
keeps them in sync.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from libinject.constants import SAFE_PATH
from libinject.errors import NvhookError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DEFAULT_DIR = "/usr/share/containers/oci/hooks.d"
PLACEHOLDER_PATH = "/usr/local/libexec/nvhook/nvhook-hook"
FILES = {"always": "oci-nvhook.json", "annotation": "oci-nvhook-annotated.json"}
HOOK_ENV_PATH = f"PATH={SAFE_PATH}"
WHEN = {
    "always": {"always": True},
    "annotation": {"annotations": {r"^cdi\.k8s\.io/": r"nvidia\.com/gpu="}},
}


def default_hook_path() -> str:
    """The compiled front installed next to this venv's python (make venv builds it)."""
    from libinject.installpath import program

    return program("nvhook-hook")


def render(variant: str = "always", hook_path: str | None = None,
           config: str | None = None, socket: str | None = None) -> dict[str, Any]:
    """socket: the hook service's socket the hook tries first (`nvhook serve
    --socket`), when not the default one."""
    if variant not in FILES:
        raise NvhookError(f"unknown hooks.d variant {variant!r} (choose: {', '.join(FILES)})")
    path = hook_path or PLACEHOLDER_PATH
    if not path.startswith("/"):
        raise NvhookError(f"hook path must be absolute: {path}")
    if socket is not None and not socket.startswith("/"):
        raise NvhookError(f"hook service socket must be an absolute path: {socket}")
    args = (["nvhook-hook"] + (["--config", config] if config else [])
            + (["--socket", socket] if socket else []) + ["prestart"])
    return {
        "version": "1.0.0",
        "hook": {"path": path, "args": args, "env": [HOOK_ENV_PATH]},
        "when": WHEN[variant],
        "stages": ["prestart"],
    }


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2) + "\n"


def install(directory: str = DEFAULT_DIR, variant: str = "always", hook_path: str | None = None,
            config: str | None = None, socket: str | None = None) -> Path:
    """Write the variant's file into directory (atomically) and remove the other variant's
    file there, so the hook is injected once. Returns the file written."""
    path = hook_path or default_hook_path()
    if not os.access(path, os.X_OK):
        # podman and CRI-O refuse a hooks.d file whose hook path does not exist
        raise NvhookError(f"hook {path} is not an executable file (run `make venv`)")
    doc = render(variant, path, config, socket)
    from libinject.linux.atomic import write_atomic

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    target = d / FILES[variant]
    write_atomic(str(target), dumps(doc).encode(), 0o644)
    for other, name in FILES.items():
        if other != variant:
            (d / name).unlink(missing_ok=True)
    return target
