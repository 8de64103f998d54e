"""Where `nvhook setup` keeps what was there before, and what --undo will put back.

A neighbour who can write the directory beside an engine's file (a sticky or group
directory: here a real unprivileged process, uid 65534) plants a NAME.nvhook-backup or
NAME.nvhook-none there, before or after the administrator's first run; --undo of every
target (and of `setup auto`) must neither put it back, nor delete the file for it, nor
leave a symlink. What setup keeps is a sealed record in its own store (--backup-dir,
default /var/lib/nvhook/setup: here under tmp_path); a record forged or moved there by
a process that can write the store but not read the key above it is refused. An
earlier nvhook's backup beside the file is still put back when only root could have
put it there.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from libinject.constants import SAFE_PATH
from support.cli import nvhook_in_process as nvhook, tree_state

NOBODY = 65534
ORIGINAL = {"docker": b'{\n  "log-level": "warn"\n}\n',
            "containerd": b'version = 2\n# the admin\'s\n',
            "crio": b'[crio.runtime]\nlog_level = "debug"\n',
            "podman": b"cdiVersion: 0.3.0\nkind: example.com/other\ndevices: []\n",
            "service": b"[Service]\nExecStart=/bin/admins-own\n"}
HOSTILE = b'{"runtimes": {"nvidia": {"path": "/tmp/evil"}}, "default-runtime": "nvidia"}\n'


@pytest.fixture(autouse=True)
def backup_dir(tmp_path, monkeypatch) -> Path:
    """The store for in-process runs: tmp_path's, never the host's /var/lib/nvhook."""
    from libinject.setup import store

    d = tmp_path / "setup-backups"
    monkeypatch.setattr(store, "STORE_DIR", str(d))
    return d


class Node:
    """One target's file in `shared` (root's, sticky, writable by everyone: where a
    neighbour can plant a file beside it), and `nvhook setup` run on it."""

    def __init__(self, tmp_path: Path, engine: str, host: Path | None = None) -> None:
        # "auto": docker's file, set up by `setup docker`, undone by `setup auto --undo`
        self.auto = engine == "auto"
        self.engine, self.tmp = "docker" if self.auto else engine, tmp_path
        self.shared = tmp_path / "shared"
        self.shared.mkdir()
        os.chmod(self.shared, 0o1777)
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        self.file = self.shared / {"docker": "daemon.json", "containerd": "config.toml",
                                   "crio": "crio.conf.d/99-nvhook.toml", "podman": "nvidia.yaml",
                                   "service": "nvhook-serve.service"}[self.engine]
        self.file.parent.mkdir(exist_ok=True)
        self.pre = ["--root", str(host)] if self.engine == "podman" else []

    def args(self, *more: str) -> list[str]:
        if self.auto and more == ("--undo",):
            return self.auto_undo()
        if self.engine == "service":
            return ["setup", "service", "--unit-dir", str(self.shared), "--no-start", *more]
        a = [*self.pre, "setup", self.engine, "--config", str(self.file), *more]
        return a + (["--hook-dir", str(self.bin)] if self.engine == "docker" else [])

    def auto_undo(self) -> list[str]:
        """`setup auto --undo` with every file it looks at here (docker's: self.file)."""
        t = self.tmp
        return ["--config", str(t / "nvhook.toml"), "setup", "auto", "--undo",
                "--containerd-config", str(t / "no-containerd/config.toml"),
                "--crio-drop-in", str(t / "no-crio/crio.conf.d/99-nvhook.toml"),
                "--hooks-dir", str(t / "hooks.d"), "--docker-config", str(self.file),
                "--docker-hook-dir", str(self.bin), "--cdi-spec", str(t / "cdi/nvidia.yaml")]

    @property
    def beside(self) -> Path:
        """Where an earlier nvhook kept the file's backups (CRI-O: above crio.conf.d)."""
        return self.shared

    def plant(self, suffix: str, kind: str) -> Path:
        """As uid 65534: NAME+suffix beside the file, a file of HOSTILE (or empty for
        kind "empty"), or a symlink to such a file of theirs."""
        name = self.file.name + suffix
        script = {"file": 'printf "%s" "$1" > "$2"', "empty": ': > "$2"',
                  "symlink": 'printf "%s" "$1" > evil && ln -s "$3/evil" "$2"'}[kind]
        subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                        "sh", "-c", script, "sh", HOSTILE.decode(), name, str(self.beside)],
                       cwd=self.beside, env={"PATH": SAFE_PATH}, check=True, timeout=60)
        planted = self.beside / name
        assert planted.lstat().st_uid == NOBODY
        return planted

    def state(self) -> dict[str, tuple]:
        return tree_state(self.shared)


ENGINES = ["docker", "containerd", "crio", "podman", "service"]


@pytest.fixture
def node(request, tmp_path, a100_host):
    return Node(tmp_path, request.param, a100_host)


# -- a neighbour's file planted beside the target ---------------------------------------------------

@pytest.mark.parametrize("kind", ["file", "symlink"])
@pytest.mark.parametrize("node", [*ENGINES, "auto"], indirect=True)
def test_backup_planted_after_setup_is_not_put_back(node, kind, capsys):
    """There was no file; setup wrote one; the neighbour then adds NAME.nvhook-backup
    (the old code kept only an empty NAME.nvhook-none, root's, so the name was free):
    --undo removes the file, as it was, and leaves the planted one alone."""
    assert nvhook(capsys, *node.args())[0] == 0
    planted = node.plant(".nvhook-backup", kind)
    was = tree_state(planted.parent, deep=False)[planted.name]
    code, out, err = nvhook(capsys, *node.args("--undo"))
    assert (code, err) == (0, "")
    assert not os.path.lexists(node.file), out
    assert tree_state(planted.parent, deep=False)[planted.name] == was


@pytest.mark.parametrize("suffix, kind", [(".nvhook-none", "empty"), (".nvhook-backup", "file"),
                                          (".nvhook-backup", "symlink")])
@pytest.mark.parametrize("node", [*ENGINES, "auto"], indirect=True)
def test_backup_planted_before_setup_is_refused(node, suffix, kind, capsys, backup_dir):
    """The admin's own file is there; the neighbour plants a backup first: setup and
    --undo each refuse it in one line naming it, and the admin's file stays as it was."""
    node.file.write_bytes(ORIGINAL[node.engine])
    planted = node.plant(suffix, kind)
    was = node.state()
    for args in (node.args(), node.args("--undo")):
        code, out, err = nvhook(capsys, *args)
        assert (code, out) == (1, ""), err
        assert err.startswith(f"nvhook: {planted}: not trusted as the backup an earlier nvhook kept of "
                              f"{node.file} (") and err.count("\n") == 1, err
        assert node.state() == was and not backup_dir.exists()
    assert node.file.read_bytes() == ORIGINAL[node.engine]
