"""Hostile images (DESIGN.md §5; CVE-2024-0132/0133/0134, CVE-2025-23359/23267).

Each image makes a directory the applier writes into a symlink to a host directory
(absolute, or ../../ relative), or a file it touches a symlink to a host file, or swaps
symlinks in while apply runs. Whatever the outcome (clean success inside the rootfs
or a clean NvhookError), host canaries must be untouched and every mount must be
inside the rootfs; the host mount table is checked by no_leaked_mounts.
"""
from __future__ import annotations

import os
import shutil
import socket
import stat
import threading
from pathlib import Path

import pytest

from libinject.plan.edits import CudaCompatEdit
from libinject.record import replace
from support.applyenv import LIBDIR, elf, flipper, in_ns, make_host, snapshot, try_apply

HOSTILE_DIRS = [LIBDIR, "/usr/bin", "/lib/firmware", "/proc/driver", "/dev",
                "/usr/local/cuda/compat", "/run/nvidia-persistenced"]


def _apply(rootfs, edits):
    err, mnts = try_apply(rootfs, edits)
    return err, [m.mountpoint for m in mnts]


def _canary(top: Path) -> Path:
    """A host directory worth attacking: files, a newer 'compat libcuda', a socket dir."""
    top.mkdir(parents=True, exist_ok=True)
    (top / "canary.txt").write_text("host data\n")
    (top / "libcuda.so.999.1.1").write_text("host file, not a library to mount")
    (top / "sub").mkdir(exist_ok=True)
    (top / "sub/keep").write_text("keep\n")
    return top


def _edits(tmp_path):
    edits = make_host(tmp_path / "drv")
    return replace(edits, cuda_compat=CudaCompatEdit("mount", 550))


def _link(rootfs: Path, cpath: str, host: Path, style: str) -> None:
    p = rootfs / cpath.lstrip("/")
    if p.is_symlink():
        p.unlink()
    elif p.is_dir():
        shutil.rmtree(p)
    p.parent.mkdir(parents=True, exist_ok=True)
    depth = cpath.strip("/").count("/") + 3        # more ../ than needed: clamped at /
    p.symlink_to(str(host) if style == "absolute" else "../" * depth + str(host).lstrip("/"))


def _assert_inside(rootfs, mounts):
    outside = [m for m in mounts if not m.startswith(f"{rootfs}/")]
    assert outside == []


@pytest.mark.parametrize("present", [False, True], ids=["dangling", "inside"])
@pytest.mark.parametrize("style", ["absolute", "relative"])
@pytest.mark.parametrize("cpath", HOSTILE_DIRS)
def test_dir_symlinked_to_host(rootfs, tmp_path, cpath, style, present, no_leaked_mounts):
    host = _canary(tmp_path / "hostcanary")
    before = snapshot(host)
    edits = _edits(tmp_path)
    _link(rootfs, cpath, host, style)
    if present:   # the same path also exists inside the rootfs: that is where it resolves
        (rootfs / str(host).lstrip("/")).mkdir(parents=True)
    err, mounts = in_ns(_apply, rootfs, edits)
    assert snapshot(host) == before
    _assert_inside(rootfs, mounts)
    inside = f"{rootfs}{host}"
    if cpath == "/usr/local/cuda/compat":
        # nothing to use in the (resolved, empty) compat dir; never the host's file
        assert err is None
        assert not any("999" in m for m in mounts)
    elif present:
        assert err is None, err
        assert any(m.startswith(inside + "/") for m in mounts)
    else:
        assert err is not None and "symlink that does not resolve inside the rootfs" in err, err
        assert mounts == []


@pytest.mark.parametrize("name", ["libnvidia-ml.so.550.54.14", "libnvidia-ml.so.1"])
def test_file_symlinked_to_host(rootfs, tmp_path, name, no_leaked_mounts):
    """A mount target (versioned lib) or a SONAME link the image pre-made as a symlink
    to a host file."""
    host = _canary(tmp_path / "hostcanary")
    before = snapshot(host)
    edits = _edits(tmp_path)
    (rootfs / LIBDIR.lstrip("/") / name).symlink_to(str(host / "canary.txt"))
    err, mounts = in_ns(_apply, rootfs, edits)
    assert snapshot(host) == before
    _assert_inside(rootfs, mounts)
    assert err is None, err
    if name.endswith(".so.1"):
        assert os.readlink(rootfs / LIBDIR.lstrip("/") / name) == "libnvidia-ml.so.550.54.14"
    else:
        # mounted where the link points inside the rootfs (made there), as NVIDIA's cli does
        assert f"{rootfs}{host}/canary.txt" in mounts


@pytest.mark.parametrize("style", ["absolute", "relative"])
def test_ldcache_and_confdir_symlinked_to_host(rootfs, tmp_path, style, no_leaked_mounts):
    host = _canary(tmp_path / "hostetc")
    (host / "ld.so.cache").write_bytes(b"the host's cache")
    (host / "ld.so.conf.d").mkdir()
    (host / "ld.so.conf.d/host.conf").write_text("/opt/host\n")
    before = snapshot(host)
    edits = _edits(tmp_path)
    _link(rootfs, "/etc/ld.so.cache", host / "ld.so.cache", style)
    _link(rootfs, "/etc/ld.so.conf.d", host / "ld.so.conf.d", style)
    err, mounts = in_ns(_apply, rootfs, edits)
    assert err is None, err
    _assert_inside(rootfs, mounts)
    assert snapshot(host) == before
    cache = (rootfs / "etc/ld.so.cache").read_bytes()
    assert b"libnvidia-ml.so.1" in cache


def test_compat_dir_symlinked_to_host_newer_libcuda(rootfs, tmp_path, no_leaked_mounts):
    """The host dir holds a *real* newer libcuda: following the image's symlink would
    mount it; resolved inside the rootfs it is not there."""
    host = tmp_path / "hostcompat"
    host.mkdir()
    elf(host / "libcuda.so.999.1.1", "libcuda.so.1")
    before = snapshot(host)
    edits = _edits(tmp_path)
    for style in ("absolute", "relative"):
        _link(rootfs, "/usr/local/cuda/compat", host, style)
        err, mounts = in_ns(_apply, rootfs, edits)
        assert err is None
        assert not any("libcuda" in m for m in mounts)
        assert snapshot(host) == before


def test_symlink_swapped_in_during_apply(rootfs, tmp_path, no_leaked_mounts):
    host = _canary(tmp_path / "hostcanary")
    before = snapshot(host)
    edits = _edits(tmp_path)
    stop = threading.Event()
    flips = [0]
    (rootfs / "lib/firmware").mkdir(parents=True)
    threads = [threading.Thread(target=flipper, args=(rootfs / p.lstrip("/"), host, stop, flips))
               for p in (LIBDIR, "/dev", "/lib/firmware")]
    for t in threads:
        t.start()
    outcomes = []
    try:
        for _ in range(12):
            err, mounts = in_ns(_apply, rootfs, edits)
            outcomes.append(err)
            _assert_inside(rootfs, mounts)
            if err is not None:
                assert mounts == []            # all or nothing, even under a race
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
            assert not t.is_alive(), "flipper thread did not stop"
    assert flips[0] > 0
    assert snapshot(host) == before
    print(f"race: {flips[0]} flips, {sum(e is None for e in outcomes)}/{len(outcomes)} applies "
          f"succeeded; errors: {sorted(set(e for e in outcomes if e))[:3]}")


# -- the host side: a source path swapped for a symlink after planning ---------------
def _plan_sim(host: Path, rootfs: Path):
    from libinject.discover.driver import discover
    from libinject.plan.planner import plan
    from libinject.request.model import Request
    driver = discover(str(host), snapshot=False)
    return plan(Request(devices="0", capabilities=frozenset({"utility", "compute"})), driver)


@pytest.mark.parametrize("swap", ["usr/lib/x86_64-linux-gnu", "proc/driver/nvidia/gpus",
                                  "lib/firmware/nvidia", "run/nvidia-persistenced"])
def test_host_source_dir_swapped_for_symlink(fresh_sim_host, rootfs, tmp_path, swap,
                                             no_leaked_mounts):
    """A local user who controls a component of a host source path (here: any driver
    dir) swaps it for a symlink to a host directory between discovery and apply, with
    the same names inside. Apply must not follow it: it fails, mounts nothing, and
    nothing from the canary appears in the container."""
    host = fresh_sim_host("a100x8")
    edits = _plan_sim(host, rootfs)
    real = host / swap
    canary = tmp_path / "hostcanary"
    def copy(src, dst):      # sockets (persistenced) cannot be copied: make new ones
        if stat.S_ISSOCK(os.lstat(src).st_mode):
            s = socket.socket(socket.AF_UNIX)
            s.bind(dst)
            s.close()
        else:
            shutil.copy2(src, dst)
    shutil.copytree(real, canary, symlinks=True, copy_function=copy)
    for dirpath, _, files in os.walk(canary):      # same names, host content
        for n in files:
            p = Path(dirpath) / n
            if p.is_file() and not p.is_symlink():
                p.write_bytes(b"host secret\n")
    before = snapshot(canary)
    real.rename(real.with_name(real.name + ".away"))
    real.symlink_to(canary)

    err, mnts = in_ns(try_apply, rootfs, edits)
    assert [m for m in mnts if m.root.startswith(str(canary))] == []
    assert err is not None and "a component is a symlink" in err, err
    assert mnts == []
    assert snapshot(canary) == before
