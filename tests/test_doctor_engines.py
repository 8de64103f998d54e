"""`nvhook doctor` against running engines: a containerd whose CRI plugin did not load
(the config an earlier `nvhook setup containerd` wrote on Debian 12's packaged file:
only `nvidia` in runtimes, default_runtime_name "runc" naming nothing) and a running
dockerd with no daemon.json, or one without the nvidia runtime. Each is a FAIL with
what to do; the working set-ups beside them are OK."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import NVHOOK, run
from support import hookenv
from support.shimenv import SHIM

V2 = "io.containerd.grpc.v1.cri"
# Debian 12's packaged file, as an earlier nvhook left it: the CRI plugin cannot load.
BROKEN = f'''version = 2
[plugins]
  [plugins."{V2}"]
    [plugins."{V2}".containerd]
      [plugins."{V2}".containerd.runtimes]
        [plugins."{V2}".containerd.runtimes.nvidia]
          runtime_type = "io.containerd.runc.v2"
          [plugins."{V2}".containerd.runtimes.nvidia.options]
            BinaryName = "{SHIM}"
'''


@pytest.fixture
def eng_dir():
    from support.engines_daemons import short_dir

    d = short_dir("nvde")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _doctor(d: Path, host: Path, *args: str) -> tuple[int, dict[str, dict]]:
    cfg = hookenv.write_config(d / "c.toml", host, extra=f'socket = "{d}/none.sock"\n')
    absent = str(d / "absent")
    r = run([NVHOOK, "--config", str(cfg), "--root", str(host), "doctor", "--json",
             "--docker-config", absent, "--containerd-config", absent, "--crio-drop-in", absent,
             "--hooks-dir", absent, "--cdi-spec", absent, "--docker-socket", absent,
             "--containerd-socket", absent, *args])
    assert r.stderr == "", r.stderr
    return r.returncode, {c["name"]: c for c in json.loads(r.stdout)}


def _private(text: str, d: Path) -> str:
    return (f'root = "{d}/root"\nstate = "{d}/state"\n[grpc]\naddress = "{d}/c.sock"\n'
            f'[ttrpc]\naddress = "{d}/c.sock.ttrpc"\n[debug]\naddress = "{d}/debug.sock"\n'
            '[metrics]\naddress = ""\n' + text.replace("version = 2\n", ""))


@pytest.mark.parametrize("broken", [True, False], ids=["cri-not-loaded", "set-up"])
def test_containerd_whose_cri_did_not_load_fails(eng_dir, a100_host, broken, capsys):
    from support.cli import nvhook_in_process as nvhook
    from support.engines_daemons import Containerd

    cfg = eng_dir / "config.toml"
    if broken:
        cfg.write_text("version = 2\n" + _private(BROKEN, eng_dir))
    else:
        cfg.write_text("version = 2\n" + _private('[plugins."io.containerd.grpc.v1.cri".cni]\nbin_dir = "/usr/lib/cni"\n',
                                                  eng_dir))
        code, out, err = nvhook(capsys, "setup", "containerd", "--config", str(cfg),
                                "--backup-dir", str(eng_dir / "store"))
        assert code == 0, err
    c = Containerd(eng_dir, cfg, {})
    try:
        code, checks = _doctor(eng_dir, a100_host, "--containerd-config", str(cfg),
                               "--containerd-socket", str(c.sock))
    finally:
        c.stop()
    if broken:
        assert (code, checks["containerd"]["status"]) == (1, "FAIL")
        assert checks["containerd"]["detail"] == (f"containerd ({c.sock}) runs, but its CRI plugin did not "
                                                  "load (status error): the node runs no pods")
        assert "`nvhook setup containerd` writes runc out" in checks["containerd"]["todo"]
    else:
        assert (code, checks["containerd"]) == (0, {"status": "OK", "name": "containerd", "todo": "",
                                                    "detail": f"{cfg} runs {SHIM}"})


@pytest.mark.parametrize("daemon_json", [None, "{}", "nvhook"], ids=["no-daemon-json", "no-runtime", "set-up"])
def test_a_running_docker_not_set_up_fails(eng_dir, a100_host, daemon_json, capsys):
    from support.cli import nvhook_in_process as nvhook
    from support.engines_daemons import Dockerd

    used = eng_dir / "dockerd.json"          # what dockerd started with
    used.write_text("{}")
    doctor_sees = eng_dir / "daemon.json"     # what doctor reads as /etc/docker/daemon.json
    if daemon_json == "nvhook":
        (eng_dir / "bin").mkdir()
        code, out, err = nvhook(capsys, "setup", "docker", "--config", str(doctor_sees), "--hook-dir",
                                str(eng_dir / "bin"), "--backup-dir", str(eng_dir / "store"))
        assert code == 0, err
        used.write_text(doctor_sees.read_text())
    elif daemon_json is not None:
        doctor_sees.write_text(daemon_json)
    d = Dockerd(eng_dir / "d", used, eng_dir, {})
    try:
        code, checks = _doctor(eng_dir, a100_host, "--docker-config", str(doctor_sees),
                               "--docker-socket", str(d.sock))
    finally:
        d.stop()
    if daemon_json is None:
        assert (code, checks["docker"]) == (1, {
            "status": "FAIL", "name": "docker", "todo": "`nvhook setup docker`",
            "detail": f"dockerd is running ({d.sock}) and {doctor_sees} does not exist: no nvidia runtime"})
    elif daemon_json == "{}":
        assert (code, checks["docker"]) == (1, {
            "status": "FAIL", "name": "docker", "todo": "`nvhook setup docker`",
            "detail": f"dockerd is running ({d.sock}) and {doctor_sees} has no nvidia runtime (nor CDI on)"})
    else:
        assert (code, checks["docker"]["status"]) == (0, "OK"), checks
