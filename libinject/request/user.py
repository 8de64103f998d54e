"""Who discovery runs as: "UID[:GID]" or "name[:group]", wherever it is written.

One parser for `--user`, `[nvidia-container-cli] user` (NVIDIA's example is
"root:video") and every command that discovers. A numeric uid without a group takes
that user's primary group when the host knows the uid, else the same number.
Names are looked up in the host's user database (the caller's mount namespace: the
hook reads it before entering any container).
"""
from __future__ import annotations

from libinject.errors import NvhookError

MAX_ID = (1 << 32) - 2          # (uid_t)-1 means "no change" to the kernel


def _id(text: str) -> int | None:
    # ASCII digits only: str.isdigit() also accepts "²" and other digits int() refuses.
    if text and text.isascii() and text.isdigit() and len(text) <= 10:
        n = int(text)
        if n <= MAX_ID:
            return n
    return None


def parse_user(spec: str | None, what: str = "user") -> tuple[int, int] | None:
    """(uid, gid) for spec, None when spec is empty; NvhookError naming `what`."""
    if not spec:
        return None
    import grp
    import pwd

    name, _, group = spec.partition(":")
    try:
        uid = _id(name)
        if uid is not None:
            try:
                gid = pwd.getpwuid(uid).pw_gid
            except KeyError:
                gid = uid
        elif name and not name.isdigit():
            pw = pwd.getpwnam(name)
            uid, gid = pw.pw_uid, pw.pw_gid
        else:
            raise NvhookError(f"{what}: invalid user {spec!r}")
        if group:
            g = _id(group)
            if g is None and group.isdigit():
                raise NvhookError(f"{what}: invalid group {spec!r}")
            gid = g if g is not None else grp.getgrnam(group).gr_gid
    except (KeyError, ValueError, OverflowError):
        # ValueError: a NUL in the name; KeyError: unknown to the host
        raise NvhookError(f"{what}: unknown user or group {spec!r}") from None
    return uid, gid
