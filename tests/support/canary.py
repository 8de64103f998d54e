"""Canaries for container input reaching the host's hook (CVE-2025-23266, "NVIDIAScape"):
a preload library and Python start-up files that each append to a host-only file when
they run. If that file exists, container input ran in the hook."""
from __future__ import annotations

import subprocess
from pathlib import Path

CANARY_C = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void canary(void) {
    int fd = open(CANARY_PATH, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) { write(fd, "preload\n", 8); close(fd); }
}
"""


def make_canary(tmp_path: Path) -> dict[str, Path]:
    """{"out": the host-only file, "lib": the preload library, "pydir": a dir with
    sitecustomize.py, usercustomize.py and startup.py}."""
    d = tmp_path / "host-only"
    d.mkdir()
    out = d / "canary"
    src = tmp_path / "canary.c"
    src.write_text(CANARY_C)
    lib = tmp_path / "canary.so"
    subprocess.run(["cc", "-shared", "-fPIC", f'-DCANARY_PATH="{out}"', "-o", str(lib), str(src)],
                   check=True, timeout=60)
    pydir = tmp_path / "pyevil"
    pydir.mkdir()
    (pydir / "sitecustomize.py").write_text(f"open({str(out)!r}, 'a').write('sitecustomize\\n')\n")
    (pydir / "usercustomize.py").write_text(f"open({str(out)!r}, 'a').write('usercustomize\\n')\n")
    (pydir / "startup.py").write_text(f"open({str(out)!r}, 'a').write('startup\\n')\n")
    return {"out": out, "lib": lib, "pydir": pydir}


def evil_env(c: dict[str, Path], rootfs: Path) -> list[str]:
    """A container env that would run the canaries in any process that honoured it."""
    return [f"LD_PRELOAD={c['lib']}", "LD_PRELOAD=canary.so",        # host path, then cwd-relative
            f"LD_PRELOAD={c['lib']}", f"LD_LIBRARY_PATH={c['lib'].parent}",
            f"PYTHONPATH={c['pydir']}:{rootfs}:/", f"PYTHONSTARTUP={c['pydir']}/startup.py",
            f"PYTHONUSERBASE={c['pydir']}", "PYTHONINSPECT=1"]


def plant(rootfs: Path, c: dict[str, Path]) -> None:
    """The canaries inside the container's rootfs too (its root, its site-packages)."""
    (rootfs / "canary.so").write_bytes(c["lib"].read_bytes())
    (rootfs / "sitecustomize.py").write_text((c["pydir"] / "sitecustomize.py").read_text())
    site = rootfs / "usr/lib/python3/dist-packages"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text((c["pydir"] / "sitecustomize.py").read_text())
