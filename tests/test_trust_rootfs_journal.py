"""Trust boundaries, class 12: a killed apply is undone by the next one.

A hook killed by its runtime's timeout (or a worker past serve-timeout) cannot roll
anything back: ~40 entries (placeholders, directories, SONAME links, the ld.so.conf.d
file) stayed in the rootfs. Every step is now written ahead to a journal on the host
(/run/nvhook/journal/<key of the rootfs path>), and the next apply on that rootfs
replays it first; afterwards the rootfs is exactly as it was before the killed apply.

The kill is real: SIGKILL after a chosen phase of the apply (the test patches the
applier's phase marker in its own child; no environment knob), and a real runc
prestart hook past its timeout while the sandboxed "ldconfig" (a host binary the
admin's config names) sleeps.
"""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from libinject.errors import NvhookError
from libinject.plan.edits import ContainerEdits
from support import hookenv
from support.applyenv import in_ns, make_host, snapshot
from support.runc import RuncContainer, RuncError


def _killed_at(rootfs: Path, edits, phase: str):
    """Apply in this process (as the exec'd hook does), SIGKILLed as soon as `phase`
    of live.apply is done ("commit": everything done, ldconfig included, just before
    the commit)."""
    from libinject.apply import live

    def mark(p: str) -> None:
        if p == phase:
            os.kill(os.getpid(), signal.SIGKILL)
    live._mark = mark
    if phase == "commit":
        live._cgroups_then_commit = lambda *a, **kw: os.kill(os.getpid(), signal.SIGKILL)
    live.apply(edits, str(rootfs), worker=False)


def _apply(rootfs: Path, edits, **kw):
    from libinject.apply.live import apply
    try:
        apply(edits, str(rootfs), **kw)
    except NvhookError as e:
        return str(e)
    return None


@pytest.mark.parametrize("phase", ["procfs", "binary", "library", "symlinks", "late mounts",
                                   "devices", "ld.so.conf", "commit"])
def test_killed_apply_replayed_by_next(rootfs, tmp_path, phase, no_leaked_mounts):
    """Killed after each phase (ld.so.conf: the conf file written and the cache saved,
    just before ldconfig; commit: after ldconfig rewrote the image's cache): the next
    apply puts everything back, the image's own cache included (content, mode, mtime)."""
    edits = make_host(tmp_path / "drv")
    (rootfs / "etc/ld.so.cache").write_bytes(b"the image's own cache")
    before = snapshot(rootfs, dir_mtimes=False)
    with pytest.raises(RuntimeError, match="exited with -9"):
        in_ns(_killed_at, rootfs, edits, phase)
    left = snapshot(rootfs, dir_mtimes=False)
    added = sorted(set(left) - set(before))
    if phase != "procfs":
        assert added, "the killed apply left nothing: nothing to test"
    if phase == "commit":
        assert left["etc/ld.so.cache"] != before["etc/ld.so.cache"]
    # the next apply on this rootfs (here one with nothing to do) replays the journal
    assert in_ns(_apply, rootfs, ContainerEdits()) is None
    assert snapshot(rootfs, dir_mtimes=False) == before
    print(f"killed after {phase}: {len(added)} entries left, all undone by the next apply")


# -- a real runc prestart hook past its timeout ----------------------------------------
PROGRAM = "#include <unistd.h>\nint main(void) {{ {body} }}\n"


def _static(tmp: Path, name: str, body: str) -> Path:
    src = tmp / f"{name}.c"
    src.write_text(PROGRAM.format(body=body))
    subprocess.run(["gcc", "-O1", "-static", "-o", str(tmp / name), str(src)], check=True,
                   capture_output=True, timeout=120)
    return tmp / name


def _container(tmp_path: Path, name: str, host: Path, rootfs: Path, ldconfig: Path,
               timeout: int) -> RuncContainer:
    config = tmp_path / f"{name}.toml"
    config.write_text(f'[nvidia-container-cli]\nroot = "{host}"\nldconfig = "@{ldconfig}"\n'
                      f'[nvhook]\nsnapshot = false\n')
    entry = hookenv.hook_entry(config, "prestart")
    entry["timeout"] = timeout
    return RuncContainer(tmp_path, args=["true"], env=hookenv.ENV + ["NVIDIA_VISIBLE_DEVICES=1"],
                         devices=[("/dev/nvidia0", 195, 0)], hooks={"prestart": [entry]},
                         rootfs=rootfs, name=f"{name}-{os.getpid()}")


def test_runc_hook_killed_by_timeout_then_retried(tmp_path, a100_host, rootfs, no_leaked_mounts):
    """runc kills the hook (SIGKILL, hook timeout 4 s) while its "ldconfig" sleeps: the
    start fails and the entries made so far stay in the rootfs. The container is
    retried on the same rootfs, and that start fails too (its ldconfig exits 1), so its
    own rollback leaves the rootfs as that apply found it: exactly as before the killed
    one (old code: everything the killed hook made was still there)."""
    sleeper = _static(tmp_path, "sleeper", "sleep(20); return 0;")
    failer = _static(tmp_path, "failer", "return 1;")
    before = snapshot(rootfs, dir_mtimes=False)
    with _container(tmp_path, "killed", a100_host, rootfs, sleeper, timeout=4) as c:
        with pytest.raises(RuncError, match="ran past specified timeout"):
            c.create(timeout=120)
    left = snapshot(rootfs, dir_mtimes=False)
    added = sorted(set(left) - set(before))
    assert any("00-nvcr-" in p for p in added), added   # killed in ldconfig, after the conf
    with _container(tmp_path, "retry", a100_host, rootfs, failer, timeout=60) as c:
        with pytest.raises(RuncError, match="nvhook: ldconfig failed: exit status 1"):
            c.create(timeout=120)
    assert snapshot(rootfs, dir_mtimes=False) == before
    print(f"the killed hook left {len(added)} entries; the retry's replay removed them")
