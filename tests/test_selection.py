"""One device selection for `nvhook list` and the planner (`nvhook configure`): on the
same host and flags they accept or refuse alike and give the same GPUs, MIG capability
nodes, cgroup-only MIG minors, MIG procfs files and IMEX channels.

--mig-config/--mig-monitor follow nvidia-container-cli (src/cli/common.c
select_mig_config_devices / select_mig_monitor_devices, configure.c, list.c): only "all"
(the MIG-capable visible GPUs; the list ends there), refused with specific MIG devices
selected unless every device is; once asked, the MIG devices' own access caps are not given.
"""
from __future__ import annotations

import json
import os

import pytest

from support.cli import nvhook_caller

CAPS = "/proc/driver/nvidia/"


@pytest.fixture
def nvhook(tmp_path):
    return nvhook_caller(tmp_path)


def from_list(doc: dict) -> dict:
    items = doc["items"]
    mig = [i for i in items if i["kind"] == "mig-device"]
    return {
        "gpus": [i["path"] for i in items if i["kind"] == "gpu-device"],
        # nodes the container gets; the "name"d ones are a GPU's minors, for cgroups only
        "mig_nodes": [i["path"] for i in mig if "name" not in i],
        "mig_minors": sorted({i["minor"] for i in mig}),
        "mig_files": sorted(i["path"].removeprefix(CAPS) for i in items
                            if i["kind"] == "mig-proc" and not i["path"].rsplit("/", 1)[1].startswith("gpu")),
        "imex": [i["path"] for i in items if i["kind"] == "imex-channel"],
    }


def from_plan(doc: dict) -> dict:
    nodes = doc["device_nodes"]
    mig = [d for d in nodes if d["kind"] == "mig"]
    majors = {d["major"] for d in mig}
    return {
        "gpus": [d["path"] for d in nodes if d["kind"] == "gpu"],
        "mig_nodes": [d["path"] for d in mig],
        "mig_minors": sorted({r["minor"] for r in doc["cgroup_rules"] if r["major"] in majors}),
        "mig_files": sorted([f for f in doc["procfs"]["files"] if f.startswith("capabilities/")]
                            + [rel for _, rel in doc["procfs"]["bound_files"]]
                            + _live_cap_files(doc, mig)),
        "imex": [d["path"] for d in nodes if d["kind"] == "imex"],
    }


# The nvidia-caps driver's fixed minors of the MIG config and monitor capabilities.
GLOBAL_CAPS = {1: "capabilities/mig/config", 2: "capabilities/mig/monitor"}


def _live_cap_files(doc: dict, mig: list[dict]) -> list[str]:
    """The config/monitor capability files the container sees through the live
    capabilities directory the plan binds (as NVIDIA's hook; `list` names the files)."""
    live = [rel for _, rel in doc["procfs"].get("live_dirs", ())]
    if "capabilities" not in live:
        return []
    return [GLOBAL_CAPS[d["minor"]] for d in mig if d["minor"] in GLOBAL_CAPS]


def both(nvhook, root, rootfs, *flags: str):
    """(returncode, stderr, what was selected) of list and of configure --dry-run."""
    lst = nvhook("--root", str(root), "list", "--json", *flags)
    cfg = nvhook("--root", str(root), "configure", "--dry-run", "--json", "--utility", *flags, str(rootfs))
    return [(r.returncode, r.stderr, f(json.loads(r.stdout)) if r.returncode == 0 else None)
            for r, f in ((lst, from_list), (cfg, from_plan))]


@pytest.fixture
def rootfs(tmp_path):
    d = tmp_path / "rootfs"
    d.mkdir()
    return d


REFUSED = {
    "only": "nvhook: {kind} error: {id}: only 'all' devices are currently supported\n",
    "specific": "nvhook: {kind} error: all: cannot enable {kind} with specific MIG devices selected\n",
}


@pytest.mark.parametrize("kind", ["mig-config", "mig-monitor"])
@pytest.mark.parametrize("devices,ids,refused", [
    ("all", "0", "only"),
    ("0", "0", "only"),
    ("0", "GPU-nope", "only"),
    ("0", "0,all", "only"),
    ("1:2", "all", "specific"),
    ("0,1:2", "all", "specific"),
    ("all", "all", None),
    ("all", "all,0", None),          # the list ends at "all"
    ("1:2,all", "all", None),        # every device selected: specific MIG devices are fine
    ("0", "all", None),
    ("4,2", "all", None),
    ("none", "all", None),
])
def test_list_and_configure_agree(sim_host, nvhook, rootfs, kind, devices, ids, refused):
    root = sim_host("h100x8-mig")
    lst, cfg = both(nvhook, root, rootfs, "--device", devices, f"--{kind}", ids)
    assert lst == cfg
    if refused:
        assert lst == (1, REFUSED[refused].format(kind=kind, id=ids.split(",")[0]), None)
    else:
        assert lst[:2] == (0, "")


def test_mig_config_all_content(sim_host, nvhook, rootfs):
    """What both give for -d all --mig-config all: every GPU, the config node only (no MIG
    device's access node), and all MIG minors of the MIG-capable GPUs as cgroup rules."""
    from libinject.discover.driver import discover
    root = sim_host("h100x8-mig")
    driver = discover(str(root), snapshot=False)
    lst, cfg = both(nvhook, root, rootfs, "--device", "all", "--mig-config", "all")
    assert lst == cfg
    got = lst[2]
    assert got["gpus"] == [f"/dev/nvidia{g.minor}" for g in driver.info.gpus]
    assert got["mig_nodes"] == [f"/dev/nvidia-caps/nvidia-cap{driver.mig_minors['config']}"]
    assert got["mig_files"] == ["capabilities/mig/config"]
    assert got["mig_minors"] == sorted(driver.mig_minors[k] for k in driver.mig_minors if k != "monitor")


def test_mig_devices_agree(sim_host, nvhook, rootfs):
    root = sim_host("h100x8-mig")
    lst, cfg = both(nvhook, root, rootfs, "--device", "1:2,0:0")
    assert lst == cfg
    got = lst[2]
    assert got["gpus"] == ["/dev/nvidia1", "/dev/nvidia0"]
    assert len(got["mig_nodes"]) == 4 and len(got["mig_files"]) == 4


def test_imex_channels_agree(fresh_sim_host, nvhook, rootfs):
    root = fresh_sim_host("t4x1")
    d = root / "dev/nvidia-caps-imex-channels"
    d.mkdir()
    for n in (0, 3):
        os.mknod(d / f"channel{n}", 0o666 | 0o020000, os.makedev(237, n))
    chan = "/dev/nvidia-caps-imex-channels/channel{}".format
    for ids, want in (("3", [chan(3)]), ("all", [chan(0), chan(3)]), ("3,0,3", [chan(3), chan(0)]),
                      ("none", []), ("all,none", [chan(0), chan(3)])):
        lst, cfg = both(nvhook, root, rootfs, "--device", "0", "--imex-channel", ids)
        assert lst == cfg and lst[:2] == (0, "")
        assert lst[2]["imex"] == want
    lst, cfg = both(nvhook, root, rootfs, "--device", "0", "--imex-channel", "x")
    assert lst == cfg == (1, "nvhook: invalid IMEX channel: x\n", None)
    # a channel without its node: `list` names it, as nvidia-container-cli list does
    # (cli/list.c prints the path of every channel id given); injecting it cannot be done
    lst, cfg = both(nvhook, root, rootfs, "--device", "0", "--imex-channel", "5")
    assert lst[:2] == (0, "") and lst[2]["imex"] == [chan(5)]
    assert cfg == (1, "nvhook: unknown IMEX channel: 5\n", None)
