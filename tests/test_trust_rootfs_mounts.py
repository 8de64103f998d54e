"""Trust boundaries, class 4: mount targets stay on the rootfs's own mount.

RESOLVE_IN_ROOT keeps a path inside the container's *view*, which includes its volumes:
an image symlink into a volume (/usr/lib/x86_64-linux-gnu -> /vol/x) would put driver
files (mounts) and the directories and placeholders made for them into a host
directory, and with rshared propagation the mounts into the host's mount table. Such a
target is refused: the apply fails (all or nothing) with one `nvhook:` line and nothing
reaches the volume. Nothing is attached to a shared mount either: in the container's own
namespace its rootfs mount is made a slave first; in ours a shared one is refused. The
sandboxed ldconfig sees volumes read-only (it would make SONAME links in one).
"""
from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from libinject.linux import native
from libinject.record import replace
from support import hookenv
from support.applyenv import (LIBDIR, elf, in_ns, make_host, mountinfo, new_mounts, snapshot,
                              try_apply)
from support.runc import RuncError

REFUSED = "on a mount that is not the container's own ("


def _apply_with_volume(rootfs: Path, edits, vol: Path):
    """As a runtime would: the host dir `vol` bind-mounted at the image's /vol."""
    native.mount(str(vol), str(rootfs / "vol"), None, native.MS_BIND)
    return try_apply(rootfs, edits)


def _volume(tmp_path: Path, rootfs: Path) -> Path:
    vol = tmp_path / "hostvol"
    vol.mkdir()
    (vol / "x").mkdir()                       # what the image's symlinks point at
    (vol / "keep.txt").write_text("the host's\n")
    (rootfs / "vol").mkdir()
    return vol


def _link_into_volume(rootfs: Path, cpath: str) -> None:
    p = rootfs / cpath.lstrip("/")
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.symlink_to("/vol/x")


@pytest.mark.parametrize("cpath", [LIBDIR, "/usr/bin", "/lib/firmware", "/dev", "/etc", "/proc/driver"])
def test_symlink_into_volume_refused(rootfs, tmp_path, cpath, no_leaked_mounts):
    """Each directory nvhook mounts into, creates in or writes to, as a symlink into a
    private volume: the apply fails before anything reaches the host dir (old code:
    directories, placeholders, a socket, ld.so.conf.d files, root-owned, in it)."""
    edits = make_host(tmp_path / "drv")
    vol = _volume(tmp_path, rootfs)
    _link_into_volume(rootfs, cpath)
    before = snapshot(vol)
    err, mnts = in_ns(_apply_with_volume, rootfs, edits, vol)
    assert snapshot(vol) == before
    assert [m.mountpoint for m in mnts] == []
    assert err is not None and REFUSED in err, err


def _apply_with_volume_notes(rootfs: Path, edits, vol: Path):
    from libinject.apply import live
    err, mnts = _apply_with_volume(rootfs, edits, vol)
    return err, [m.mountpoint for m in mnts], list(live.notes)


def test_optional_socket_in_a_volume_is_skipped(rootfs, tmp_path, no_leaked_mounts):
    """The persistenced socket's directory as a symlink into a volume: the socket is
    optional (CUDA works without it), so it is skipped with a note and the start goes
    on; nothing reaches the host dir, and everything else is mounted (old code: the
    start failed)."""
    edits = make_host(tmp_path / "drv")
    vol = _volume(tmp_path, rootfs)
    _link_into_volume(rootfs, "/run/nvidia-persistenced")
    before = snapshot(vol)
    err, mnts, notes = in_ns(_apply_with_volume_notes, rootfs, edits, vol)
    assert err is None
    assert snapshot(vol) == before
    assert not any("persistenced" in m or m.startswith(f"{rootfs}/vol") for m in mnts), mnts
    assert any(m.endswith("/usr/bin/nvidia-smi") for m in mnts), mnts
    [note] = notes
    assert note.startswith("skipped /run/nvidia-persistenced/socket: ") and REFUSED in note, note


def _ldconfig_with_volume(rootfs: Path, vol: Path):
    from libinject.apply import ldconfig
    from libinject.apply.rootfs import RootFS
    native.mount(str(vol), str(rootfs / "vol"), None, native.MS_BIND)
    return ldconfig.update(RootFS(str(rootfs)), [LIBDIR])


def test_ldconfig_never_links_in_a_volume(rootfs, tmp_path):
    """The image's ld.so.conf names a volume holding a library without its SONAME link:
    the sandboxed ldconfig (old code: it made the link, as root, in the host dir) sees
    the volume read-only."""
    vol = tmp_path / "hostvol"
    elf(vol / "libs/libfoo.so.1.2.3", "libfoo.so.1")
    (rootfs / "vol").mkdir()
    (rootfs / "etc/ld.so.conf.d/vol.conf").write_text("/vol/libs\n")
    before = snapshot(vol)
    assert in_ns(_ldconfig_with_volume, rootfs, vol) == "ldconfig"
    assert snapshot(vol) == before
    cache = subprocess.run(["/sbin/ldconfig", "-p", "-C", str(rootfs / "etc/ld.so.cache")],
                           capture_output=True, text=True).stdout
    assert "libc.so.6" in cache


# -- shared mounts ----------------------------------------------------------------------
def _share_rootfs(rootfs: Path, peer: Path) -> None:
    """rootfs becomes a shared mount with a peer elsewhere (as a host's mount of a
    container's rootfs, seen through Docker's rshared or a Bidirectional volume)."""
    native.mount(str(rootfs), str(rootfs), None, native.MS_BIND)
    native.mount(None, str(rootfs), None, native.MS_SHARED)
    native.mount(str(rootfs), str(peer), None, native.MS_BIND)


def _apply_on_shared_rootfs(rootfs: Path, peer: Path, edits):
    _share_rootfs(rootfs, peer)
    err, _ = try_apply(rootfs, edits)
    return err, [m.mountpoint for m in mountinfo() if m.mountpoint.startswith(f"{peer}/")]


def test_shared_rootfs_mount_refused_in_our_namespace(rootfs, tmp_path, no_leaked_mounts):
    """`configure ROOTFS` in our own namespace on a shared mount: what it mounted would
    appear at the peer (old code: 30 mounts there). Refused, nothing mounted. (No
    ldconfig: the old sandbox could not even pivot into a shared rootfs.)"""
    edits = replace(make_host(tmp_path / "drv"), ldconfig_folders=())
    peer = tmp_path / "peer"
    peer.mkdir()
    err, at_peer = in_ns(_apply_on_shared_rootfs, rootfs, peer, edits)
    assert at_peer == []
    assert err is not None and "is on a shared mount" in err, err


def _apply_into_container_with_shared_rootfs(rootfs: Path, peer: Path, edits, ready: Path):
    """Here (the "host"): rootfs shared, with a peer. The container: a mount namespace
    cloned from here, so its rootfs mount is in the same peer group."""
    _share_rootfs(rootfs, peer)
    p = subprocess.Popen(["unshare", "-m", "--propagation", "unchanged", "sh", "-c",
                          f"mount -t tmpfs tmpfs {rootfs}/dev && touch {ready} && exec sleep 60"])
    try:
        deadline = time.monotonic() + 10
        while not ready.exists():
            assert p.poll() is None and time.monotonic() < deadline, "container not ready"
            time.sleep(0.02)
        # (its /dev tmpfs, mounted on the shared rootfs, is here too: the runtime's)
        before = mountinfo()
        err, _ = try_apply(rootfs, edits, pid=p.pid)
        here = [m.mountpoint for m in new_mounts(before, mountinfo())]
        there = [m.mountpoint for m in mountinfo(p.pid) if m.mountpoint.startswith(f"{rootfs}/")]
        return err, here, there
    finally:
        p.kill()
        p.wait(timeout=10)


def test_shared_rootfs_mount_made_slave_in_container_namespace(rootfs, tmp_path, no_leaked_mounts):
    """In the container's own namespace its rootfs mount is made a slave before anything
    is attached: the container gets its GPU, and nothing propagates back (old code:
    every mount appeared here, in the "host" namespace, at the rootfs and its peer)."""
    edits = replace(make_host(tmp_path / "drv"), ldconfig_folders=())
    peer = tmp_path / "peer"
    peer.mkdir()
    err, here, there = in_ns(_apply_into_container_with_shared_rootfs, rootfs, peer, edits,
                             tmp_path / "ready")
    assert here == []
    assert err is None, err
    assert f"{rootfs}{LIBDIR}/libnvidia-ml.so.550.54.14" in there
    assert f"{rootfs}/dev/nvidia0" in there


# -- a real runc container with an rshared volume ---------------------------------------
@pytest.mark.parametrize("hostile", [False, True], ids=["benign", "symlinks-into-volume"])
def test_runc_rshared_volume(tmp_path, a100_host, hook_config, gpu_uuids, hostile):
    """runc (v2: in a private "host" mount namespace) with a volume bind-mounted rshared
    from a host dir that is a shared mount there, rootfsPropagation rshared (Docker
    :rshared, Kubernetes Bidirectional). Benign image: the GPU container runs, and
    nothing of nvhook's reaches the host dir or the host's mount table. Hostile image
    (/lib/firmware and /run/nvidia-persistenced symlinked into the volume): the start
    fails with one nvhook: line, and again nothing reaches the host (old code: firmware
    and the rw persistenced socket mounted in the host's mount table, directories and
    placeholders made in the host dir)."""
    vol = tmp_path / "hostvol"
    for d in ("fw", "pd"):
        (vol / d).mkdir(parents=True)
    (vol / "keep.txt").write_text("the host's\n")
    script = "nvidia-smi -L; ls /vol"
    with hookenv.gpu_container(tmp_path, hook_config, ["NVIDIA_VISIBLE_DEVICES=1"], script,
                               mode="v2") as c:
        subprocess.run(c.host_cmd(["sh", "-c", f"mount --bind {vol} {vol} && mount --make-shared {vol}"]),
                       check=True, timeout=60)
        c.config["mounts"].append({"destination": "/vol", "type": "bind", "source": str(vol),
                                   "options": ["rbind", "rshared"]})
        c.config["linux"]["rootfsPropagation"] = "rshared"
        if hostile:
            shutil.rmtree(c.rootfs / "run")
            (c.rootfs / "run").mkdir()
            (c.rootfs / "run/nvidia-persistenced").symlink_to("/vol/pd")
            (c.rootfs / "lib/firmware").symlink_to("/vol/fw")
        before = snapshot(vol)
        msg = None
        if hostile:
            try:
                c.create()
            except RuncError as e:
                msg = str(e)
        else:
            r = c.run()
            assert re.findall(r"UUID: (GPU-[0-9a-f-]+)", r.stdout) == [gpu_uuids[1]], r.stdout + r.stderr
        host_view = [m.mountpoint for m in mountinfo(c.ns_pid)
                     if m.mountpoint.startswith(f"{vol}/") or str(a100_host) in m.root]
        assert host_view == []
        assert snapshot(vol) == before
    if hostile:
        assert msg is not None and msg.count("nvhook: ") == 1, msg
        assert REFUSED in msg, msg

