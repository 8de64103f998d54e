"""`nvhook setup auto`: the native-CDI decision over a table of detected engine states
(pure: libinject.setup.auto.decide over Facts), the CLI over fake engine binaries
(shell scripts printing a version and an effective config), and the real containerd
1.6 of this machine (its own `containerd config dump` of a private config).

Every file lives under tmp_path (--config, --containerd-config, --docker-config, ...,
--backup-dir): the host's /etc and /var/lib/nvhook are never touched.
"""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from libinject.setup.auto import HOOK, NATIVE, RUNTIME, Facts, decide
from support.cli import nvhook_in_process as nvhook, tree_state

CTRD_16 = "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3\n"
CTRD_17 = "containerd github.com/containerd/containerd v1.7.13 7c3aca7a610df76212171d200ca3811ff6096eb8\n"
CTRD_20 = "containerd github.com/containerd/containerd/v2 v2.0.2 c507a0257ea6462fbd6f5ba4f5c74facb04021f4\n"
CTRD_FORK = "containerd example.com/acme/containerd acme-lts-2024 deadbeef\n"
V2_NO_CDI = 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "pause:3.6"\n'
V2_CDI_ON = 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  enable_cdi = true\n  cdi_spec_dirs = ["/etc/cdi"]\n'
V2_CDI_OFF = 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  enable_cdi = false\n'
V3_CDI_ON = 'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n  enable_cdi = true\n'
CRIO_128 = "crio version 1.28.1\nGitCommit: abc\n"
CRIO_120 = "crio version 1.20.9\n"
CRIO_CONF_CDI = '[crio.runtime]\ndefault_runtime = "runc"\ncdi_spec_dirs = [\n  "/etc/cdi",\n]\n'
CRIO_CONF_OLD = '[crio.runtime]\ndefault_runtime = "runc"\n'
DOCKER_24 = "Docker version 24.0.7, build afdd53b\n"
DOCKER_25 = "Docker version 25.0.3, build f417435\n"

# name -> (facts, method, enable_cdi, a reason must contain)
TABLE = {
    "containerd 1.6": (Facts("containerd", "/c", CTRD_16, V2_NO_CDI), RUNTIME, False, "has no enable_cdi"),
    "containerd 1.7 cdi on": (Facts("containerd", "/c", CTRD_17, V2_CDI_ON), NATIVE, False, "enable_cdi = true"),
    "containerd 1.7 cdi off": (Facts("containerd", "/c", CTRD_17, V2_CDI_OFF), NATIVE, True, "turning it on"),
    "containerd 2.x v3": (Facts("containerd", "/c", CTRD_20, V3_CDI_ON), NATIVE, False, "io.containerd.cri.v1.runtime"),
    "containerd fork": (Facts("containerd", "/c", CTRD_FORK, V2_CDI_ON), NATIVE, False, "the config decides"),
    "containerd 1.7 renumbered 1.6": (Facts("containerd", "/c", CTRD_16, V2_CDI_ON), NATIVE, False,
                                      "would say otherwise; the config decides"),
    "containerd no dump 1.7": (Facts("containerd", "/c", CTRD_17, None, "exit 1"), NATIVE, True,
                               "decided by its version"),
    "crio with cdi": (Facts("crio", "/c", CRIO_128, CRIO_CONF_CDI), NATIVE, False, "has cdi_spec_dirs"),
    "crio without cdi": (Facts("crio", "/c", CRIO_120, CRIO_CONF_OLD), HOOK, False, "has no cdi_spec_dirs"),
    "docker 24": (Facts("docker", "/d", DOCKER_24, info_text='{"ServerVersion": "24.0.7"}'), RUNTIME, False,
                  "no CDI before 25"),
    "docker 25 cdi on": (Facts("docker", "/d", DOCKER_25, info_text='{"CDISpecDirs": ["/etc/cdi"]}'),
                         NATIVE, False, "`docker info` has CDISpecDirs"),
    "docker 25 cdi off": (Facts("docker", "/d", DOCKER_25, info_text='{"CDISpecDirs": []}'), NATIVE, True,
                          "turning it on"),
    "docker 25 no info features.cdi": (Facts("docker", "/d", DOCKER_25, daemon_json='{"features": {"cdi": true}}'),
                                       NATIVE, False, "features.cdi: true"),
    "docker 25 no info no features": (Facts("docker", "/d", DOCKER_25, daemon_json="{}"), NATIVE, True,
                                      "turning it on"),
}


@pytest.mark.parametrize("case", list(TABLE))
def test_decision_table(case):
    facts, method, enable, reason = TABLE[case]
    [d] = decide([facts])
    # containerd < 1.7 alone on the node: nothing applies CDI annotations, so the shim
    # reads the device plugin's default prefix too, and containerd must pass both on.
    prefixes = (["cdi.k8s.io/", "nvidia.cdi.k8s.io/"] if (method, facts.engine) == (RUNTIME, "containerd")
                else ["nvidia.cdi.k8s.io/"] if method == RUNTIME else [])
    assert (d.method, d.enable_cdi, d.native_cdi, d.set_as_default, d.runtime_mode,
            d.annotation_prefixes, d.container_annotations) == (
        method, enable, method == NATIVE, method == RUNTIME, None if method == HOOK else "cdi",
        prefixes, [p + "*" for p in prefixes] if facts.engine == "containerd" else [])
    assert any(reason in r for r in d.reasons), d.reasons


def test_containerd_16_beside_an_engine_applying_cdi_annotations_reads_only_the_operators_prefix():
    # CRI-O applies cdi.k8s.io/ itself; nvhook's config is the node's: its nvidia handler
    # must not apply those devices a second time.
    ctrd, crio = decide([TABLE["containerd 1.6"][0], TABLE["crio with cdi"][0]])
    assert (ctrd.annotation_prefixes, ctrd.container_annotations) == (
        ["nvidia.cdi.k8s.io/"], ["nvidia.cdi.k8s.io/*"])
    assert any("crio here applies cdi.k8s.io/ annotations itself" in r for r in ctrd.reasons), ctrd.reasons


def test_native_engines_report_their_spec_dirs():
    ctrd, crio = decide([TABLE["containerd 1.7 cdi on"][0], TABLE["crio with cdi"][0]])
    assert (ctrd.spec_dirs, crio.spec_dirs) == (["/etc/cdi"], ["/etc/cdi"])
    [d] = decide([TABLE["containerd 1.7 cdi off"][0]])
    assert d.spec_dirs == ["/etc/cdi", "/var/run/cdi"]


def test_no_engine_present_decides_nothing():
    assert decide([Facts("containerd"), Facts("crio"), Facts("docker")]) == []


def test_several_engines_each_get_their_own_decision():
    ds = decide([TABLE["containerd 1.6"][0], Facts("crio"), TABLE["docker 25 cdi on"][0]])
    assert [(d.engine, d.method) for d in ds] == [("containerd", RUNTIME), ("docker", NATIVE)]


# -- the CLI over fake engines ------------------------------------------------------------------

def _script(path: Path, cases: dict[str, str]) -> str:
    """A fake engine binary: prints cases[ARGS-suffix] (the first whose key ends $*)."""
    body = "".join(f'  *"{k}") cat <<\'EOF\'\n{v}EOF\n  ;;\n' for k, v in cases.items())
    path.write_text(f'#!/bin/sh\ncase "$*" in\n{body}  *) exit 3 ;;\nesac\n')
    path.chmod(0o755)
    return str(path)


class Node:
    """Fake engines (or none) and every file auto writes, under tmp_path."""

    def __init__(self, tmp_path: Path, host: Path, containerd: tuple[str, str] | None = None,
                 crio: tuple[str, str] | None = None, docker: tuple[str, str] | None = None) -> None:
        self.top = tmp_path / "node"
        b = tmp_path / "fakebin"
        for d in (self.top / "containerd", self.top / "crio/crio.conf.d", self.top / "docker",
                  self.top / "hooks.d", self.top / "cdi", self.top / "nvhook", self.top / "bin", b):
            d.mkdir(parents=True, exist_ok=True)
        self.containerd_config = self.top / "containerd/config.toml"
        self.containerd_config.write_text(V2_NO_CDI)
        none = str(tmp_path / "absent")
        self.argv = ["--config", str(self.top / "nvhook/config.toml"), "--root", str(host), "setup", "auto",
                     "--containerd-config", str(self.containerd_config),
                     "--crio-drop-in", str(self.top / "crio/crio.conf.d/99-nvhook.toml"),
                     "--hooks-dir", str(self.top / "hooks.d"),
                     "--docker-config", str(self.top / "docker/daemon.json"),
                     "--docker-hook-dir", str(self.top / "bin"), "--cdi-spec", str(self.top / "cdi/nvidia.yaml"),
                     "--backup-dir", str(tmp_path / "setup-backups"),
                     "--containerd-bin", none, "--crio-bin", none, "--dockerd-bin", none, "--docker-bin", none]
        if containerd:
            self._bin("--containerd-bin", _script(b / "containerd", {"--version": containerd[0],
                                                                     "config dump": containerd[1]}))
        if crio:
            self._bin("--crio-bin", _script(b / "crio", {"--version": crio[0], "config": crio[1]}))
        if docker:
            self._bin("--dockerd-bin", _script(b / "dockerd", {"--version": docker[0]}))
            self._bin("--docker-bin", _script(b / "docker", {"info --format {{json .}}": docker[1] + "\n"}))

    def _bin(self, opt: str, path: str) -> None:
        self.argv[self.argv.index(opt) + 1] = path

    def snapshot(self) -> dict[str, tuple]:
        return tree_state(self.top)


SEVERAL = dict(containerd=(CTRD_17, V2_CDI_OFF), crio=(CRIO_120, CRIO_CONF_OLD),
               docker=(DOCKER_24, '{"ServerVersion": "24.0.7"}'))


def test_json_has_every_key_with_its_type(tmp_path, a100_host, capsys):
    n = Node(tmp_path, a100_host, **SEVERAL)
    code, out, err = nvhook(capsys, *n.argv, "--json", "--dry-run")
    assert code == 0, err
    engines = json.loads(out)["engines"]
    types = {"engine": str, "version": str, "native_cdi": bool, "set_as_default": bool,
             "annotation_prefixes": list, "reasons": list}
    assert [e["engine"] for e in engines] == ["containerd", "crio", "docker"]
    assert [{k: type(e[k]) for k in types} for e in engines] == [types] * 3
    assert [e["runtime_mode"] for e in engines] == ["cdi", None, "cdi"]
    assert all(e["reasons"] and all(isinstance(r, str) for r in e["reasons"]) for e in engines)


def test_human_output_names_each_engine_and_its_reasons(tmp_path, a100_host, capsys):
    n = Node(tmp_path, a100_host, **SEVERAL)
    code, out, err = nvhook(capsys, *n.argv, "--dry-run")
    lines = out.splitlines()
    assert code == 0, err
    assert [line.split(":")[0] for line in lines if not line.startswith((" ", "-", "+", "@"))][:3] == [
        "containerd v1.7.13", "crio 1.20.9", "docker 24.0.7"], out
    assert "  why: [plugins.\"io.containerd.grpc.v1.cri\"] of its effective config (`containerd config dump`) " \
           "has enable_cdi = false: this containerd has CDI" in lines, out
    assert "  why: its effective config (`crio config`) has no cdi_spec_dirs: no CDI in this CRI-O " \
           "(it came in 1.23)" in lines, out


def test_dry_run_changes_nothing(tmp_path, a100_host, capsys):
    n = Node(tmp_path, a100_host, **SEVERAL)
    was = n.snapshot()
    code, out, err = nvhook(capsys, *n.argv, "--dry-run")
    assert (code, n.snapshot()) == (0, was), err


def test_apply_then_undo_is_byte_identical(tmp_path, a100_host, capsys):
    n = Node(tmp_path, a100_host, **SEVERAL)
    was = n.snapshot()
    assert nvhook(capsys, *n.argv)[0] == 0
    assert n.snapshot() != was
    code, out, err = nvhook(capsys, *n.argv, "--undo")
    assert (code, n.snapshot()) == (0, was), out + err


def test_apply_writes_what_each_decision_says(tmp_path, a100_host, capsys):
    """containerd 1.7 (CDI off): enable_cdi on, runtime added, not default; CRI-O 1.20:
    the hooks.d file; Docker 24: nvidia as the default runtime; nvhook's config in cdi
    mode with the nvidia.cdi.k8s.io/ prefix; the spec written."""
    n = Node(tmp_path, a100_host, **SEVERAL)
    assert nvhook(capsys, *n.argv)[0] == 0
    cri = tomllib.loads(n.containerd_config.read_text())["plugins"]["io.containerd.grpc.v1.cri"]
    assert (cri["enable_cdi"], "default_runtime_name" in cri["containerd"], "nvidia" in cri["containerd"]["runtimes"]) == (
        True, False, True)
    assert json.loads((n.top / "hooks.d/oci-nvhook.json").read_text())["when"] == {"always": True}
    assert json.loads((n.top / "docker/daemon.json").read_text())["default-runtime"] == "nvidia"
    rt = tomllib.loads((n.top / "nvhook/config.toml").read_text())["nvidia-container-runtime"]
    assert (rt["mode"], rt["modes"]["cdi"]["annotation-prefixes"]) == ("cdi", ["nvidia.cdi.k8s.io/"])
    assert (n.top / "cdi/nvidia.yaml").read_text().startswith("cdiVersion:")
    # the spec is not in /etc/cdi or /var/run/cdi: containerd (native CDI) and the shim look where it is
    assert (cri["cdi_spec_dirs"], rt["modes"]["cdi"]["spec-dirs"]) == (
        ["/etc/cdi", "/var/run/cdi", str(n.top / "cdi")], ["/etc/cdi", "/var/run/cdi", str(n.top / "cdi")])
    assert not (n.top / "crio/crio.conf.d/99-nvhook.toml").exists()


def test_no_engine_says_so_and_changes_nothing(tmp_path, a100_host, capsys):
    n = Node(tmp_path, a100_host)
    was = n.snapshot()
    code, out, err = nvhook(capsys, *n.argv)
    assert (code, out, n.snapshot()) == (
        0, "no container engine found (containerd, CRI-O, Docker): nothing to set up\n", was), err


def test_an_unparseable_engine_file_is_one_error_line_and_nothing_changes(tmp_path, a100_host, capsys):
    n = Node(tmp_path, a100_host, **SEVERAL)
    (n.top / "docker/daemon.json").write_text('{"runtimes": {,}}\n')
    was = n.snapshot()
    code, out, err = nvhook(capsys, *n.argv)
    assert (code, out, n.snapshot()) == (1, "", was)
    assert err.startswith("nvhook: ") and err.count("\n") == 1 and "not valid JSON" in err, err


# -- the real containerd 1.6 of this machine ------------------------------------------------------

CONTAINERD = "/usr/bin/containerd"


def test_real_containerd_16_is_set_up_as_default_runtime_in_cdi_mode_and_undone(tmp_path, a100_host, capsys):
    """Facts from the real binary (`containerd --version`, `containerd --config PRIVATE
    config dump` of `containerd config default` with private paths): no enable_cdi, so
    nvhook's runtime in cdi mode as the default runtime with the cdi.k8s.io/ and
    nvidia.cdi.k8s.io/ prefixes, which its container_annotations let through; the spec
    (under tmp_path, not /etc/cdi) among the shim's spec-dirs; containerd's own dump of
    the result has it; --undo is byte-identical."""
    from libinject.setup import auto
    from support.engines_daemons import private_containerd_config

    n = Node(tmp_path, a100_host)
    n.containerd_config.write_text(private_containerd_config(tmp_path / "state"))
    n._bin("--containerd-bin", CONTAINERD)
    facts = auto.gather(auto.Paths(containerd_config=str(n.containerd_config), containerd_bin=CONTAINERD,
                                   crio_bin=str(tmp_path / "absent"), dockerd_bin=str(tmp_path / "absent")))
    assert [(f.engine, bool(f.binary)) for f in facts] == [("containerd", True), ("crio", False), ("docker", False)]
    [d] = auto.decide(facts)
    assert (d.version.startswith("1.6."), d.native_cdi, d.runtime_mode, d.set_as_default, d.annotation_prefixes) == (
        True, False, "cdi", True, ["cdi.k8s.io/", "nvidia.cdi.k8s.io/"])
    was = n.snapshot()
    code, out, err = nvhook(capsys, *n.argv)
    assert code == 0, err
    import subprocess

    dump = tomllib.loads(subprocess.run([CONTAINERD, "--config", str(n.containerd_config), "config", "dump"],
                                        capture_output=True, text=True, timeout=60, check=True).stdout)
    ctrd = dump["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert (ctrd["default_runtime_name"], ctrd["runtimes"]["nvidia"]["container_annotations"]) == (
        "nvidia", ["cdi.k8s.io/*", "nvidia.cdi.k8s.io/*"])
    rt = tomllib.loads((n.top / "nvhook/config.toml").read_text())["nvidia-container-runtime"]
    assert (rt["mode"], rt["modes"]["cdi"]["annotation-prefixes"], rt["modes"]["cdi"]["spec-dirs"]) == (
        "cdi", ["cdi.k8s.io/", "nvidia.cdi.k8s.io/"], ["/etc/cdi", "/var/run/cdi", str(n.top / "cdi")])
    code, out, err = nvhook(capsys, *n.argv, "--undo")
    assert (code, n.snapshot()) == (0, was), out + err


def test_crio_with_cdi_gets_the_nvidia_handler_and_keeps_its_default(tmp_path, a100_host, capsys):
    n = Node(tmp_path, a100_host, crio=(CRIO_128, CRIO_CONF_CDI))
    code, out, err = nvhook(capsys, *n.argv)
    assert code == 0, err
    rt = tomllib.loads((n.top / "crio/crio.conf.d/99-nvhook.toml").read_text())["crio"]["runtime"]
    assert ("default_runtime" in rt, "nvidia" in rt["runtimes"], (n.top / "hooks.d/oci-nvhook.json").exists()) == (
        False, True, False)
    cfg = tomllib.loads((n.top / "nvhook/config.toml").read_text())["nvidia-container-runtime"]
    spec_dirs = ["/etc/cdi", "/var/run/cdi", str(n.top / "cdi")]
    assert cfg == {"mode": "cdi", "modes": {"cdi": {"spec-dirs": spec_dirs}}}
    # CRI-O applies the spec itself: its cdi_spec_dirs (a drop-in's replace crio.conf's) include it
    assert rt["cdi_spec_dirs"] == ["/etc/cdi"] + [str(n.top / "cdi")]
    # the handler's shim reads that config: CRI-O passes it no environment but monitor_env
    assert rt["runtimes"]["nvidia"]["monitor_env"][1] == f"NVHOOK_CONFIG={n.top / 'nvhook/config.toml'}"


def test_a_spec_in_a_default_dir_adds_no_spec_dirs():
    # The default /var/run/cdi/nvidia.yaml: every reader looks there already; nothing written.
    from libinject.setup.auto import Paths, _wanted_dirs, config_edit

    text = config_edit(None, "/x/config.toml", [], "/var/run/cdi").decode()
    assert "spec-dirs" not in text and 'mode = "cdi"' in text
    [d] = decide([TABLE["containerd 1.7 cdi off"][0]])
    assert _wanted_dirs(d, Paths(cdi_spec="/var/run/cdi/nvidia.yaml")) is None
    assert _wanted_dirs(d, Paths(cdi_spec="/opt/cdi/nvidia.yaml")) == ["/etc/cdi", "/var/run/cdi", "/opt/cdi"]


def test_hook_dir_is_where_the_gpus_hook_is_linked(tmp_path, a100_host, capsys):
    # `setup auto --hook-dir` as `setup docker --hook-dir` (--docker-hook-dir still works)
    n = Node(tmp_path, a100_host, docker=(DOCKER_24, '{"ServerVersion": "24.0.7"}'))
    argv = list(n.argv)
    i = argv.index("--docker-hook-dir")
    hooks = tmp_path / "hookbin"
    hooks.mkdir()
    argv[i:i + 2] = ["--hook-dir", str(hooks)]
    code, out, err = nvhook(capsys, *argv)
    assert code == 0, err
    assert (hooks / "nvidia-container-runtime-hook").is_symlink(), out
    assert not (n.top / "bin/nvidia-container-runtime-hook").exists()


# -- --restart-engines: the engine takes the new configuration ---------------------------------

@pytest.fixture
def fake_systemd(tmp_path, monkeypatch):
    """A systemctl that logs its argv (and fails while tmp_path/fail exists), systemd "running"."""
    from nvhook import cmd_setup

    log, fail = tmp_path / "systemctl.log", tmp_path / "fail"
    exe = tmp_path / "systemctl"
    exe.write_text(f'#!/bin/sh\necho "$*" >> {log}\n[ -e {fail} ] && {{ echo "Job failed" >&2; exit 1; }}\nexit 0\n')
    exe.chmod(0o755)
    (tmp_path / "run-systemd").mkdir()
    monkeypatch.setattr(cmd_setup, "SYSTEMCTL", str(exe))
    monkeypatch.setattr(cmd_setup, "SYSTEMD_RUNNING", str(tmp_path / "run-systemd"))

    def calls() -> list[str]:
        return log.read_text().splitlines() if log.exists() else []
    return calls, fail


def test_restart_engines_restarts_what_changed_once(tmp_path, a100_host, capsys, fake_systemd):
    calls, _ = fake_systemd
    n = Node(tmp_path, a100_host, containerd=(CTRD_16, V2_NO_CDI), docker=(DOCKER_24, '{"ServerVersion": "24.0.7"}'))
    code, out, err = nvhook(capsys, *n.argv, "--restart-engines")
    assert (code, calls()) == (0, ["restart containerd.service", "reload docker.service"]), err
    assert "restarted containerd (`systemctl restart containerd.service`): it takes its new configuration" in out
    assert "reloaded docker (`systemctl reload docker.service`)" in out
    # a second run changes nothing: nothing restarted (a pod's restart must not restart containerd)
    code, out, err = nvhook(capsys, *n.argv, "--restart-engines")
    assert (code, len(calls())) == (0, 2), err
    code, out, err = nvhook(capsys, *n.argv, "--undo", "--restart-engines")
    assert (code, calls()[2:]) == (0, ["restart containerd.service", "reload docker.service"]), err


def test_a_failed_restart_is_one_line_and_the_next_run_tries_again(tmp_path, a100_host, capsys, fake_systemd):
    calls, fail = fake_systemd
    n = Node(tmp_path, a100_host, containerd=(CTRD_16, V2_NO_CDI))
    fail.touch()
    code, out, err = nvhook(capsys, *n.argv, "--restart-engines")
    assert code == 1 and err.count("\n") == 1 and err.startswith(
        "nvhook: could not restart containerd (`systemctl restart containerd.service`): failed (exit 1): "
        "Job failed; it still runs its old configuration"), err
    assert "default_runtime_name" in n.containerd_config.read_text()      # the files are written
    fail.unlink()
    code, out, err = nvhook(capsys, *n.argv, "--restart-engines")          # files unchanged now
    assert (code, calls()) == (0, ["restart containerd.service"] * 2), err
    code, out, err = nvhook(capsys, *n.argv, "--restart-engines")
    assert (code, len(calls())) == (0, 2), err


def test_restart_engines_without_systemd_says_so(tmp_path, a100_host, capsys, fake_systemd, monkeypatch):
    from nvhook import cmd_setup

    monkeypatch.setattr(cmd_setup, "SYSTEMD_RUNNING", str(tmp_path / "absent"))
    n = Node(tmp_path, a100_host, containerd=(CTRD_16, V2_NO_CDI))
    code, out, err = nvhook(capsys, *n.argv, "--restart-engines")
    assert (code, fake_systemd[0]()) == (1, []) and "systemd is not running here" in err, err


@pytest.mark.parametrize("extra", [[], ["--undo"]], ids=["apply", "undo"])
def test_json_prints_only_json(tmp_path, a100_host, capsys, extra):
    """--json (applying and undoing, as a script reads it): stdout is one JSON object
    and nothing else."""
    n = Node(tmp_path, a100_host, **SEVERAL)
    if extra:
        assert nvhook(capsys, *n.argv)[0] == 0
    code, out, err = nvhook(capsys, *n.argv, "--json", *extra)
    assert code == 0, err
    doc, end = json.JSONDecoder().raw_decode(out)
    assert (out[end:], doc["undo"]) == ("\n", bool(extra)), out
