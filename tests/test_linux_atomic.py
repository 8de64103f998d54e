"""libinject.linux.atomic: host files replaced whole, never through a symlink."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from libinject.linux import atomic


def _leftovers(d: Path) -> list[str]:
    return [n for n in os.listdir(d) if ".tmp-" in n]


def test_write_new_and_replace(tmp_path: Path):
    f = tmp_path / "spec.json"
    old = os.umask(0o077)
    try:
        atomic.write_atomic(str(f), b"one", 0o644)
    finally:
        os.umask(old)
    assert f.read_bytes() == b"one"
    assert stat.S_IMODE(f.stat().st_mode) == 0o644        # the mode asked for, whatever the umask
    ino = f.stat().st_ino
    atomic.write_atomic(str(f), b"two", 0o600)
    assert f.read_bytes() == b"two" and f.stat().st_ino != ino   # a new file, renamed in
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert _leftovers(tmp_path) == []


def test_symlink_at_the_name_is_replaced_not_followed(tmp_path: Path):
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    link = tmp_path / "spec.json"
    link.symlink_to(target)
    atomic.write_atomic(str(link), b"new")
    assert not link.is_symlink() and link.read_bytes() == b"new"
    assert target.read_text() == "keep"


def test_symlinked_directory_is_refused(tmp_path: Path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "dir").symlink_to(real)
    with pytest.raises(OSError):
        atomic.write_atomic(str(tmp_path / "dir/spec.json"), b"x")
    assert os.listdir(real) == []


def test_write_at_checks_through_the_fd(tmp_path: Path):
    dfd = atomic.open_dir(str(tmp_path))
    try:
        assert os.fstat(dfd).st_ino == tmp_path.stat().st_ino
        atomic.write_at(dfd, "a", b"1", 0o600)
        for bad in ("", ".", "..", "x/y"):
            with pytest.raises(OSError):
                atomic.write_at(dfd, bad, b"1")
    finally:
        os.close(dfd)
    assert (tmp_path / "a").read_bytes() == b"1"


def test_failure_leaves_nothing(tmp_path: Path):
    (tmp_path / "sub").mkdir()                  # a directory where the file should go
    with pytest.raises(IsADirectoryError):
        atomic.write_atomic(str(tmp_path / "sub"), b"x")
    assert _leftovers(tmp_path) == [] and os.listdir(tmp_path / "sub") == []


def test_durable_writes_are_synced_and_others_are_not(tmp_path: Path, monkeypatch):
    """A spec or a record is fsync'ed (file and directory); a bundle's config.json
    (durable=False) is not: its reader comes a moment later, and no crash outlives it."""
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    f = tmp_path / "config.json"
    atomic.write_atomic(str(f), b"one")
    assert len(synced) == 2
    atomic.write_atomic(str(f), b"two", durable=False)
    assert len(synced) == 2 and f.read_bytes() == b"two" and _leftovers(tmp_path) == []
