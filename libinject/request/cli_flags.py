"""`nvhook configure` flags -> Request (pure: no I/O).

Meanings as nvidia-container-cli's configure: --device and --mig-* values joined with
","; no --device = driver only (no GPU); capability flags as given (none = no driver
libraries or binaries); --require repeatable; @PATH for --ldconfig = a host path.
"""
from __future__ import annotations

import argparse
import posixpath

from libinject.errors import NvhookError
from libinject.request.model import Request
from libinject.request.oci_state import PID_MAX

CAPABILITY_FLAGS = ("compute", "utility", "video", "graphics", "display", "ngx", "compat32")
COMPAT_MODES = ("mount", "ldconfig", "disabled")
DEFAULT_LDCONFIG = "@/sbin/ldconfig"


def _join(values: list[str] | None) -> str | None:
    if not values:
        return None
    return ",".join(values)


def check_rootfs(rootfs: str) -> str:
    """An absolute rootfs that is not the host's root however it is spelled ("/.",
    "/tmp/..", "//"): normalized first, then "/" refused. (A symlink to "/" is the
    caller's to refuse: this is pure.)"""
    norm = posixpath.normpath(rootfs) if rootfs.startswith("/") else ""
    if not norm or norm.strip("/") == "":   # normpath keeps a leading "//"
        raise NvhookError("input error: invalid rootfs directory")
    return rootfs


def check_pid(pid: str | int | None) -> int | None:
    if pid is None:
        return None
    # ASCII digits only: int() also takes "١٢" and " +5", and raises past 4300 digits.
    text = str(pid)
    if not (text.isascii() and text.isdigit() and len(text) <= 10) or not 0 < int(text) <= PID_MAX:
        raise NvhookError(f"input error: invalid pid: {text[:20]}")
    return int(text)


def build(args: argparse.Namespace) -> Request:
    """The Request a configure command line asks for."""
    caps = frozenset(c for c in CAPABILITY_FLAGS if getattr(args, c.replace("-", "_"), False))
    mode = getattr(args, "cuda_compat_mode", None) or "ldconfig"
    if mode not in COMPAT_MODES:
        raise NvhookError(f"input error: invalid cuda-compat-mode: {mode} (one of {', '.join(COMPAT_MODES)})")
    ldconfig = getattr(args, "ldconfig", None) or DEFAULT_LDCONFIG
    devices = _join(getattr(args, "device", None))
    return Request(
        devices=devices if devices is not None else "none",
        capabilities=caps,
        modeset_required="display" in caps,
        requirements=tuple(getattr(args, "require", None) or ()),
        disable_require=False,
        mig_config=_join(getattr(args, "mig_config", None)),
        mig_monitor=_join(getattr(args, "mig_monitor", None)),
        imex_channels=_join(getattr(args, "imex_channel", None)),
        no_cgroups=bool(getattr(args, "no_cgroups", False)),
        no_devbind=bool(getattr(args, "no_devbind", False)),
        no_persistenced=bool(getattr(args, "no_persistenced", False)),
        no_fabricmanager=bool(getattr(args, "no_fabricmanager", False)),
        no_gsp_firmware=bool(getattr(args, "no_gsp_firmware", False)),
        cuda_compat_mode=mode,
        ldconfig=ldconfig,
    )
