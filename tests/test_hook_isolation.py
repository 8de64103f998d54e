"""CVE-2025-23266 ("NVIDIAScape") and friends: the container's LD_PRELOAD, PYTHON*
variables and a sitecustomize.py in its rootfs never run in the host's hook.

A canary library and a sitecustomize.py each create a file in a host-only directory when
they run. A positive control proves they would; the hook (prestart via runc, and
createContainer whose cwd is the rootfs) must leave no canary.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support import hookenv
from support.runc import RuncContainer

CANARY_C = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void canary(void) {
    int fd = open(CANARY_PATH, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) { write(fd, "preload\n", 8); close(fd); }
}
"""


@pytest.fixture
def canary(tmp_path) -> dict[str, Path]:
    return make_canary(tmp_path)


def make_canary(tmp_path: Path) -> dict[str, Path]:
    """A preload library and Python start-up files that each write to a host-only file
    when they run: if that file exists, container input reached the hook."""
    d = tmp_path / "host-only"
    d.mkdir()
    out = d / "canary"
    src = tmp_path / "canary.c"
    src.write_text(CANARY_C)
    lib = tmp_path / "canary.so"
    subprocess.run(["cc", "-shared", "-fPIC", f'-DCANARY_PATH="{out}"', "-o", str(lib), str(src)],
                   check=True)
    pydir = tmp_path / "pyevil"
    pydir.mkdir()
    (pydir / "sitecustomize.py").write_text(f"open({str(out)!r}, 'a').write('sitecustomize\\n')\n")
    (pydir / "usercustomize.py").write_text(f"open({str(out)!r}, 'a').write('usercustomize\\n')\n")
    (pydir / "startup.py").write_text(f"open({str(out)!r}, 'a').write('startup\\n')\n")
    return {"out": out, "lib": lib, "pydir": pydir}


def _evil_env(c: dict[str, Path], rootfs: Path) -> list[str]:
    return [f"LD_PRELOAD={c['lib']}", "LD_PRELOAD=canary.so",        # host path, then cwd-relative
            f"LD_PRELOAD={c['lib']}", f"LD_LIBRARY_PATH={c['lib'].parent}",
            f"PYTHONPATH={c['pydir']}:{rootfs}:/", f"PYTHONSTARTUP={c['pydir']}/startup.py",
            f"PYTHONUSERBASE={c['pydir']}", "PYTHONINSPECT=1"]


def _plant(rootfs: Path, c: dict[str, Path]) -> None:
    (rootfs / "canary.so").write_bytes(c["lib"].read_bytes())
    (rootfs / "sitecustomize.py").write_text((c["pydir"] / "sitecustomize.py").read_text())
    site = rootfs / "usr/lib/python3/dist-packages"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text((c["pydir"] / "sitecustomize.py").read_text())


def test_canaries_work(canary):
    """Positive control: without isolation each of them runs."""
    subprocess.run(["/bin/true"], env={"LD_PRELOAD": str(canary["lib"])}, check=True)
    subprocess.run([sys.executable, "-c", "pass"], env={"PYTHONPATH": str(canary["pydir"])}, check=True)
    assert canary["out"].read_text().split() == ["preload", "sitecustomize"]


@pytest.mark.parametrize("stage, mode", [("prestart", "v1"), ("createContainer", "v2")])
def test_hook_runs_none_of_them(tmp_path, sim_host, canary, stage, mode):
    cfg = hookenv.write_config(tmp_path / "c.toml", sim_host("a100x8"), log=tmp_path / "hook.log")
    # The hook's own env (the runtime's hook entry) is hostile too: the front must not pass it on.
    entry = hookenv.hook_entry(cfg, stage, env=[f"LD_PRELOAD={canary['lib']}",
                                                f"PYTHONPATH={canary['pydir']}", "PYTHONHOME=/nonexistent"])
    with RuncContainer(tmp_path, mode=mode, args=["sh", "-c", "nvidia-smi -L"], hooks={stage: [entry]}) as c:
        _plant(c.rootfs, canary)
        c.config["process"]["env"] = ["PATH=/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=1",
                                      *_evil_env(canary, c.rootfs)]
        r = c.run()
    assert "GPU 0: NVIDIA" in r.stdout, r.stdout + r.stderr      # the hook did its job
    assert f"{stage}: done" in (tmp_path / "hook.log").read_text()
    assert not canary["out"].exists(), canary["out"].read_text()
