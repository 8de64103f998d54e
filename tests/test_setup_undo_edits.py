"""--undo after an administrator edited the engine's config since nvhook's set-up: only
nvhook's settings go (those still holding nvhook's value), everything else stays, a
setting someone changed since keeps their value and is named; a file that no longer
parses is one `nvhook:` line and nothing changes. Without later edits the file comes
back byte for byte (test_setup_engines, test_setup_auto). Every file under tmp_path.
"""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from support.cli import nvhook_in_process as nvhook, tree_state

V2 = "io.containerd.grpc.v1.cri"
CONTAINERD = b'''# the admin's containerd config
version = 2
root = "/var/lib/containerd"   # keep this comment

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.6"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
'''
# What the admin adds after nvhook's set-up: a runtime of their own, a comment, a key.
LATER = '''
# added by the admin after nvhook
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata]
  runtime_type = "io.containerd.kata.v2"
'''


@pytest.fixture
def backup_dir(tmp_path) -> Path:
    return tmp_path / "store" / "setup"


def _records(backup_dir: Path) -> list[str]:
    """The records in the store (--backup-dir keeps its key there too)."""
    return [p.name for p in backup_dir.iterdir() if p.name != "setup.key"]


def _containerd(tmp_path: Path, backup_dir: Path) -> tuple[Path, list[str]]:
    f = tmp_path / "containerd" / "config.toml"
    f.parent.mkdir()
    f.write_bytes(CONTAINERD)
    return f, ["setup", "containerd", "--config", str(f), "--set-as-default", "--backup-dir", str(backup_dir)]


def test_containerd_undo_keeps_what_the_admin_added_later(tmp_path, backup_dir, capsys):
    f, args = _containerd(tmp_path, backup_dir)
    assert nvhook(capsys, *args)[0] == 0
    f.write_text(f.read_text() + LATER)
    code, out, err = nvhook(capsys, *args, "--undo")
    assert code == 0, err
    cri = tomllib.loads(f.read_text())["plugins"][V2]["containerd"]
    # nvhook's runtime and default gone (the default back to runc); the admin's kata stays
    assert (cri["default_runtime_name"], sorted(cri["runtimes"])) == ("runc", ["kata", "runc"]), f.read_text()
    assert "# added by the admin after nvhook" in f.read_text() and "# keep this comment" in f.read_text()
    assert f.read_text() == CONTAINERD.decode() + LATER     # exactly: nvhook's lines gone, the rest as it was
    assert "took nvhook's settings out of" in out and _records(backup_dir) == []


def test_containerd_undo_keeps_a_setting_the_admin_changed_and_says_so(tmp_path, backup_dir, capsys):
    f, args = _containerd(tmp_path, backup_dir)
    assert nvhook(capsys, *args)[0] == 0
    text = f.read_text()
    f.write_text(text.replace('BinaryName = "', 'BinaryName = "/opt/admin/').replace(
        'default_runtime_name = "nvidia"', 'default_runtime_name = "kata"') + LATER)
    code, out, err = nvhook(capsys, *args, "--undo")
    assert code == 0, err
    cri = tomllib.loads(f.read_text())["plugins"][V2]["containerd"]
    assert (cri["default_runtime_name"], cri["runtimes"]["nvidia"]) == (
        "kata", {"options": {"BinaryName": "/opt/admin/" + _shim()}}), f.read_text()
    assert (f"kept in {f}, changed since nvhook set them: plugins.{V2}.containerd.default_runtime_name, "
            f"plugins.{V2}.containerd.runtimes.nvidia.options.BinaryName") in out, out


def test_undo_dry_run_shows_the_three_way_result_and_changes_nothing(tmp_path, backup_dir, capsys):
    f, args = _containerd(tmp_path, backup_dir)
    assert nvhook(capsys, *args)[0] == 0
    f.write_text(f.read_text() + LATER)
    was = tree_state(tmp_path)
    code, out, err = nvhook(capsys, *args, "--undo", "--dry-run")
    assert (code, tree_state(tmp_path)) == (0, was), err
    assert '-    default_runtime_name = "nvidia"' in out and "+    default_runtime_name = \"runc\"" in out, out
    assert "-# added by the admin" not in out and "kata" not in out.replace(" ", "").split("@@")[0]


def test_an_unparseable_file_now_is_one_line_and_nothing_changes(tmp_path, backup_dir, capsys):
    f, args = _containerd(tmp_path, backup_dir)
    assert nvhook(capsys, *args)[0] == 0
    f.write_text(f.read_text() + "[[[ broken\n")
    was = tree_state(tmp_path)
    code, out, err = nvhook(capsys, *args, "--undo")
    assert (code, out, tree_state(tmp_path)) == (1, "", was)
    assert err.startswith(f"nvhook: {f}: not valid TOML") and err.count("\n") == 1, err


def test_a_file_removed_since_is_left_absent(tmp_path, backup_dir, capsys):
    f, args = _containerd(tmp_path, backup_dir)
    assert nvhook(capsys, *args)[0] == 0
    f.unlink()
    code, out, err = nvhook(capsys, *args, "--undo")
    assert (code, f.exists(), _records(backup_dir)) == (0, False, []), err
    assert f"left {f} absent: removed since nvhook set it up" in out


def test_a_file_nvhook_made_keeps_only_the_admins_keys(tmp_path, backup_dir, capsys):
    # No config there before: nvhook made it; the admin added a key since.
    f = tmp_path / "config.toml"
    args = ["setup", "containerd", "--config", str(f), "--backup-dir", str(backup_dir)]
    assert nvhook(capsys, *args)[0] == 0
    f.write_text(f.read_text() + '\n[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "/etc/containerd/certs.d"\n')
    code, out, err = nvhook(capsys, *args, "--undo")
    assert code == 0, err
    assert tomllib.loads(f.read_text()) == {"plugins": {V2: {"registry": {"config_path": "/etc/containerd/certs.d"}}}}


def test_docker_undo_keeps_what_the_admin_added_later(tmp_path, backup_dir, capsys):
    f = tmp_path / "daemon.json"
    f.write_text('{\n  "log-driver": "journald"\n}\n')
    (tmp_path / "bin").mkdir()
    args = ["setup", "docker", "--config", str(f), "--hook-dir", str(tmp_path / "bin"), "--set-as-default",
            "--backup-dir", str(backup_dir)]
    assert nvhook(capsys, *args)[0] == 0
    doc = json.loads(f.read_text())
    doc["debug"] = True
    f.write_text(json.dumps(doc, indent=2) + "\n")
    code, out, err = nvhook(capsys, *args, "--undo")
    assert code == 0, err
    assert f.read_text() == '{\n  "log-driver": "journald",\n  "debug": true\n}\n'


def test_auto_undo_keeps_later_edits_of_nvhooks_own_config(tmp_path, a100_host, capsys):
    # The shim's config.toml, made by auto: the admin turned debug logging on since.
    from test_setup_auto import CTRD_16, V2_NO_CDI, Node

    n = Node(tmp_path, a100_host, containerd=(CTRD_16, V2_NO_CDI))
    assert nvhook(capsys, *n.argv)[0] == 0
    cfg = n.top / "nvhook/config.toml"
    cfg.write_text(cfg.read_text() + '\n[nvidia-container-cli]\ndebug = "/var/log/nvidia-container-toolkit.log"\n')
    code, out, err = nvhook(capsys, *n.argv, "--undo")
    assert code == 0, err
    assert tomllib.loads(cfg.read_text()) == {"nvidia-container-cli": {"debug": "/var/log/nvidia-container-toolkit.log"}}
    assert tomllib.loads(n.containerd_config.read_text()) == tomllib.loads(V2_NO_CDI)


def _shim() -> str:
    from libinject.setup.install import venv_program

    return venv_program("nvhook-runtime")


def test_real_containerd_reads_the_undone_config(tmp_path, backup_dir, capsys):
    """containerd 1.6's own `config dump` of the file --undo left (a private config of
    `containerd config default`, set up by auto's containerd target, then edited by the
    admin): nvhook's runtime and default gone, the admin's runtime there."""
    import subprocess

    from support.engines_daemons import private_containerd_config

    f = tmp_path / "config.toml"
    f.write_text(private_containerd_config(tmp_path / "state"))
    args = ["setup", "containerd", "--config", str(f), "--set-as-default", "--backup-dir", str(backup_dir)]
    assert nvhook(capsys, *args)[0] == 0
    f.write_text(f.read_text() + LATER)
    assert nvhook(capsys, *args, "--undo")[0] == 0
    dump = tomllib.loads(subprocess.run(["/usr/bin/containerd", "--config", str(f), "config", "dump"],
                                        capture_output=True, text=True, timeout=60, check=True).stdout)
    cri = dump["plugins"][V2]["containerd"]
    assert (cri["default_runtime_name"], "nvidia" in cri["runtimes"], cri["runtimes"]["kata"]["runtime_type"]) == (
        "runc", False, "io.containerd.kata.v2")
