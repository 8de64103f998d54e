"""Where this install's programs are: the one home of that answer (engine configs, hooks.d
files, CDI hooks and systemd units all name them).

The directory of the running interpreter, which holds the compiled fronts (`make venv`,
a wheel's scripts, the Debian package's venv, the bundle). A versioned install reached
through a `current` link beside it (the Kubernetes DaemonSet's
/usr/local/lib/nvhook/<version>, with `current` -> <version>) is named through that
link: the files nvhook writes then stay the same across upgrades, so an upgrade needs no
engine restart and a later --undo still recognises them.
"""
from __future__ import annotations

import os
import sys


def bin_dir() -> str:
    here = os.path.dirname(os.path.abspath(sys.executable))
    prefix = os.path.dirname(here)
    current = os.path.join(os.path.dirname(prefix), "current")
    try:
        target = os.readlink(current)
        ours = target.rstrip("/") in (os.path.basename(prefix), prefix) and os.path.samefile(current, prefix)
    except OSError:         # no link, or one that leads nowhere
        return here
    return os.path.join(current, os.path.basename(here)) if ours else here


def program(name: str) -> str:
    """This install's program `name` (nvhook-hook, nvhook-runtime, nvhook)."""
    return os.path.join(bin_dir(), name)
