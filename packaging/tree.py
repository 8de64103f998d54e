"""The installed tree every package (.deb, .rpm) carries, staged by stage_tree:
  /usr/lib/nvhook/<version>/  the bundle (packaging/build_bundle.py): nvhook with its own
                              CPython, glibc and libraries, so the package needs nothing of
                              the node's userland (no distribution Python)
  /usr/lib/nvhook/current     -> <version>: what the units, the alternative and /usr/bin
                              name, so an upgrade is the new directory and this link renamed
  /usr/lib/nvhook/bin         -> current/bin: the path 0.1.0's engine configs name
  /usr/bin/nvhook, nvhook-hook, nvhook-runtime   links through current
  /usr/lib/systemd/system/    nvhook-serve.service and nvhook-cdi-refresh.service
  /usr/share/nvhook/config.toml   the default config (postinst copies it where none is)
  /usr/share/doc/nvhook/      README.md and copyright
  EXTRA_FILES                 anything else every package ships (udev rules, units, ...)
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import arch as archmod
from build_bundle import build as build_bundle
from common import HERE, REPO

LIBDIR = "/usr/lib/nvhook"
CURRENT = f"{LIBDIR}/current"
PROGRAMS = ("nvhook", "nvhook-hook", "nvhook-runtime")
UNITS = ("nvhook-serve.service", "nvhook-cdi-refresh.service")
# Further files every package installs: (source relative to the checkout, installed path,
# mode). The place for a udev rule or a unit of another feature.
EXTRA_FILES: list[tuple[str, str, int]] = [
    # /dev/char links at boot and when the driver binds (nvhook system create-dev-char-symlinks)
    ("packaging/udev/71-nvhook-dev-char.rules", "/usr/lib/udev/rules.d/71-nvhook-dev-char.rules", 0o644),
    ("packaging/systemd/nvhook-dev-char.service", "/usr/lib/systemd/system/nvhook-dev-char.service", 0o644),
]


def _units(stage: Path) -> None:
    sys.path.insert(0, str(REPO))
    from libinject.setup.service import TEMPLATES, UNITS as COMMANDS, read_template, render_unit

    dest = stage / "usr/lib/systemd/system"
    dest.mkdir(parents=True)
    for unit in UNITS:
        template = os.path.join(TEMPLATES, unit)
        text = render_unit(read_template(template), f"{CURRENT}/bin/nvhook-hook", None, COMMANDS[unit], template)
        (dest / unit).write_bytes(text)


def stage_tree(stage: Path, work: Path, version: str, arch: archmod.Arch = archmod.ARCHES["amd64"]) -> None:
    """The installed tree (module doc) under stage, for arch's nodes."""
    build_bundle(f"{LIBDIR}/{version}", stage, work, version=version, arch=arch)
    os.symlink(version, stage / CURRENT.lstrip("/"))
    # 0.1.0's program dir, which engine configs it set up name (packaging/deb/preinst).
    os.symlink("current/bin", stage / LIBDIR.lstrip("/") / "bin")
    (stage / "usr/bin").mkdir(parents=True)
    for name in PROGRAMS:
        os.symlink(f"../lib/nvhook/current/bin/{name}", stage / "usr/bin" / name)
    _units(stage)
    share = stage / "usr/share/nvhook"
    share.mkdir(parents=True)
    shutil.copy(HERE / "deb/config.toml", share / "config.toml")
    doc = stage / "usr/share/doc/nvhook"
    doc.mkdir(parents=True)
    shutil.copy(REPO / "README.md", doc / "README.md")
    shutil.copy(HERE / "copyright", doc / "copyright")
    (stage / "etc/nvidia-container-runtime").mkdir(parents=True)
    for src, dest, mode in EXTRA_FILES:
        path = stage / dest.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / src, path)
        os.chmod(path, mode)
