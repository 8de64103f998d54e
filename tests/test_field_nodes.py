"""Set-ups GPU users hit in the field (issue 30), with the hook under real runc on a
simulated host: an Ubuntu config's ldconfig on a host without it, images that carry the
driver's file names as symlinks, a privileged container given the host's /dev, CUDA
forward compat only where the GPU supports it.
"""
from __future__ import annotations

from pathlib import Path

from support import hookenv
from support.hookenv import ENV, PROBE, assert_only_gpu1
from support.runc import RuncContainer


def _config(tmp_path: Path, host: Path, cli: str = "") -> Path:
    """The hook's config for `host`, `cli` lines added to [nvidia-container-cli]."""
    path = tmp_path / "config.toml"
    path.write_text(f'[nvidia-container-cli]\nroot = "{host}"\n{cli}\n'
                    f'[nvhook]\nsnapshot = false\nlog-file = "{tmp_path}/hook.log"\n'
                    'log-level = "debug"\n')
    return path


def _container(tmp_path: Path, config: Path, env: list[str], script: str, **kw) -> RuncContainer:
    return RuncContainer(tmp_path, args=["sh", "-c", script], env=ENV + env,
                         devices=[("/dev/nvidia0", 195, 0)],
                         hooks={"prestart": [hookenv.hook_entry(config)]}, **kw)


# -- 1. an Ubuntu config's ldconfig.real on a host without it ---------------------------

def test_ldconfig_real_missing_falls_back_to_sbin_ldconfig(tmp_path, a100_host, gpu_uuids):
    """NVIDIA's toolkit (1.20) runs /sbin/ldconfig when the configured
    @/sbin/ldconfig.real does not exist; so does the hook, and says so in its log."""
    assert not Path("/sbin/ldconfig.real").exists()
    cfg = _config(tmp_path, a100_host, 'ldconfig = "@/sbin/ldconfig.real"')
    with _container(tmp_path, cfg, ["NVIDIA_VISIBLE_DEVICES=1"], PROBE) as c:
        r = c.run()
        cache_file = c.rootfs / "etc/ld.so.cache"
        cache = cache_file.read_bytes() if cache_file.exists() else b""
    assert_only_gpu1(r.stdout + r.stderr, gpu_uuids)
    assert b"libcuda.so.1" in cache and b"libnvidia-ml.so.1" in cache
    log = (tmp_path / "hook.log").read_text()
    assert "ldconfig /sbin/ldconfig.real does not exist on this host: using /sbin/ldconfig" in log
