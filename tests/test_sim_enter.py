"""`nvhook sim enter ROOT -- CMD`: NVIDIA's tools see the simulated host at the real
host's paths.

NVIDIA's tools read /proc/driver/nvidia, /proc/devices, /sys/bus/pci/devices and
/dev/nvidia* from the host they run on, not from a driver root, and load NVML by name.
Under `sim enter` they see the simulated host there: on every built-in profile,
`nvidia-smi -L` (the simulated one, found on PATH as on a GPU host) and go-nvml-style
calls through pynvml (tests/support/nvmlprobe.py, loading libnvidia-ml.so.1 by name)
answer what `nvhook --root ROOT info` says; and nvhook's own discovery of "/" from inside
gives the same as its discovery of ROOT from outside.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from conftest import NVHOOK, run
from libinject.sim.profile import list_profiles
from test_sim_nvml_api import PROBE, expected, nvhook_info


def enter(root: Path, *cmd: str):
    return run([NVHOOK, "sim", "enter", str(root), "--", *cmd])


def smi_lines(info: dict) -> list[str]:
    """What NVIDIA's nvidia-smi -L prints for the GPUs (and MIG devices) of `info`."""
    out = []
    for g in info["gpus"]:
        out.append(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})")
        for m in g.get("mig_devices", []):
            out.append(f"  MIG {m['name']:<12}Device {m['index']:>2}: (UUID: {m['uuid']})")
    return out


@pytest.mark.parametrize("profile", list_profiles())
def test_nvidia_smi_and_nvml_match_nvhook_info(sim_host, profile, no_leaked_mounts):
    root = sim_host(profile)
    info = nvhook_info(root)
    smi = enter(root, "nvidia-smi", "-L")
    assert smi.returncode == 0, smi.stderr
    assert smi.stdout.splitlines() == smi_lines(info)
    nvml = enter(root, sys.executable, str(PROBE))   # libnvidia-ml.so.1 found by name
    assert nvml.returncode == 0, nvml.stderr
    assert json.loads(nvml.stdout) == expected(info)
    inside = enter(root, NVHOOK, "info", "--json")
    assert inside.returncode == 0, inside.stderr
    mine = json.loads(inside.stdout)
    assert mine.pop("root") == "/" and info.pop("root") == str(root)
    assert mine == info


def test_the_kernel_view_is_the_simulated_one(sim_host, no_leaked_mounts):
    root = sim_host("h100x8-mig")
    script = ("cat /proc/devices; ls /proc/driver/nvidia/gpus /sys/bus/pci/devices; "
              "stat -c '%F %t:%T %n' /dev/nvidiactl /dev/nvidia-caps/nvidia-cap1; "
              "cat /sys/bus/pci/devices/0000:18:00.0/vendor /sys/bus/pci/devices/0000:18:00.0/device; "
              "ls /dev/pts >/dev/null && echo pts")
    r = enter(root, "sh", "-c", script)
    assert r.returncode == 0, r.stderr
    bus = sorted(p.name for p in (root / "proc/driver/nvidia/gpus").iterdir())
    assert (root / "proc/devices").read_text() in r.stdout
    assert r.stdout.count(bus[0]) == 2                  # procfs and sysfs: the simulated GPUs
    assert sorted(os.listdir(root / "sys/bus/pci/devices")) == bus
    assert "character special file c3:ff /dev/nvidiactl" in r.stdout            # 195:255
    assert "character special file ec:1 /dev/nvidia-caps/nvidia-cap1" in r.stdout
    assert "0x10de\n0x2330\n" in r.stdout              # NVIDIA's vendor id, the H100's device id
    assert r.stdout.rstrip().endswith("pts")          # the host's /dev submounts are still there
    # and the host's own view is untouched
    assert not os.path.exists("/proc/driver/nvidia/gpus") or sorted(os.listdir("/proc/driver/nvidia/gpus")) != bus


def test_i386_libraries_and_driver_sockets_where_nvidia_looks_without_a_root(sim_host, no_leaked_mounts):
    """NVIDIA's cli without --root finds 32-bit libraries through /etc/ld.so.cache and the
    persistenced/fabricmanager sockets under /run: both are there under `sim enter`, even
    on a host with no /usr/lib/i386-linux-gnu; the host's /run submounts stay (issue 31).
    Old code: no i386 dir, nothing in the cache, no sockets."""
    root = sim_host("a100x8")
    subs = sorted({line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                   if line.split()[4].startswith("/run/")})
    script = ("readlink -f /usr/lib/i386-linux-gnu/libcuda.so.1; ldconfig -p | grep -c 'libcuda.so.1 (libc6)'; "
              "ldconfig -p | grep -c 'libcuda.so.1 (libc6,x86-64)'; "
              "for s in /run/nvidia-persistenced/socket /var/run/nvidia-persistenced/socket; do test -S $s && echo $s; done; "
              "awk '$5 ~ \"^/run/\" {print $5}' /proc/self/mountinfo | sort -u")
    r = enter(root, "sh", "-c", script)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    ver = json.loads((root / "etc/nvhook-sim/profile.json").read_text())["driver_version"]
    assert lines[:5] == [f"/usr/lib/i386-linux-gnu/libcuda.so.{ver}", "1", "1",
                         "/run/nvidia-persistenced/socket", "/var/run/nvidia-persistenced/socket"], r.stdout
    assert set(subs) <= set(lines[5:])


def test_exit_status_passes_through(sim_host):
    assert enter(sim_host("t4x1"), "sh", "-c", "exit 7").returncode == 7


@pytest.mark.parametrize("which, message", [
    ("missing", "/missing: not a directory"),
    ("empty", "/empty: not a driver root (no proc/driver/nvidia/version)"),
    ("a,b", "cannot be in the path"),
])
def test_bad_root_is_one_line(tmp_path, which, message):
    root = tmp_path / which
    if which != "missing":
        root.mkdir()
    if which == "a,b":
        (root / "proc/driver/nvidia").mkdir(parents=True)
        (root / "proc/driver/nvidia/version").write_text("NVRM version: x\n")
    r = run([NVHOOK, "sim", "enter", str(root), "--", "true"])
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("nvhook: ") and message in r.stderr and len(r.stderr.splitlines()) == 1


def test_unknown_command_is_one_line(sim_host):
    r = enter(sim_host("t4x1"), "/no/such/tool")
    assert r.returncode == 1
    assert r.stderr == "nvhook: sim enter: /no/such/tool: No such file or directory\n"


def test_no_command_is_one_line(sim_host):
    r = run([NVHOOK, "sim", "enter", str(sim_host("t4x1"))])
    assert r.returncode == 1 and r.stderr.startswith("nvhook: sim enter: no command given")
