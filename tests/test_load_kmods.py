"""load-kmods: the hook creates the driver's missing device nodes (as nvidia-container-cli
does through nvidia-modprobe), on a simulated host, for a GPU container under runc; and
never through a planted link or in a dev dir someone else can write."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from libinject.errors import NvhookError
from libinject.linux import devnodes
from support import hookenv


# open() of /dev/nvidia-uvm: ENXIO when the cgroup allows it (no driver behind the simulated
# major), EPERM when it does not, "No such file" when the node is not there.
PROBE = ("dd if=/dev/nvidia-uvm of=/dev/null bs=1 count=0 2>&1 | grep -o \"can't open.*\" "
         "|| echo 'uvm: OK'")


def _majors(host: Path) -> dict[str, int]:
    return devnodes.char_majors((host / "proc/devices").read_text())


@pytest.fixture
def host_without_uvm(fresh_sim_host) -> Path:
    host = fresh_sim_host("t4x1", name="kmods-host")
    (host / "dev/nvidia-uvm").unlink()
    (host / "dev/nvidia-uvm-tools").unlink()
    return host


def _config(tmp_path: Path, host: Path, load: bool) -> Path:
    cfg = hookenv.write_config(tmp_path / "config.toml", host, log=tmp_path / "hook.log")
    if not load:
        cfg.write_text(cfg.read_text().replace(f'root = "{host}"\n', f'root = "{host}"\nload-kmods = false\n'))
    return cfg


@pytest.mark.parametrize("mode", ["v1", "v2"])
def test_missing_uvm_is_created_and_allowed(tmp_path, host_without_uvm, mode):
    host = host_without_uvm
    cfg = _config(tmp_path, host, load=True)
    with hookenv.gpu_container(tmp_path / "c", cfg, ["NVIDIA_VISIBLE_DEVICES=0"], PROBE, mode=mode) as c:
        r = c.run()
    assert r.returncode == 0, r.stderr
    assert "can't open '/dev/nvidia-uvm': No such device or address" in r.stdout, r.stdout + r.stderr
    for name, minor in (("nvidia-uvm", 0), ("nvidia-uvm-tools", 1)):
        st = os.lstat(host / "dev" / name)
        assert stat.S_ISCHR(st.st_mode)
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (_majors(host)["nvidia-uvm"], minor)
        assert stat.S_IMODE(st.st_mode) == 0o666 and (st.st_uid, st.st_gid) == (0, 0)
    assert not [n for n in os.listdir(host / "dev") if n.startswith(".nvhook-")]


def test_load_kmods_false_creates_nothing(tmp_path, host_without_uvm):
    host = host_without_uvm
    cfg = _config(tmp_path, host, load=False)
    with hookenv.gpu_container(tmp_path / "c", cfg, ["NVIDIA_VISIBLE_DEVICES=0"], PROBE) as c:
        r = c.run()
    assert r.returncode == 0, r.stderr
    assert "can't open '/dev/nvidia-uvm': No such file or directory" in r.stdout, r.stdout + r.stderr
    assert not os.path.lexists(host / "dev/nvidia-uvm")


def test_planted_link_at_node_is_refused_by_the_hook(tmp_path, host_without_uvm):
    """A link where /dev/nvidia-uvm should be: the start is refused and nothing is made at
    (or through) the link."""
    host = host_without_uvm
    victim = tmp_path / "victim"
    (host / "dev/nvidia-uvm").symlink_to(victim)
    cfg = _config(tmp_path, host, load=True)
    with hookenv.gpu_container(tmp_path / "c", cfg, ["NVIDIA_VISIBLE_DEVICES=0"], PROBE) as c:
        r = c.run()
    assert r.returncode != 0
    assert f"nvhook: load-kmods: {host}/dev/nvidia-uvm: exists and is not character device" in r.stderr, r.stderr
    assert not os.path.lexists(victim)
    assert os.readlink(host / "dev/nvidia-uvm") == str(victim)


@pytest.mark.parametrize("what", ["file", "other-device", "fifo", "dir"])
def test_anything_but_the_device_at_a_node_name_is_refused(fresh_sim_host, what):
    """A regular file, another device (/dev/null's numbers: a container granted "nvidia-uvm"
    would be given it), a FIFO or a directory at a node's name: refused, left as it is."""
    host = fresh_sim_host("t4x1", name=f"kmods-{what}")
    node = host / "dev/nvidia-uvm"
    node.unlink()
    if what == "file":
        node.write_text("planted\n")
    elif what == "other-device":
        os.mknod(node, stat.S_IFCHR | 0o666, os.stat("/dev/null").st_rdev)
    elif what == "fifo":
        os.mkfifo(node)
    else:
        node.mkdir()
    before = os.lstat(node)
    with pytest.raises(NvhookError, match=f"load-kmods: {node}: exists and is not character device "
                                          f"{_majors(host)['nvidia-uvm']}:0; not replaced"):
        devnodes.create_nodes(str(host))
    after = os.lstat(node)
    assert (after.st_ino, after.st_mode, after.st_rdev) == (before.st_ino, before.st_mode, before.st_rdev)
    assert not [n for n in os.listdir(host / "dev") if n.startswith(".nvhook-")]


def test_planted_link_as_caps_dir_is_not_followed(tmp_path, fresh_sim_host):
    """dev/nvidia-caps a link (to a dir another user owns): no cap node is made through it."""
    host = fresh_sim_host("h100x8-mig", name="kmods-capslink")
    for n in os.listdir(host / "dev/nvidia-caps"):
        (host / "dev/nvidia-caps" / n).unlink()
    (host / "dev/nvidia-caps").rmdir()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    (host / "dev/nvidia-caps").symlink_to(theirs)
    with pytest.raises(NvhookError, match=r"dev/nvidia-caps: not a directory \(a link is not followed\)"):
        devnodes.create_nodes(str(host))
    assert os.listdir(theirs) == []


def test_planted_link_as_dev_dir_is_not_followed(tmp_path, fresh_sim_host):
    host = fresh_sim_host("t4x1", name="kmods-linkdir")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (host / "dev").rename(tmp_path / "realdev")
    (host / "dev").symlink_to(elsewhere)
    with pytest.raises(NvhookError, match=r"dev: not a directory \(a link is not followed\)"):
        devnodes.create_nodes(str(host))
    assert os.listdir(elsewhere) == []


@pytest.mark.parametrize("sub", ["dev", "dev/nvidia-caps"])
def test_dev_dir_writable_by_another_user_is_refused(fresh_sim_host, sub):
    host = fresh_sim_host("h100x8-mig", name="kmods-caps")
    (host / "dev/nvidia-uvm").unlink()
    for n in os.listdir(host / "dev/nvidia-caps"):
        (host / "dev/nvidia-caps" / n).unlink()
    os.chown(host / sub, 1000, 1000)
    with pytest.raises(NvhookError, match=f"{host}/{sub}: owned by uid 1000"):
        devnodes.create_nodes(str(host))
    os.chown(host / sub, 0, 0)
    os.chmod(host / sub, 0o777)
    with pytest.raises(NvhookError, match=f"{host}/{sub}: owned by uid 0 with mode 777"):
        devnodes.create_nodes(str(host))
    assert not os.path.lexists(host / "dev/nvidia-caps/nvidia-cap1")


def test_caps_nodes_from_capability_files(fresh_sim_host):
    """nvidia-caps nodes take their minors and modes from the driver's capability files,
    as nvidia-modprobe -f does; what exists and is right is left alone."""
    host = fresh_sim_host("h100x8-mig", name="kmods-caps2")
    caps = host / "dev/nvidia-caps"
    before = {n: os.lstat(caps / n) for n in os.listdir(caps)}
    for n in before:
        (caps / n).unlink()
    made = devnodes.create_nodes(str(host))
    assert sorted(made) == sorted(str(caps / n) for n in before)
    for n, old in before.items():
        st = os.lstat(caps / n)
        assert (st.st_rdev, st.st_mode) == (old.st_rdev, old.st_mode), n
    assert devnodes.create_nodes(str(host)) == []


def test_no_driver_no_nodes(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/devices").write_text("Character devices:\n195 nvidia\n510 nvidia-uvm\n")
    assert devnodes.create_nodes(str(tmp_path)) == []
    assert os.listdir(tmp_path / "dev") == []


def test_served_start_creates_the_node(tmp_path, host_without_uvm, sockdir):
    """The same through `nvhook serve` (a worker of the warm service, not the exec'd hook)."""
    from support.serve import Serve

    host = host_without_uvm
    cfg = _config(tmp_path, host, load=True)
    s = Serve(cfg, sockdir / "run/hook.sock")
    try:
        with hookenv.gpu_container(tmp_path / "c", cfg, ["NVIDIA_VISIBLE_DEVICES=0"], PROBE,
                                   socket=str(s.sock)) as c:
            r = c.run()
    finally:
        assert s.stop() == 0, s.log()
    assert r.returncode == 0, r.stderr
    assert "can't open '/dev/nvidia-uvm': No such device or address" in r.stdout, r.stdout + r.stderr
    assert "status 0" in s.log(), s.log()
    assert os.stat(host / "dev/nvidia-uvm").st_rdev == os.makedev(_majors(host)["nvidia-uvm"], 0)
