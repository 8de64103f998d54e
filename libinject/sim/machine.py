"""The host's architecture as a simulated GPU host (and a sim rootfs) lays it out: its
multiarch dir, its glibc's ELF loader and the path its programs name for it, and the
32-bit arch its compiler also builds (x86_64: i386 with -m32; aarch64: none, as NVIDIA's
arm64 driver has no 32-bit libraries)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from libinject.errors import NvhookError


@dataclass(frozen=True)
class Machine:
    name: str               # uname -m
    triplet: str            # the multiarch dir: lib/<triplet>, usr/lib/<triplet>
    loader: str             # glibc's ELF loader in lib/<triplet>
    loader_link: str        # where programs' PT_INTERP names it, relative to the root
    compat32: str | None    # the 32-bit arch (libinject.sim.build.ARCHES) built beside it


MACHINES = {
    "x86_64": Machine("x86_64", "x86_64-linux-gnu", "ld-linux-x86-64.so.2", "lib64/ld-linux-x86-64.so.2", "i386"),
    "aarch64": Machine("aarch64", "aarch64-linux-gnu", "ld-linux-aarch64.so.1", "lib/ld-linux-aarch64.so.1", None),
}


def native() -> Machine:
    """This host's machine (uname -m)."""
    return get(os.uname().machine)


def get(name: str) -> Machine:
    try:
        return MACHINES[name]
    except KeyError:
        raise NvhookError(f"simulated GPU hosts are built for {' and '.join(MACHINES)}, not {name}") from None
