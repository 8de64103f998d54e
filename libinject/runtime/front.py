"""What the compiled front (csrc/hookfront.c) tells the exec'd Python besides its argv
and the state: where the runtime started the hook."""
from __future__ import annotations

import os


def start_cwd() -> str | None:
    # hookfront chdirs to "/" before exec and tells us where the runtime started it.
    cwd = os.environ.get("NVHOOK_HOOK_CWD")
    if cwd:
        return cwd
    try:
        return os.getcwd()
    except OSError:
        return None
