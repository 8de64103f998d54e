"""nvhook runtime [runc args] (console script nvhook-runtime): the runtime shim.

Takes runc's own arguments unparsed (RAW): every command is exec'd on the low-level
runtime unchanged, `create` after rewriting the bundle's config.json for the mode in
config.toml (libinject.runtime.shim). Config from $NVHOOK_CONFIG or the default path.
"""
from __future__ import annotations

RAW = True


def run_raw(argv: list[str]) -> int:
    from libinject.runtime import shim

    return shim.main(argv)
