"""Capabilities and identity (python-prctl): keep only some capabilities, or give up
all privileges (another user, no capabilities, no new privileges), and the other
prctl(2) calls nvhook makes.

Through python-prctl's C module `_prctl`: its Python wrapper (`prctl`) builds objects
for every capability and securebit at import, ~1.4 ms of the exec'd hook's start-up
for the four calls made here."""
from __future__ import annotations

import errno
import os

import _prctl

from libinject.linux.proc import proc_fd

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import AbstractSet

_CAP_LAST_CAP: int | None = None
_ALL_KNOWN_UP_TO = -1       # python-prctl knows every capability up to this one (checked)
# Every capability python-prctl was built with (as prctl.ALL_CAPS).
ALL_CAPS = tuple(sorted({getattr(_prctl, n) for n in dir(_prctl) if n.startswith("CAP_")
                         and n not in ("CAP_EFFECTIVE", "CAP_PERMITTED", "CAP_INHERITABLE")}))


def cap_last_cap() -> int:
    """The highest capability this kernel knows (read once per process)."""
    global _CAP_LAST_CAP
    if _CAP_LAST_CAP is None:
        try:
            with open("sys/kernel/cap_last_cap",
                      opener=lambda p, f: os.open(p, f, dir_fd=proc_fd())) as fh:
                _CAP_LAST_CAP = int(fh.read())
        except OSError:
            return max(ALL_CAPS)
    return _CAP_LAST_CAP


def _bounding_set() -> int:
    """This thread's bounding set as the kernel reports it (CapBnd in
    /proc/thread-self/status); every bit set when it cannot be read (drop them all)."""
    try:
        fd = os.open("thread-self/status", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc_fd())
    except OSError:
        return -1
    try:
        text = os.read(fd, 1 << 16)
    except OSError:
        return -1
    finally:
        os.close(fd)
    i = text.find(b"\nCapBnd:")
    if i < 0:
        return -1
    try:
        return int(text[i + 8:text.index(b"\n", i + 1)].strip(), 16)
    except ValueError:
        return -1


def limit_capabilities(keep: AbstractSet[int], *, last_cap: int | None = None) -> None:
    """Keep only `keep` in the effective, permitted and bounding sets of this process
    and clear the inheritable set (and with it the ambient one), so what runs later in
    this process cannot use the rest. The bounding set needs CAP_SETPCAP: without it
    (not root) that part is skipped."""
    global _ALL_KNOWN_UP_TO
    if last_cap is None:
        last_cap = cap_last_cap()
    if last_cap != _ALL_KNOWN_UP_TO:
        unknown = set(range(last_cap + 1)) - set(ALL_CAPS)
        if unknown:
            # capset through python-prctl only names the capabilities it was built with:
            # the kernel's newer ones would stay set (fail closed instead)
            raise OSError(errno.EINVAL, f"python-prctl does not know capability {min(unknown)} "
                          "of this kernel; cannot drop it")
        _ALL_KNOWN_UP_TO = last_cap
    # Only what the kernel says is still in this thread's bounding set: a served worker
    # drops at set-up and the applier again, and one prctl per capability is ~30 calls.
    bound = _bounding_set()
    for cap in range(last_cap + 1):
        if cap not in keep and bound >> cap & 1:
            try:
                _prctl.prctl(_prctl.PR_CAPBSET_DROP, cap)
            except (OSError, ValueError):
                pass
    # One capset(2) for all three sets (prctl's per-set limit() is three round trips).
    # The kernel clears ambient capabilities that are no longer permitted and inheritable.
    # _prctl.set_caps(effective, permitted, inheritable to set; the same to clear)
    drop = [c for c in ALL_CAPS if c not in keep]
    _prctl.set_caps([], [], [], drop, drop, list(ALL_CAPS))


def drop_all(user: tuple[int, int] | None = None) -> None:
    """Become `user` (uid, gid; no supplementary groups) if given, then set
    no_new_privs and empty every capability set: bounding (while still root),
    effective, permitted, inheritable and ambient."""
    if user is not None:
        os.setgroups([])
        os.setresgid(user[1], user[1], user[1])
        os.setresuid(user[0], user[0], user[0])
    no_new_privs()
    limit_capabilities(frozenset())


def no_new_privs() -> None:
    """PR_SET_NO_NEW_PRIVS: nothing exec'd from here on gains privileges (setuid, file caps)."""
    _prctl.prctl(_prctl.PR_SET_NO_NEW_PRIVS, 1)


def set_pdeathsig(sig: int) -> None:
    """Get `sig` when the thread that forked us exits."""
    _prctl.prctl(_prctl.PR_SET_PDEATHSIG, sig)


def set_name(name: str) -> None:
    """The name ps shows (PR_SET_NAME; 15 bytes kept)."""
    _prctl.prctl(_prctl.PR_SET_NAME, name)
