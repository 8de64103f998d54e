"""Trust boundaries of the graphics/display surface (ICD and vendor files, X modules, DRM
nodes, their links), attacked as a hostile image, a hostile running container, a hostile
CDI spec and a root peer holding the snapshot key would.

The edits are the planner's for a simulated GeForce host (libinject.discover.graphics +
libinject.plan.planner), applied for real by libinject.apply.live (in a private mount
namespace, as `configure` without --pid is, or into runc containers through the hook).
Every test checks that nothing outside the rootfs changed (host canary dirs, volumes, the
host's mount table), that a refusal is one clean line with everything undone, and (in
containers) what a node opens to: ENXIO (the cgroup allows it) or EPERM.

Each test names the defence it relies on (the forged-snapshot graphics-file tests failed
before graphics.could_find: the hole they found is closed).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from conftest import NVHOOK, run
from libinject.linux import native
from libinject.record import replace
from support import hookenv
from support.applyenv import LIBDIR, flipper, in_ns, mountinfo, snapshot, try_apply
from support.runc import RuncContainer, RuncError

VER = "550.163.01"
ICD = "/usr/share/vulkan/icd.d/nvidia_icd.json"
GLX_DIR = "/usr/lib/xorg/modules/extensions"
GBM_DIR = f"{LIBDIR}/gbm"
REFUSED = "on a mount that is not the container's own ("
DANGLING = "symlink that does not resolve inside the rootfs"
ALL_CAPS = frozenset({"utility", "compute", "graphics", "display"})

BUS = ("0000:01:00.0", "0000:41:00.0")


@pytest.fixture(scope="module")
def gfx_host(geforce2_host) -> Path:
    return geforce2_host


@pytest.fixture(scope="module")
def gfx_driver(gfx_host):
    from libinject.discover.driver import discover

    d = discover(str(gfx_host), snapshot=False)
    assert len(d.drm_devices) == 4 and d.graphics_files
    return d


def _edits(driver, devices: str = "0", caps=ALL_CAPS, ldconfig: bool = False):
    """The hook's plan for `devices` with `caps`; without the ld cache step unless asked
    (it is not what these tests attack, and it is the slow part)."""
    from libinject.plan.planner import plan
    from libinject.request.model import Request

    e = plan(Request(devices=devices, capabilities=frozenset(caps)), driver)
    return e if ldconfig else replace(e, ldconfig_folders=(), cuda_compat=None)


def _canary(top: Path) -> Path:
    """A host directory worth attacking."""
    top.mkdir(parents=True, exist_ok=True)
    (top / "canary.txt").write_text("host data\n")
    (top / "sub").mkdir(exist_ok=True)
    (top / "sub/keep").write_text("keep\n")
    return top


def _clear(p: Path) -> None:
    if p.is_symlink() or (p.exists() and not p.is_dir()):
        p.unlink()
    elif p.is_dir():
        shutil.rmtree(p)


def _symlink(rootfs: Path, cpath: str, target: str, style: str = "absolute") -> Path:
    """The image's `cpath` made a symlink to `target` (an absolute path), written as
    is or as enough ../ to climb past any root, the rootfs's or the host's ("relative")."""
    p = rootfs / cpath.lstrip("/")
    _clear(p)
    p.parent.mkdir(parents=True, exist_ok=True)
    if style == "relative":
        target = "../" * 40 + target.lstrip("/")
    p.symlink_to(target)
    return p


def _special(rootfs: Path, cpath: str, kind: str) -> Path:
    """The image's `cpath` made an entry of type `kind`."""
    p = rootfs / cpath.lstrip("/")
    _clear(p)
    p.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(p, 0o666)
    elif kind == "chr":
        os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))      # the image's /dev/null
    elif kind == "blk":
        os.mknod(p, 0o666 | stat.S_IFBLK, os.makedev(7, 0))      # a loop device
    elif kind == "sock":
        cwd = os.open(".", os.O_RDONLY)
        os.chdir(p.parent)      # sun_path is short: bind by the relative name
        try:
            s = socket.socket(socket.AF_UNIX)
            s.bind(p.name)
            s.close()
        finally:
            os.fchdir(cwd)
            os.close(cwd)
    elif kind == "file":
        p.write_text("the image's file\n")
    elif kind == "dir":
        p.mkdir()
        (p / "keep").write_text("the image's\n")
    else:
        raise ValueError(kind)
    return p


def _inside(rootfs: Path, mounts) -> None:
    outside = [m.mountpoint for m in mounts if not m.mountpoint.startswith(f"{rootfs}/")]
    assert outside == []


def _one_line(err: str | None, *expected: str) -> str:
    assert err is not None, "the apply went through"
    assert "\n" not in err and err.isprintable(), err
    assert "Traceback" not in err and "internal error" not in err, err
    for e in expected:
        assert e in err, err
    return err


# ---------------------------------------------------------------------------------------
# 1. The image's graphics directories as symlinks to host directories (configure without
#    --pid on an unpacked rootfs: the image controls /dev too).
#    Defence: RootFS.resolve/makedirs resolve with openat2(RESOLVE_IN_ROOT), so "/host/x"
#    and "../../../host/x" both mean <rootfs>/host/x; RootFS._step refuses a symlink that
#    does not resolve inside the rootfs (libinject/apply/rootfs.py, _step's
#    FileExistsError branch). Without them the ICD files, X modules, DRM nodes and the
#    gbm/by-path links would land in the host directory.
# ---------------------------------------------------------------------------------------
GRAPHICS_DIRS = ["/usr/share/vulkan", "/usr/share/vulkan/icd.d", "/usr/share/glvnd/egl_vendor.d",
                 "/etc/OpenCL", "/etc/OpenCL/vendors", GLX_DIR, "/usr/share/X11/xorg.conf.d",
                 GBM_DIR, "/dev/dri", "/dev/dri/by-path"]


def _expect_inside(cpath: str) -> str:
    """A file the apply puts in `cpath` (so in the dir it resolves to)."""
    return {"/usr/share/vulkan": "icd.d/nvidia_icd.json", "/usr/share/vulkan/icd.d": "nvidia_icd.json",
            "/usr/share/glvnd/egl_vendor.d": "10_nvidia.json", "/etc/OpenCL": "vendors/nvidia.icd",
            "/etc/OpenCL/vendors": "nvidia.icd", GLX_DIR: "libglxserver_nvidia.so",
            "/usr/share/X11/xorg.conf.d": "10-nvidia.conf", GBM_DIR: "nvidia-drm_gbm.so",
            "/dev/dri": "card0", "/dev/dri/by-path": f"pci-{BUS[0]}-card"}[cpath]


@pytest.mark.parametrize("present", [False, True], ids=["dangling", "inside"])
@pytest.mark.parametrize("style", ["absolute", "relative"])
@pytest.mark.parametrize("cpath", GRAPHICS_DIRS)
def test_graphics_dir_symlinked_to_host(rootfs, tmp_path, gfx_driver, cpath, style, present,
                                        no_leaked_mounts):
    host = _canary(tmp_path / "hostcanary")
    before = snapshot(host)
    _symlink(rootfs, cpath, str(host), style)
    inside = rootfs / str(host).lstrip("/")
    if present:     # the same path exists in the image: that is where it resolves
        inside.mkdir(parents=True)
    err, mnts = in_ns(try_apply, rootfs, _edits(gfx_driver))
    assert snapshot(host) == before
    _inside(rootfs, mnts)
    if present:
        assert err is None, err
        assert os.path.lexists(inside / _expect_inside(cpath))
    else:
        _one_line(err, DANGLING)
        assert mnts == []


# ---------------------------------------------------------------------------------------
# 2. Entries of the wrong type where the graphics edits go (unpacked rootfs).
#    Defence: RootFS.target() checks the resolved target's type on its O_PATH fd (a file
#    target must be a regular file or the source's own type: "is a fifo, expected a
#    regular file"); makedirs refuses a non-directory component ("not a directory"). A
#    FIFO is never opened (O_PATH only): an apply that opened it would hang here.
#    All or nothing: the image is as it was (Journal.rollback).
# ---------------------------------------------------------------------------------------
WRONG_TYPES = [
    (ICD, "fifo", "is a fifo, expected a regular file"),
    (ICD, "chr", "is a char device, expected a regular file"),
    (ICD, "sock", "is a socket, expected a regular file"),
    (ICD, "dir", "is a directory, expected a regular file"),
    ("/usr/share/vulkan/icd.d", "file", "not a directory"),
    ("/usr/share/vulkan/icd.d", "fifo", "not a directory"),
    ("/etc/OpenCL/vendors/nvidia.icd", "blk", "is a block device, expected a regular file"),
    (f"{GLX_DIR}/libglxserver_nvidia.so.{VER}", "fifo", "is a fifo"),
    (GLX_DIR, "file", "not a directory"),
    (GBM_DIR, "file", "not a directory"),
    (GBM_DIR, "fifo", "not a directory"),
    ("/dev/dri", "file", "not a directory"),
    ("/dev/dri/by-path", "fifo", "not a directory"),
    ("/dev/dri/card0", "fifo", "is a fifo, expected a regular file"),
    ("/dev/dri/card0", "blk", "is a block device, expected a regular file"),
    ("/dev/dri/renderD128", "dir", "is a directory, expected a regular file"),
    ("/dev/dri/renderD128", "sock", "is a socket"),
]


@pytest.mark.parametrize("cpath,kind,why", WRONG_TYPES,
                         ids=[f"{c.rsplit('/', 1)[1]}-{k}" for c, k, _ in WRONG_TYPES])
def test_wrong_type_refused_and_undone(rootfs, gfx_driver, cpath, kind, why, no_leaked_mounts):
    (rootfs / "dev/dri").mkdir(parents=True, exist_ok=True)
    _special(rootfs, cpath, kind)
    before = snapshot(rootfs, dir_mtimes=False)
    err, mnts = in_ns(try_apply, rootfs, _edits(gfx_driver))
    _one_line(err, cpath, why)
    assert mnts == []
    assert snapshot(rootfs, dir_mtimes=False) == before


def _stat_in_ns(rootfs: Path, edits, paths: list[str]):
    err, _ = try_apply(rootfs, edits)
    out = {}
    for p in paths:
        st = os.stat(rootfs / p.lstrip("/"))
        out[p] = (stat.S_IFMT(st.st_mode), os.major(st.st_rdev), os.minor(st.st_rdev))
    return err, out


def test_image_char_node_at_drm_path_is_covered(rootfs, gfx_driver, no_leaked_mounts):
    """The image ships /dev/dri/card0 as its own char node (1:3 here; /dev/mem would do
    the same): the target may be of the source's own type (RootFS.target's `also`, for a
    configure run twice), so it is mounted over, and the path then is the host's 226:0.
    What the image's node was never matters: nothing opens it, the bind covers it."""
    _special(rootfs, "/dev/dri/card0", "chr")
    err, st = in_ns(_stat_in_ns, rootfs, _edits(gfx_driver), ["/dev/dri/card0", "/dev/dri/renderD128"])
    assert err is None, err
    assert st == {"/dev/dri/card0": (stat.S_IFCHR, 226, 0), "/dev/dri/renderD128": (stat.S_IFCHR, 226, 128)}


def test_image_by_path_link_replaced_and_restored(rootfs, gfx_driver, no_leaked_mounts):
    """The image's by-path link points at the host's /proc/1/root: it is replaced by the
    planned ../card0 (a symlink is never written through, RootFS.symlink renames over
    it), and when the apply fails later it is put back exactly (Journal: "restore")."""
    link = _symlink(rootfs, f"/dev/dri/by-path/pci-{BUS[0]}-card", "/proc/1/root/etc/shadow")
    # A later step fails: the render node's placeholder is a FIFO.
    _special(rootfs, "/dev/dri/renderD128", "fifo")
    before = snapshot(rootfs, dir_mtimes=False)
    err, mnts = in_ns(try_apply, rootfs, _edits(gfx_driver))
    _one_line(err, "/dev/dri/renderD128", "is a fifo")
    assert mnts == []
    assert snapshot(rootfs, dir_mtimes=False) == before
    # and without the FIFO it goes through, with the planned link
    os.unlink(rootfs / "dev/dri/renderD128")
    err, _ = in_ns(try_apply, rootfs, _edits(gfx_driver))
    assert err is None, err
    assert os.readlink(link) == "../card0"


# ---------------------------------------------------------------------------------------
# 3. As the runtime lays the rootfs out (procfs at /proc, sysfs at /sys, a tmpfs at /dev
#    with /dev/shm, a volume at /vol bound from a host dir), the image's graphics dirs as
#    symlinks into those mounts; and, as a running container could before a `configure
#    --pid`, /dev/dri itself a symlink in its /dev tmpfs.
#    Defence: RootFS._check_create / _check_attach (statx mount id of the very fd: only
#    the rootfs's own mount, a tmpfs of ours, or the runtime's /dev tmpfs for a path that
#    *is* under /dev) and RootFS.target's procfs/sysfs check (a file target resolving to
#    /proc/sys/... is refused even where its type fits).
# ---------------------------------------------------------------------------------------
def _runtime_layout(rootfs: Path, vol: Path) -> None:
    """In this (private) namespace: what runc mounts before its hooks run."""
    native.mount("proc", str(rootfs / "proc"), "proc", 0)
    native.mount("sysfs", str(rootfs / "sys"), "sysfs", native.MS_RDONLY)
    native.mount("tmpfs", str(rootfs / "dev"), "tmpfs", native.MS_NOSUID, "mode=755")
    (rootfs / "dev/shm").mkdir()
    native.mount("shm", str(rootfs / "dev/shm"), "tmpfs", native.MS_NOSUID | native.MS_NODEV)
    (rootfs / "dev/shm/x").mkdir()
    (rootfs / "dev/shm/f").write_text("shm file\n")
    native.mount(str(vol), str(rootfs / "vol"), None, native.MS_BIND)


def _apply_in_runtime_layout(rootfs: Path, vol: Path, edits, dev_links: dict[str, str]):
    _runtime_layout(rootfs, vol)
    for cpath, target in dev_links.items():     # made by the running container, in its /dev
        p = rootfs / cpath.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.symlink_to(target)
    dev_before = snapshot(rootfs / "dev", dir_mtimes=False)
    err, mnts = try_apply(rootfs, edits)
    dev_after = snapshot(rootfs / "dev", dir_mtimes=False)
    return err, [(m.mountpoint, m.fstype) for m in mnts], dev_before == dev_after


def _volume(tmp_path: Path, rootfs: Path) -> Path:
    vol = tmp_path / "hostvol"
    (vol / "x").mkdir(parents=True)
    (vol / "keep.txt").write_text("the host's\n")
    (vol / "x/f").write_text("the host's file\n")
    (rootfs / "vol").mkdir()
    return vol


# (image path, symlink target, what the refusal says)
INTO_MOUNTS = [
    ("/usr/share/vulkan/icd.d", "/proc/sys/kernel", REFUSED),
    ("/usr/share/vulkan/icd.d", "/sys/kernel", REFUSED),
    ("/usr/share/vulkan/icd.d", "/dev", REFUSED),           # the runtime's /dev: only for /dev paths
    ("/usr/share/vulkan/icd.d", "/dev/shm/x", REFUSED),
    ("/usr/share/vulkan/icd.d", "/vol/x", REFUSED),
    (ICD, "/proc/sys/kernel/core_pattern", "is on procfs/sysfs"),   # a regular file there
    (ICD, "/sys/kernel/profiling", "is on procfs/sysfs"),
    (ICD, "/vol/x/f", REFUSED),
    (ICD, "/dev/shm/f", REFUSED),
    ("/etc/OpenCL/vendors", "/proc/self/fd", "nvidia.icd"),     # our own fd dir: procfs refuses too
    (GLX_DIR, "/proc/sys/kernel", REFUSED),                   # the GLX link: symlinkat refused there
    (GLX_DIR, "/dev", REFUSED),
    (GBM_DIR, "/proc/sys/kernel", REFUSED),                   # the gbm link
    (GBM_DIR, "/dev/shm/x", REFUSED),
    (GBM_DIR, "/vol/x", REFUSED),
    (GBM_DIR, "/sys/fs/cgroup", REFUSED),
]


@pytest.mark.parametrize("cpath,target,why", INTO_MOUNTS,
                         ids=[f"{c.rsplit('/', 1)[1]}->{t}" for c, t, _ in INTO_MOUNTS])
def test_image_symlink_into_runtime_mounts_refused(rootfs, tmp_path, gfx_driver, cpath, target, why,
                                                   no_leaked_mounts):
    vol = _volume(tmp_path, rootfs)
    before = snapshot(vol)
    _symlink(rootfs, cpath, target)
    err, mnts, dev_same = in_ns(_apply_in_runtime_layout, rootfs, vol, _edits(gfx_driver), {})
    _one_line(err, why)
    assert mnts == []
    assert dev_same, "an entry was left in the runtime's /dev (or /dev/shm)"
    assert snapshot(vol) == before


# A running container's own /dev (configure --pid): /dev/dri, by-path or a node a symlink.
DEV_LINKS = [
    ({"/dev/dri": "/proc/sys/kernel"}, REFUSED),
    ({"/dev/dri": "/sys/kernel"}, REFUSED),
    ({"/dev/dri": "/vol/x"}, REFUSED),
    ({"/dev/dri": "/dev/shm/x"}, REFUSED),                  # /dev/shm is another tmpfs
    ({"/dev/dri/by-path": "/vol/x"}, REFUSED),
    ({"/dev/dri/by-path": "/proc/sys/kernel"}, REFUSED),
    ({"/dev/dri/card0": "/proc/sys/kernel/core_pattern"}, "is on procfs/sysfs"),
    ({"/dev/dri/card0": "/dev/shm/f"}, REFUSED),
    ({"/dev/dri/card0": "/vol/x/f"}, REFUSED),
    ({"/dev/dri/renderD128": "/sys/kernel/profiling"}, "is on procfs/sysfs"),
]


@pytest.mark.parametrize("links,why", DEV_LINKS, ids=[",".join(f"{k}->{v}" for k, v in ln.items())
                                                     for ln, _ in DEV_LINKS])
def test_container_dev_symlinks_refused(rootfs, tmp_path, gfx_driver, links, why, no_leaked_mounts):
    vol = _volume(tmp_path, rootfs)
    before = snapshot(vol)
    err, mnts, _ = in_ns(_apply_in_runtime_layout, rootfs, vol, _edits(gfx_driver), links)
    _one_line(err, why)
    assert mnts == []
    assert snapshot(vol) == before


def test_runtime_layout_benign(rootfs, tmp_path, gfx_driver, no_leaked_mounts):
    """The same layout with a plain image: the DRM nodes and links go in the runtime's
    /dev tmpfs, the files on the rootfs (what the refusals above are measured against)."""
    vol = _volume(tmp_path, rootfs)
    err, mnts, _ = in_ns(_apply_in_runtime_layout, rootfs, vol, _edits(gfx_driver, "1"), {})
    assert err is None, err
    points = {m for m, _ in mnts}
    assert {f"{rootfs}/dev/dri/card1", f"{rootfs}/dev/dri/renderD129", f"{rootfs}{ICD}"} <= points
    assert not {f"{rootfs}/dev/dri/card0", f"{rootfs}/dev/dri/renderD128"} & points


# ---------------------------------------------------------------------------------------
# 4. Races: while applies run, the image's graphics dirs flip between the real directory
#    and a symlink to a host directory (absolute; relative climbs clamp the same way).
#    Defence: every lookup is openat2(RESOLVE_IN_ROOT) from the rootfs fd, and mounts are
#    attached to the resolved fd (move_mount), so a swap between check and use moves
#    nothing to the host; a failed apply undoes everything (all or nothing).
# ---------------------------------------------------------------------------------------
def test_graphics_dirs_swapped_during_apply(rootfs, tmp_path, gfx_driver, no_leaked_mounts):
    host = _canary(tmp_path / "hostcanary")
    before = snapshot(host)
    for d in ("/usr/share/vulkan/icd.d", "/dev/dri/by-path", GBM_DIR, GLX_DIR, "/etc/OpenCL/vendors"):
        (rootfs / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
    stop, flips = threading.Event(), [0]
    targets = {"/usr/share/vulkan/icd.d": str(host), "/dev/dri": str(host), GBM_DIR: str(host),
               GLX_DIR: "../../../../../../../" + str(host).lstrip("/"), "/etc/OpenCL": str(host)}
    threads = [threading.Thread(target=flipper, args=(rootfs / p.lstrip("/"), t, stop, flips))
               for p, t in targets.items()]
    for t in threads:
        t.start()
    outcomes = []
    try:
        for _ in range(10):
            err, mnts = in_ns(try_apply, rootfs, _edits(gfx_driver))
            outcomes.append(err)
            _inside(rootfs, mnts)
            if err is not None:
                assert mnts == [], err          # all or nothing, even under a race
                _one_line(err)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
            assert not t.is_alive(), "flipper thread did not stop"
    assert flips[0] > 0
    assert snapshot(host) == before
    print(f"race: {flips[0]} flips, {sum(e is None for e in outcomes)}/{len(outcomes)} applies "
          f"went through; errors: {sorted(set(e for e in outcomes if e))[:3]}")


def _one_round(rootfs: Path, edits):
    err, mnts = try_apply(rootfs, edits)
    bad = [(m.mountpoint, m.fstype) for m in mnts     # (the /proc/driver/nvidia mask is planned)
           if m.mountpoint.startswith((f"{rootfs}/vol", f"{rootfs}/proc", f"{rootfs}/sys",
                                       f"{rootfs}/dev/shm"))
           and not m.mountpoint.startswith(f"{rootfs}/proc/driver")]
    return err, len(mnts), bad


def _race_in_runtime_layout(rootfs: Path, vol: Path, edits, rounds: int):
    """configure --pid on a running container that flips its own /dev/dri (and the
    image's ICD dir) between a directory and symlinks into procfs, its /dev/shm and a
    volume while the applies run."""
    _runtime_layout(rootfs, vol)
    (rootfs / "dev/dri/by-path").mkdir(parents=True)
    (rootfs / "usr/share/vulkan/icd.d").mkdir(parents=True)
    stop, flips = threading.Event(), [0]
    threads = [threading.Thread(target=flipper, args=(rootfs / p, t, stop, flips))
               for p, t in (("dev/dri", "/proc/sys/kernel"), ("dev/dri/by-path", "/vol/x"),
                            ("usr/share/vulkan/icd.d", "/dev/shm/x"))]
    for t in threads:
        t.start()
    out = []
    try:
        for _ in range(rounds):     # each in a namespace of its own: the next starts clean
            out.append(in_ns(_one_round, rootfs, edits))
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
    shm = sorted(os.listdir(rootfs / "dev/shm/x"))
    return out, flips[0], shm


def test_running_container_flips_dev_dri_during_configure(rootfs, tmp_path, gfx_driver, no_leaked_mounts):
    """Defence: as in 3 and 4; the mount id is taken from the very fd a mount is attached
    to or an entry made in, so a flip between lookup and use lands nothing on procfs,
    /dev/shm or the volume."""
    vol = _volume(tmp_path, rootfs)
    before = snapshot(vol)
    out, flips, shm = in_ns(_race_in_runtime_layout, rootfs, vol, _edits(gfx_driver), 10)
    assert flips > 0
    assert snapshot(vol) == before
    assert shm == [], shm
    for err, n, bad in out:
        assert bad == [], bad
        if err is not None:
            assert n == 0, err
            _one_line(err)


# ---------------------------------------------------------------------------------------
# 5. `nvhook configure --graphics --display ROOTFS` on an unpacked hostile rootfs (no
#    runtime /dev: the image's /dev is what it is), the real CLI in a private namespace.
#    A refusal: exit 1, one `nvhook:` line, the rootfs as it was, nothing in the host dir,
#    nothing mounted. Defences as in 1 and 2 (RootFS), end to end through the CLI.
# ---------------------------------------------------------------------------------------
def _tree(top: Path) -> dict:
    return snapshot(top, dir_mtimes=False)


@pytest.mark.parametrize("attack", ["dri-dangling-host", "card1-fifo", "icd-dir-is-file",
                                    "by-path-blk", "gbm-dangling-relative"])
def test_configure_cli_on_hostile_unpacked_rootfs(rootfs, tmp_path, gfx_host, attack):
    host = _canary(tmp_path / "hostcanary")
    if attack == "dri-dangling-host":
        _symlink(rootfs, "/dev/dri", str(host))
    elif attack == "card1-fifo":
        _special(rootfs, "/dev/dri/card1", "fifo")
    elif attack == "icd-dir-is-file":
        _special(rootfs, "/usr/share/vulkan/icd.d", "file")
    elif attack == "by-path-blk":
        _special(rootfs, "/dev/dri/by-path", "blk")
    else:
        _symlink(rootfs, GBM_DIR, str(host), "relative")
    before, host_before = _tree(rootfs), snapshot(host)
    script = (f"{NVHOOK} --root {gfx_host} configure --device 1 --utility --compute --graphics "
              f"--display --no-cgroups {rootfs}; echo rc=$?; grep -c ' {rootfs}/' /proc/self/mountinfo || true")
    r = run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], timeout=120)
    out = r.stdout.splitlines()
    assert out[0] == "rc=1", (r.stdout, r.stderr)
    assert out[1] == "0", r.stdout          # nothing mounted in that namespace either
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nvhook: "), r.stderr
    assert _tree(rootfs) == before
    assert snapshot(host) == host_before


def test_configure_cli_benign_unpacked_rootfs(rootfs, tmp_path, gfx_host):
    """Reference for the above: the same command on a plain image goes through and puts
    GPU 1's DRM nodes (only) and by-path links in the image's /dev."""
    script = (f"{NVHOOK} --root {gfx_host} configure --device 1 --utility --compute --graphics "
              f"--display --no-cgroups {rootfs} && ls {rootfs}/dev/dri {rootfs}/dev/dri/by-path "
              f"&& stat -c '%t:%T' {rootfs}/dev/dri/card1")
    r = run(["unshare", "-m", "--propagation", "private", "sh", "-ec", script], timeout=120)
    assert r.returncode == 0, r.stderr
    words = r.stdout.split()
    assert "card1" in words and "renderD129" in words, r.stdout
    assert "card0" not in words and "renderD128" not in words, r.stdout
    assert f"pci-{BUS[1]}-card" in words and f"pci-{BUS[0]}-card" not in words, r.stdout
    assert words[-1] == "e2:1", r.stdout    # 226:1


# ---------------------------------------------------------------------------------------
# 6. Real runc containers through the hook (the compiled front, prestart), cgroup v1 and
#    v2 (runc's eBPF program, which nvhook replaces by one that also allows its nodes).
#    A container given GPU 1 (or 0, none, all) of two: its DRM nodes open (ENXIO:
#    allowed, no driver); the other GPU's nodes, made by runc from linux.devices but not
#    allowed, give EPERM; no cgroup rule for the other GPU's minors (v1: devices.list);
#    only its own GPUs' by-path links.
#    Defence: planner._drm (only the selected whole GPUs' nodes), the cgroup rules made
#    from exactly the device list (planner.plan), cgroups.allow_devices.
# ---------------------------------------------------------------------------------------
DRM_NODES = {"card0": 0, "renderD128": 128, "card1": 1, "renderD129": 129}
DRM_PROBE = ("for d in card0 renderD128 card1 renderD129; do "
             "dd if=/dev/dri/$d of=/dev/null bs=1 count=0 2>/tmp/e && echo \"$d OK\" "
             "|| echo \"$d $(cat /tmp/e)\"; done; ls /dev/dri/by-path; "
             "for l in /dev/dri/by-path/*; do readlink $l; done")


def _verdicts(out: str) -> dict[str, str]:
    from support.runc import open_result

    got = {}
    for line in out.splitlines():
        name, _, rest = line.partition(" ")
        if name in DRM_NODES:
            got[name] = "OK" if rest == "OK" else open_result(rest, 1)
    return got


@pytest.mark.parametrize("mode", ["v1", "v2"])
@pytest.mark.parametrize("devices,given", [("1", {1}), ("0", {0}), ("none", set()), ("all", {0, 1})])
def test_runc_drm_nodes_follow_the_request(tmp_path, gfx_host, mode, devices, given):
    """Every DRM node of the host is made by runc from linux.devices (as a spec that lists
    them would) and not allowed; the hook binds and allows those of the GPUs asked for."""
    cfg = hookenv.write_config(tmp_path / "config.toml", gfx_host, log=tmp_path / "hook.log")
    env = hookenv.ENV + [f"NVIDIA_VISIBLE_DEVICES={devices}", "NVIDIA_DRIVER_CAPABILITIES=graphics,utility"]
    with RuncContainer(tmp_path, mode=mode, env=env,
                       devices=[(f"/dev/dri/{n}", 226, m) for n, m in DRM_NODES.items()],
                       hooks={"prestart": [hookenv.hook_entry(cfg)]}) as c:
        c.create()
        c.start()
        r = c.exec("sh", "-c", DRM_PROBE)
        want = {n: "ENXIO" if (m if m < 128 else m - 128) in given else "EPERM" for n, m in DRM_NODES.items()}
        assert _verdicts(r.stdout) == want, r.stdout + r.stderr
        for i, bus in enumerate(BUS):
            assert (f"pci-{bus}-card" in r.stdout) == (i in given), r.stdout
            assert (f"../card{i}" in r.stdout) == (i in given), r.stdout
        if mode == "v1":
            rules = (c.cgroup_dir("devices") / "devices.list").read_text().split("\n")
            drm = sorted(x for x in rules if x.startswith("c 226:"))
            assert drm == sorted(f"c 226:{m} rw" for m in DRM_NODES.values()
                                 if (m if m < 128 else m - 128) in given), rules


# ---------------------------------------------------------------------------------------
# 7. A hostile image in a real runc container with an rshared volume (Docker :rshared,
#    Kubernetes Bidirectional): the graphics dirs symlinked into the volume, into the
#    container's /proc or into its /dev. The start fails with one `nvhook:` line; nothing
#    reaches the host dir or the host's mount table.
#    Defence: RootFS._check_create/_check_attach (mount ids), as in 3.
# ---------------------------------------------------------------------------------------
RUNC_ATTACKS = {
    "icd-into-volume": ({"/usr/share/vulkan/icd.d": "/vol/icd"}, REFUSED),
    "gbm-into-volume": ({GBM_DIR: "/vol/gbm"}, REFUSED),
    "glx-into-volume": ({GLX_DIR: "/vol/glx"}, REFUSED),
    "opencl-into-proc": ({"/etc/OpenCL/vendors": "/proc/sys/kernel"}, REFUSED),
    "icd-file-onto-proc": ({ICD: "/proc/sys/kernel/core_pattern"}, "is on procfs/sysfs"),
}


@pytest.mark.parametrize("attack", list(RUNC_ATTACKS))
def test_runc_hostile_image_graphics_dirs(tmp_path, gfx_host, attack):
    links, why = RUNC_ATTACKS[attack]
    vol = tmp_path / "hostvol"
    for d in ("icd", "gbm", "glx"):
        (vol / d).mkdir(parents=True)
    (vol / "keep.txt").write_text("the host's\n")
    cfg = hookenv.write_config(tmp_path / "config.toml", gfx_host)
    env = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=all"]
    with hookenv.gpu_container(tmp_path, cfg, env, "ls /dev/dri", mode="v2") as c:
        subprocess.run(c.host_cmd(["sh", "-c", f"mount --bind {vol} {vol} && mount --make-shared {vol}"]),
                       check=True, timeout=60)
        c.config["mounts"].append({"destination": "/vol", "type": "bind", "source": str(vol),
                                   "options": ["rbind", "rshared"]})
        c.config["linux"]["rootfsPropagation"] = "rshared"
        for cpath, target in links.items():
            _symlink(c.rootfs, cpath, target)
        before = snapshot(vol)
        with pytest.raises(RuncError) as e:
            c.create()
        msg = str(e.value)
        host_view = [m.mountpoint for m in mountinfo(c.ns_pid)
                     if m.mountpoint.startswith(f"{vol}/") or str(gfx_host) in m.root]
        assert host_view == []
        assert snapshot(vol) == before
    assert msg.count("nvhook: ") == 1, msg
    assert why in msg, msg


def test_runc_graphics_dir_into_the_containers_own_dev(tmp_path, gfx_host):
    """The X config dir symlinked into the container's /dev (a tmpfs the runtime made in
    the container's namespace, rootfs rshared): that tmpfs is the container's own, so the
    config lands there like on the rootfs and the container starts; nothing reaches the
    host's mount table (issue: every ordinary container starts; only host-backed mounts
    are refused)."""
    cfg = hookenv.write_config(tmp_path / "config.toml", gfx_host)
    env = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=all"]
    with hookenv.gpu_container(tmp_path, cfg, env, "ls /usr/share/X11/xorg.conf.d/",
                               mode="v2") as c:
        c.config["linux"]["rootfsPropagation"] = "rshared"
        _symlink(c.rootfs, "/usr/share/X11/xorg.conf.d", "/dev")
        r = c.run()
        host_view = [m.mountpoint for m in mountinfo(c.ns_pid) if str(gfx_host) in m.root]
    assert host_view == []
    assert "nvidia-drm-outputclass.conf" in r.stdout, r.stdout + r.stderr


# ---------------------------------------------------------------------------------------
# 8. Forged snapshots: a root peer that can write the snapshot dir and holds its key
#    (so the seal holds) edits the graphics facts.
# ---------------------------------------------------------------------------------------
def _snap_doc(sdir: Path) -> tuple[Path, str, dict]:
    (snap,) = [p for p in sdir.iterdir() if p.name.startswith("driver-")]
    text = snap.read_text()
    i = text.index("\n{")
    return snap, text.split("\n", 1)[0], json.loads(text[i + 1:])


def _reseal(snap: Path, fp: str, doc: dict) -> None:
    from libinject.discover import snapshot as S

    snap.write_bytes(S.seal(fp, json.dumps(doc).encode(), S.read_key(str(snap.parent))))


def _loads(snap: Path, fp: str, root: Path):
    from libinject.discover import snapshot as S

    r = os.path.realpath(root)
    return S.load(str(snap), fp, S.view(r, r))


def _node(doc: dict, i: int) -> dict:
    return doc["drm_devices"][i]["node"]


# Device facts. Defence: snapshot.verify re-derives the DRM nodes from dev/dri and sysfs
# (`driver.drm_devices == drm_nodes(host.dev_root, gpus)`), so any edit to them is seen.
DRM_FORGERIES = {
    # GPU 0's card node is GPU 1's (card1): a container asking for GPU 0 would open GPU 1
    "card-of-other-gpu": lambda d: d["drm_devices"][0].update(node=dict(_node(d, 2))),
    # the two GPUs' entries swapped wholesale (bus ids kept)
    "nodes-swapped": lambda d: [d["drm_devices"][i].update(node=n) for i, n in
                                zip(range(4), [_node(d, 2), _node(d, 3), _node(d, 0), _node(d, 1)])],
    # GPU 0's render node is the host's /dev/null (1:3) under a DRM-looking name
    "render-is-dev-null": lambda d: d["drm_devices"][1]["node"].update(path="/dev/null", major=1, minor=3),
    # GPU 0's by-path link leads the container's loader to card1
    "by-path-other-gpu": lambda d: d["drm_devices"][0].update(by_path=d["drm_devices"][2]["by_path"]),
    # a DRM node for GPU 0 that the host does not pair with it
    "extra-node": lambda d: d["drm_devices"].append(dict(d["drm_devices"][2], bus_id=d["drm_devices"][0]["bus_id"])),
}


@pytest.mark.parametrize("forgery", list(DRM_FORGERIES))
def test_forged_snapshot_drm_facts_discarded(gfx_host, tmp_path, forgery):
    from libinject.discover.driver import discover

    sdir = tmp_path / "snaps"
    d0 = discover(str(gfx_host), snapshot_dir=str(sdir))
    snap, fp, doc = _snap_doc(sdir)
    assert [x["node"]["minor"] for x in doc["drm_devices"]] == [0, 128, 1, 129]
    DRM_FORGERIES[forgery](doc)
    _reseal(snap, fp, doc)
    assert _loads(snap, fp, gfx_host) is None
    d = discover(str(gfx_host), snapshot_dir=str(sdir))
    assert d == d0
    drm = [(x.path, x.minor) for x in _edits(d, "0").device_nodes if x.kind == "drm"]
    assert drm == [("/dev/dri/card0", 0), ("/dev/dri/renderD128", 128)]


def _add_igpu(host: Path) -> None:
    """A second display device on the host that is not NVIDIA's (an iGPU at 00:02.0):
    card2/renderD130 with udev's by-path links."""
    dri = host / "dev/dri"
    os.mknod(dri / "card2", 0o666 | stat.S_IFCHR, os.makedev(226, 2))
    os.mknod(dri / "renderD130", 0o666 | stat.S_IFCHR, os.makedev(226, 130))
    (dri / "by-path/pci-0000:00:02.0-card").symlink_to("../card2")
    (dri / "by-path/pci-0000:00:02.0-render").symlink_to("../renderD130")


def test_forged_snapshot_gpu_bus_relabelled_to_igpu(fresh_sim_host, tmp_path):
    """GPU 0's bus id rewritten to the iGPU's, its DRM entries re-derived for that bus (so
    verify()'s DRM check holds) and its gpus/ entry dropped. Defence: verify() requires a
    gpus/<bus> entry for every GPU when the driver has a procfs (the driver makes one for
    each of its GPUs): the snapshot is discarded and rediscovered, and the container gets
    GPU 0's own nodes, never the iGPU's 226:2/226:130."""
    from libinject.discover.driver import discover

    host = fresh_sim_host("rtx4090x1")
    _add_igpu(host)
    sdir = tmp_path / "snaps"
    d0 = discover(str(host), snapshot_dir=str(sdir))
    assert [x.node.minor for x in d0.drm_devices] == [0, 128]
    snap, fp, doc = _snap_doc(sdir)
    g = doc["info"]["gpus"][0]
    g["bus_id"] = "00000000:00:02.0"
    doc["gpu_procfs"] = {}
    doc["drm_devices"] = [
        {"bus_id": g["bus_id"], "by_path": f"/dev/dri/by-path/pci-0000:00:02.0-{k}",
         "node": {"path": str(host / "dev/dri" / n), "container_path": f"/dev/dri/{n}",
                  "major": 226, "minor": m, "capability": "graphics"}}
        for n, m, k in (("card2", 2, "card"), ("renderD130", 130, "render"))]
    _reseal(snap, fp, doc)
    assert _loads(snap, fp, host) is None
    d = discover(str(host), snapshot_dir=str(sdir))
    assert d == d0
    drm = [(x.path, x.minor) for x in _edits(d, "0").device_nodes if x.kind == "drm"]
    assert drm == [("/dev/dri/card0", 0), ("/dev/dri/renderD128", 128)]


# Host files. Under the driver root is not enough (it is "/" on a normal host): a forged
# snapshot could name any regular host file (/etc/shadow here stands for it, inside the
# simulated root), mounted at a loader's path in every graphics (or compute: the OpenCL
# ICD) container; or any container path, e.g. the masked /proc/driver/nvidia/params (a
# tmpfs of ours, so the mount is allowed there), undoing the ModifyDeviceFiles: 0 mask.
# Defence: snapshot.verify -> graphics.could_find (a name discovery looks for, with its
# capability, resolving in the root to that very file, no name twice). These failed on
# the code before it.
GRAPHICS_FORGERIES = {
    "vendor-json-is-shadow": lambda d, root: d["graphics_files"][0].update(path=f"{root}/etc/shadow"),
    "opencl-icd-is-shadow": lambda d, root: next(
        f for f in d["graphics_files"] if f["container_path"].endswith("nvidia.icd")).update(
        path=f"{root}/etc/shadow"),
    "extra-file": lambda d, root: d["graphics_files"].append(
        {"path": f"{root}/etc/shadow", "container_path": "/etc/OpenCL/vendors/zz.icd",
         "capability": "compute", "kind": "graphics"}),
    "params-unmasked": lambda d, root: d["graphics_files"][0].update(
        path=f"{root}/proc/driver/nvidia/params", container_path="/proc/driver/nvidia/params"),
}


@pytest.mark.parametrize("forgery", list(GRAPHICS_FORGERIES))
def test_forged_snapshot_graphics_files_discarded(fresh_sim_host, tmp_path, forgery):
    from libinject.discover.driver import discover

    host = fresh_sim_host("rtx4090x1")
    (host / "etc/shadow").write_text("root:$6$host-secret:19000:0:99999:7:::\n")
    sdir = tmp_path / "snaps"
    d0 = discover(str(host), snapshot_dir=str(sdir))
    legit = {(m.host_path, m.container_path) for m in _edits(d0, "0").mounts if m.kind == "graphics"}
    snap, fp, doc = _snap_doc(sdir)
    GRAPHICS_FORGERIES[forgery](doc, os.path.realpath(host))
    _reseal(snap, fp, doc)
    d = discover(str(host), snapshot_dir=str(sdir))
    forged = [(m.host_path, m.container_path) for m in _edits(d, "0").mounts
              if m.kind == "graphics" and (m.host_path, m.container_path) not in legit]
    assert forged == [], f"a container would get {forged}"
    assert d == d0


def test_forged_snapshot_through_the_hook(fresh_sim_host, tmp_path):
    """The same, end to end: the hook (snapshots on) starts a container and writes its
    snapshot; the peer rewrites it (resealed); the next graphics container reads the
    host's secret at the EGL vendor file's path (it did before graphics.could_find)."""
    host = fresh_sim_host("rtx4090x1")
    (host / "etc/shadow").write_text("root:$6$host-secret:19000:0:99999:7:::\n")
    sdir = tmp_path / "snaps"
    cfg = hookenv.write_config(tmp_path / "config.toml", host, extra=f'snapshot-dir = "{sdir}"\n')
    cfg.write_text(cfg.read_text().replace("snapshot = false", "snapshot = true"))
    vendor = "/usr/share/glvnd/egl_vendor.d/10_nvidia.json"
    env = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=graphics,utility"]

    def start(name: str) -> str:
        (tmp_path / name).mkdir()
        with hookenv.gpu_container(tmp_path / name, cfg, env, f"cat {vendor}") as c:
            r = c.run()
            assert r.returncode == 0, r.stdout + r.stderr
            return r.stdout

    first = start("c0")
    assert "host-secret" not in first and "libEGL_nvidia" in first, first
    snap, fp, doc = _snap_doc(sdir)
    next(f for f in doc["graphics_files"] if f["container_path"] == vendor).update(
        path=f"{os.path.realpath(host)}/etc/shadow")
    _reseal(snap, fp, doc)
    second = start("c1")
    assert "host-secret" not in second, f"the container read the host's /etc/shadow: {second!r}"


# ---------------------------------------------------------------------------------------
# 9. CDI: the generated spec, the per-device `cdi-hook create-symlinks`, and a spec whose
#    links point outside.
# ---------------------------------------------------------------------------------------
def _generate(host: Path, tmp_path: Path, *args: str) -> dict:
    out = tmp_path / f"spec{len(list(tmp_path.glob('spec*')))}.json"
    r = run([NVHOOK, "cdi", "generate", "--driver-root", str(host), "--hook-path", hookenv.ensure_front(),
             "-o", str(out), *args])
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())


def _drm_of(edits: dict) -> tuple[list[int], list[list[str]]]:
    nodes = [n["minor"] for n in edits.get("deviceNodes", ()) if n["path"].startswith("/dev/dri/")]
    links = [[a for a in h["args"] if "::" in a] for h in edits.get("hooks", ())
             if "cdi-hook" in h["args"] and any("/dev/dri/" in a for a in h["args"])]
    return nodes, links


def test_cdi_spec_gives_each_device_only_its_drm_nodes(gfx_host, tmp_path):
    """Defence: cdi.generate plans each device as the hook would (planner._drm) and
    subtracts the driver-only plan: a device's DRM nodes and by-path links are its own
    GPU's; the spec-level edits, the driver-only "none" device and the IMEX / MIG-caps
    specs carry none (a runtime would give them to every container)."""
    spec = _generate(gfx_host, tmp_path, "--device-id", "all,none")
    by = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    assert _drm_of(spec["containerEdits"]) == ([], [])
    assert _drm_of(by["none"]) == ([], [])
    for i, (card, render) in enumerate(((0, 128), (1, 129))):
        nodes, links = _drm_of(by[str(i)])
        assert nodes == [card, render]
        assert links == [[f"../card{card}::/dev/dri/by-path/pci-{BUS[i]}-card",
                          f"../renderD{render}::/dev/dri/by-path/pci-{BUS[i]}-render"]]
    assert sorted(_drm_of(by["all"])[0]) == [0, 1, 128, 129]
    one = _generate(gfx_host, tmp_path, "--device-id", "1")
    assert {m for d in one["devices"] for m in _drm_of(d["containerEdits"])[0]} == {1, 129}
    assert _drm_of(one["containerEdits"]) == ([], [])


def _cdi_hook(rootfs: Path, *links: str) -> subprocess.CompletedProcess:
    """`nvhook cdi-hook create-symlinks` as a runtime runs it at createContainer: in the
    container's mount namespace (here: a private one with the runtime's /dev tmpfs and
    procfs mounted), the front's environment."""
    args = " ".join(f"--link '{ln}'" for ln in links)
    script = (f"mount -t tmpfs -o mode=755 tmpfs {rootfs}/dev && mount -t proc proc {rootfs}/proc && "
              f"{NVHOOK} cdi-hook create-symlinks {args} --rootfs {rootfs}; echo rc=$?; "
              f"ls -la {rootfs}/dev/dri/by-path 2>&1; grep -c ' {rootfs}/' /proc/self/mountinfo")
    return run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], timeout=120,
               env={"PATH": os.environ["PATH"]})


# (the link a hostile spec asks for, what the refusal says; "" = made, inside only)
CDI_LINKS = [
    ("../card0::/dev/dri/by-path/../../../etc/cron.d/x", "must not contain '..'"),
    ("x::/proc/sys/kernel/nvhook", REFUSED),
    ("x::/proc/self/root/etc/nvhook", "Too many levels of symbolic links"),   # RESOLVE_NO_MAGICLINKS
    ("x::dev/dri/by-path/relative", "invalid --link"),
    ("/etc/shadow::/dev/dri/by-path/pci-0000:01:00.0-card", ""),
    ("../../../../../../HOST::/dev/dri/by-path/pci-0000:01:00.0-card", ""),
]


@pytest.mark.parametrize("link,why", CDI_LINKS, ids=[ln.split("::")[1] for ln, _ in CDI_LINKS])
def test_cdi_hook_hostile_links(rootfs, tmp_path, link, why):
    """A spec's create-symlinks links: the LINK is a container path resolved inside the
    rootfs (RootFS: split() refuses '..', _check_create refuses procfs), so none is made
    outside it; the TARGET is only the link's text (it points wherever the container's
    own root says, never at the host: nothing of nvhook's follows it)."""
    host = _canary(tmp_path / "hostcanary")
    host_before = snapshot(host)
    link = link.replace("HOST", str(host).lstrip("/") + "/canary.txt")
    before = _tree(rootfs)
    r = _cdi_hook(rootfs, link)
    out = r.stdout.splitlines()
    assert out[-1] == "2", r.stdout                 # the runtime's /dev and /proc; nothing of ours
    assert snapshot(host) == host_before
    if why:
        assert "rc=1" in out, (r.stdout, r.stderr)
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("nvhook: ") and why in lines[0], r.stderr
        assert _tree(rootfs) == before
    else:
        assert "rc=0" in out, (r.stdout, r.stderr)
        assert f"-> {link.split('::')[0]}" in r.stdout, r.stdout


@pytest.mark.parametrize("present", [False, True], ids=["dangling", "inside"])
def test_cdi_hook_by_path_through_image_symlink(rootfs, tmp_path, present):
    """An unpacked rootfs (no runtime /dev): the image's /dev/dri a symlink to a host dir.
    Defence: RESOLVE_IN_ROOT and _step's dangling-symlink refusal, as in 1."""
    host = _canary(tmp_path / "hostcanary")
    host_before = snapshot(host)
    _symlink(rootfs, "/dev/dri", str(host))
    if present:
        (rootfs / str(host).lstrip("/")).mkdir(parents=True)
    script = (f"{NVHOOK} cdi-hook create-symlinks --link ../card0::/dev/dri/by-path/pci-{BUS[0]}-card "
              f"--rootfs {rootfs}; echo rc=$?")
    r = run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], timeout=120,
            env={"PATH": os.environ["PATH"]})
    assert snapshot(host) == host_before
    if present:
        assert "rc=0" in r.stdout, r.stderr
        assert os.readlink(rootfs / str(host).lstrip("/") / f"by-path/pci-{BUS[0]}-card") == "../card0"
    else:
        assert "rc=1" in r.stdout and r.stderr.count("nvhook: ") == 1 and DANGLING in r.stderr, r.stderr


def test_podman_cdi_gpu1_gets_only_its_drm_nodes(gfx_host, tmp_path):
    """podman applies the generated spec for nvidia.com/gpu=1: the container has GPU 1's
    DRM nodes (ENXIO), GPU 0's made by mknod inside it are denied (EPERM), and the
    per-device cdi-hook made only GPU 1's by-path links."""
    from libinject.sim.rootfs import build_rootfs
    from support.podman import Podman, state_dir

    specs = tmp_path / "specs"
    specs.mkdir()
    r = run([NVHOOK, "cdi", "generate", "--driver-root", str(gfx_host), "--hook-path", hookenv.ensure_front(),
             "-o", str(specs / "nvidia.yaml")])
    assert r.returncode == 0, r.stderr
    rootfs = build_rootfs(tmp_path / "rootfs")
    probe = ("[ -e /dev/dri/card0 ] || mknod /dev/dri/card0 c 226 0; "
             "[ -e /dev/dri/renderD128 ] || mknod /dev/dri/renderD128 c 226 128; " + DRM_PROBE)
    with state_dir() as state:
        r = Podman(state).run(rootfs, ["sh", "-c", probe], cdi_specs=specs, devices=["nvidia.com/gpu=1"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert _verdicts(r.stdout) == {"card0": "EPERM", "renderD128": "EPERM",
                                   "card1": "ENXIO", "renderD129": "ENXIO"}, r.stdout + r.stderr
    assert f"pci-{BUS[1]}-card" in r.stdout and f"pci-{BUS[0]}" not in r.stdout, r.stdout


# A hostile OCI spec: host directories bound where the graphics edits go (Kubernetes'
# hostPath /dev/dri, as Intel's GPU plugin setups have it; a host dir at an ICD dir).
# Defence: RootFS._check_create/_check_attach: the bind is another mount than the rootfs's
# and, under /dev, than the runtime's /dev tmpfs (RootFS._dev_writable), so nothing is
# created in (or mounted onto) the host directory: one `nvhook:` line.
@pytest.mark.parametrize("dest", ["/dev/dri", "/dev/dri/by-path", "/usr/share/vulkan/icd.d", GBM_DIR])
def test_runc_spec_binds_host_dir_at_graphics_dir(tmp_path, gfx_host, dest):
    hostdir = tmp_path / "hostdir"
    hostdir.mkdir()
    (hostdir / "keep.txt").write_text("the host's\n")
    before = snapshot(hostdir)
    cfg = hookenv.write_config(tmp_path / "config.toml", gfx_host)
    env = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=all"]
    with hookenv.gpu_container(tmp_path, cfg, env, "ls /dev/dri", mode="v1") as c:
        c.config["mounts"].append({"destination": dest, "type": "bind", "source": str(hostdir),
                                   "options": ["rbind", "rw"]})
        with pytest.raises(RuncError) as e:
            c.create()
    msg = str(e.value)
    assert snapshot(hostdir) == before
    assert msg.count("nvhook: ") == 1 and REFUSED in msg, msg
