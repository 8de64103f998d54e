"""Set-ups GPU users hit in the field (issue 30), with the hook under real runc on a
simulated host: an Ubuntu config's ldconfig on a host without it, images that carry the
driver's file names as symlinks, a privileged container given the host's /dev, CUDA
forward compat only where the GPU supports it.
"""
from __future__ import annotations

from pathlib import Path

import pytest

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


# -- 5. CUDA forward compat only on the GPUs it supports -----------------------------------

def _first_libcuda(rootfs: Path) -> str:
    import subprocess

    from support.applyenv import HOST_LDCONFIG

    cache = subprocess.run([HOST_LDCONFIG, "-p", "-C", str(rootfs / "etc/ld.so.cache")],
                           capture_output=True, text=True, check=True).stdout
    return [ln.split("=> ")[1] for ln in cache.splitlines() if "libcuda.so.1 (libc6,x86-64)" in ln][0]


def _compat_image(rootfs: Path) -> None:
    from support.applyenv import elf

    compat = rootfs / "usr/local/cuda/compat"
    compat.mkdir(parents=True)
    elf(compat / "libcuda.so.999.1.1", "libcuda.so.1")


@pytest.mark.parametrize("profile, first", [
    ("rtx4090x1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
    ("a100x8", "/usr/local/cuda/compat/libcuda.so.1")])
def test_legacy_compat_libcuda_first_only_on_gpus_that_support_it(tmp_path, sim_host, profile, first):
    """An image's forward-compat libcuda (newer than the driver) goes first on a data
    center GPU, as NVIDIA's hook does; on a GeForce one CUDA would fail with error 804
    with it (NVIDIA's hook puts it first there too): the driver's libcuda stays first."""
    cfg = _config(tmp_path, sim_host(profile))
    with _container(tmp_path, cfg, ["NVIDIA_VISIBLE_DEVICES=0"], "nvidia-smi -L") as c:
        _compat_image(c.rootfs)
        r = c.run()
        assert r.returncode == 0, r.stdout + r.stderr
        assert _first_libcuda(c.rootfs) == first
    said = "CUDA forward compat not used: NVIDIA GeForce RTX 4090 does not support it"
    assert (said in (tmp_path / "hook.log").read_text()) is (profile == "rtx4090x1")


@pytest.mark.parametrize("profile, flag", [("rtx4090x1", False), ("a100x8", True)])
def test_cdi_compat_flag_only_on_hosts_whose_gpus_support_it(tmp_path, sim_host, profile, flag):
    """The CDI spec's hook gets --cuda-compat-driver-major (NVIDIA: enable-cuda-compat)
    on a data center host, not on a host of GeForce GPUs; a container given the GeForce
    GPU through that spec keeps the driver's libcuda first."""
    from test_cdi_hook import cdi_container, generate

    d = tmp_path / "specs"
    d.mkdir()
    spec = generate(sim_host(profile), d / "nvidia.json")
    [hook] = spec["containerEdits"]["hooks"]
    assert ("--cuda-compat-driver-major" in hook["args"]) is flag
    with cdi_container(tmp_path, d, "0", script="true") as c:
        _compat_image(c.rootfs)
        r = c.run()
        assert r.returncode == 0, r.stdout + r.stderr
        assert _first_libcuda(c.rootfs) == ("/usr/local/cuda/compat/libcuda.so.1" if flag
                                            else "/usr/lib/x86_64-linux-gnu/libcuda.so.1")


# -- 2. images that carry the driver's file names as symlinks ------------------------------

LIB = "/usr/lib/x86_64-linux-gnu"
VER = "550.163.01"
# A WSL-built / committed / alternatives-managed image: the driver's names are links,
# dangling (absolute, relative, chained through a missing directory) or absolute to
# where the driver file will be.
LINKS = {
    "/usr/bin/nvidia-smi": "/etc/alternatives/nvidia-smi",
    "/etc/alternatives/nvidia-smi": "/usr/lib/nvidia/current/nvidia-smi",
    f"{LIB}/libcuda.so.1": "/usr/lib/wsl/lib/libcuda.so.1",
    f"{LIB}/libcuda.so.{VER}": f"../wsl/lib/libcuda.so.{VER}",
    f"{LIB}/libnvidia-ml.so.1": f"{LIB}/libnvidia-ml.so.{VER}",
    f"{LIB}/libnvidia-ml.so.{VER}": "/usr/lib/wsl/drivers/nv.inf_amd64/libnvidia-ml.so.1",
}


def _plant(rootfs: Path, links: dict[str, str]) -> None:
    import os

    for link, target in links.items():
        p = rootfs / link.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, p)


def _digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_driver_names_that_are_symlinks_in_the_image(tmp_path, a100_host, gpu_uuids):
    """NVIDIA mounts over what the image's link names inside the image, creating it if
    missing; so does the hook: the container runs the driver's nvidia-smi and sees the
    driver's libraries at the names it asked for."""
    cfg = _config(tmp_path, a100_host)
    script = (PROBE + f"; for f in /usr/bin/nvidia-smi {LIB}/libcuda.so.1 {LIB}/libcuda.so.{VER} "
              f"{LIB}/libnvidia-ml.so.1; do echo \"$f $(sha256sum < $f | cut -c1-64)\"; done")
    with _container(tmp_path, cfg, ["NVIDIA_VISIBLE_DEVICES=1"], script) as c:
        _plant(c.rootfs, LINKS)
        r = c.run()
        out = r.stdout + r.stderr
        assert_only_gpu1(out, gpu_uuids)
        want = {"/usr/bin/nvidia-smi": "usr/bin/nvidia-smi",
                f"{LIB}/libcuda.so.1": f"{LIB}/libcuda.so.{VER}",
                f"{LIB}/libcuda.so.{VER}": f"{LIB}/libcuda.so.{VER}",
                f"{LIB}/libnvidia-ml.so.1": f"{LIB}/libnvidia-ml.so.{VER}"}
        for path, host in want.items():
            assert f"{path} {_digest(a100_host / host.lstrip('/'))}" in out, out
        # the files the links name were made in the image (empty once unmounted)
        assert (c.rootfs / "usr/lib/nvidia/current/nvidia-smi").stat().st_size == 0
        assert (c.rootfs / f"usr/lib/wsl/lib/libcuda.so.{VER}").is_file()


@pytest.mark.parametrize("links, path, want", [
    ({"/a/l": "/x/y/f"}, "/a/l", "/x/y/f"),                              # absolute, dangling
    ({"/a/l": "../../../../x/f"}, "/a/l", "/x/f"),                       # '..' stops at the root
    ({"/a/l": "m", "/a/m": "/b/f"}, "/a/l", "/b/f"),                     # a chain
    ({"/a/d": "/b", "/b/l": "f"}, "/a/d/l", "/b/f"),                     # a directory link on the way
    ({"/a/l": "/etc/passwd"}, "/a/l", "/etc/passwd"),                    # an existing file
])
def test_follow_stays_in_the_rootfs(rootfs, links, path, want):
    import os

    from libinject.apply.links import follow

    _plant(rootfs, links)
    fd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY)
    try:
        assert follow(fd, path) == want
    finally:
        os.close(fd)


@pytest.mark.parametrize("links, path, message", [
    ({"/a/l": "/a/m", "/a/m": "/a/l"}, "/a/l", "Too many levels of symbolic links"),
    ({"/a/l": "/nowhere/../etc"}, "/a/l", "'..' of a missing directory"),
    ({"/a/l": "/etc/passwd/x"}, "/a/l", "Not a directory"),
])
def test_follow_refusals(rootfs, links, path, message):
    import os

    from libinject.apply.links import follow
    from libinject.errors import NvhookError

    _plant(rootfs, links)
    fd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY)
    try:
        with pytest.raises(NvhookError, match=message):
            follow(fd, path)
    finally:
        os.close(fd)


# The attacks: a name the hook mounts onto (nvidia-smi) links out of the image, into
# procfs, into a volume (a host directory), in a loop, to a directory or a device.
# Whatever it names is looked for inside the rootfs only (as if it were "/"): the host is
# untouched, the container either runs the driver's nvidia-smi from the name it asked
# for or does not start, with one line.
PWN = "nvhook-field-pwn"


@pytest.mark.parametrize("link", [f"../../../../../../../etc/{PWN}", f"/etc/{PWN}",
                                  "../../../../../../etc/passwd"],
                         ids=["dotdot-dangling", "host-etc-dangling", "dotdot-passwd"])
def test_driver_name_linked_out_of_the_image_stays_inside(tmp_path, a100_host, link):
    cfg = _config(tmp_path, a100_host)
    passwd = _digest(Path("/etc/passwd"))
    with _container(tmp_path, cfg, ["NVIDIA_VISIBLE_DEVICES=1"], "nvidia-smi -L") as c:
        (c.rootfs / "usr/bin/nvidia-smi").symlink_to(link)
        r = c.run()
        assert r.returncode == 0 and "UUID: GPU-" in r.stdout, r.stdout + r.stderr
        inside = c.rootfs / "etc" / link.rsplit("/", 1)[1]
        assert inside.is_file() and not inside.is_symlink()
    assert not Path(f"/etc/{PWN}").exists()
    assert _digest(Path("/etc/passwd")) == passwd


@pytest.mark.parametrize("links, message", [
    ({"/usr/bin/nvidia-smi": "/proc/self/root/etc/" + PWN}, "/usr/bin/nvidia-smi in the rootfs"),
    ({"/usr/bin/nvidia-smi": "/proc/self/environ"}, "procfs/sysfs"),
    ({"/usr/bin/nvidia-smi": "/hostdir/nvidia-smi"}, "not the container's own"),
    ({"/usr/bin/nvidia-smi": "/usr/bin/a", "/usr/bin/a": "/usr/bin/nvidia-smi"},
     "Too many levels of symbolic links"),
    ({"/usr/bin/nvidia-smi": "/usr/bin/x", "/usr/bin/x": "/usr/bin/y", "/usr/bin/y": "x"},
     "Too many levels of symbolic links"),
    ({"/usr/bin/nvidia-smi": "/etc"}, "is a directory, expected a regular file"),
    ({"/usr/bin/nvidia-smi": "/dev/null"}, "is a char device, expected a regular file"),
], ids=["proc-self-root", "proc-self-environ", "volume", "loop", "dangling-loop", "dir", "device"])
def test_driver_name_linked_to_what_cannot_take_it_is_refused(tmp_path, a100_host, links, message):
    from support.runc import RuncError

    cfg = _config(tmp_path, a100_host)
    hostdir = tmp_path / "hostdir"     # a volume: a host directory
    hostdir.mkdir()
    with _container(tmp_path, cfg, ["NVIDIA_VISIBLE_DEVICES=1"], "sleep 100") as c:
        c.config["mounts"].append({"destination": "/hostdir", "type": "bind", "source": str(hostdir),
                                   "options": ["rbind", "rw"]})
        _plant(c.rootfs, links)
        with pytest.raises(RuncError) as e:
            c.create()
        rootfs = str(c.rootfs)
        err = [ln for ln in str(e.value).replace("\\n", "\n").splitlines() if "nvhook:" in ln]
        assert len(err) == 1 and message in err[0], str(e.value)
        assert hookenv.mounts_naming(rootfs) == []
    assert list(hostdir.iterdir()) == []
    assert not Path(f"/etc/{PWN}").exists()


# -- 4. a privileged container given the host's /dev --------------------------------------

def _host_dev_bind(c: RuncContainer, source: str) -> None:
    """The container's /dev a bind of `source` (a privileged pod's hostPath /dev),
    instead of runc's tmpfs."""
    c.config["mounts"] = [m for m in c.config["mounts"] if m["destination"] != "/dev"]
    c.config["mounts"].insert(1, {"destination": "/dev", "type": "bind", "source": source,
                                  "options": ["rbind", "rw", "nosuid"]})


def _tree(top: Path) -> list[tuple]:
    return sorted((str(p), p.lstat().st_ino, p.lstat().st_mode, p.lstat().st_rdev, p.lstat().st_mtime_ns)
                  for p in [top, *top.rglob("*")])


def test_privileged_container_with_the_hosts_dev(tmp_path, fresh_sim_host):
    """The container's /dev is the host's: its GPU nodes are the driver's own, nothing
    is made or mounted there (NVIDIA's cli bind-mounts each node onto itself); the
    cgroup still lets only GPU 1 through and the libraries are there. The host's /dev
    (here the simulated host's, the driver's /dev, given what runc needs in a /dev) is
    as it was after start and stop."""
    import os

    from libinject.linux import mountinfo

    host = fresh_sim_host("a100x8")
    dev = host / "dev"
    for name, minor in (("null", 3), ("zero", 5), ("full", 7), ("random", 8), ("urandom", 9)):
        os.mknod(dev / name, 0o20666, os.makedev(1, minor))
    for d in ("pts", "shm", "mqueue"):
        (dev / d).mkdir()
    before = _tree(dev)
    cfg = _config(tmp_path, host)
    uuids = hookenv.gpu_uuids(host)
    with _container(tmp_path, cfg, ["NVIDIA_VISIBLE_DEVICES=1"], "sleep 100; true") as c:
        _host_dev_bind(c, str(dev))
        c.config["linux"]["devices"] = []
        c.create()
        c.start()
        out = c.exec("sh", "-c", PROBE)
        assert_only_gpu1(out.stdout + out.stderr, uuids)
        ns_mounts = [m.mountpoint for m in mountinfo.read(c.pid)]
        assert [m for m in ns_mounts if m.startswith("/dev/nvidia")] == [], ns_mounts
        assert _tree(dev) == before
    assert _tree(dev) == before


def test_privileged_container_with_a_dev_lacking_the_nodes_is_refused(tmp_path, a100_host):
    """The host's real /dev bound in, without the (simulated) GPU's nodes: nothing is
    ever made there; one line, and the host's /dev is as it was."""
    from support.runc import RuncError

    before = sorted(p.name for p in Path("/dev").iterdir() if p.name.startswith("nvidia"))
    cfg = _config(tmp_path, a100_host)
    with _container(tmp_path, cfg, ["NVIDIA_VISIBLE_DEVICES=1"], "sleep 100") as c:
        _host_dev_bind(c, "/dev")
        c.config["linux"]["devices"] = []
        with pytest.raises(RuncError) as e:
            c.create()
        err = [ln for ln in str(e.value).replace("\\n", "\n").splitlines() if "nvhook:" in ln]
        assert len(err) == 1 and "/dev/nvidia" in err[0] and "host's /dev" in err[0], str(e.value)
        assert hookenv.mounts_naming(str(c.rootfs)) == []
    assert sorted(p.name for p in Path("/dev").iterdir() if p.name.startswith("nvidia")) == before


MIXED = {
    "description": "a data center GPU and a GeForce one (issue 30: forward compat per GPU)",
    "gpus": [{"name": "NVIDIA A100-SXM4-80GB", "brand": "Tesla", "bus_id": "0000:07:00.0",
              "architecture": "Ampere", "memory_mib": 81920},
             {"name": "NVIDIA GeForce RTX 4090", "brand": "GeForce", "bus_id": "0000:41:00.0",
              "architecture": "Ada", "memory_mib": 24564}],
}


@pytest.mark.parametrize("device, first", [("0", "/usr/local/cuda/compat/libcuda.so.1"),
                                           ("1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1")],
                         ids=["a100", "geforce"])
def test_cdi_compat_on_a_mixed_host_follows_the_containers_gpu(tmp_path, device, first):
    """A host with an A100 and a GeForce: the spec's hook has the compat flag (its hook is
    common to every device); a container given the A100 gets the compat libcuda first,
    one given the GeForce keeps the driver's."""
    import json

    from libinject.sim.build import create_host
    from test_cdi_hook import cdi_container, generate

    prof = tmp_path / "mixed.json"
    prof.write_text(json.dumps(MIXED))
    host = create_host(tmp_path / "mixed", profile_file=prof)
    d = tmp_path / "specs"
    d.mkdir()
    spec = generate(host, d / "nvidia.json")
    [hook] = spec["containerEdits"]["hooks"]
    assert "--cuda-compat-driver-major" in hook["args"]
    with cdi_container(tmp_path, d, device, script="true") as c:
        _compat_image(c.rootfs)
        r = c.run()
        assert r.returncode == 0, r.stdout + r.stderr
        assert _first_libcuda(c.rootfs) == first
