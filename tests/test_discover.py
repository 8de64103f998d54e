"""Discovery on simulated hosts: NVML in a child, libraries, snapshots, selection."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from libinject.plan import select as S
from libinject.discover.driver import discover
from libinject.errors import NvhookError
from libinject.sim.profile import list_profiles
from support.simhost import compile_lib, ldconfig, profile_of

PROFILES = list_profiles()


@pytest.mark.parametrize("profile", PROFILES)
def test_discover_matches_profile(sim_host, profile):
    root = sim_host(profile)
    prof = profile_of(root)
    d = discover(str(root), snapshot=False)
    ver = prof["driver_version"]
    assert (d.info.driver_version, d.info.cuda_version) == (ver, prof["cuda_version"])
    want = sorted(prof["gpus"], key=lambda g: g["bus_id"])
    assert [g.uuid for g in d.info.gpus] == [g["uuid"] for g in want]
    for i, (g, w) in enumerate(zip(d.info.gpus, want)):
        assert (g.index, g.minor, g.name, g.brand, g.bus_id, list(g.cc), g.architecture) == \
               (i, w["minor"], w["name"], w["brand"], w["bus_id"].lower(), w["cc"], w["architecture"])
        assert g.memory_total == w["memory_mib"] << 20
        assert (g.mig_capable, g.mig_enabled) == (w["mig_capable"], w["mig_enabled"])
        assert [(m.uuid, m.gi, m.ci, m.name) for m in g.mig_devices] == \
               [(m["uuid"], m["gi"], m["ci"], m["name"]) for m in w["mig"]]
        for m in g.mig_devices:
            assert m.gi_access_minor == d.mig_minors[f"gpu{g.minor}/gi{m.gi}/access"]
            assert m.ci_access_minor == d.mig_minors[f"gpu{g.minor}/gi{m.gi}/ci{m.ci}/access"]
    assert d.library_source == f"ldcache {root}/etc/ld.so.cache"
    native = {lib.name for lib in d.libraries if not lib.compat32}
    i386 = {lib.name for lib in d.libraries if lib.compat32}
    # a library's file name ends in its own version (the EGL platform libraries) or the driver's
    files = {lib["name"]: f"{lib['name']}.so.{lib.get('version') or ver}" for lib in prof["libraries"]}
    # but for libnvidia-sandboxutils, which stays on the host (as with nvidia-container-cli)
    assert native == set(files.values()) - {files.get("libnvidia-sandboxutils")}
    assert i386 == ({files[lib["name"]] for lib in prof["libraries"] if lib["i386"]}
                    if prof["compat32"] else set())
    for lib in d.libraries:
        assert lib.path.startswith(str(root) + "/") and os.path.isfile(lib.path)
        assert lib.path.endswith(ver) or lib.name.startswith("libnvidia-egl-")
    caps = {files[lib["name"]]: lib["capability"] for lib in prof["libraries"]}
    assert all(lib.capability == caps[lib.name] for lib in d.libraries)
    assert [b.container_path for b in d.binaries] == [
        f"/usr/bin/{b}" for b in ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager",
                                  "nvidia-cuda-mps-control", "nvidia-cuda-mps-server") if b in prof["binaries"]]
    assert [f.container_path for f in d.firmware] == [f"/lib/firmware/nvidia/{ver}/{n}" for n in sorted(prof["firmware"])]
    ctl = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"] + (["/dev/nvidia-modeset"] if prof["modeset"] else [])
    assert [n.container_path for n in d.control_devices] == ctl
    assert d.control_devices[0].major == 195 and d.control_devices[0].minor == 255
    assert [(n.container_path, n.minor) for n in d.gpu_devices] == [(f"/dev/nvidia{w['minor']}", w["minor"]) for w in want]
    assert d.procfs_dir == f"{root}/proc/driver/nvidia"


def test_extra_library_and_version_filter(fresh_sim_host, tmp_path):
    root = fresh_sim_host("a100x8")
    ver = profile_of(root)["driver_version"]
    lib = root / "usr/lib/x86_64-linux-gnu"
    compile_lib(lib / f"libnvidia-foo.so.{ver}", "libnvidia-foo.so.1")
    compile_lib(lib / f"libnvidia-vulkan-thing.so.{ver}", "libnvidia-vulkan-thing.so.1")
    compile_lib(lib / "libnvidia-bar.so.535.1.2", "libnvidia-bar.so.1")          # another version
    compile_lib(lib / "libnvidia-old.so.1", "libnvidia-old.so.1")                # no version at all
    ldconfig(root)
    d = discover(str(root), snapshot=False)
    extra = {x.name: x for x in d.libraries if x.extra}
    # libnvidia-sandboxutils is on the host too, but not for containers (nvc_info.c lists
    # do not have it): test_nvidia_reference.py
    assert set(extra) == {f"libnvidia-foo.so.{ver}", f"libnvidia-vulkan-thing.so.{ver}"}
    assert extra[f"libnvidia-foo.so.{ver}"].capability == "utility"
    assert extra[f"libnvidia-foo.so.{ver}"].soname == "libnvidia-foo.so.1"
    assert extra[f"libnvidia-vulkan-thing.so.{ver}"].capability == "graphics"
    assert not any("bar" in x.name or "old" in x.name for x in d.libraries)


def test_other_version_of_a_listed_library_is_skipped(fresh_sim_host):
    root = fresh_sim_host("t4x1")
    ver = profile_of(root)["driver_version"]
    lib = root / "usr/lib/x86_64-linux-gnu"
    # A leftover libcuda of another driver sorted first in the cache must not win.
    (lib / f"libcuda.so.{ver}").unlink()
    (lib / "libcuda.so.1").unlink()
    compile_lib(lib / "libcuda.so.470.1.1", "libcuda.so.1")
    ldconfig(root)
    d = discover(str(root), snapshot=False)
    assert not any(x.name.startswith("libcuda.so") and not x.compat32 for x in d.libraries)


def _move_libs(root: Path, src: str, dst: str, keep=lambda n: False) -> None:
    (root / dst).mkdir(parents=True, exist_ok=True)
    for p in sorted((root / src).iterdir()):
        if not keep(p.name):
            shutil.move(str(p), str(root / dst / p.name))


@pytest.mark.parametrize("how", ["missing", "corrupt", "no-driver-entries"])
def test_no_usable_ldcache_searches_nonstandard_dirs(fresh_sim_host, how):
    root = fresh_sim_host("a100x8")
    ver = profile_of(root)["driver_version"]
    # Drivers unpacked under /usr/local/nvidia (GKE style). NVML stays in lib64, where
    # the simulated NVML can still work out its root from its own path.
    _move_libs(root, "usr/lib/x86_64-linux-gnu", "usr/lib64", keep=lambda n: not n.startswith("libnvidia-ml"))
    _move_libs(root, "usr/lib/x86_64-linux-gnu", "usr/local/nvidia/lib64")
    _move_libs(root, "usr/lib/i386-linux-gnu", "usr/local/nvidia/lib")
    cache = root / "etc/ld.so.cache"
    if how == "missing":
        cache.unlink()
    elif how == "corrupt":
        cache.write_bytes(cache.read_bytes()[:100])
    else:
        (root / "etc/ld.so.conf.d").rename(root / "etc/ld.so.conf.d.off")
        (root / "etc/ld.so.conf").write_text("")
        ldconfig(root)
    d = discover(str(root), snapshot=False)
    assert d.library_source.startswith("search ")
    assert "/usr/local/nvidia/lib64" in d.library_source and "/usr/lib64" in d.library_source
    assert len(d.info.gpus) == 8
    names = {x.name: x for x in d.libraries if not x.compat32}
    assert names[f"libcuda.so.{ver}"].path == f"{root}/usr/local/nvidia/lib64/libcuda.so.{ver}"
    assert names[f"libcuda.so.{ver}"].soname == "libcuda.so.1"
    assert names[f"libnvidia-ml.so.{ver}"].path == f"{root}/usr/lib64/libnvidia-ml.so.{ver}"
    i386 = [x for x in d.libraries if x.compat32]
    assert i386 and all(x.path.startswith(f"{root}/usr/local/nvidia/lib/") for x in i386)
    if how != "missing":
        # Asked for explicitly, a cache without driver entries (or a broken one) is an error.
        with pytest.raises(NvhookError, match="ld.so.cache"):
            discover(str(root), ldcache="/etc/ld.so.cache", snapshot=False)


def test_rpm_layout_without_cache(fresh_sim_host):
    root = fresh_sim_host("t4x1")
    _move_libs(root, "usr/lib/x86_64-linux-gnu", "usr/lib64")
    _move_libs(root, "usr/lib/i386-linux-gnu", "usr/lib")
    (root / "etc/ld.so.cache").unlink()
    d = discover(str(root), snapshot=False)
    assert d.library_source.startswith("search /usr/lib:/usr/lib64")
    assert all(x.path.startswith(f"{root}/usr/lib64/") for x in d.libraries if not x.compat32)
    assert all(x.path.startswith(f"{root}/usr/lib/") for x in d.libraries if x.compat32)


# ----------------------------------------------------------------------------- NVML failures

def _knob(root: Path, text: str) -> None:
    (root / "etc/nvhook-sim/nvml.conf").write_text(text)


def test_nvml_error_is_one_clear_line(fresh_sim_host):
    root = fresh_sim_host("t4x1")
    _knob(root, "error = DRIVER_NOT_LOADED\n")
    with pytest.raises(NvhookError) as e:
        discover(str(root), snapshot=False)
    msg = str(e.value)
    assert str(root) in msg and "Driver Not Loaded" in msg and "\n" not in msg


def test_hung_nvml_is_killed_at_the_timeout(fresh_sim_host):
    root = fresh_sim_host("t4x1")
    _knob(root, "delay_ms = 30000\n")
    t = time.monotonic()
    with pytest.raises(NvhookError, match=f"NVML on driver root {root} did not answer within 1s"):
        discover(str(root), snapshot=False, nvml_timeout=1.0)
    assert time.monotonic() - t < 5
    # the child is gone (killed, reaped): no process of ours still has the library loaded
    out = subprocess.run(["pgrep", "-f", f"{root}/usr/lib"], capture_output=True, text=True,
                         timeout=30).stdout
    assert out.strip() == ""


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for whoever inherited it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_nvml_child_dies_with_its_parent(fresh_sim_host):
    """A hook killed while NVML hangs leaves no NVML child behind: the child gets
    SIGKILL when its parent dies, also after it changed user (which clears the
    parent-death signal)."""
    root = fresh_sim_host("t4x1")
    _knob(root, "delay_ms = 30000\n")
    code = ("from libinject.discover.driver import discover; "
            f"discover({str(root)!r}, snapshot=False, nvml_timeout=60)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    kid = None
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:   # NVML loaded in the child: it now hangs in init
            for pid in _children(parent.pid):
                try:
                    maps = Path(f"/proc/{pid}/maps").read_text()
                except OSError:
                    continue
                if "libnvidia-ml" in maps:
                    kid = pid
            if kid:
                break
            time.sleep(0.02)
        assert kid, "the NVML child never loaded the library"
        assert Path(f"/proc/{kid}/status").read_text().count("\t65534\t") >= 1   # as nobody
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 3
        while _alive(kid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(kid), "the NVML child outlived its parent"
    finally:
        parent.kill()
        parent.wait(timeout=10)
        if kid and _alive(kid):
            try:
                fd = os.pidfd_open(kid)
            except OSError:
                pass
            else:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
                os.close(fd)


def test_missing_nvml(fresh_sim_host):
    root = fresh_sim_host("t4x1")
    for p in (root / "usr/lib/x86_64-linux-gnu").glob("libnvidia-ml.so*"):
        p.unlink()
    ldconfig(root)
    with pytest.raises(NvhookError, match=f"NVML not found under driver root {root}"):
        discover(str(root), snapshot=False)


def test_unreadable_root(tmp_path):
    with pytest.raises(NvhookError, match="cannot read driver root"):
        discover(str(tmp_path / "nope"), snapshot=False)


def test_nvml_runs_without_privileges(fresh_sim_host, tmp_path):
    root = fresh_sim_host("t4x1")
    # A 0700 dir above the driver root (root's own tmp dir) does not stop nobody: the
    # child binds the driver root where it can reach it before dropping privileges.
    os.chmod(tmp_path, 0o700)
    assert len(discover(str(root), snapshot=False, user=(65534, 65534)).info.gpus) == 1
    # The driver's own library dir closed to others: as nobody the child cannot even
    # load the library, which shows the setuid happened before NVML was touched.
    libdir = root / "usr/lib/x86_64-linux-gnu"
    os.chmod(libdir, 0o700)
    with pytest.raises(NvhookError, match="cannot load"):
        discover(str(root), snapshot=False, user=(65534, 65534))
    # As root without capabilities (--user 0:0) the library loads (root owns the files).
    assert len(discover(str(root), snapshot=False, user=(0, 0)).info.gpus) == 1


def test_nvml_default_user_is_nobody(fresh_sim_host):
    """Without --user the NVML child is 65534:65534, not capability-less root: a
    library dir only nobody may read loads by default and not as 0:0."""
    root = fresh_sim_host("t4x1")
    libdir = root / "usr/lib/x86_64-linux-gnu"
    os.chown(libdir, 65534, 65534)
    os.chmod(libdir, 0o700)
    assert len(discover(str(root), snapshot=False).info.gpus) == 1
    with pytest.raises(NvhookError, match="cannot load"):
        discover(str(root), snapshot=False, user=(0, 0))


def test_nvml_child_drops_capabilities():
    from libinject.discover import nvml

    code = ("import sys; sys.argv=['x', '/nonexistent']; from libinject.discover import nvml; "
            "nvml._drop_privileges(); print(open('/proc/self/status').read())")
    out = subprocess.run([os.sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    status = dict(line.split(":\t", 1) for line in out.splitlines() if ":\t" in line)
    for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[k], 16) == 0, k
    assert status["NoNewPrivs"].strip() == "1"
    assert nvml.architecture((8, 0)) == "Ampere" and nvml.architecture((9, 0)) == "Hopper"


# ----------------------------------------------------------------------------- snapshots

def test_snapshot_reused_while_current(fresh_sim_host, tmp_path):
    root = fresh_sim_host("a100x8")
    sdir = tmp_path / "snaps"
    cold = discover(str(root), snapshot_dir=str(sdir))
    files = list(sdir.iterdir())
    assert sorted(f.name.split("-")[0] for f in files) == ["driver", "snapshot.key"]
    assert all(f.stat().st_mode & 0o077 == 0 for f in files)
    # NVML now fails: a warm call must not need it
    _knob(root, "error = UNKNOWN\n")
    assert discover(str(root), snapshot_dir=str(sdir)) == cold
    # without snapshots the failure shows
    with pytest.raises(NvhookError):
        discover(str(root), snapshot=False)


def _edit(path: Path, old: str, new: str) -> None:
    path.write_text(path.read_text().replace(old, new))


def test_stale_snapshot_never_used(fresh_sim_host, tmp_path):
    root = fresh_sim_host("a100x8")
    sdir = str(tmp_path / "snaps")
    d0 = discover(str(root), snapshot_dir=sdir)
    info = root / f"proc/driver/nvidia/gpus/{d0.info.gpus[0].procfs_name}/information"
    # 1. a GPU changes (same size, same clock tick: contents, not times, are compared)
    _edit(info, "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-81GB")
    d1 = discover(str(root), snapshot_dir=sdir)
    assert d1.info.gpus[0].name == "NVIDIA A100-SXM4-81GB"
    # 2. a GPU goes away
    os.unlink(root / "dev/nvidia7")
    d2 = discover(str(root), snapshot_dir=sdir)
    assert len(d2.info.gpus) == 7 and len(d2.gpu_devices) == 7
    # 3. the ld.so.cache changes: a new library appears
    compile_lib(root / f"usr/lib/x86_64-linux-gnu/libnvidia-new.so.{d0.info.driver_version}", "libnvidia-new.so.1")
    ldconfig(root)
    d3 = discover(str(root), snapshot_dir=sdir)
    assert any(x.name.startswith("libnvidia-new") for x in d3.libraries)
    # 4. an IPC socket goes away
    os.unlink(root / "run/nvidia-fabricmanager/socket")
    d4 = discover(str(root), snapshot_dir=sdir)
    assert not any("fabricmanager" in f.path for f in d4.ipcs)
    assert discover(str(root), snapshot_dir=sdir) == d4


def test_mig_layout_change_invalidates(fresh_sim_host, tmp_path):
    root = fresh_sim_host("h100x8-mig")
    sdir = str(tmp_path / "snaps")
    d0 = discover(str(root), snapshot_dir=sdir)
    g0 = d0.info.gpus[0]
    assert len(g0.mig_devices) == 2
    # destroy MIG device 0:1: its compute instance's capability node goes away
    os.unlink(root / f"dev/nvidia-caps/nvidia-cap{g0.mig_devices[1].ci_access_minor}")
    d1 = discover(str(root), snapshot_dir=sdir)
    assert [m.uuid for m in d1.info.gpus[0].mig_devices] == [g0.mig_devices[0].uuid]
    # and a rewritten MIG table (same file, new contents)
    sim = root / f"proc/driver/nvidia/gpus/{g0.procfs_name}/nvhook-sim"
    _edit(sim, "3g.40gb", "3g.41gb")
    d2 = discover(str(root), snapshot_dir=sdir)
    assert d2.info.gpus[0].mig_devices[0].name == "3g.41gb"


def test_procfs_texts_invalidate(fresh_sim_host, tmp_path):
    """params and registry are copied into every container's /proc/driver/nvidia: a
    change to them is a change of discovery's answer."""
    from libinject.discover import snapshot as snap
    root = fresh_sim_host("t4x1")
    sdir = str(tmp_path / "snaps")
    proc = root / "proc/driver/nvidia"
    discover(str(root), snapshot_dir=sdir)
    args = _snap_args(root)
    keys = [snap.fingerprint(*args, [])]
    got = []
    for name, old, new in (("params", "ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0"),
                           ("registry", 'Binary: ""', 'Binary: "x"')):
        _edit(proc / name, old, new)
        keys.append(snap.fingerprint(*args, []))
        got.append((name, new, discover(str(root), snapshot_dir=sdir)))
    assert len(set(keys)) == 3
    for name, new, d in got:
        assert new in d.procfs[name]
    assert d.procfs == {"params": (proc / "params").read_text(), "version": (proc / "version").read_text(),
                        "registry": (proc / "registry").read_text()}


def test_whole_mig_table_is_fingerprinted(fresh_sim_host, tmp_path):
    """The mig-minors table is ~100 KB (every possible GPU): a change at its end (GPU
    minors up to 31 are legal) is a change too, and discovery reads all of it."""
    from libinject.discover import snapshot as snap
    root = fresh_sim_host("t4x1")
    table = root / "proc/driver/nvidia-caps/mig-minors"
    text = table.read_text()
    assert len(text) > 1 << 16
    k0 = snap.fingerprint(*_snap_args(root), [])
    last = text.rstrip("\n").rsplit("\n", 1)[1]
    name, minor = last.split()
    table.write_text(text.replace(last, f"{name} {int(minor) + 1}"))
    assert snap.fingerprint(*_snap_args(root), []) != k0


def test_untrusted_snapshot_ignored(fresh_sim_host, tmp_path):
    from libinject.discover import snapshot as snap_mod
    root = fresh_sim_host("t4x1")
    sdir = tmp_path / "snaps"
    d0 = discover(str(root), snapshot_dir=str(sdir))
    (snap,) = sdir.glob("driver-*")
    key, mac, body = snap.read_text().split("\n", 2)
    doc = json.loads(body)
    doc["libraries"][0]["path"] = "/etc/shadow"
    snap.write_bytes(snap_mod.seal(key, json.dumps(doc).encode(), snap_mod.read_key(str(sdir))))
    os.chmod(snap, 0o666)   # writable by anyone: must not be believed
    assert discover(str(root), snapshot_dir=str(sdir)) == d0
    assert os.stat(snap).st_mode & 0o077 == 0   # rewritten by us
    # a snapshot that is ours but damaged is ignored too
    snap.write_bytes(snap_mod.seal(key, b"{broken", snap_mod.read_key(str(sdir))))
    assert discover(str(root), snapshot_dir=str(sdir)) == d0


# ----------------------------------------------------------------------------- selection

@pytest.fixture(scope="module")
def h100(sim_host):
    return discover(str(sim_host("h100x8-mig")), snapshot=False).info


def _ids(sel):
    return [(s.gpu.index, None if s.mig is None else s.mig.index) for s in sel]


def test_select_grammar(h100):
    g = h100.gpus
    assert _ids(S.select(h100, "all")) == [(i, None) for i in range(8)] + \
        [(i, m.index) for i in range(8) for m in g[i].mig_devices]
    assert _ids(S.select(h100, "1,0,1")) == [(1, None), (0, None)]
    assert _ids(S.select(h100, g[2].uuid.upper())) == [(2, None)]
    assert _ids(S.select(h100, g[3].uuid.lower())) == [(3, None)]
    assert _ids(S.select(h100, g[4].bus_id)) == [(4, None)]
    short = g[5].bus_id[4:].upper()          # "0000:XX:00.0"
    assert _ids(S.select(h100, short)) == [(5, None)]
    assert _ids(S.select(h100, "0:1," + g[1].mig_devices[2].uuid)) == [(0, 1), (1, 2)]
    assert S.gpus_of(S.select(h100, "0:1,1:2,0")) == [g[0], g[1]]
    assert S.select(h100, "none") == [] and S.select(h100, "") == [] and S.select(h100, None) == []
    assert _ids(S.select(h100, " 6 , ,7")) == [(6, None), (7, None)]
    for bad in ("8", "GPU-nope", "MIG-nope", "0:9", "3:0", "0000:ff:00.0", "-1", "1.5", "0:1:2"):
        with pytest.raises(NvhookError, match=f"unknown device: {bad}"):
            S.select(h100, f"0,{bad}")


def test_mig_caps_selection(h100):
    sel = S.select(h100, "all")
    assert [x.index for x in S.mig_caps_gpus("all", "all", sel, "mig-config")] == \
           [x.index for x in h100.gpus if x.mig_capable]
    with pytest.raises(NvhookError, match="only 'all'"):
        S.mig_caps_gpus("0", "all", sel, "mig-config")
    with pytest.raises(NvhookError, match="specific MIG devices"):
        S.mig_caps_gpus("all", "0:0", S.select(h100, "0:0"), "mig-monitor")
    assert S.mig_caps_gpus(None, "all", sel, "mig-config") == []


class _NoIO:
    """Stands in for the file system: every call is recorded and fails."""

    def __init__(self, monkeypatch):
        import builtins
        import io

        self.calls: list[str] = []
        for mod, names in ((builtins, ("open",)), (io, ("open", "open_code")),
                           (os, ("open", "stat", "lstat", "scandir", "listdir", "access",
                                 "readlink"))):
            for name in names:
                monkeypatch.setattr(mod, name, self._refuse(f"{mod.__name__}.{name}"))

    def _refuse(self, what):
        def call(*a, **kw):
            self.calls.append(f"{what}{a!r}")
            raise PermissionError(13, f"no I/O in the planner: {what}")
        return call


@pytest.mark.parametrize("devices,extra", [
    ("all", {}), ("0:0,2", {}), ("0", {"mig_config": "all", "mig_monitor": "all"})])
def test_planner_does_no_io(sim_host, monkeypatch, devices, extra):
    """plan() is a pure function of (Request, Driver): the masked procfs (params,
    version, registry, gpus/<busid> dirs, MIG capability files) comes from discovery."""
    from libinject.plan.planner import plan
    from libinject.request.model import Request

    driver = discover(str(sim_host("h100x8-mig")), snapshot=False)
    req = Request(devices=devices, capabilities=frozenset({"utility", "compute"}), **extra)
    want = plan(req, driver)          # once with the file system (imports, caches)
    assert want.procfs.files and want.procfs.gpu_dirs
    assert "ModifyDeviceFiles: 0" in want.procfs.files["params"]
    with monkeypatch.context() as m:
        guard = _NoIO(m)
        got = plan(req, driver)
    assert guard.calls == []
    assert got == want


def test_ipc_dirs_not_owned_by_root_are_refused(fresh_sim_host, tmp_path):
    """A /tmp/nvidia-mps made by an unprivileged user (or in a non-sticky world-writable
    dir) is not the driver's: it would be mounted read-write into every compute container."""
    from libinject.discover.driver import discover
    host = fresh_sim_host("t4x1")
    mps = host / "tmp/nvidia-mps"
    mps.mkdir(parents=True, exist_ok=True)
    os.chmod(host / "tmp", 0o1777)
    snap = tmp_path / "snap"

    def ipcs():
        return [f.container_path for f in discover(str(host), snapshot=False, snapshot_dir=str(snap)).ipcs]

    assert "/tmp/nvidia-mps" in ipcs()
    os.chown(mps, 65534, 65534)
    assert "/tmp/nvidia-mps" not in ipcs()
    os.chown(mps, 0, 0)
    os.chmod(host / "tmp", 0o777)          # world-writable without the sticky bit
    assert "/tmp/nvidia-mps" not in ipcs()


def test_snapshot_dir_swapped_after_check_not_followed(fresh_sim_host, tmp_path, monkeypatch):
    """The snapshot dir is checked, then swapped for a symlink to a directory another
    user controls holding a forged snapshot (same name, right fingerprint): what was
    checked must be what is read."""
    from libinject.discover import snapshot as snap
    root = fresh_sim_host("t4x1")
    sdir = tmp_path / "snaps"
    d0 = discover(str(root), snapshot_dir=str(sdir))
    (good,) = sdir.glob("driver-*")
    evil = tmp_path / "evil"
    evil.mkdir()
    key, mac, body = good.read_text().split("\n", 2)
    doc = json.loads(body)
    doc["info"]["driver_version"] = "666.6.6"
    forged = evil / good.name
    evil_key = os.urandom(snap.KEY_BYTES)    # their own key beside it, sealed with it
    forged.write_bytes(snap.seal(key, json.dumps(doc).encode(), evil_key))
    (evil / snap.KEY_NAME).write_bytes(evil_key)
    for f in (forged, evil / snap.KEY_NAME):
        os.chmod(f, 0o600)
    os.chown(evil, 65534, 65534)          # the directory is theirs; the file looks ours
    real = snap._trusted
    swapped = []

    def check_then_swap(st):
        ok = real(st)
        if not swapped and os.path.isdir(sdir) and not os.path.islink(sdir):
            swapped.append(1)
            os.rename(sdir, tmp_path / "snaps.away")
            os.symlink(evil, sdir)
        return ok
    monkeypatch.setattr(snap, "_trusted", check_then_swap)
    got = snap.load(snap.path_for(str(sdir), *_snap_args(root)), key)
    assert swapped and os.path.islink(sdir)
    # load() opened the directory before the check and read the file through that fd:
    # the genuine snapshot, never the forged one (nor nothing)
    assert got == d0


def _snap_args(root):
    from libinject.discover.driver import DEFAULT_LDCACHE
    r = os.path.abspath(str(root))
    return r, r, os.path.join(r, DEFAULT_LDCACHE.lstrip("/"))
