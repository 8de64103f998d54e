"""The runtime shim (nvhook-runtime) and the plain prestart hook for tests: their paths,
a config.toml for them on a simulated host, and a container env that asks for GPUs."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import NVHOOK, REPO

SHIM = str(REPO / ".venv/bin/nvhook-runtime")
ENV_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def gpu_env(devices: str, caps: str = "all") -> list[str]:
    """A container env asking for `devices` with driver capabilities `caps`."""
    return [ENV_PATH, f"NVIDIA_VISIBLE_DEVICES={devices}", f"NVIDIA_DRIVER_CAPABILITIES={caps}"]


def write_config(path: Path, *, root: Path, mode: str, spec_dirs=(), csv_dir: str = "",
                 extra: str = "", runtimes: bool = True) -> Path:
    """config.toml: driver root `root`, the shim in `mode` over runc, CDI specs from
    spec_dirs, csv files from csv_dir (default: csv/ beside the config); no snapshots.
    extra: more [nvhook] lines. runtimes=False: no `runtimes` key (the runtime is
    NVIDIA's default list, which the shim's front looks up itself)."""
    dirs = ", ".join(json.dumps(str(d)) for d in spec_dirs)
    text = f'''
[nvidia-container-cli]
root = "{root}"
[nvidia-container-runtime]
mode = "{mode}"
{'runtimes = ["runc"]' if runtimes else ''}
[nvidia-container-runtime.modes.cdi]
spec-dirs = [{dirs}]
[nvidia-container-runtime.modes.csv]
mount-spec-path = "{csv_dir or path.parent / 'csv'}"
[nvhook]
snapshot = false
{extra}'''
    path.write_text(text)
    return path


def prestart_hooks(config: Path) -> dict[str, Any]:
    """An OCI config's `hooks`: `nvhook prestart` with this config.toml (the legacy hook
    as the shim adds it, but with the config named)."""
    return {"prestart": [{"path": NVHOOK, "args": ["nvhook", "--config", str(config), "prestart"],
                          "env": [ENV_PATH]}]}
