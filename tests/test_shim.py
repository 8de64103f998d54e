"""The runtime shim (nvhook-runtime) in front of real runc: non-create commands pass
through unchanged; `create` in cdi, legacy and csv modes gives the container the hook
gives (same GPUs visible, same cgroup verdicts, same driver files)."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

import support.runc as R
from conftest import NVHOOK, run
from support.driverview import SNAPSHOT, snapshot_lines
from support.shimenv import ENV_PATH, SHIM, gpu_env, prestart_hooks, write_config


@pytest.fixture
def shim_env(monkeypatch, sim_host, tmp_path):
    """(host, spec dir, configure(mode, **kw)): runc commands of RuncContainer go
    through the shim, with config.toml from configure()."""
    host = sim_host("a100x8")
    specs = tmp_path / "specs"
    specs.mkdir()
    # every capability (the default spec leaves compat32 out): what the hook gives for "all"
    r = run([NVHOOK, "cdi", "generate", "--driver-root", str(host), "--capabilities", "all",
             "-o", str(specs / "nvidia.json")])
    assert r.returncode == 0, r.stderr
    monkeypatch.setattr(R, "RUNC", SHIM)

    def configure(mode: str, **kw) -> Path:
        cfg = write_config(tmp_path / "config.toml", root=host, mode=mode, spec_dirs=[specs], **kw)
        monkeypatch.setenv("NVHOOK_CONFIG", str(cfg))
        return cfg

    return host, specs, configure


# a node of another GPU, made by runc but not allowed by the cgroup: must stay EPERM
OTHER = [("/dev/nvidia0", 195, 0)]


def probe(c: R.RuncContainer, minors=range(8)) -> dict[int, str]:
    return {m: c.open_result(f"/dev/nvidia{m}") for m in minors}


def reference_then_shim(shim_env, tmp_path: Path, monkeypatch, mode: str,
                        **kw) -> tuple[list[str], dict]:
    """The reference, GPU 1 by plain runc + our prestart hook (`nvhook prestart`): what
    its container sees (SNAPSHOT) and its open() verdicts. Then RuncContainer's runc
    commands go through the shim again, configured for `mode` (kw: configure()'s)."""
    host, _specs, configure = shim_env
    workdir = tmp_path / "ref"
    workdir.mkdir()
    cfg = write_config(workdir / "hook-config.toml", root=host, mode="legacy")
    monkeypatch.setattr(R, "RUNC", R.shutil.which("runc") or "/usr/sbin/runc")
    with R.RuncContainer(workdir, env=gpu_env("1"), hooks=prestart_hooks(cfg), devices=OTHER) as c:
        c.create()
        c.start()
        snap = c.exec("sh", "-c", SNAPSHOT)
        assert snap.returncode == 0, snap.stderr
        ref = snapshot_lines(snap.stdout), probe(c)
    monkeypatch.setattr(R, "RUNC", SHIM)
    configure(mode, **kw)
    return ref


def test_non_create_commands_pass_through(tmp_path, monkeypatch, sim_host):
    cfg = write_config(tmp_path / "config.toml", root=sim_host("t4x1"), mode="cdi",
                       spec_dirs=[tmp_path / "none"])
    monkeypatch.setenv("NVHOOK_CONFIG", str(cfg))
    with R.RuncContainer(tmp_path, env=[ENV_PATH, "NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0"]) as c:
        # created by runc itself: the shim never sees this create
        c.create()
        before = (c.bundle / "config.json").read_bytes()
        direct = c.runc("state", c.id)
        shim = run([SHIM, "--root", str(c.state_root), "state", c.id])
        assert shim.returncode == 0 and json.loads(shim.stdout) == json.loads(direct.stdout)
        # a failing command fails the same way, with runc's own message
        bad = run([SHIM, "--root", str(c.state_root), "state", "no-such-id"])
        ref = run([R.RUNC, "--root", str(c.state_root), "state", "no-such-id"])
        assert (bad.returncode, bad.stderr) == (ref.returncode, ref.stderr)
        r = run([SHIM, "--root", str(c.state_root), "delete", "--force", c.id])
        assert r.returncode == 0, r.stderr
        assert run([R.RUNC, "--root", str(c.state_root), "state", c.id]).returncode != 0
        assert (c.bundle / "config.json").read_bytes() == before
        c._created = False


def test_cdi_mode_matches_the_hook(shim_env, tmp_path, monkeypatch):
    ref_snap, ref_probe = reference_then_shim(shim_env, tmp_path, monkeypatch, "cdi")
    with R.RuncContainer(tmp_path, env=gpu_env("1"), devices=OTHER) as c:
        c.create()
        c.start()
        cfg = json.loads((c.bundle / "config.json").read_text())
        assert "NVIDIA_VISIBLE_DEVICES=void" in cfg["process"]["env"]
        assert {"allow": True, "type": "c", "major": 195, "minor": 1, "access": "rw"} in \
            cfg["linux"]["resources"]["devices"]
        snap = c.exec("sh", "-c", SNAPSHOT)
        assert snap.returncode == 0, snap.stderr
        assert snapshot_lines(snap.stdout) == ref_snap
        # /dev/nvidia0 exists (runc made it) but only GPU 1 is allowed
        assert probe(c) == ref_probe == {m: {0: "EPERM", 1: "ENXIO"}.get(m, "ENOENT") for m in range(8)}


def test_cdi_mode_annotations_and_errors(shim_env, tmp_path):
    host, specs, configure = shim_env
    configure("cdi")
    # annotations win over the env; unqualified ids go under the default kind
    with R.RuncContainer(tmp_path, env=gpu_env("1"),
                         annotations={"cdi.k8s.io/gpus": "nvidia.com/gpu=2,nvidia.com/gpu=3"}) as c:
        c.create()
        c.start()
        assert probe(c, range(4)) == {0: "ENOENT", 1: "ENOENT", 2: "ENXIO", 3: "ENXIO"}
    # an unknown device fails create and changes nothing; the error is in runc's log
    with R.RuncContainer(tmp_path, env=gpu_env("0,42")) as c:
        c.write_config()
        before = (c.bundle / "config.json").read_bytes()
        log = tmp_path / "log.json"
        r = run([SHIM, "--root", str(c.state_root), "--log", str(log), "--log-format", "json",
                 "create", "--bundle", str(c.bundle), c.id])
        assert r.returncode == 1
        assert r.stderr.strip() == "nvhook: unresolvable CDI devices nvidia.com/gpu=42"
        assert (c.bundle / "config.json").read_bytes() == before
        # nothing added to the bundle (the container's rootfs was built in it)
        assert sorted(p.name for p in c.bundle.iterdir()) == ["config.json", "rootfs"]
        entry = json.loads(log.read_text().splitlines()[-1])
        assert entry["level"] == "error" and "nvidia.com/gpu=42" in entry["msg"]
        assert run([R.shutil.which("runc"), "--root", str(c.state_root), "state", c.id]).returncode != 0


def test_legacy_mode_matches_the_hook(shim_env, tmp_path, monkeypatch):
    ref_snap, ref_probe = reference_then_shim(shim_env, tmp_path, monkeypatch, "legacy")
    log = tmp_path / "runc.log"
    with R.RuncContainer(tmp_path, env=gpu_env("1"), devices=OTHER) as c:
        c.write_config()
        # the container inherits create's stdio: a file, never a pipe we would wait on
        with open(tmp_path / "create.out", "w") as out:
            r = run([SHIM, "--root", str(c.state_root), "--log", str(log), "--debug", "create",
                     "--bundle", str(c.bundle), c.id], capture_output=False, stdout=out,
                    stderr=out, stdin=R.subprocess.DEVNULL, timeout=60)
        c._created = True
        assert r.returncode == 0, (tmp_path / "create.out").read_text()
        cfg = json.loads((c.bundle / "config.json").read_text())
        assert len(cfg["hooks"]["prestart"]) == 1
        c.start()
        snap = c.exec("sh", "-c", SNAPSHOT)
        assert snapshot_lines(snap.stdout) == ref_snap
        assert probe(c) == ref_probe
    text = log.read_text()
    assert re.search(r'level=info msg="nvhook-runtime: legacy: added prestart hook ', text)
    assert "level=debug" in text and "mode legacy -> legacy" in text


def test_legacy_hook_added_once_and_auto_mode(monkeypatch):
    from libinject import config
    from libinject.runtime import shim

    cfg = config.Config()
    log = shim.Log("")
    spec = {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}}
    assert shim.add_legacy_hook(spec, log) and not shim.add_legacy_hook(spec, log)
    assert len(spec["hooks"]["prestart"]) == 1
    assert shim.resolve_mode("auto", ["nvidia.com/gpu=0", "nvidia.com/gpu=GPU-x"]) == "cdi"
    assert shim.resolve_mode("auto", ["nvidia.com/gpu=0", "1"]) == "legacy"
    assert shim.resolve_mode("auto", []) == "legacy"
    assert shim.requested_devices({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}}, cfg) == ([], "none")
    a = shim.parse_args(["--root", "/r", "--log=/l", "--log-format", "json", "--debug", "create",
                         "-b", "/bun", "--pid-file", "/p", "cid"])
    assert (a.command, a.bundle, a.log, a.log_format, a.debug, a.container_id) == (
        "create", "/bun", "/l", "json", True, "cid")
    with pytest.raises(Exception, match="invalid"):
        shim.resolve_mode("bogus", [])


def test_csv_mode(shim_env, tmp_path, monkeypatch):
    host = shim_env[0]
    csv = tmp_path / "csv"
    ref_snap, ref_probe = reference_then_shim(shim_env, tmp_path, monkeypatch, "csv", csv_dir=str(csv))
    csv.mkdir()
    from libinject.discover.driver import discover

    drv = discover(str(host), snapshot=False)
    ml = next(lib for lib in drv.libraries if lib.name.startswith("libnvidia-ml.so."))
    rel = "/" + os.path.relpath(ml.path, host)
    (csv / "gpu.csv").write_text(
        "# test board\n"
        "dev, /dev/nvidiactl\ndev, /dev/nvidia1\n"
        f"lib, {rel}\nsym, {os.path.dirname(rel)}/libnvidia-ml.so.1\n"
        "lib, /usr/bin/nvidia-smi\nlib, /usr/lib/not-on-this-board.so\n")
    with R.RuncContainer(tmp_path, env=gpu_env("1"), devices=OTHER) as c:
        c.create()
        c.start()
        snap = snapshot_lines(c.exec("sh", "-c", SNAPSHOT).stdout)
        # the same nvidia-smi view and the same cgroup verdicts as the hook ...
        assert [x for x in snap if x.startswith("GPU ")] == [x for x in ref_snap if x.startswith("GPU ")]
        assert probe(c) == ref_probe
        # ... and exactly the files the csv lists, as the hook mounts them
        for line in snap:
            if line.startswith(("F /usr/lib/x86_64", "L /usr/lib/x86_64")) and "nvidia" in line:
                assert line in ref_snap
        assert any(f"F {rel}" in x for x in snap)
    # a bad csv line: create fails, one clear line
    (csv / "z.csv").write_text("bin, /usr/bin/x\n")
    with R.RuncContainer(tmp_path, env=gpu_env("1")) as c:
        c.write_config()
        r = run([SHIM, "--root", str(c.state_root), "create", "--bundle", str(c.bundle), c.id])
        assert r.returncode == 1 and "expected 'dev|lib|sym|dir, PATH'" in r.stderr
        assert r.stderr.count("\n") == 1
