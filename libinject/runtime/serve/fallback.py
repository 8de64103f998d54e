"""The log line of a start the service did not take: the compiled front (csrc/serveclient.h)
said why on stderr and passes the same word in ENV to the Python it execs, which writes it
to the log file through its own Log (so the line lands where the start's other lines do).
Only the words below are ever logged: the variable's value is never echoed."""
from __future__ import annotations

import os

ENV = "NVHOOK_SERVE_FALLBACK"       # as csrc/shimfront.c's FALLBACK_ENV
WHY = {
    "timeout": "did not take the start within 5 s",
    "declined": "declined the start",
    "untrusted": "is not one this front may use (not root's, or not in its namespaces)",
}


def note(log, what: str) -> None:
    """Log (a libinject.log.Log) the front's fallback, if there was one, and drop ENV
    from our environment (nothing we exec gets it). what: the stage, or the shim's command."""
    word = os.environ.pop(ENV, None)
    if word is not None:
        why = WHY.get(word, "did not take the start")
        log.write("warning", f"{what}: hook service {why}; running it without the service")
