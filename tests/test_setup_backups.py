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
from libinject.setup import store
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
    """The admin's own file is there; the neighbour plants a backup first: setup, its
    --dry-run and --undo each refuse it in one line naming it, and the admin's file
    stays as it was."""
    node.file.write_bytes(ORIGINAL[node.engine])
    planted = node.plant(suffix, kind)
    was = node.state()
    for args in (node.args(), node.args("--dry-run"), node.args("--undo")):
        code, out, err = nvhook(capsys, *args)
        assert (code, out) == (1, ""), err
        assert err.startswith(f"nvhook: {planted}: not trusted as the backup an earlier nvhook kept of "
                              f"{node.file} (") and err.count("\n") == 1, err
        assert node.state() == was and not backup_dir.exists()
    assert node.file.read_bytes() == ORIGINAL[node.engine]


# -- where setup keeps it -----------------------------------------------------------------------

def _docker(tmp_path: Path) -> tuple[Path, list[str]]:
    """daemon.json (the admin's, 0640 root:4) in a directory of root's alone; the args."""
    etc = tmp_path / "etc"
    etc.mkdir(mode=0o755)
    f = etc / "daemon.json"
    f.write_bytes(ORIGINAL["docker"])
    os.chmod(f, 0o640)
    os.chown(f, 0, 4)
    (tmp_path / "bin").mkdir()
    return f, ["setup", "docker", "--config", str(f), "--hook-dir", str(tmp_path / "bin")]


def test_round_trip_keeps_nothing_beside_the_file_and_drops_the_record(tmp_path, backup_dir, capsys):
    f, args = _docker(tmp_path)
    was = tree_state(f.parent)
    code, out, err = nvhook(capsys, *args)
    assert code == 0, err
    assert sorted(p.name for p in f.parent.iterdir()) == ["daemon.json"]
    # two records: what was there, and the settings nvhook set (for a three-way --undo)
    rec, changes = sorted(backup_dir.iterdir(), key=lambda p: p.name != store.name_for(str(f)))
    assert f"(the one there before: {rec})" in out
    key = backup_dir.parent / "setup.key"
    assert [oct(p.stat().st_mode & 0o7777) for p in (backup_dir, rec, changes, key)] == [
        "0o700", "0o600", "0o600", "0o600"]
    code, out, err = nvhook(capsys, *args, "--undo")
    assert (code, tree_state(f.parent), list(backup_dir.iterdir())) == (0, was, []), err


def _as_root_process(code: str, *argv: str) -> None:
    """A separate root process (say, a container given the store as a volume): not nvhook."""
    import sys

    subprocess.run([sys.executable, "-c", code, *argv], check=True, timeout=60, env={"PATH": SAFE_PATH})


EDIT = "import sys; p = sys.argv[1]; d = open(p, 'rb').read(); open(p, 'wb').write(d[:d.rindex(b'\\n{') + 2] + sys.argv[2].encode())"
OWN_KEY = """import hashlib, json, os, sys
store, target, body = sys.argv[1:4]
key = os.urandom(32)
open(os.path.join(store, "setup.key"), "wb").write(key)      # its own key, in the store
head = json.dumps({"gid": 0, "kind": "file", "mode": 420, "path": target, "uid": 0}, sort_keys=True).encode()
b = head + b"\\n" + body.encode()
mac = hashlib.blake2b(b, digest_size=32, key=key, person=b"nvhook-setup").hexdigest().encode()
open(sys.argv[4], "wb").write(b"nvhook-setup-backup 1\\n" + mac + b"\\n" + b)
"""


@pytest.mark.parametrize("forgery", ["edited", "own key", "another file's"])
def test_a_record_forged_in_the_store_is_refused(tmp_path, backup_dir, capsys, forgery):
    """After a real set-up, a root process that can write the store (not the key above
    it) edits the record, seals one with a key of its own, or moves the record of
    another file it set up into this one's name: --undo refuses it in one line."""
    from libinject.setup.store import name_for

    f, args = _docker(tmp_path)
    assert nvhook(capsys, *args)[0] == 0
    rec = backup_dir / name_for(str(f))
    if forgery == "edited":
        _as_root_process(EDIT, str(rec), HOSTILE.decode())
        why = "its seal does not match: not written by nvhook setup with this node's key"
    elif forgery == "own key":
        _as_root_process(OWN_KEY, str(backup_dir), str(f), HOSTILE.decode(), str(rec))
        why = "its seal does not match: not written by nvhook setup with this node's key"
    else:
        other = tmp_path / "etc/evil.json"
        other.write_bytes(HOSTILE)
        assert nvhook(capsys, "setup", "docker", "--config", str(other), "--hook-dir", str(tmp_path / "bin"))[0] == 0
        other.write_bytes(b"{}")        # its record holds HOSTILE, sealed for evil.json
        _as_root_process("import os, sys; os.replace(sys.argv[1], sys.argv[2])",
                         str(backup_dir / name_for(str(other))), str(rec))
        why = f"it is the backup of {other}, not of this file"
    was = tree_state(f.parent)
    code, out, err = nvhook(capsys, *args, "--undo")
    assert (code, out, tree_state(f.parent)) == (1, "", was)
    assert err == f"nvhook: {rec} (the backup of {f}): {why}; not restored, nothing changed\n"


@pytest.mark.parametrize("case", ["symlink on the way", "store not root's", "store writable by others",
                                  "key dir writable by others"])
def test_a_store_nvhook_cannot_call_its_own_is_refused(tmp_path, capsys, case, monkeypatch):
    from libinject.setup import store as _store

    f, args = _docker(tmp_path)
    store = tmp_path / "var/lib/nvhook/setup"
    monkeypatch.setattr(_store, "STORE_DIR", str(store))     # the default one: its key is above it
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    store.parent.parent.mkdir(parents=True)
    if case == "symlink on the way":
        (tmp_path / "var/lib/nvhook").symlink_to(elsewhere)
        expected = f"backup directory {store}: {tmp_path}/var/lib/nvhook is a symlink (not followed)"
    else:
        store.mkdir(parents=True, mode=0o700)
        if case == "store not root's":
            os.chown(store, NOBODY, NOBODY)
        elif case == "store writable by others":
            os.chmod(store, 0o777)
        else:
            os.chmod(store.parent, 0o777)
        where = store.parent if case.startswith("key dir") else store
        expected = f"backup directory {where} must be owned by root and writable by nobody else"
    was = tree_state(tmp_path / "etc", elsewhere)
    code, out, err = nvhook(capsys, *args, "--backup-dir", str(store))
    assert (code, out, tree_state(tmp_path / "etc", elsewhere)) == (1, "", was)
    assert err == f"nvhook: {expected}; nothing changed\n"


# -- an earlier nvhook's backup beside the file ------------------------------------------------------

def test_an_earlier_nvhooks_backup_is_put_back(tmp_path, capsys):
    """Upgrade: an earlier nvhook kept daemon.json.nvhook-backup beside it (root's, 0640,
    one link, in a directory of root's alone): --undo puts it back byte for byte, with
    its mode and owner, and removes it."""
    f, args = _docker(tmp_path)
    old = f.with_name("daemon.json.nvhook-backup")
    os.link(f, old)
    f.unlink()
    was = {**tree_state(f.parent), str(f): tree_state(f.parent)[str(old)]}
    del was[str(old)]
    f.write_bytes(b'{"runtimes": {"nvidia": {"path": "/old/nvhook-runtime"}}}\n')
    code, out, err = nvhook(capsys, *args, "--undo")
    assert (code, err, tree_state(f.parent)) == (0, "", was)
    assert out.startswith(f"restored {f} from {old}\n"), out


def test_an_earlier_nvhooks_none_marker_removes_the_file(tmp_path, capsys):
    f, args = _docker(tmp_path)
    f.with_name("daemon.json.nvhook-none").touch(mode=0o644)
    code, out, err = nvhook(capsys, *args, "--undo")
    assert (code, err, list(f.parent.iterdir())) == (0, "", [])


LEGACY = ["writable by others", "not root's", "two links", "a symlink", "a directory", "none not empty",
          "directory writable by others", "sticky directory"]


@pytest.mark.parametrize("case", LEGACY)
def test_an_earlier_backup_only_root_could_not_vouch_for_is_refused(tmp_path, capsys, case):
    f, args = _docker(tmp_path)
    old = f.with_name("daemon.json.nvhook-none" if case == "none not empty" else "daemon.json.nvhook-backup")
    if case == "a symlink":
        os.symlink(tmp_path / "elsewhere.json", old)
    elif case == "a directory":
        old.mkdir(mode=0o755)
    else:
        old.write_bytes(HOSTILE)
        os.chmod(old, 0o644)
    why = {"writable by others": "mode 0o666: writable by others", "not root's": f"owned by uid {NOBODY}, not root",
           "two links": "2 links to it", "a symlink": "a symlink", "a directory": "not a regular file",
           "none not empty": "not empty", "directory writable by others": f"its directory {f.parent} is not root's alone",
           "sticky directory": f"its directory {f.parent} is not root's alone"}[case]
    if case == "writable by others":
        os.chmod(old, 0o666)
    elif case == "not root's":
        os.chown(old, NOBODY, NOBODY)
    elif case == "two links":
        os.link(old, tmp_path / "second-link")
    elif case == "directory writable by others":
        os.chmod(f.parent, 0o775)
    elif case == "sticky directory":
        os.chmod(f.parent, 0o1777)
    was = tree_state(f.parent)
    code, out, err = nvhook(capsys, *args, "--undo")
    assert (code, out, tree_state(f.parent)) == (1, "", was)
    assert err == (f"nvhook: {old}: not trusted as the backup an earlier nvhook kept of {f} ({why}); not "
                   "restored, nothing changed (check it, then put it back by hand or remove it)\n")


def test_backup_dir_keeps_everything_inside_it(tmp_path, capsys):
    """--backup-dir D: the records and their key are in D; nothing is written beside D
    (an earlier nvhook put the key in D/..), and --undo reads them back from there."""
    f, args = _docker(tmp_path)
    d = tmp_path / "admins" / "nvhook-backups"
    d.parent.mkdir(mode=0o700)
    was = tree_state(f.parent)
    code, out, err = nvhook(capsys, *args, "--backup-dir", str(d))
    assert code == 0, err
    assert sorted(p.name for p in d.parent.iterdir()) == ["nvhook-backups"]
    assert "setup.key" in [p.name for p in d.iterdir()]
    code, out, err = nvhook(capsys, *args, "--backup-dir", str(d), "--undo")
    assert (code, tree_state(f.parent)) == (0, was), err
