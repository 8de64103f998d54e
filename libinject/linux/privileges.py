"""Capabilities and identity (python-prctl): keep only some capabilities, or give up
all privileges (another user, no capabilities, no new privileges)."""
from __future__ import annotations

import errno
import os
from typing import AbstractSet

import prctl

from libinject.linux.proc import proc_fd

_CAP_LAST_CAP: int | None = None


def cap_last_cap() -> int:
    """The highest capability this kernel knows (read once per process)."""
    global _CAP_LAST_CAP
    if _CAP_LAST_CAP is None:
        try:
            with open("sys/kernel/cap_last_cap",
                      opener=lambda p, f: os.open(p, f, dir_fd=proc_fd())) as fh:
                _CAP_LAST_CAP = int(fh.read())
        except OSError:
            return max(prctl.ALL_CAPS)
    return _CAP_LAST_CAP


def limit_capabilities(keep: AbstractSet[int], *, last_cap: int | None = None) -> None:
    """Keep only `keep` in the effective, permitted and bounding sets of this process
    and clear the inheritable set (and with it the ambient one), so what runs later in
    this process cannot use the rest. The bounding set needs CAP_SETPCAP: without it
    (not root) that part is skipped."""
    if last_cap is None:
        last_cap = cap_last_cap()
    unknown = set(range(last_cap + 1)) - set(prctl.ALL_CAPS)
    if unknown:
        # capset through python-prctl only names the capabilities it was built with:
        # the kernel's newer ones would stay set (fail closed instead)
        raise OSError(errno.EINVAL, f"python-prctl does not know capability {min(unknown)} "
                      "of this kernel; cannot drop it")
    for cap in range(last_cap + 1):
        if cap not in keep:
            try:
                prctl.capbset_drop(cap)
            except (OSError, ValueError):
                pass
    # One capset(2) for all three sets (prctl's per-set limit() is three round trips).
    # The kernel clears ambient capabilities that are no longer permitted and inheritable.
    drop = [c for c in prctl.ALL_CAPS if c not in keep]
    prctl.set_caps((drop, (prctl.CAP_EFFECTIVE, prctl.CAP_PERMITTED), False),
                   (list(prctl.ALL_CAPS), prctl.CAP_INHERITABLE, False))


def drop_all(user: tuple[int, int] | None = None) -> None:
    """Become `user` (uid, gid; no supplementary groups) if given, then set
    no_new_privs and empty every capability set: bounding (while still root),
    effective, permitted, inheritable and ambient."""
    if user is not None:
        os.setgroups([])
        os.setresgid(user[1], user[1], user[1])
        os.setresuid(user[0], user[0], user[0])
    prctl.set_no_new_privs(1)
    limit_capabilities(frozenset())
