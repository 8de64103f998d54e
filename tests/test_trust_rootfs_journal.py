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


# -- mounts that outlive the apply (`configure ROOTFS` in our own namespace) -------------
def _killed_after_mounts(rootfs: Path, edits, n: int) -> None:
    """Apply in a forked child in this namespace, SIGKILLed right after its n-th mount
    (mid-phase: the phase's mount records were written ahead, at once)."""
    from libinject.apply import rootfs as rfs
    from libinject.linux.child import Child

    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            real, done = rfs.RootFS.attach, []

            def attach(self, *a, **kw):
                real(self, *a, **kw)
                done.append(1)
                if len(done) == n:
                    os.kill(os.getpid(), signal.SIGKILL)
            rfs.RootFS.attach = attach
            _apply(rootfs, edits, worker=False)
        finally:
            os._exit(3)
    with Child(pid) as c:
        assert c.wait(60) == -signal.SIGKILL


def _mounts_under(rootfs: Path) -> list[str]:
    from libinject.linux import mountinfo
    top = str(rootfs)
    return sorted(m.mountpoint[len(top):] for m in mountinfo.read()
                  if m.mountpoint.startswith(top + "/"))


def _kill_mid_phase_then_replay(rootfs: Path, edits, n: int, committed_first: bool):
    first = None
    if committed_first:
        assert _apply(rootfs, edits) is None
        first = _mounts_under(rootfs)
    before = snapshot(rootfs, dir_mtimes=False)
    _killed_after_mounts(rootfs, edits, n)
    left = _mounts_under(rootfs)
    journal = [ln for ln in (Path("/run/nvhook/journal") / _journal_name(rootfs)).read_text().splitlines()]
    assert _apply(rootfs, ContainerEdits()) is None     # replays the killed one's journal
    return first, before, left, journal, _mounts_under(rootfs), snapshot(rootfs, dir_mtimes=False)


def _journal_name(rootfs: Path) -> str:
    from _blake2 import blake2b
    return blake2b(os.fsencode(os.path.abspath(rootfs)), digest_size=20).hexdigest() + ".journal"


@pytest.mark.parametrize("n", [3, 9])
def test_killed_mid_phase_replayed_in_same_namespace(rootfs, tmp_path, n, no_leaked_mounts):
    """Killed in the middle of a phase (after the procfs tmpfs and 2 binaries' mounts, or
    some of the libraries'): the phase's mount records were written ahead in one write,
    some for mounts never made. The next apply, in the same namespace (where the mounts
    outlived the kill), detaches exactly the mounts made, then removes the entries."""
    edits = make_host(tmp_path / "drv")
    _, before, left, journal, after, snap = in_ns(_kill_mid_phase_then_replay, rootfs, edits, n, False)
    assert len(left) == n
    mount_recs = [ln for ln in journal if '"op":"mount"' in ln]
    assert len(mount_recs) > n          # written ahead: more records than mounts made
    assert after == [] and snap == before


def test_replay_leaves_an_earlier_committed_mount(rootfs, tmp_path, no_leaked_mounts):
    """A committed configure's mounts, then a second configure of the same rootfs killed
    after 9 of its mounts (stacked on the first's), then the replay: it detaches the 9
    it made and none of the first's, at the paths the killed one mounted too or had
    recorded ahead and never reached (old replay: every mount there with that root)."""
    edits = make_host(tmp_path / "drv")
    first, before, left, _, after, snap = in_ns(_kill_mid_phase_then_replay, rootfs, edits, 9, True)
    assert len(left) == len(first) + 9
    assert after == first and snap == before


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


# -- what is read back from /run: sealed, and about this very rootfs ---------------------
JOURNAL_DIR = Path("/run/nvhook/journal")


def _forged(records: list[dict]) -> str:
    """A journal as a writer of the host's /run would write it: the records, in the
    format the old code replayed as it found them."""
    import json
    return "".join(json.dumps(r) + "\n" for r in records)


def _saved(path: str, data: bytes) -> dict:
    import binascii
    return {"op": "save", "path": path, "kind": "file", "mode": 0o644, "uid": 0, "gid": 0,
            "atime": 0, "mtime": 0, "ino": 1, "data": binascii.b2a_base64(data, newline=False).decode()}


def test_a_run_writer_cannot_forge_a_victims_journal(tmp_path, a100_host, rootfs, no_leaked_mounts):
    """A root process that can write the host's /run (a container given it as a volume)
    writes a journal for another container's rootfs path: attacker bytes for its
    /etc/passwd and an /etc/ld.so.preload. The victim's GPU start through the real hook
    replays none of it (the lines fail their seal: a log line), and the victim is as it
    should be. Old code: /etc/passwd was the attacker's, ld.so.preload planted."""
    (rootfs / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (rootfs / "etc/ld.so.preload").unlink(missing_ok=True)
    JOURNAL_DIR.mkdir(parents=True, exist_ok=True)
    forged = JOURNAL_DIR / _journal_name(rootfs)
    forged.write_text(_forged([_saved("/etc/passwd", b"root::0:0::/:/bin/sh\n"),
                               _saved("/etc/ld.so.preload", b"/tmp/evil.so\n")]))
    config = hookenv.write_config(tmp_path / "c.toml", a100_host, log=tmp_path / "hook.log")
    try:
        with RuncContainer(tmp_path, args=["cat", "/etc/passwd"], env=hookenv.ENV + ["NVIDIA_VISIBLE_DEVICES=1"],
                           devices=[("/dev/nvidia0", 195, 0)],
                           hooks={"prestart": [hookenv.hook_entry(config, "prestart")]},
                           rootfs=rootfs) as c:
            r = c.run()
    finally:
        forged.unlink(missing_ok=True)
    assert r.stdout == "root:x:0:0:root:/root:/bin/sh\n", r.stdout + r.stderr
    assert (rootfs / "etc/passwd").read_text() == "root:x:0:0:root:/root:/bin/sh\n"
    assert not (rootfs / "etc/ld.so.preload").exists()
    assert "line 1 fails its seal" in (tmp_path / "hook.log").read_text()


def test_a_killed_start_of_tenant_a_is_not_replayed_into_tenant_b(rootfs, tmp_path, no_leaked_mounts):
    """No attacker: A's killed start leaves its journal; B's rootfs is made later at the
    same path. B's start replays nothing of A's (the journal names A's rootfs: another
    directory). Old code: A's ld.so.cache was put back over B's."""
    import shutil
    from libinject.sim.rootfs import build_rootfs

    edits = make_host(tmp_path / "drv")
    (rootfs / "etc/ld.so.cache").write_bytes(b"tenant A's own cache")
    with pytest.raises(RuntimeError, match="exited with -9"):
        in_ns(_killed_at, rootfs, edits, "commit")      # (its mounts went with its namespace)
    assert (JOURNAL_DIR / _journal_name(rootfs)).exists()
    shutil.rmtree(rootfs)
    build_rootfs(rootfs)
    (rootfs / "etc/ld.so.cache").write_bytes(b"tenant B's own cache")
    before = snapshot(rootfs, dir_mtimes=False)
    assert in_ns(_apply, rootfs, ContainerEdits()) is None      # B's start
    assert snapshot(rootfs, dir_mtimes=False) == before
    assert not (JOURNAL_DIR / _journal_name(rootfs)).exists()   # discarded, then B's own ended


def _killed_in_temp_file(rootfs: Path, edits) -> None:
    """Apply in this process, SIGKILLed while it fills a temp file (RootFS.write_file's,
    before its rename into place)."""
    from libinject.apply import live, rootfs as rfs

    real = rfs.RootFS._own

    def own(self, fd, mode, st=None):
        if ".nvhook-" in os.readlink(f"/proc/self/fd/{fd}"):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, fd, mode, st)
    rfs.RootFS._own = own
    live.apply(edits, str(rootfs), worker=False)


def test_a_start_killed_in_a_temp_file_leaves_nothing(rootfs, tmp_path, no_leaked_mounts):
    """Killed while a temp file of write_file is being filled (before anything names it
    but its journal record): the next apply removes it. Old code: the temp file was made
    before anything was journaled and stayed in the image for good."""
    edits = make_host(tmp_path / "drv")
    before = snapshot(rootfs, dir_mtimes=False)
    with pytest.raises(RuntimeError, match="exited with -9"):
        in_ns(_killed_in_temp_file, rootfs, edits)
    temps = [p for p in snapshot(rootfs, dir_mtimes=False) if ".nvhook-" in p]
    assert temps, "the kill came before any temp file: nothing to test"
    assert in_ns(_apply, rootfs, ContainerEdits()) is None
    assert snapshot(rootfs, dir_mtimes=False) == before


def _apply_with_a_full_journal(rootfs: Path, edits, pages: int) -> str | None:
    """_apply with /run/nvhook/journal a tmpfs of `pages` pages (this private namespace)."""
    from libinject.linux import native
    JOURNAL_DIR.mkdir(parents=True, exist_ok=True)
    native.mount("tmpfs", str(JOURNAL_DIR), "tmpfs", 0, f"size={pages * 4096},mode=0700")
    return _apply(rootfs, edits)


def test_a_full_run_fails_the_start_with_one_line_and_leaves_nothing(rootfs, tmp_path, no_leaked_mounts):
    """/run full at every point of an apply (a tmpfs of 1, 2, ... pages for the journal):
    the start fails with one line naming the journal and the cause, and the image is as
    it was. Old code: an entry made just before its record failed stayed in the image,
    and the line named /etc/ld.so.cache."""
    edits = make_host(tmp_path / "drv")
    (rootfs / "etc/ld.so.cache").write_bytes(os.urandom(48 << 10))   # a big save record
    before = snapshot(rootfs, dir_mtimes=False)
    failed = 0
    for pages in range(1, 40):
        err = in_ns(_apply_with_a_full_journal, rootfs, edits, pages)
        if err is None:
            break
        failed += 1
        assert err.startswith("cannot write journal /run/nvhook/journal/"), err
        assert err.endswith("No space left on device"), err
        assert snapshot(rootfs, dir_mtimes=False) == before, f"{pages} pages: {err}"
    assert failed >= 2 and err is None


def test_a_big_forged_journal_costs_what_its_first_line_does(rootfs, tmp_path):
    """A writer of /run fills a victim's journal with 40 MiB: the start reads and hashes
    its first line only (the header's seal fails), then starts it afresh."""
    import tracemalloc

    from libinject.apply.journal import DiskJournal

    d = tmp_path / "journal"
    d.mkdir(mode=0o700)
    forged = d / _journal_name(rootfs)
    forged.write_bytes(b"0" * 32 + b" {}\n" + b"x" * (40 << 20))
    tracemalloc.start()
    try:
        j = DiskJournal.open(str(rootfs), directory=str(d), key=b"k" * 32)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    try:
        assert j.stale == [] and len(j.notes) == 1 and "line 1 fails its seal" in j.notes[0]
        assert peak < 1 << 20, peak
        assert forged.stat().st_size == 0       # started afresh
    finally:
        j.done()


def test_journals_of_dead_starts_are_swept(rootfs, tmp_path, no_leaked_mounts):
    """A start killed mid-apply, its container then removed (the rootfs gone), left its
    journal in /run until reboot. The next apply that ends sweeps it; the journal of a
    killed start whose rootfs is still there is kept (its retry replays it), and a link
    planted in the journal dir is neither followed nor its target touched."""
    import shutil
    from libinject.sim.rootfs import build_rootfs

    edits = make_host(tmp_path / "drv")
    dead, kept, other = tmp_path / "dead", tmp_path / "kept", tmp_path / "other"
    for r in (dead, kept, other):
        build_rootfs(r)
    for r in (dead, kept):
        with pytest.raises(RuntimeError, match="exited with -9"):
            in_ns(_killed_at, r, edits, "commit")
    target = tmp_path / "target.journal"
    target.write_text("not ours")
    link = JOURNAL_DIR / ("0" * 40 + ".journal")
    link.symlink_to(target)
    try:
        shutil.rmtree(dead)                                 # the dead start's container removed
        assert (JOURNAL_DIR / _journal_name(dead)).exists()
        assert in_ns(_apply, other, ContainerEdits()) is None   # any start, ending
        assert not (JOURNAL_DIR / _journal_name(dead)).exists()
        assert (JOURNAL_DIR / _journal_name(kept)).exists()
        assert link.is_symlink() and target.read_text() == "not ours"
        assert in_ns(_apply, kept, ContainerEdits()) is None    # its retry replays it, then it goes
        assert not (JOURNAL_DIR / _journal_name(kept)).exists()
    finally:
        link.unlink()
