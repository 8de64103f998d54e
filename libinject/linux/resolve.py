"""Paths resolved by fd inside a root (a container's rootfs, an image): openat2(2)
retried on EAGAIN, the flags that keep a walk inside the root, and a container path's
components."""
from __future__ import annotations

from libinject.errors import NvhookError
from libinject.linux import native

RESOLVE = native.RESOLVE_IN_ROOT | native.RESOLVE_NO_MAGICLINKS


def openat2(dirfd: int, path: str, flags: int, resolve: int) -> int:
    """openat2 that retries EAGAIN: with RESOLVE_IN_ROOT/BENEATH the kernel refuses a
    '..' walk that raced with any rename or mount on the system, asking us to retry."""
    for _ in range(1000):
        try:
            return native.openat2(dirfd, path, flags, 0, resolve)
        except BlockingIOError:
            continue
    return native.openat2(dirfd, path, flags, 0, resolve)


def split(path: str) -> list[str]:
    """Container path -> components. Absolute paths only; '..' is refused (a planned
    path never needs it, and RESOLVE_IN_ROOT would clamp it anyway)."""
    if not path.startswith("/"):
        raise NvhookError(f"container path must be absolute: {path!r}")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise NvhookError(f"container path must not contain '..': {path!r}")
    return parts
