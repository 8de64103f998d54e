"""`nvhook cdi generate` beyond GPUs, as nvidia-ctk generates them: IMEX channels
(--mode imex, kind nvidia.com/imex-channel), the MIG config/monitor capabilities
(--mode mig-caps, kind nvidia.com/mig-caps), the driver-only device nvidia.com/gpu=none
(--device-id none), --device-id restrictions and --no-all-device. Podman applying them:
test_cdi_podman.py."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import yaml

from conftest import NVHOOK, run
from test_cdi import official_validator

IMEX_MAJOR = 237
CHANNELS = (0, 1, 3)            # a gap: names are channel numbers, not positions


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> Path:
    """A copy of h100x8-mig (MIG capable) with IMEX channel nodes (the simulator makes none)."""
    from libinject.sim.build import create_host

    h = create_host(tmp_path_factory.mktemp("cdidev") / "host", profile="h100x8-mig")
    d = h / "dev/nvidia-caps-imex-channels"
    d.mkdir()
    for n in CHANNELS:
        os.mknod(d / f"channel{n}", 0o666 | stat.S_IFCHR, os.makedev(IMEX_MAJOR, n))
    return h


@pytest.fixture(scope="module")
def driver(host):
    from libinject.discover.driver import discover

    return discover(str(host), snapshot=False)


def gen(host: Path, *extra: str) -> dict:
    r = run([NVHOOK, "cdi", "generate", "--driver-root", str(host), *extra])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def fails(host: Path, *extra: str) -> str:
    r = run([NVHOOK, "cdi", "generate", "--driver-root", str(host), *extra])
    assert r.returncode == 1 and r.stderr.startswith("nvhook: ") and r.stderr.count("\n") == 1, \
        (extra, r.returncode, r.stderr)
    return r.stderr


def valid(spec: dict, tmp_path: Path) -> None:
    assert list(official_validator().iter_errors(spec)) == []
    f = tmp_path / f"{spec['kind'].replace('/', '_')}.json"
    f.write_text(json.dumps(spec))
    r = run([NVHOOK, "cdi", "validate", str(f)])
    assert r.returncode == 0, r.stdout


def names(spec: dict) -> list[str]:
    return [d["name"] for d in spec["devices"]]


def by_name(spec: dict) -> dict:
    return {d["name"]: d["containerEdits"] for d in spec["devices"]}


# --- IMEX channels -----------------------------------------------------------------------

def test_imex_spec(host, tmp_path):
    spec = gen(host, "--mode", "imex")
    valid(spec, tmp_path)
    assert spec["kind"] == "nvidia.com/imex-channel"
    assert spec["cdiVersion"] == "0.5.0"            # digit names, hostPath
    assert names(spec) == ["0", "1", "3", "all"]
    # the spec adds no driver: only what keeps a legacy hook off the container
    assert spec["containerEdits"] == {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}
    nodes = by_name(spec)
    for n in CHANNELS:
        path = f"/dev/nvidia-caps-imex-channels/channel{n}"
        assert nodes[str(n)] == {"deviceNodes": [{
            "path": path, "hostPath": str(host) + path, "type": "c", "major": IMEX_MAJOR, "minor": n,
            "permissions": "rw"}]}
    assert nodes["all"]["deviceNodes"] == [nodes[str(n)]["deviceNodes"][0] for n in CHANNELS]
    assert names(gen(host, "--mode", "imex", "--no-all-device")) == ["0", "1", "3"]


def test_imex_nodes_are_the_planners(host, driver):
    """Each channel's node is the one the hook injects for NVIDIA_IMEX_CHANNELS=<n>."""
    from libinject.plan import planner as P
    from libinject.request.model import Request

    spec = gen(host, "--mode", "imex", "--class", "imex")
    assert spec["kind"] == "nvidia.com/imex"
    planned = P.plan(Request(devices="none", imex_channels="3"), driver)
    (node,) = [d for d in planned.device_nodes if d.kind == "imex"]
    assert by_name(spec)["3"]["deviceNodes"] == [
        {"path": node.path, "hostPath": node.host_path, "type": node.type, "major": node.major,
         "minor": node.minor, "permissions": node.permissions}]


def test_imex_without_channels_fails(sim_host, tmp_path):
    err = fails(sim_host("a100x8"), "--mode", "imex", "-o", str(tmp_path / "x.yaml"))
    assert "no IMEX channels found" in err and "nvidia-caps-imex-channels" in err
    assert list(tmp_path.iterdir()) == []


# --- MIG config / monitor ----------------------------------------------------------------

def test_mig_caps_spec(host, driver, tmp_path):
    spec = gen(host, "--mode", "mig-caps")
    valid(spec, tmp_path)
    assert spec["kind"] == "nvidia.com/mig-caps"
    assert names(spec) == ["config", "monitor", "all"]
    assert spec["containerEdits"] == {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}
    nodes = by_name(spec)
    major = os.major(os.stat(host / "dev/nvidia-caps/nvidia-cap1").st_rdev)
    for key in ("config", "monitor"):
        minor = driver.mig_minors[key]
        path = f"/dev/nvidia-caps/nvidia-cap{minor}"
        assert nodes[key] == {"deviceNodes": [{"path": path, "hostPath": str(host) + path,
                                               "type": "c", "major": major, "minor": minor,
                                               "permissions": "rw"}]}
    assert [n["path"] for n in nodes["all"]["deviceNodes"]] == [
        "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"]


def test_mig_caps_cgroup_rules_beyond_the_node_are_not_in_the_spec(host, driver):
    """The planner also allows every MIG minor of the GPUs for mig-config (by cgroup rule,
    nodes or not); CDI can only allow the nodes a device lists: the spec carries the
    capability node only (as nvidia-ctk's)."""
    from libinject.plan import planner as P
    from libinject.request.model import Request

    every = P.plan(Request(devices="all"), driver)
    cfg = P.plan(Request(devices="all", mig_config="all"), driver)
    extra_rules = set(cfg.cgroup_rules) - set(every.cgroup_rules)
    cfg_minor = driver.mig_minors["config"]
    assert {r.minor for r in extra_rules} > {cfg_minor}       # more than the node's rule
    spec = gen(host, "--mode", "mig-caps")
    assert [n["minor"] for n in by_name(spec)["config"]["deviceNodes"]] == [cfg_minor]


def test_mig_caps_on_a_host_without_mig_fails(sim_host):
    err = fails(sim_host("t4x1"), "--mode", "mig-caps")
    assert "not MIG capable" in err


# --- the driver-only device and --device-id ----------------------------------------------

def test_none_device_alone(host, tmp_path):
    """--device-id none, as nvidia-ctk: the driver (spec-level edits, the same as the full
    spec's) and one device, "none", with no GPU; no "all"."""
    full = gen(host)
    spec = gen(host, "--device-id", "none")
    valid(spec, tmp_path)
    assert spec["kind"] == "nvidia.com/gpu" and names(spec) == ["none"]
    assert spec["containerEdits"] == full["containerEdits"]
    none = by_name(spec)["none"]
    assert set(none) == {"deviceNodes"}
    paths = [n["path"] for n in none["deviceNodes"]]
    assert paths == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    # the driver's own control nodes, again (a CDI device may not be empty): no GPU node
    assert none["deviceNodes"] == [n for n in spec["containerEdits"]["deviceNodes"]
                                   if n["path"] in paths]
    assert not any(p.removeprefix("/dev/nvidia").isdigit() for p in paths)


def test_none_beside_all_keeps_every_other_device_byte_identical(host):
    full = gen(host)
    both = gen(host, "--device-id", "all,none")
    assert names(both) == names(full) + ["none"]
    assert both["devices"][:-1] == full["devices"]
    assert both["containerEdits"] == full["containerEdits"]
    assert both["cdiVersion"] == full["cdiVersion"]
    assert gen(host, "--device-id", "all", "--device-id", "none") == both


def test_device_id_restricts_the_devices(host, driver):
    g = driver.info.gpus
    m = g[0].mig_devices[1]
    full = by_name(gen(host))
    spec = gen(host, "--device-id", f"{g[5].uuid},0:1", "--device-id", "4")
    # host order, each device under every strategy's name
    assert names(spec) == ["4", g[4].uuid, "5", g[5].uuid, "0:1", m.uuid, "all"]
    edits = by_name(spec)
    for name in names(spec)[:-1]:
        assert edits[name] == full[name]
    # "all" is those devices, not the host's
    allnodes = {n["path"] for n in edits["all"]["deviceNodes"]}
    assert {"/dev/nvidia0", "/dev/nvidia4", "/dev/nvidia5"} <= allnodes
    assert "/dev/nvidia2" not in allnodes
    assert names(gen(host, "--device-id", "4", "--no-all-device")) == ["4", g[4].uuid]
    assert names(gen(host, "--no-all-device"))[-1] != "all"


def test_device_id_errors(host, tmp_path):
    out = str(tmp_path / "x.json")
    assert "unknown device: 9" in fails(host, "--device-id", "9", "-o", out)
    # a GPU in MIG mode is not a device (nvidia-ctk): its MIG devices are
    assert "device 1: GPU 1 is in MIG mode: its MIG devices (1:<n>, MIG-<uuid>) are the devices" in fails(
        host, "--device-id", "1", "-o", out)
    assert "invalid device-id void" in fails(host, "--device-id", "void", "-o", out)
    assert "empty list" in fails(host, "--device-id", ",", "-o", out)
    assert "needs --mode gpu" in fails(host, "--mode", "imex", "--device-id", "0", "-o", out)
    assert list(tmp_path.iterdir()) == []


# --- several modes in one run ------------------------------------------------------------

def test_several_modes_write_several_files(host, tmp_path):
    out = tmp_path / "nvidia.yaml"
    r = run([NVHOOK, "cdi", "generate", "--driver-root", str(host), "--mode", "gpu,imex",
             "--mode", "mig-caps", "-o", str(out)])
    assert r.returncode == 0 and r.stdout == "", r.stderr
    files = {p.name: yaml.safe_load(p.read_text()) for p in tmp_path.iterdir()}
    assert sorted(files) == ["nvidia.imex-channel.yaml", "nvidia.mig-caps.yaml", "nvidia.yaml"]
    assert files["nvidia.yaml"] == gen(host)
    assert files["nvidia.imex-channel.yaml"] == gen(host, "--mode", "imex")
    assert files["nvidia.mig-caps.yaml"] == gen(host, "--mode", "mig-caps")
    for p in tmp_path.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o644
    # one mode: --output as given, whatever the mode
    one = tmp_path / "one" / "imex.json"
    one.parent.mkdir()
    r = run([NVHOOK, "cdi", "generate", "--driver-root", str(host), "--mode", "imex", "-o", str(one)])
    assert r.returncode == 0 and [p.name for p in one.parent.iterdir()] == ["imex.json"]
    assert json.loads(one.read_text())["kind"] == "nvidia.com/imex-channel"


def test_several_modes_fail_before_writing(host, sim_host, tmp_path):
    out = str(tmp_path / "nvidia.yaml")
    assert "give --output" in fails(host, "--mode", "gpu,imex")
    assert "one --mode" in fails(host, "--mode", "gpu,imex", "--class", "x", "-o", out)
    assert "invalid mode 'bogus'" in fails(host, "--mode", "bogus", "-o", out)
    assert "given twice" in fails(host, "--mode", "imex,imex", "-o", out)
    # a100x8 has no IMEX channels: the GPU spec is not written either
    fails(sim_host("a100x8"), "--mode", "gpu,imex", "-o", out)
    assert list(tmp_path.iterdir()) == []


def test_refresh_keeps_one_mode_current(host, tmp_path):
    out = tmp_path / "imex.yaml"
    cmd = [NVHOOK, "cdi", "refresh", "--driver-root", str(host), "-o", str(out)]
    r = run([*cmd, "--mode", "imex"])
    assert (r.returncode, r.stdout) == (0, f"updated {out}\n"), r.stderr
    assert yaml.safe_load(out.read_text()) == gen(host, "--mode", "imex")
    r = run([*cmd, "--mode", "imex"])
    assert (r.returncode, r.stdout) == (0, f"unchanged {out}\n")
    r = run([*cmd, "--mode", "gpu,imex"])
    assert r.returncode == 1 and "give one --mode" in r.stderr
