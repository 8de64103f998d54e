"""`nvhook setup containerd` on configs that define no runtimes (Debian 12's packaged
/etc/containerd/config.toml, a v2 file with only a snapshotter, a v3 file), then
containerd's real CRI started from what setup wrote.

containerd's built-in `runc` runtime exists only while the file defines no runtimes:
a setup that adds only `nvidia` leaves default_runtime_name = "runc" naming nothing,
and the CRI plugin does not load ("no corresponding runtime ... runc") while
containerd itself starts. Here the CRI must answer Version, and run a host-network pod
sandbox with the default handler (runc) and with the `nvidia` handler (nvhook's shim).
containerd 1.6 (Debian's) reads no version 3 file: that one is checked in the file.
"""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from support.cli import nvhook_in_process as nvhook
from support.shimenv import SHIM

V2 = "io.containerd.grpc.v1.cri"
V3 = "io.containerd.cri.v1.runtime"
PAUSE = "nvhook.test/pause:1"
# Debian 12's containerd 1.6.20~ds1-1+deb12u3: /etc/containerd/config.toml as packaged
# (its comment lines left out).
DEBIAN12 = '''version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
'''
SNAPSHOTTER_ONLY = '''version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
'''
V3_FILE = '''version = 3
[plugins."io.containerd.cri.v1.runtime".containerd]
  snapshotter = "overlayfs"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
'''


def _private(text: str, d: Path) -> str:
    """text with containerd's root, state, sockets and opt dir under d, and what a
    pod without a registry and without CAP_SYS_RESOURCE needs (a local pause image)."""
    import tomlkit

    doc = tomlkit.parse(text)
    top = tomlkit.document()
    for k, v in (("root", str(d / "root")), ("state", str(d / "state"))):
        top.add(k, v)
    top.add("grpc", {"address": str(d / "c.sock")})
    top.add("ttrpc", {"address": str(d / "c.sock.ttrpc")})
    top.add("debug", {"address": str(d / "debug.sock")})
    top.add("metrics", {"address": ""})
    for k, v in doc.body:
        if k is not None:
            top.add(k, v)
    plugins = top.setdefault("plugins", tomlkit.table(is_super_table=True))
    cri = plugins.setdefault(V2, tomlkit.table())
    cri["sandbox_image"] = PAUSE
    cri["restrict_oom_score_adj"] = True
    if "io.containerd.internal.v1.opt" in plugins:
        plugins["io.containerd.internal.v1.opt"]["path"] = str(d / "opt")
    return top.as_string()


@pytest.fixture
def ctrd_dir():
    import shutil

    from support.engines_daemons import short_dir

    d = short_dir("nvcc")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("default", [False, True], ids=["runc-default", "set-as-default"])
@pytest.mark.parametrize("text", [DEBIAN12, SNAPSHOTTER_ONLY], ids=["debian12", "snapshotter-only"])
def test_cri_loads_and_runs_pods_with_runc_and_nvidia(ctrd_dir, a100_host, capsys, text, default):
    from libinject.sim.rootfs import build_rootfs
    from support import cri
    from support.engines_daemons import CTR, Containerd
    from support.shimenv import write_config

    cfg = ctrd_dir / "config.toml"
    cfg.write_text(_private(text, ctrd_dir))
    code, out, err = nvhook(capsys, "setup", "containerd", "--config", str(cfg),
                            *(["--set-as-default"] if default else []))
    assert code == 0, err
    shim_cfg = write_config(ctrd_dir / "nvhook.toml", root=a100_host, mode="legacy")
    c = Containerd(ctrd_dir, cfg, {"NVHOOK_CONFIG": str(shim_cfg)})
    client = None
    try:
        rootfs = build_rootfs(ctrd_dir / "rootfs")
        cri.import_image(CTR, c.sock, cri.oci_archive(rootfs, PAUSE, ctrd_dir / "pause.tar",
                                                      ["/bin/sleep", "2147483647"]))
        client = cri.CRI(c.sock, timeout=60)
        assert client.version().runtime_name == "containerd", c.log.read_text()[-3000:]
        for handler in ("", "runc", "nvidia"):
            pod = client.run_pod(client.sandbox_config(f"p-{handler or 'default'}", ctrd_dir / "logs"), handler)
            assert pod
            client.remove_pod(pod)
    finally:
        if client is not None:
            client.close()
        c.stop()
    runtimes = tomllib.loads(cfg.read_text())["plugins"][V2]["containerd"]["runtimes"]
    assert runtimes["runc"]["runtime_type"] == "io.containerd.runc.v2"
    assert (runtimes["nvidia"]["runtime_type"], runtimes["nvidia"]["options"]["BinaryName"]) == (
        "io.containerd.runc.v2", SHIM)


def test_v3_file_without_runtimes_keeps_runc_defined(tmp_path, capsys):
    cfg = tmp_path / "config.toml"
    cfg.write_text(V3_FILE)
    code, out, err = nvhook(capsys, "setup", "containerd", "--config", str(cfg))
    assert code == 0, err
    c = tomllib.loads(cfg.read_text())["plugins"][V3]["containerd"]
    assert "default_runtime_name" not in c
    assert c["runtimes"]["runc"] == {"runtime_type": "io.containerd.runc.v2"}
    assert c["runtimes"]["nvidia"] == {"runtime_type": "io.containerd.runc.v2", "options": {"BinaryName": SHIM}}
    assert c["snapshotter"] == "overlayfs"


def test_a_file_an_earlier_nvhook_broke_is_repaired(tmp_path, capsys):
    """Only `nvidia` in runtimes and runc the default (what nvhook wrote on Debian's file
    before): a new run writes runc out, so the CRI loads again after the restart."""
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'version = 2\n[plugins."{V2}".containerd.runtimes.nvidia]\n'
                   f'runtime_type = "io.containerd.runc.v2"\n[plugins."{V2}".containerd.runtimes.nvidia.options]\n'
                   f'BinaryName = "{SHIM}"\n')
    code, out, err = nvhook(capsys, "setup", "containerd", "--config", str(cfg))
    assert code == 0, err
    runtimes = tomllib.loads(cfg.read_text())["plugins"][V2]["containerd"]["runtimes"]
    assert (sorted(runtimes), runtimes["runc"]) == (["nvidia", "runc"], {"runtime_type": "io.containerd.runc.v2"})
