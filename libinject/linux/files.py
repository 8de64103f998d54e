"""Reading files we are handed (config.toml, an OCI spec, a CDI spec) with a size bound,
so a huge or endless file is a clear error, not memory exhaustion."""
from __future__ import annotations

from libinject.errors import NvhookError


def read_bounded(path: str, limit: int, what: str, *, missing_ok: bool = False) -> bytes | None:
    """The whole file, at most `limit` bytes; NvhookError naming `what` and path otherwise.
    A missing file is None when missing_ok (callers with a default)."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise NvhookError(f"cannot read {what} {path}: No such file or directory") from None
    except OSError as e:
        raise NvhookError(f"cannot read {what} {path}: {e.strerror}") from None
    if len(data) > limit:
        raise NvhookError(f"{what} {path} is larger than {limit} bytes")
    return data
