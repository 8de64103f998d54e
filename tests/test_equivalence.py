"""One request, four ways in, one container (DESIGN.md §2: three appliers, same edits).

For the same request (a GPU or a MIG device, every driver capability: on the GeForce
profile that includes graphics and display, with their ICD/vendor files, X modules,
DRM nodes and by-path links) the container
sees the same device nodes, driver files (size and checksum), symlinks,
/proc/driver/nvidia, ld cache and nvidia-smi output, and the same open() verdicts,
whether the GPUs came from
  1. the OCI prestart hook (`nvhook prestart`, runc),
  2. `nvhook configure --pid` on a running runc container,
  3. the runtime shim in cdi mode (runc) applying our generated CDI spec (all capabilities),
  4. podman 4.3.1 applying the same CDI spec itself.
"""
from __future__ import annotations

import json
import shutil

import pytest

import support.runc as R
from conftest import NVHOOK, run
from support.driverview import SNAPSHOT, split_opens
from support.podman import Podman, state_dir
from support.shimenv import ENV_PATH, SHIM, gpu_env, prestart_hooks, write_config

ALL_CAPS = ["--compute", "--utility", "--video", "--graphics", "--display", "--ngx", "--compat32"]
DRM_OPENS = ("; for d in card0 renderD128; do dd if=/dev/dri/$d of=/dev/null count=0 2>/tmp/e "
             "&& echo \"drm $d OK\" || echo \"drm $d $(grep -o 'No such device or address\\|"
             "Operation not permitted' /tmp/e)\"; done")
OPENS = ("for m in {minors}; do if dd if=/dev/nvidia$m of=/dev/null count=0 2>/tmp/e; "
         "then echo \"open $m OK\"; else echo \"open $m $(cat /tmp/e)\"; fi; done")


@pytest.mark.parametrize("profile,device", [("a100x8", "1"), ("h100x8-mig", "0:1"), ("rtx4090x1", "0")])
def test_hook_configure_shim_and_podman_give_the_same_container(sim_host, tmp_path, monkeypatch,
                                                                 profile, device):
    from libinject.discover.driver import discover

    host = sim_host(profile)
    driver = discover(str(host), snapshot=False)
    minors = " ".join(str(g.minor) for g in driver.info.gpus)
    # NVIDIA_DRIVER_CAPABILITIES=all takes display where the host has /dev/nvidia-modeset;
    # naming --display on a host without it fails (as nvidia-container-cli)
    caps = [c for c in ALL_CAPS if c != "--display" or (host / "dev/nvidia-modeset").exists()]
    script = SNAPSHOT + OPENS.format(minors=minors)
    if profile == "rtx4090x1":      # the DRM nodes: the cgroup lets them through (ENXIO, not EPERM)
        script += DRM_OPENS
    specs = tmp_path / "specs"
    specs.mkdir()
    # every capability (the default spec leaves compat32 out), as the other three ask
    r = run([NVHOOK, "cdi", "generate", "--driver-root", str(host), "--capabilities", "all",
             "-o", str(specs / "nvidia.yaml")])
    assert r.returncode == 0, r.stderr
    cfg = write_config(tmp_path / "config.toml", root=host, mode="cdi", spec_dirs=[specs])
    monkeypatch.setenv("NVHOOK_CONFIG", str(cfg))
    runc = shutil.which("runc") or "/usr/sbin/runc"
    results: dict[str, tuple[list[str], dict[int, str]]] = {}

    # 1. the prestart hook
    monkeypatch.setattr(R, "RUNC", runc)
    with R.RuncContainer(tmp_path, env=gpu_env(device), hooks=prestart_hooks(cfg)) as c:
        c.create()
        c.start()
        results["hook"] = split_opens(c.exec("sh", "-c", script).stdout)

    # 2. nvhook configure --pid on a running container
    with R.RuncContainer(tmp_path, env=[ENV_PATH]) as c:
        c.create()
        c.start()
        r = run([NVHOOK, "--root", str(host), "configure", "--pid", str(c.pid), "--device", device,
                 *caps, str(c.rootfs)])
        assert r.returncode == 0, r.stderr
        results["configure"] = split_opens(c.exec("sh", "-c", script).stdout)

    # 3. the runtime shim in cdi mode
    monkeypatch.setattr(R, "RUNC", SHIM)
    with R.RuncContainer(tmp_path, env=gpu_env(device)) as c:
        c.create()
        c.start()
        spec = json.loads((c.bundle / "config.json").read_text())
        assert any(h["args"][1:3] == ["cdi-hook", "createRuntime"] and "--link" in h["args"]
                   for h in spec["hooks"]["createRuntime"])
        results["shim-cdi"] = split_opens(c.exec("sh", "-c", script).stdout)

    # 4. podman with the same spec
    from libinject.sim.rootfs import build_rootfs

    rootfs = build_rootfs(tmp_path / "podman-rootfs")
    with state_dir() as state:
        r = Podman(state).run(rootfs, ["sh", "-c", script], cdi_specs=specs,
                              devices=[f"nvidia.com/gpu={device}"])
    assert r.returncode == 0, r.stderr
    results["podman-cdi"] = split_opens(r.stdout)

    ref_snap, ref_opens = results["hook"]
    if profile == "rtx4090x1":
        # `nvhook list` names the same graphics files and DRM nodes the container got
        r = run([NVHOOK, "--root", str(host), "list", "--graphics", "--device", device])
        listed = r.stdout.split()
        assert "/dev/dri/card0" in listed and "/usr/share/vulkan/icd.d/nvidia_icd.json" in listed
        for path in listed:
            assert any(ln.split()[1] == path for ln in ref_snap if ln[:2] in ("F ", "C ")), path
        assert "L /dev/dri/by-path/pci-0000:01:00.0-card -> ../card0" in ref_snap
        assert "drm card0 No such device or address" in ref_snap
        assert "drm renderD128 No such device or address" in ref_snap
        assert ("L /usr/lib/xorg/modules/extensions/libglxserver_nvidia.so -> "
                f"libglxserver_nvidia.so.{driver.info.driver_version}") in ref_snap
        assert "L /usr/lib/x86_64-linux-gnu/gbm/nvidia-drm_gbm.so -> ../libnvidia-allocator.so.1" in ref_snap
    # the reference is a real injection: nvidia-smi lists the device, its node opens
    assert any(ln.startswith("GPU ") for ln in ref_snap), ref_snap
    assert any(ln.startswith("L /usr/lib/x86_64-linux-gnu/libcuda.so -> ") for ln in ref_snap)
    assert any(ln.startswith("LDCONF ") for ln in ref_snap)
    assert list(ref_opens.values()).count("ENXIO") == 1
    if ":" in device:   # a MIG device: its gi/ci access nodes and procfs capability files
        assert sum(ln.startswith("C /dev/nvidia-caps/nvidia-cap") for ln in ref_snap) == 2
        assert sum(ln.startswith("F /proc/driver/nvidia/capabilities/gpu") for ln in ref_snap) == 2
    for way, (snap, opens) in results.items():
        assert snap == ref_snap, f"{way} differs from the hook:\n" + "\n".join(
            f"{'-' if x in ref_snap else '+'} {x}" for x in sorted(set(snap) ^ set(ref_snap)))
        assert opens == ref_opens, way
