"""Reading and changing a simulated host (libinject.sim): its profile, extra shared
libraries in it, and its ld.so.cache."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

COMPILE_TIMEOUT = 60
# Two GeForce GPUs with the graphics surface (DRM nodes card0/renderD128, card1/renderD129),
# for graphics selection and trust tests (the conftest fixture geforce2_host builds it).
TWO_GEFORCE = {
    "description": "two GeForce GPUs, for graphics selection and trust tests",
    "graphics": True, "modeset": True,
    "gpus": [{"name": "NVIDIA GeForce RTX 4090", "bus_id": "0000:01:00.0", "architecture": "Ada",
              "memory_mib": 24564, "pci_device_id": "0x268410DE"},
             {"name": "NVIDIA GeForce RTX 4080", "bus_id": "0000:41:00.0", "architecture": "Ada",
              "memory_mib": 16376, "pci_device_id": "0x270410DE"}],
}


def profile_of(root: Path) -> dict:
    """The profile the simulated host at root was built from."""
    return json.loads((root / "etc/nvhook-sim/profile.json").read_text())


def compile_lib(path: Path, soname: str, m32: bool = False) -> Path:
    """A small shared library (x86-64, or i386 with m32) with the given SONAME at path,
    parent dirs made; nothing else is written beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", *(["-m32"] if m32 else []), "-shared", "-fPIC", "-nostdlib",
                    f"-Wl,-soname,{soname}", "-o", str(path), "-x", "c", "-"],
                   input=b"int extra_fn(void) { return 1; }\n", check=True, timeout=COMPILE_TIMEOUT)
    return path


def ldconfig(root: Path) -> None:
    """Rebuild root's ld.so.cache with the host's ldconfig."""
    subprocess.run(["ldconfig", "-r", str(root)], check=True, capture_output=True,
                   timeout=COMPILE_TIMEOUT)
