"""`nvhook cdi refresh --watch` following MIG reconfiguration (issue 31): MIG devices
created and destroyed on a simulated h100 (`nvhook sim mig`, as nvidia-smi mig -cgi/-dgi
change a real host: no uevent) show in the spec within --mig-interval, which names
exactly the MIG devices that exist; readers never see a half-written spec; and a
container asking for a MIG device made after the watcher started gets exactly it."""
from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest
import yaml

from conftest import NVHOOK, run
from support import hookenv
from support.cdi_refresh import Watch, device_names, write_config
from support.runc import RuncContainer

DEADLINE = 20


def sim_mig(host: Path, *args: str) -> str:
    r = run([NVHOOK, "sim", "mig", str(host), *args], timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def names_now(host: Path) -> set[str]:
    """The device names the host's MIG layout makes, from the simulator's own profile
    copy (not discovery): a GPU in MIG mode by its MIG devices only, "all" besides."""
    prof = json.loads((host / "etc/nvhook-sim/profile.json").read_text())
    out = {"all"}
    for i, g in enumerate(sorted(prof["gpus"], key=lambda g: g["bus_id"])):
        if g["mig_enabled"]:
            out |= {n for j, m in enumerate(g["mig"]) for n in (f"{i}:{j}", m["uuid"])}
        else:
            out |= {str(i), g["uuid"]}
    return out


class Reader(threading.Thread):
    """Reads the spec over and over while the host changes: every read must be a whole
    spec (a writer that truncates and writes in place would be seen half-way)."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.reads, self.bad = path, 0, []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                spec = yaml.safe_load(self.path.read_text())
                if not (isinstance(spec, dict) and spec.get("devices") and spec.get("containerEdits")):
                    self.bad.append(spec)
            except FileNotFoundError:
                self.bad.append("missing")
            except yaml.YAMLError as e:
                self.bad.append(str(e))
            self.reads += 1


@pytest.fixture
def mig_watch(tmp_path, fresh_sim_host):
    host = fresh_sim_host("h100x8-mig")
    out = tmp_path / "nvidia.yaml"
    # --interval far away: only the MIG checks can see the changes in time
    w = Watch(write_config(tmp_path), "--driver-root", str(host), "-o", str(out), "--hook-path",
              hookenv.ensure_front(), "--hook-socket", "none", "--interval", "3600", "--mig-interval", "0.3",
              "--no-uevents")
    w.started(out)
    yield host, out, w
    assert w.stop() == 0


def test_watch_follows_mig_devices_made_and_destroyed(mig_watch):
    host, out, w = mig_watch
    assert set(device_names(out)) == names_now(host)
    reader = Reader(out)
    reader.start()
    try:
        made = re.search(r"(MIG-\S+)", sim_mig(host, "--gpu", "3", "--create", "1g.10gb")).group(1)
        w.wait_until(lambda: made in device_names(out), "the new MIG device listed", DEADLINE)
        assert set(device_names(out)) == names_now(host) and "3:0" in device_names(out)
        second = re.search(r"(MIG-\S+)", sim_mig(host, "--gpu", "3", "--create", "3g.40gb")).group(1)
        w.wait_until(lambda: second in device_names(out), "the second MIG device listed", DEADLINE)
        assert set(device_names(out)) == names_now(host)
        sim_mig(host, "--gpu", "3", "--destroy", "1")
        w.wait_until(lambda: made not in device_names(out), "the destroyed MIG device dropped", DEADLINE)
        # what was 3:1 is 3:0 now; the other GPUs' devices stay as they were
        assert set(device_names(out)) == names_now(host) and "3:1" not in device_names(out)
        gone = json.loads((host / "etc/nvhook-sim/profile.json").read_text())["gpus"][1]["mig"][0]["uuid"]
        sim_mig(host, "--gpu", "1", "--destroy", "7")
        w.wait_until(lambda: gone not in device_names(out), "a MIG device of GPU 1 dropped", DEADLINE)
        assert set(device_names(out)) == names_now(host)
    finally:
        reader.stopping.set()
        reader.join(10)
    assert reader.reads > 0 and reader.bad == []
    assert w.stderr() == ""


def test_a_container_gets_a_mig_device_made_after_the_watch_started(mig_watch, tmp_path):
    from libinject.apply import cdi
    from libinject.apply.spec import apply_cdi

    host, out, w = mig_watch
    made = re.search(r"(MIG-\S+)", sim_mig(host, "--gpu", "3", "--create", "2g.20gb")).group(1)
    w.wait_until(lambda: made in device_names(out), "the new MIG device listed", DEADLINE)
    edits, missing = cdi.scan([str(out.parent)]).resolve([f"nvidia.com/gpu={made}"])
    assert not missing
    c = RuncContainer(tmp_path / "c", args=["sh", "-c", "nvidia-smi -L; ls /dev/nvidia-caps"],
                      env=["PATH=/usr/bin:/bin"])
    apply_cdi(c.config, edits)
    with c:
        r = c.run()
    assert r.returncode == 0, r.stdout + r.stderr
    gpu3 = json.loads((host / "etc/nvhook-sim/profile.json").read_text())["gpus"][3]
    mig = next(m for m in gpu3["mig"] if m["uuid"] == made)
    from libinject.sim.build import ci_minor, gi_minor

    # exactly that MIG device: its parent GPU, it alone under it, its two capability nodes
    assert re.findall(r"UUID: ((?:GPU|MIG)-[0-9a-f-]+)", r.stdout) == [gpu3["uuid"], made], r.stdout
    assert r.stdout.split("\n", 2)[-1].split() == sorted(
        [f"nvidia-cap{gi_minor(3, mig['gi'])}", f"nvidia-cap{ci_minor(3, mig['gi'], mig['ci'])}"]), r.stdout
