"""Graphics in a real container: a real Vulkan loader (Debian's libvulkan1) inside a runc
container given a GeForce GPU by the hook reads the ICD file the hook mounted, loads the
library it names (no LD_LIBRARY_PATH: through the ld cache the hook updated) and lists
exactly the injected GPU; without the graphics capability there is no ICD to find."""
from __future__ import annotations

import shutil

import pytest

import support.runc as R
from support.hookenv import write_config
from support.shimenv import gpu_env, prestart_hooks
from support.vkprobe import vkprobe_binary

def _run_probe(tmp_path, host, env) -> str:
    from libinject.sim.rootfs import build_rootfs

    rootfs = build_rootfs(tmp_path / "rootfs", vulkan=True)
    shutil.copy2(vkprobe_binary(tmp_path), rootfs / "usr/bin/vkprobe")
    cfg = write_config(tmp_path / "config.toml", host)
    with R.RuncContainer(tmp_path, env=env, hooks=prestart_hooks(cfg), rootfs=rootfs,
                         args=["sh", "-c", "vkprobe -v 2>&1; echo rc=$?; ls /dev/dri"]) as c:
        return c.run().stdout


def test_vulkan_loader_finds_the_injected_gpu(tmp_path, geforce2_host):
    out = _run_probe(tmp_path, geforce2_host, gpu_env("1", "graphics,compute,utility"))
    lines = out.splitlines()
    assert [ln for ln in lines if ln.startswith("VK ")] == [
        "VK NVIDIA GeForce RTX 4080 vendor=0x10de type=2 device=0x2704 driver=0x89a8c040 api=1.3.277"], out
    assert "rc=0" in lines
    # only GPU 1's DRM nodes
    assert lines[lines.index("rc=0") + 1:] == ["by-path", "card1", "renderD129"], out


def test_no_graphics_capability_no_icd(tmp_path, geforce2_host):
    out = _run_probe(tmp_path, geforce2_host, gpu_env("1", "compute,utility"))
    # the loader finds no driver at all: VK_ERROR_INCOMPATIBLE_DRIVER
    assert "VK error: vkCreateInstance: VkResult -9" in out.splitlines(), out
    assert "rc=1" in out.splitlines(), out
    assert "VK NVIDIA" not in out
