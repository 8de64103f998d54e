"""nvhook prestart | createContainer | poststart | poststop: the OCI hook.

The work is libinject.runtime.hook's (shared with `nvhook serve`); this module only
describes the command for argparse.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.description = (f"OCI {name} hook: reads the container state JSON on stdin."
                     if name in ("prestart", "createContainer") else
                     f"OCI {name} hook: reads the container state on stdin and does nothing "
                     "(as NVIDIA's hook); accepted so an OCI config naming it works.")


def run(args: argparse.Namespace) -> int:
    from libinject.runtime.hook import run as run_hook

    return run_hook(args)
