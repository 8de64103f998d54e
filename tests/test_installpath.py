"""The one home of "where are this install's programs" (libinject.installpath): the
interpreter's directory, or, for a versioned install reached through a `current` link
beside it (the DaemonSet's /usr/local/lib/nvhook/<version>), that link: what nvhook
writes into engine configs then survives an upgrade unchanged."""
from __future__ import annotations

import os

from libinject import installpath


def _install(base, version):
    bindir = base / version / "bin"
    bindir.mkdir(parents=True)
    (bindir / "python3.11").touch()
    return bindir


def test_a_plain_install_is_its_interpreters_dir(tmp_path, monkeypatch):
    bindir = _install(tmp_path, "0.1.0")
    monkeypatch.setattr(installpath.sys, "executable", str(bindir / "python3.11"))
    assert installpath.program("nvhook-hook") == str(bindir / "nvhook-hook")


def test_the_current_version_is_named_through_its_link(tmp_path, monkeypatch):
    bindir = _install(tmp_path, "0.1.0")
    os.symlink("0.1.0", tmp_path / "current")
    monkeypatch.setattr(installpath.sys, "executable", str(bindir / "python3.11"))
    assert installpath.program("nvhook-runtime") == str(tmp_path / "current/bin/nvhook-runtime")


def test_an_older_version_is_named_as_itself(tmp_path, monkeypatch):
    old = _install(tmp_path, "0.1.0")
    _install(tmp_path, "0.2.0")
    os.symlink("0.2.0", tmp_path / "current")
    monkeypatch.setattr(installpath.sys, "executable", str(old / "python3.11"))
    assert installpath.program("nvhook-hook") == str(old / "nvhook-hook")


def test_a_current_link_that_leads_nowhere_is_ignored(tmp_path, monkeypatch):
    bindir = _install(tmp_path, "0.1.0")
    os.symlink("0.1.0-gone", tmp_path / "current")
    monkeypatch.setattr(installpath.sys, "executable", str(bindir / "python3.11"))
    assert installpath.program("nvhook-hook") == str(bindir / "nvhook-hook")
