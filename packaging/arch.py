"""The architectures the packages are built for (`make deb ARCH=arm64`, the scripts'
--arch): their names in each packaging system, and how their bundle is made.

amd64 is built from this (Debian 12 amd64) machine's own Python and libraries. arm64
is cross-built: Debian 12's arm64 packages of the interpreter, its standard library and
the libraries they link are extracted (mmdebstrap --variant=extract, nothing run) into a
sysroot the bundle is made from; C (the static fronts, the cffi module, python-prctl,
the simulated GPU's prebuilt objects) is compiled by clang for aarch64 against Debian's
arm64 cross libc (libc6-dev-arm64-cross: gcc-aarch64-linux-gnu cannot be installed
beside gcc-multilib, which the i386 simulated libraries need), and wheels from PyPI are
the manylinux aarch64 ones.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from common import fail, run, step

SUITE = "bookworm"      # the Debian release whose packages make the bundle
# What the sysroot is made of (their dependencies come along): the interpreter and its
# standard library, its headers (pyconfig.h, for C extensions), libcap (python-prctl).
SYSROOT_PACKAGES = ("python3.11-minimal", "libpython3.11-stdlib", "libpython3.11-dev", "libcap-dev")


@dataclass(frozen=True)
class Arch:
    deb: str                # Debian's name: the .deb's Architecture
    rpm: str                # rpm's name
    machine: str            # uname -m on such a node
    triplet: str            # Debian's multiarch dir
    loader: str             # glibc's ELF loader
    cross: tuple[str, ...]  # the C compiler command, () for this machine's own gcc
    glibc: int              # Debian 12's glibc: 2.<glibc>

    def pip_platforms(self) -> list[str]:
        """pip --platform args for PyPI's wheels of this machine: each manylinux tag up to
        this glibc's (pip does not expand one to the older ones it implies) and local wheels."""
        tags = [f"manylinux_2_{n}_{self.machine}" for n in range(self.glibc, 16, -1)]
        return [arg for tag in (*tags, f"manylinux2014_{self.machine}", f"linux_{self.machine}")
                for arg in ("--platform", tag)]

    @property
    def native(self) -> bool:
        return not self.cross


ARCHES = {
    "amd64": Arch("amd64", "x86_64", "x86_64", "x86_64-linux-gnu", "ld-linux-x86-64.so.2", (),
                  36),
    "arm64": Arch("arm64", "aarch64", "aarch64", "aarch64-linux-gnu", "ld-linux-aarch64.so.1",
                  ("clang", "--target=aarch64-linux-gnu", "-Wno-unknown-warning-option"),
                  36),
}
# The tools a cross build needs, and the Debian packages that have them.
CROSS_TOOLS = {"clang": "clang", "aarch64-linux-gnu-ld": "binutils-aarch64-linux-gnu",
               "aarch64-linux-gnu-strip": "binutils-aarch64-linux-gnu", "mmdebstrap": "mmdebstrap"}
CROSS_FILES = {"/usr/aarch64-linux-gnu/lib/libc.a": "libc6-dev-arm64-cross",
               "/usr/lib/gcc-cross/aarch64-linux-gnu/12/crtbeginT.o": "libgcc-12-dev-arm64-cross"}


def get(name: str) -> Arch:
    """By its Debian or rpm name (arm64 or aarch64)."""
    for a in ARCHES.values():
        if name in (a.deb, a.rpm):
            return a
    fail(f"--arch must be one of {', '.join(ARCHES)}: {name!r}")
    raise AssertionError


def check_tools(arch: Arch) -> None:
    if arch.native:
        return
    missing = sorted({pkg for tool, pkg in CROSS_TOOLS.items() if not shutil.which(tool)}
                     | {pkg for path, pkg in CROSS_FILES.items() if not os.path.exists(path)})
    if missing:
        fail(f"building for {arch.deb} needs {', '.join(missing)} (apt-get install {' '.join(missing)})")


def strip_tool(arch: Arch) -> str:
    return "strip" if arch.native else f"{arch.triplet}-strip"


def sysroot(arch: Arch, dest: Path) -> Path:
    """Debian's packages for arch (SYSROOT_PACKAGES and their dependencies) extracted in
    dest, their absolute links made relative so they resolve inside it."""
    step(f"extracting Debian {SUITE}'s {arch.deb} packages (mmdebstrap, from the Debian mirror)")
    run(["mmdebstrap", "--quiet", "--variant=extract", f"--architectures={arch.deb}",
         f"--include={','.join(SYSROOT_PACKAGES)}", SUITE, str(dest)], timeout=900)
    for top, dirs, files in os.walk(dest):
        for name in files + dirs:
            path = os.path.join(top, name)
            target = os.readlink(path) if os.path.islink(path) else ""
            if target.startswith("/"):
                os.unlink(path)
                os.symlink(os.path.relpath(os.path.join(dest, target.lstrip("/")), top), path)
    return dest


def cross_env(arch: Arch, root: Path) -> dict[str, str]:
    """The environment a setuptools build (the nvhook wheel, an sdist's C extension)
    compiles for arch in: the cross compiler for CC (setup.py's fronts use it too),
    the sysroot's headers after the cross libc's (Python's pyconfig.h, sys/capability.h)
    and its libraries, the extension's file name and the wheel's platform tag."""
    cc = " ".join(arch.cross)
    return dict(os.environ, CC=cc, LDSHARED=f"{cc} -shared",
                CFLAGS=f"-idirafter {root}/usr/include", LDFLAGS=f"-L{_dev_libs(arch, root)}",
                SETUPTOOLS_EXT_SUFFIX=f".cpython-311-{arch.triplet}.so",
                _PYTHON_HOST_PLATFORM=f"linux-{arch.machine}")


def _dev_libs(arch: Arch, root: Path) -> Path:
    """A dir of the sysroot's libraries to link with (lib*.so), but those the cross libc
    has: the sysroot's libc.so is a linker script naming /lib paths of an arm64 machine."""
    out = root.parent / f"{root.name}-devlibs"
    if not out.is_dir():
        out.mkdir()
        libc = Path(f"/usr/{arch.triplet}/lib")
        for lib in sorted((root / "usr/lib" / arch.triplet).glob("lib*.so")):
            if not (libc / lib.name).exists():
                os.symlink(lib.resolve(), out / lib.name)
    return out


def needed(path: Path) -> list[str]:
    """DT_NEEDED of an ELF file of any machine (patchelf reads them all)."""
    r = subprocess.run(["patchelf", "--print-needed", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"patchelf --print-needed {path} failed: {r.stderr.strip()}")
    return r.stdout.split()
