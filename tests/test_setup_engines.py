"""`nvhook setup docker|containerd|crio|podman`: each engine's file over a table of
what was there before (absent, empty, with unrelated keys and comments, already
configured, containerd v2 / v3 / with an imports conf.d, CRI-O with other drop-ins),
then the real engines running a container through what nvhook wrote.

Every file lives under tmp_path (--config, --hook-dir, and the store of backups): the
host's /etc/docker, /etc/containerd, /etc/crio, /etc/cdi and /var/lib/nvhook are never
touched.
"""
from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest
import yaml

from libinject.constants import SAFE_PATH
from support.cli import nvhook_in_process as nvhook, tree_state
from support.shimenv import SHIM

FRONT = str(Path(SHIM).with_name("nvhook-hook"))
V2 = "io.containerd.grpc.v1.cri"
V3 = "io.containerd.cri.v1.runtime"


@pytest.fixture(autouse=True)
def backup_dir(tmp_path, monkeypatch) -> Path:
    """The store of setup's backups, under tmp_path: never the host's /var/lib/nvhook."""
    from libinject.setup import store

    d = tmp_path / "setup-backups"
    monkeypatch.setattr(store, "STORE_DIR", str(d))
    return d

# -- the table of files there before ----------------------------------------------------------

DOCKER = {
    "absent": None,
    "empty": b"",
    "unrelated": b'{\n\t"log-level": "warn",\n\t"runtimes": {\n\t\t"other": {"path": "/usr/bin/other", "runtimeArgs": ["-x"]}\n\t},\n\t"data-root": "/srv/docker"\n}\n',
    "configured": ('{\n    "runtimes": {\n        "nvidia": {\n            "path": "%s"\n        }\n    },\n'
                   '    "default-runtime": "nvidia",\n    "features": {\n        "cdi": true\n    }\n}' % SHIM).encode(),
}
CONTAINERD = {
    "absent": None,
    "empty": b"",
    "v2": b'''# containerd 1.6, by the admin
version = 2
root = "/var/lib/containerd"   # keep this comment

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.local/pause:3.6"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = true
  [plugins."io.containerd.unknown.v1.thing"]
    knob = 7
''',
    "v3": b'''version = 3
# containerd 2.x
[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"   # unknown to us: kept
''',
    "configured": ('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  enable_cdi = true\n'
                   '  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]\n'
                   '[plugins."io.containerd.grpc.v1.cri".containerd]\n  default_runtime_name = "nvidia"\n'
                   '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
                   '  runtime_type = "io.containerd.runc.v2"\n'
                   '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
                   f'  BinaryName = "{SHIM}"  # ours\n').encode(),
    "imports": b'''version = 2
imports = ["conf.d/*.toml"]
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.local/pause:3.6"
''',
}
CRIO = {
    "absent": None,
    "empty": b"",
    "unrelated": b'# the admin\'s own 99-nvhook.toml\n[crio.runtime]\nlog_level = "debug"  # keep\n[crio.image]\npause_image = "registry.local/pause:3.9"\n',
    "configured": (f'[crio.runtime]\ndefault_runtime = "nvidia"\n[crio.runtime.runtimes.nvidia]\n'
                   f'runtime_path = "{SHIM}"\nruntime_type = "oci"\n').encode(),
    "other drop-ins": None,
}
PODMAN = {
    "absent": None,
    "other spec": b"cdiVersion: 0.3.0\nkind: nvidia.com/gpu\ndevices: []\n",
}
CASES = [(e, c) for e, table in (("docker", DOCKER), ("containerd", CONTAINERD), ("crio", CRIO),
                                 ("podman", PODMAN)) for c in table]
BEFORE = {"docker": DOCKER, "containerd": CONTAINERD, "crio": CRIO, "podman": PODMAN}
# text of each case that must survive (comments, unknown keys)
SURVIVES = {
    ("docker", "unrelated"): ['"log-level": "warn"', '"data-root": "/srv/docker"', '"runtimeArgs"'],
    ("containerd", "v2"): ["# containerd 1.6, by the admin", "# keep this comment",
                           'sandbox_image = "registry.local/pause:3.6"', "knob = 7", "SystemdCgroup = true"],
    ("containerd", "v3"): ["# containerd 2.x", "# unknown to us: kept", 'snapshotter = "overlayfs"'],
    ("containerd", "configured"): ["# ours"],
    ("crio", "unrelated"): ["# the admin's own 99-nvhook.toml", "# keep", 'pause_image = "registry.local/pause:3.9"'],
}


class Node:
    """One engine's files under tmp_path, and `nvhook setup ENGINE` run on them."""

    def __init__(self, tmp_path: Path, engine: str, case: str, host: Path | None = None) -> None:
        self.engine, self.case, self.host = engine, case, host
        self.top = tmp_path / engine
        self.bin = tmp_path / "bin"
        self.bin.mkdir(exist_ok=True)
        self.file = {"docker": self.top / "daemon.json", "containerd": self.top / "config.toml",
                     "crio": self.top / "crio.conf.d/99-nvhook.toml",
                     "podman": self.top / "cdi/nvidia.yaml"}[engine]
        self.file.parent.mkdir(parents=True)
        data = BEFORE[engine][case]
        if data is not None:
            self.file.write_bytes(data)
            os.chmod(self.file, 0o640)
            os.chown(self.file, 0, 4)
        # where the settings end up (containerd with imports: its drop-in)
        self.result = self.file
        if (engine, case) == ("containerd", "imports"):
            (self.top / "conf.d").mkdir()
            (self.top / "conf.d/10-mirror.toml").write_text(
                'version = 2\n[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "/etc/containerd/certs.d"\n')
            self.result = self.top / "conf.d/99-nvhook.toml"
        if (engine, case) == ("crio", "other drop-ins"):
            (self.file.parent / "10-crun.conf").write_text('[crio.runtime]\ndefault_runtime = "crun"\n')
            (self.file.parent / "zz-later.toml").write_text('[crio.image]\nbig_files_temporary_dir = "/var/tmp"\n')

    def args(self) -> list[str]:
        pre = ["--root", str(self.host)] if self.engine == "podman" else []
        a = [*pre, "setup", self.engine, "--config", str(self.file)]
        if self.engine == "docker":
            a += ["--hook-dir", str(self.bin)]
        if self.engine in ("docker", "containerd", "crio"):
            a.append("--set-as-default")
        if self.engine in ("docker", "containerd"):
            a.append("--cdi")
        return a

    def snapshot(self) -> dict[str, tuple]:
        """Every entry under the engine's dir and the hook dir: bytes or link, mode, owner."""
        return tree_state(self.top, self.bin)


@pytest.fixture
def node(request, tmp_path, a100_host):
    engine, case = request.param
    return Node(tmp_path, engine, case, a100_host)


def _check_keys(n: Node) -> None:
    data = n.result.read_bytes()
    if n.engine == "docker":
        d = json.loads(data)
        assert (d["runtimes"]["nvidia"]["path"], d["default-runtime"], d["features"]["cdi"]) == (SHIM, "nvidia", True)
        assert os.readlink(n.bin / "nvidia-container-runtime-hook") == FRONT
    elif n.engine == "containerd":
        d = tomllib.loads(data.decode())
        cri = d["plugins"][V3 if n.case == "v3" else V2]
        nv = cri["containerd"]["runtimes"]["nvidia"]
        assert (nv["runtime_type"], nv["options"]["BinaryName"], cri["containerd"]["default_runtime_name"],
                cri["enable_cdi"], cri["cdi_spec_dirs"]) == (
            "io.containerd.runc.v2", SHIM, "nvidia", True, ["/etc/cdi", "/var/run/cdi"])
        assert d["version"] == (3 if n.case == "v3" else 2)
    elif n.engine == "crio":
        d = tomllib.loads(data.decode())["crio"]["runtime"]
        assert (d["default_runtime"], d["runtimes"]["nvidia"]) == (
            "nvidia", {"runtime_path": SHIM, "runtime_type": "oci"})
    else:
        d = yaml.safe_load(data)
        names = [x["name"] for x in d["devices"]]
        assert d["kind"] == "nvidia.com/gpu" and "1" in names and "all" in names
        assert {h["path"] for h in d["containerEdits"]["hooks"]} == {FRONT}


# -- unit: the table ----------------------------------------------------------------------------

@pytest.mark.parametrize("node", CASES, indirect=True, ids=[f"{e}-{c}" for e, c in CASES])
def test_result_has_the_right_keys(node, capsys):
    code, out, err = nvhook(capsys, *node.args())
    assert code == 0, err
    _check_keys(node)


@pytest.mark.parametrize("node", list(SURVIVES), indirect=True, ids=[f"{e}-{c}" for e, c in SURVIVES])
def test_comments_and_unknown_keys_survive(node, capsys):
    assert nvhook(capsys, *node.args())[0] == 0
    text = node.result.read_text()
    assert [s for s in SURVIVES[(node.engine, node.case)] if s not in text] == []


@pytest.mark.parametrize("node", CASES, indirect=True, ids=[f"{e}-{c}" for e, c in CASES])
def test_second_run_is_unchanged(node, capsys):
    assert nvhook(capsys, *node.args())[0] == 0
    was = node.snapshot()
    ino = node.result.stat().st_ino
    code, out, _ = nvhook(capsys, *node.args())
    assert (code, node.snapshot(), node.result.stat().st_ino) == (0, was, ino)
    assert out.startswith(f"unchanged: {node.result}\n"), out


@pytest.mark.parametrize("node", CASES, indirect=True, ids=[f"{e}-{c}" for e, c in CASES])
def test_dry_run_writes_nothing_and_prints_a_diff(node, capsys):
    was = node.snapshot()
    code, out, err = nvhook(capsys, *node.args(), "--dry-run")
    assert code == 0 and node.snapshot() == was, err
    if (node.engine, node.case) in (("docker", "configured"), ("crio", "configured"), ("containerd", "configured")):
        assert out.startswith(f"unchanged: {node.result}\n"), out
    else:
        old = str(node.result) if node.result.exists() else "/dev/null"
        assert out.startswith(f"--- {old}\n+++ {node.result}\n@@ "), out


@pytest.mark.parametrize("node", CASES, indirect=True, ids=[f"{e}-{c}" for e, c in CASES])
def test_undo_is_byte_identical(node, capsys):
    was = node.snapshot()
    assert nvhook(capsys, *node.args())[0] == 0
    code, out, err = nvhook(capsys, *node.args(), "--undo")
    assert code == 0, err
    assert node.snapshot() == was, out


UNPARSEABLE = [("docker", b'{"runtimes": {,}}\n', "not valid JSON"), ("docker", b"[1]\n", "not a JSON object"),
               ("containerd", b'version = 2\n[plugins\n', "not valid TOML"),
               ("containerd", b'root = "/var/lib/containerd"\n', "version 1 is not supported"),
               ("crio", b"[crio.runtime\n", "not valid TOML"),
               ("crio", b'crio = "a string"\n', "crio is not a table")]


@pytest.mark.parametrize("engine, data, expected", UNPARSEABLE, ids=[f"{e}-{x}" for e, _, x in UNPARSEABLE])
def test_unparseable_file_is_one_error_line_and_nothing_changes(tmp_path, capsys, engine, data, expected):
    n = Node(tmp_path, engine, "absent")
    n.file.write_bytes(data)
    was = n.snapshot()
    code, out, err = nvhook(capsys, *n.args())
    assert code == 1 and out == "" and n.snapshot() == was
    assert err.startswith("nvhook: ") and err.count("\n") == 1 and expected in err, err


# -- unit: what each engine adds ------------------------------------------------------------------

def test_containerd_imports_get_a_drop_in_and_the_main_file_is_untouched(tmp_path, capsys):
    n = Node(tmp_path, "containerd", "imports")
    nvhook(capsys, *n.args())
    assert n.file.read_bytes() == CONTAINERD["imports"]
    # containerd 1.x replaces the plugin's section with the import's: ours carries the rest
    cri = tomllib.loads(n.result.read_text())["plugins"][V2]
    assert (cri["sandbox_image"], cri["registry"]["config_path"]) == (
        "registry.local/pause:3.6", "/etc/containerd/certs.d")


def test_containerd_drop_in_backup_is_outside_the_imported_dir(tmp_path, capsys):
    n = Node(tmp_path, "containerd", "imports")
    nvhook(capsys, *n.args())
    assert sorted(p.name for p in (n.top / "conf.d").iterdir()) == ["10-mirror.toml", "99-nvhook.toml"]


def test_containerd_new_runtime_copies_runcs_options(tmp_path, capsys):
    n = Node(tmp_path, "containerd", "v2")
    nvhook(capsys, *n.args())
    opts = tomllib.loads(n.file.read_text())["plugins"][V2]["containerd"]["runtimes"]["nvidia"]["options"]
    assert opts == {"SystemdCgroup": True, "BinaryName": SHIM}


def test_crio_other_drop_ins_are_untouched_and_the_backup_is_outside(tmp_path, capsys):
    n = Node(tmp_path, "crio", "other drop-ins")
    before = {p.name: p.read_bytes() for p in n.file.parent.iterdir()}
    nvhook(capsys, *n.args())
    after = {p.name: p.read_bytes() for p in n.file.parent.iterdir()}
    assert after.keys() - before.keys() == {"99-nvhook.toml"}
    assert {k: after[k] for k in before} == before


def test_docker_hook_name_of_someone_else_is_kept(tmp_path, capsys):
    n = Node(tmp_path, "docker", "absent")
    (n.bin / "nvidia-container-runtime-hook").write_text("#!/bin/sh\n")
    code, out, _ = nvhook(capsys, *n.args())
    assert code == 0 and f"kept {n.bin}/nvidia-container-runtime-hook: not nvhook's (a file)" in out
    nvhook(capsys, *n.args(), "--undo")
    assert (n.bin / "nvidia-container-runtime-hook").read_text() == "#!/bin/sh\n"


def test_docker_keeps_a_one_line_files_layout(tmp_path, capsys):
    n = Node(tmp_path, "docker", "absent")
    n.file.write_text('{"debug": true}')
    nvhook(capsys, *n.args())
    assert n.file.read_text() == ('{"debug": true, "runtimes": {"nvidia": {"path": "%s"}}, '
                                  '"default-runtime": "nvidia", "features": {"cdi": true}}' % SHIM)


def test_undo_with_nothing_to_undo_changes_nothing(tmp_path, capsys):
    n = Node(tmp_path, "crio", "unrelated")
    was = n.snapshot()
    code, out, _ = nvhook(capsys, *n.args(), "--undo")
    assert code == 0 and out.startswith("nothing to undo") and n.snapshot() == was


def test_setup_engines_import_no_tomlkit_on_the_hook_path():
    """tomlkit is for `nvhook setup` only: the hook's modules never import it."""
    import subprocess
    import sys

    code = ("import sys, libinject.runtime.hook, libinject.runtime.shim, libinject.pipeline; "
            "print(sorted(m for m in sys.modules if m.startswith(('tomlkit', 'libinject.setup'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout == "[]\n", r.stderr


# -- real engines -----------------------------------------------------------------------------

def _shim_config(d: Path, host: Path) -> Path:
    from support.shimenv import write_config

    return write_config(d / "nvhook.toml", root=host, mode="legacy")


@pytest.fixture
def engine_dir():
    import shutil

    from support.engines_daemons import short_dir

    d = short_dir("nvse")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_containerd_runs_a_gpu_container_through_the_runtime_nvhook_wrote(engine_dir, a100_host,
                                                                          gpu_uuids, capsys):
    """containerd 1.6 started from the config `nvhook setup containerd` edited
    (`containerd config default` with private root/state/addresses).

    Exercised: containerd parses the file nvhook wrote; its CRI plugin starts with the
    `nvidia` runtime in its runtimes (its start-up log line); its own `config dump`
    gives that runtime's runtime_type and options.BinaryName, and the container runs
    with exactly those (`ctr run --runtime TYPE --runc-binary BINARY`): containerd's
    io.containerd.runc.v2 shim runs nvhook's shim as its runc, which adds the hook
    (config by NVHOOK_CONFIG in containerd's environment, which its shims inherit); the
    container sees GPU 1 only. Not exercised: the CRI plugin itself choosing the
    `nvidia` handler for a pod (needs a CRI client, CNI and a pause image; ctr has no
    runtime-handler option), default_runtime_name and enable_cdi (no CDI in 1.6).
    """
    from libinject.sim.rootfs import build_rootfs
    from support.engines_daemons import Containerd, private_containerd_config, uuids_seen
    from support.runc import RuncContainer

    cfg = engine_dir / "config.toml"
    cfg.write_text(private_containerd_config(engine_dir))
    code, out, err = nvhook(capsys, "setup", "containerd", "--config", str(cfg))
    assert code == 0, err
    dump = tomllib.loads(__import__("subprocess").run(
        ["/usr/bin/containerd", "--config", str(cfg), "config", "dump"], capture_output=True,
        text=True, timeout=60, check=True).stdout)
    nv = dump["plugins"][V2]["containerd"]["runtimes"]["nvidia"]
    assert (nv["runtime_type"], nv["options"]["BinaryName"]) == ("io.containerd.runc.v2", SHIM)
    shim_cfg = _shim_config(engine_dir, a100_host)
    ctrd = Containerd(engine_dir, cfg, {"NVHOOK_CONFIG": str(shim_cfg)})
    try:
        assert "Runtimes:map[nvidia:{Type:io.containerd.runc.v2 " in ctrd.log.read_text()
        assert f"BinaryName:{SHIM} " in ctrd.log.read_text()
        with RuncContainer(engine_dir, args=["nvidia-smi", "-L"],
                           env=["PATH=/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=1"]) as c:
            spec = engine_dir / "spec.json"
            spec.write_text(json.dumps(c.config))
            r = ctrd.ctr("run", "--rm", "--runtime", nv["runtime_type"], "--runc-binary",
                         nv["options"]["BinaryName"], "--config", str(spec), "gpu1")
        assert uuids_seen(r.stdout) == [gpu_uuids[1]], r.stdout + r.stderr
        # `ctr run` with its own defaults (a tmpfs on the container's /run): the
        # persistenced socket lands in that tmpfs (old code: refusing /run)
        rootfs = build_rootfs(engine_dir / "ctr-rootfs")
        r = ctrd.ctr("run", "--rm", "--runtime", nv["runtime_type"], "--runc-binary",
                     nv["options"]["BinaryName"], "--env", "PATH=/usr/bin:/bin", "--env", "NVIDIA_VISIBLE_DEVICES=1",
                     "--rootfs", str(rootfs), "gpu1-defaults", "sh", "-c",
                     "grep ' /run tmpfs' /proc/mounts | cut -d' ' -f3; "
                     "test -S /run/nvidia-persistenced/socket && echo SOCKET; nvidia-smi -L")
        assert r.stdout.splitlines()[:2] == ["tmpfs", "SOCKET"], r.stdout + r.stderr
        assert uuids_seen(r.stdout) == [gpu_uuids[1]], r.stdout + r.stderr
    finally:
        ctrd.stop()


DOCKERD = "/usr/sbin/dockerd"


@pytest.fixture
def dockerd(engine_dir, a100_host, capsys):
    """A private dockerd started from the daemon.json `nvhook setup docker` wrote, with
    the hook link it made (--hook-dir) first on its PATH, and /etc/nvidia-container-runtime/
    config.toml (driver root: the simulated host; legacy mode) over its /etc, where the
    shim and the `--gpus` hook (whose entry has no --config) read it."""
    from libinject.sim.rootfs import build_rootfs
    from support.engines_daemons import Dockerd
    from support.shimenv import write_config

    daemon_json = engine_dir / "daemon.json"
    hook_dir = engine_dir / "bin"
    hook_dir.mkdir()
    code, out, err = nvhook(capsys, "setup", "docker", "--config", str(daemon_json),
                            "--hook-dir", str(hook_dir))
    assert code == 0, err
    conf = write_config(engine_dir / "c.toml", root=a100_host, mode="legacy").read_text()
    d = Dockerd(engine_dir / "d", daemon_json, hook_dir,
                {"nvidia-container-runtime/config.toml": conf})
    try:
        d.import_rootfs(build_rootfs(engine_dir / "rootfs"), "nvhook-test:1")
        yield d
    finally:
        d.stop()


def test_docker_runtime_nvidia_sees_only_gpu_1(dockerd, gpu_uuids):
    """`docker run --runtime=nvidia`: dockerd runs the shim named in daemon.json."""
    from support.engines_daemons import uuids_seen

    r = dockerd.run("--runtime=nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=1", "nvhook-test:1", "nvidia-smi", "-L")
    assert uuids_seen(r.stdout.decode()) == [gpu_uuids[1]], r.stdout + r.stderr


def test_docker_gpus_flag_sees_only_gpu_1(dockerd, gpu_uuids):
    """`docker run --gpus device=1` (default runtime runc): dockerd's hook is the
    nvidia-container-runtime-hook link nvhook made."""
    from support.engines_daemons import uuids_seen

    r = dockerd.run("--gpus", "device=1", "nvhook-test:1", "nvidia-smi", "-L")
    assert uuids_seen(r.stdout.decode()) == [gpu_uuids[1]], r.stdout + r.stderr


@pytest.mark.parametrize("flags", [["--tmpfs", "/run"], ["--read-only"]])
def test_docker_gpus_with_a_tmpfs_run_or_read_only(dockerd, gpu_uuids, flags):
    """`docker run --tmpfs /run --gpus device=1` and `docker run --read-only --gpus
    device=1` start with GPU 1 and the persistenced socket (old code, --tmpfs /run:
    `cannot create /run/nvidia-persistenced ...: refusing`)."""
    from support.engines_daemons import uuids_seen

    r = dockerd.run(*flags, "--gpus", "device=1", "nvhook-test:1", "sh", "-c",
                    "test -S /run/nvidia-persistenced/socket && echo SOCKET; nvidia-smi -L")
    out = r.stdout.decode()
    assert out.splitlines()[:1] == ["SOCKET"], out + r.stderr.decode()
    assert uuids_seen(out) == [gpu_uuids[1]], out


def test_podman_applies_the_cdi_spec_nvhook_wrote(tmp_path, a100_host, gpu_uuids, capsys):
    """`nvhook setup podman` writes the spec; podman 4.3 (its /etc/cdi bound to the spec's
    dir in a private mount namespace) gives the container GPU 1 only."""
    from libinject.sim.rootfs import build_rootfs
    from support.engines_daemons import uuids_seen
    from support.podman import Podman, state_dir

    specs = tmp_path / "cdi"
    specs.mkdir()
    code, out, err = nvhook(capsys, "--root", str(a100_host), "setup", "podman", "--config",
                            str(specs / "nvidia.yaml"))
    assert code == 0, err
    rootfs = build_rootfs(tmp_path / "rootfs")
    with state_dir() as state:
        p = Podman(state / "s")
        try:
            r = p.run(rootfs, ["nvidia-smi", "-L"], cdi_specs=specs, devices=["nvidia.com/gpu=1"])
        finally:
            p.cleanup()
    assert uuids_seen(r.stdout) == [gpu_uuids[1]], r.stdout + r.stderr


def test_programs_a_user_could_replace_are_never_configured(tmp_path):
    """Engines (and systemd) run the shim and the hook as root on every container: a
    front in a venv a user owns, or in a directory others can write, is refused."""
    from libinject.errors import NvhookError
    from libinject.setup.install import trusted_program

    d = tmp_path / "venv/bin"
    d.mkdir(parents=True)
    os.chmod(tmp_path, 0o755)
    os.chmod(tmp_path / "venv", 0o755)
    prog = d / "nvhook-runtime"
    prog.write_text("#!/bin/sh\n")
    prog.chmod(0o755)
    trusted_program(str(prog))                      # root's, 0755 all the way: fine
    os.chown(prog, 65534, 65534)
    with pytest.raises(NvhookError, match="must be owned by root"):
        trusted_program(str(prog))
    os.chown(prog, 0, 0)
    d.chmod(0o777)
    with pytest.raises(NvhookError, match=f"directory {d} "):
        trusted_program(str(prog))
    d.chmod(0o755)
    os.chown(tmp_path / "venv", 65534, 65534)
    with pytest.raises(NvhookError, match="directory .*venv "):
        trusted_program(str(prog))


@pytest.mark.parametrize("given", [True, False])
def test_crio_handler_gets_nvhooks_config_through_monitor_env(tmp_path, capsys, given):
    """CRI-O starts conmon, and so the handler's shim, with only the handler's
    monitor_env and PATH: `nvhook --config F setup crio` puts NVHOOK_CONFIG=F there (old
    code: F was ignored and the shim read the default config); without --config the
    handler gets no environment of ours."""
    n = Node(tmp_path, "crio", "absent")
    cfg = tmp_path / "etc" / "nvhook.toml"
    code, out, err = nvhook(capsys, *(["--config", str(cfg)] if given else []), *n.args())
    assert code == 0, err
    nv = tomllib.loads(n.file.read_text())["crio"]["runtime"]["runtimes"]["nvidia"]
    if given:
        assert nv["monitor_env"] == [f"PATH={SAFE_PATH}", f"NVHOOK_CONFIG={cfg}"]
    else:
        assert "monitor_env" not in nv


def test_setup_says_whether_gpu_containers_will_be_served(tmp_path, a100_host, sockdir, capsys):
    """`nvhook setup docker` ends with whether the hook service answers on the config's
    socket, and how to start it when it does not (served is the fast path)."""
    from support import hookenv
    from support.serve import Serve

    sock = sockdir / "hook.sock"
    cfg = hookenv.write_config(tmp_path / "c.toml", a100_host, extra=f'socket = "{sock}"\n')
    n = Node(tmp_path, "docker", "absent")
    code, out, err = nvhook(capsys, "--config", str(cfg), *n.args())
    assert code == 0, err
    assert out.splitlines()[-1] == (f"the hook service is not running ({sock}): GPU containers take "
                                    "the exec'd hook, about twice as slow; `nvhook setup service` "
                                    "installs and starts it")
    s = Serve(cfg, sock)
    try:
        code, out, err = nvhook(capsys, "--config", str(cfg), *n.args())
        assert out.splitlines()[-1] == f"the hook service answers on {sock}: GPU containers are served"
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("target", ["containerd", "docker", "crio", "podman", "auto", "service"])
def test_non_root_dry_run_says_it_needs_root(tmp_path, target):
    """A user without root asking what setup would do: one line saying it needs root,
    not a "Permission denied" from somewhere on the way; nothing written."""
    import subprocess

    from conftest import NVHOOK

    os.chmod(tmp_path, 0o755)
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", NVHOOK,
                        "setup", target, "--dry-run"], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert (r.returncode, r.stdout) == (1, ""), r.stderr
    assert r.stderr == (f"nvhook: setup {target} needs root (it edits the engines' files and keeps their "
                        "backups in a root-only store), --dry-run too: run it as root; nothing changed\n")
