"""The planner against hand-built discovery results (no simulated host needed)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from libinject.plan.edits import CgroupRule, ContainerEdits
from libinject.errors import NvhookError
from libinject.discover.model import DeviceNode, Driver, DriverInfo, Gpu, HostFile, Library, MigDevice
from libinject.discover.libraries import container_lib_dirs
from libinject.plan.planner import Flags, describe, plan
from libinject.request.model import Request

VER = "550.163.01"
LIB = "/usr/lib/x86_64-linux-gnu"
LIB32 = "/usr/lib/i386-linux-gnu"
CAPS_MAJOR = 237
UVM_MAJOR = 511

LIBS = [  # (name stem, soname major, capability)
    ("libnvidia-ml", "1", "utility"), ("libnvidia-cfg", "1", "utility"),
    ("libcuda", "1", "compute"), ("libnvidia-ptxjitcompiler", "1", "compute"),
    ("libnvidia-opticalflow", "1", "video"), ("libnvcuvid", "1", "video"),
    ("libGLX_nvidia", "0", "graphics"), ("libEGL_nvidia", "0", "graphics"),
    ("libnvidia-glcore", None, "graphics"), ("libnvidia-ngx", "1", "ngx"),
]


def mk_gpu(i: int, mig: bool = False) -> Gpu:
    migs = ()
    if mig:
        migs = tuple(MigDevice(index=j, uuid=f"MIG-{i}-{j}", gi=j + 1, ci=0, name="3g.40gb",
                               memory_total=1, gi_access_minor=100 + 10 * i + 2 * j,
                               ci_access_minor=101 + 10 * i + 2 * j) for j in range(2))
    return Gpu(index=i, minor=i, uuid=f"GPU-{i:08d}", name="NVIDIA A100-SXM4-80GB", brand="Tesla",
               bus_id=f"00000000:{0x07 + i:02X}:00.0", cc=(8, 0), architecture="Ampere",
               memory_total=80 << 30, mig_enabled=mig, mig_devices=migs, mig_capable=mig)


def make_driver(root: Path, ngpus: int = 4, mig: bool = False) -> Driver:
    """A Driver as discovery would return it for `root`: its procfs files written there
    and read back by discovery's procfs reader (the planner itself reads nothing)."""
    from libinject.discover import procfs as host_procfs

    gpus = tuple(mk_gpu(i, mig) for i in range(ngpus))
    proc = root / "proc/driver/nvidia"
    (proc / "gpus").mkdir(parents=True)
    (proc / "params").write_text("ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nEnableMSI: 1\n")
    (proc / "version").write_text(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {VER}\n")
    for g in gpus:
        (proc / "gpus" / g.procfs_name).mkdir()
        (proc / "gpus" / g.procfs_name / "information").write_text(f"Model: {g.name}\n")
    mig_minors = {"config": 1, "monitor": 2}
    for g in gpus:
        for m in g.mig_devices:
            mig_minors[f"gpu{g.minor}/gi{m.gi}/access"] = m.gi_access_minor
            mig_minors[f"gpu{g.minor}/gi{m.gi}/ci{m.ci}/access"] = m.ci_access_minor
    for k, minor in mig_minors.items():
        rel = (f"capabilities/{k.split('/', 1)[0]}/mig/{k.split('/', 1)[1]}" if k.startswith("gpu")
               else f"capabilities/mig/{k}")
        (proc / rel).parent.mkdir(parents=True, exist_ok=True)
        (proc / rel).write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\n")
    host = host_procfs.read(str(proc), mig_minors)
    libs = []
    for arch, d in (("x86-64", LIB), ("i386", LIB32)):
        for stem, so, cap in LIBS:
            libs.append(Library(path=f"{root}{d}/{stem}.so.{VER}",
                                soname=f"{stem}.so.{so}" if so else None, capability=cap, arch=arch))
    dev = lambda p, ma, mi, cap="": DeviceNode(f"{root}{p}", p, ma, mi, cap)  # noqa: E731
    return Driver(
        root=str(root), dev_root=str(root), info=DriverInfo(VER, "12.4", gpus),
        libraries=tuple(libs),
        binaries=tuple(HostFile(f"{root}/usr/bin/{b}", f"/usr/bin/{b}", cap, "binary") for b, cap in
                       (("nvidia-smi", "utility"), ("nvidia-debugdump", "utility"),
                        ("nvidia-persistenced", "utility"), ("nvidia-cuda-mps-control", "compute"),
                        ("nvidia-cuda-mps-server", "compute"))),
        firmware=(HostFile(f"{root}/lib/firmware/nvidia/{VER}/gsp_ga10x.bin",
                           f"/lib/firmware/nvidia/{VER}/gsp_ga10x.bin", "", "firmware"),),
        ipcs=(HostFile(f"{root}/run/nvidia-persistenced/socket", "/run/nvidia-persistenced/socket", "utility", "ipc"),
              HostFile(f"{root}/run/nvidia-fabricmanager/socket", "/run/nvidia-fabricmanager/socket", "utility", "ipc"),
              HostFile(f"{root}/tmp/nvidia-mps", "/tmp/nvidia-mps", "compute", "ipc")),
        control_devices=(dev("/dev/nvidiactl", 195, 255), dev("/dev/nvidia-uvm", UVM_MAJOR, 0, "compute"),
                         dev("/dev/nvidia-uvm-tools", UVM_MAJOR, 1, "compute"),
                         dev("/dev/nvidia-modeset", 195, 254, "display")),
        gpu_devices=tuple(dev(f"/dev/nvidia{g.minor}", 195, g.minor) for g in gpus),
        mig_minors=mig_minors,
        imex_channels=tuple(dev(f"/dev/nvidia-caps-imex-channels/channel{i}", 234, i) for i in range(3)),
        # the planner takes cap node majors from discovery: no host node needed
        cap_devices=tuple(dev(f"/dev/nvidia-caps/nvidia-cap{m}", CAPS_MAJOR, m) for m in sorted(mig_minors.values())),
        procfs_dir=str(proc),
        procfs=host.files,
        gpu_procfs={g.bus_id: host_procfs.gpu_entry(host.gpus, g.bus_id) for g in gpus},
    )


@pytest.fixture
def driver(tmp_path) -> Driver:
    return make_driver(tmp_path / "host")


@pytest.fixture
def mig_driver(tmp_path) -> Driver:
    return make_driver(tmp_path / "mighost", ngpus=2, mig=True)


def req(**kw) -> Request:
    kw.setdefault("devices", "all")
    kw.setdefault("capabilities", frozenset({"utility", "compute"}))
    return Request(**kw)


def cpaths(e: ContainerEdits, kind: str | None = None) -> list[str]:
    return [m.container_path for m in e.mounts if kind is None or m.kind == kind]


def names(e: ContainerEdits, kind: str = "library") -> set[str]:
    return {p.rsplit("/", 1)[1] for p in cpaths(e, kind)}


def test_not_a_gpu_container(driver):
    assert plan(Request(devices=None), driver) == ContainerEdits()


def test_utility_compute_one_gpu(driver):
    e = plan(req(devices="1"), driver)
    assert names(e) == {f"{s}.so.{VER}" for s, _, c in LIBS if c in ("utility", "compute")}
    assert all(p.startswith(LIB + "/") for p in cpaths(e, "library"))
    assert cpaths(e, "binary") == ["/usr/bin/nvidia-smi", "/usr/bin/nvidia-debugdump", "/usr/bin/nvidia-persistenced",
                                   "/usr/bin/nvidia-cuda-mps-control", "/usr/bin/nvidia-cuda-mps-server"]
    assert cpaths(e, "ipc") == ["/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket", "/tmp/nvidia-mps"]
    assert cpaths(e, "firmware") == [f"/lib/firmware/nvidia/{VER}/gsp_ga10x.bin"]
    assert [d.path for d in e.device_nodes] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia1"]
    assert [(r.major, r.minor) for r in e.cgroup_rules] == [(195, 255), (UVM_MAJOR, 0), (UVM_MAJOR, 1), (195, 1)]
    assert e.procfs.gpu_dirs == ((f"{driver.procfs_dir}/gpus/0000:08:00.0", "0000:08:00.0"),)
    assert "ModifyDeviceFiles: 0" in e.procfs.files["params"] and "ModifyDeviceFiles: 1" not in e.procfs.files["params"]
    assert set(e.procfs.files) == {"params", "version"}       # no registry on this host: skipped
    assert e.ldconfig_folders == (LIB,)
    assert e.env == ()
    assert e.cuda_compat.driver_major == 550 and e.cuda_compat.mode == "ldconfig"


def test_order_of_kinds(driver):
    e = plan(req(capabilities=frozenset({"utility", "compute", "graphics"})), driver)
    kinds = [m.kind for m in e.mounts]
    order = ["binary", "library", "firmware", "ipc"]
    assert kinds == sorted(kinds, key=order.index)
    dk = [d.kind for d in e.device_nodes]
    assert dk == sorted(dk, key=["control", "gpu", "mig", "imex"].index)


def test_mount_options(driver):
    e = plan(req(), driver)
    for m in e.mounts:
        if m.kind == "ipc":
            assert set(m.options) == {"bind", "nosuid", "nodev", "noexec"}
        else:
            assert set(m.options) == {"bind", "ro", "nosuid", "nodev"}


def test_symlinks(driver):
    e = plan(req(capabilities=frozenset({"utility", "compute", "video", "graphics", "compat32"})), driver)
    links = {s.link: s.target for s in e.symlinks}
    assert links[f"{LIB}/libcuda.so.1"] == f"libcuda.so.{VER}"
    assert links[f"{LIB}/libcuda.so"] == "libcuda.so.1"
    assert links[f"{LIB}/libGLX_indirect.so.0"] == "libGLX_nvidia.so.0"
    assert links[f"{LIB}/libnvidia-opticalflow.so"] == "libnvidia-opticalflow.so.1"
    assert links[f"{LIB32}/libcuda.so"] == "libcuda.so.1"
    assert links[f"{LIB32}/libGLX_indirect.so.0"] == "libGLX_nvidia.so.0"
    # nvc_mount.c symlink_libraries makes no libGL.so.1 (the image's GLVND has it)
    assert f"{LIB32}/libGL.so.1" not in links and f"{LIB}/libGL.so.1" not in links
    # Every link sits next to a library the plan mounts; none replaces a mount.
    mounted = set(cpaths(e))
    assert not mounted & set(links)
    assert not any(s.link.endswith(f"libnvidia-glcore.so.{VER}") for s in e.symlinks)


def test_capabilities(driver):
    base = names(plan(req(capabilities=frozenset()), driver))
    assert base == set()
    none = plan(req(capabilities=frozenset()), driver)
    assert cpaths(none, "binary") == [] and cpaths(none, "ipc") == []
    assert [d.path for d in none.device_nodes] == ["/dev/nvidiactl"] + [f"/dev/nvidia{i}" for i in range(4)]
    # firmware does not depend on capabilities
    assert cpaths(none, "firmware") == [f"/lib/firmware/nvidia/{VER}/gsp_ga10x.bin"]
    video = plan(req(capabilities=frozenset({"video"})), driver)
    assert names(video) == {f"{s}.so.{VER}" for s, _, c in LIBS if c in ("compute", "video")}
    assert cpaths(video, "binary") == []      # video: compute libraries, not compute binaries
    assert "/dev/nvidia-uvm" in [d.path for d in video.device_nodes]
    assert cpaths(video, "ipc") == ["/tmp/nvidia-mps"]
    display = plan(req(capabilities=frozenset({"display"})), driver)
    assert names(display) == {f"{s}.so.{VER}" for s, _, c in LIBS if c == "graphics"}
    assert "/dev/nvidia-modeset" in [d.path for d in display.device_nodes]
    g = plan(req(capabilities=frozenset({"graphics"})), driver)
    assert "/dev/nvidia-modeset" not in [d.path for d in g.device_nodes]
    assert g.cuda_compat is None
    ngx = plan(req(capabilities=frozenset({"ngx"})), driver)
    assert names(ngx) == {f"libnvidia-ngx.so.{VER}"}
    allcaps = plan(req(capabilities=frozenset({"all"})), driver)
    assert len(cpaths(allcaps, "library")) == 2 * len(LIBS)


def test_compat32(driver):
    e = plan(req(capabilities=frozenset({"utility", "compat32"})), driver, lib_dir="/usr/lib64", lib32_dir="/usr/lib")
    assert sorted(cpaths(e, "library")) == sorted(
        [f"/usr/lib64/libnvidia-ml.so.{VER}", f"/usr/lib64/libnvidia-cfg.so.{VER}",
         f"/usr/lib/libnvidia-ml.so.{VER}", f"/usr/lib/libnvidia-cfg.so.{VER}"])
    assert e.ldconfig_folders == ("/usr/lib64", "/usr/lib")
    assert e.lib_dir == "/usr/lib64"
    hosts = {m.container_path: m.host_path for m in e.mounts}
    assert hosts[f"/usr/lib/libnvidia-ml.so.{VER}"].endswith(f"{LIB32}/libnvidia-ml.so.{VER}")


def test_no_flags(driver):
    e = plan(req(no_persistenced=True, no_fabricmanager=True, no_gsp_firmware=True,
                 cuda_compat_mode="disabled"), driver)
    assert cpaths(e, "ipc") == ["/tmp/nvidia-mps"]
    assert cpaths(e, "firmware") == []
    assert "/usr/bin/nvidia-persistenced" in cpaths(e, "binary")   # the binary stays, as upstream
    assert e.cuda_compat is None
    nc = plan(req(no_cgroups=True), driver)
    assert nc.cgroup_rules == () and nc.device_nodes
    nd = plan(req(no_devbind=True), driver)
    assert nd.device_nodes == () and nd.cgroup_rules == plan(req(), driver).cgroup_rules


def test_container_env_never_picks_a_host_dir(driver):
    """An image's CUDA_MPS_PIPE_DIRECTORY must not choose what gets mounted from the host
    (a container asking for /etc would get the host's /etc read-write): through the hook's
    own request builder, the plan is the same whatever the image sets."""
    from libinject.config import Config
    from libinject.request.oci_spec import request_from_spec

    root = Path(driver.root)
    (root / "etc").mkdir(exist_ok=True)

    def planned(*env: str):
        spec = {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all", *env]}}
        return plan(request_from_spec(spec, Config()), driver)

    for asked in ("/etc", "/", "/nope"):
        e = planned(f"CUDA_MPS_PIPE_DIRECTORY={asked}")
        assert cpaths(e, "ipc") == cpaths(planned(), "ipc")
        assert all(m.host_path.startswith(str(root) + "/") and m.host_path != str(root / "etc")
                   for m in e.mounts if m.kind == "ipc")


def test_driver_only(driver):
    e = plan(req(devices="none"), driver)
    assert e.procfs.gpu_dirs == ()
    assert [d.path for d in e.device_nodes] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    # the driver's files still come, as for any GPU
    assert names(e) == {f"{s}.so.{VER}" for s, _, c in LIBS if c in ("utility", "compute")}
    assert cpaths(e, "binary") == cpaths(plan(req(), driver), "binary")


def test_requirements(driver):
    with pytest.raises(NvhookError, match="unsatisfied condition: cuda>=12.5, please update"):
        plan(req(requirements=("cuda>=12.5",)), driver)
    with pytest.raises(NvhookError, match="unsatisfied condition: brand=geforce"):
        plan(req(devices="0", requirements=("brand=geforce",)), driver)
    # Without a GPU the brand is not checked.
    plan(req(devices="none", requirements=("brand=geforce",)), driver)
    plan(req(requirements=("cuda>=12.5",), disable_require=True), driver)
    with pytest.raises(NvhookError, match="invalid expression"):
        plan(req(requirements=("cuda=>12",)), driver)


def test_unknown_device(driver):
    with pytest.raises(NvhookError, match="unknown device"):
        plan(req(devices="7"), driver)


def test_mig_selection(mig_driver):
    e = plan(req(devices="1:0"), mig_driver)
    g1 = mig_driver.info.gpus[1]
    m = g1.mig_devices[0]
    devs = [(d.path, d.kind) for d in e.device_nodes]
    assert ("/dev/nvidia1", "gpu") in devs and ("/dev/nvidia0", "gpu") not in devs
    assert (f"/dev/nvidia-caps/nvidia-cap{m.gi_access_minor}", "mig") in devs
    assert (f"/dev/nvidia-caps/nvidia-cap{m.ci_access_minor}", "mig") in devs
    assert CgroupRule(CAPS_MAJOR, m.gi_access_minor) in e.cgroup_rules
    assert e.procfs.gpu_dirs == ((f"{mig_driver.procfs_dir}/gpus/{g1.procfs_name}", g1.procfs_name),)
    caps = [d for d in e.device_nodes if d.kind == "mig"]
    assert all(d.major == CAPS_MAJOR for d in caps) and len(caps) == 2
    # NVML in the container finds the MIG device through these procfs files, bound from
    # the host as NVIDIA's mount_procfs_mig binds them.
    base = f"capabilities/gpu1/mig/gi{m.gi}"
    assert set(e.procfs.files) == {"params", "version"}
    assert e.procfs.bound_files == tuple((f"{mig_driver.procfs_dir}/{rel}", rel)
                                         for rel in (f"{base}/access", f"{base}/ci{m.ci}/access"))


def test_mig_config_monitor(mig_driver):
    e = plan(req(devices="0", mig_config="all", mig_monitor="all"), mig_driver)
    assert [(d.path, d.kind) for d in e.device_nodes if d.kind in ("gpu", "mig")] == [
        ("/dev/nvidia0", "gpu"), ("/dev/nvidia-caps/nvidia-cap1", "mig"), ("/dev/nvidia-caps/nvidia-cap2", "mig")]
    # as NVIDIA: the live capabilities dir and /dev/nvidia-caps (instances made later show)
    assert not any(f.startswith("capabilities/") for f in e.procfs.files)
    assert e.procfs.live_dirs == ((f"{mig_driver.procfs_dir}/capabilities", "capabilities"),)
    caps_dir = os.path.dirname(mig_driver.cap_devices[0].path)
    assert [(m.host_path, m.container_path, m.options) for m in e.mounts if m.kind == "devdir"] == [
        (caps_dir, "/dev/nvidia-caps", ("ro", "nosuid", "noexec", "bind"))]
    g0 = mig_driver.info.gpus[0]
    # config may use every MIG minor of the GPU (cgroup only), and only that GPU's
    g0_minors = sorted(m for g0m in g0.mig_devices for m in (g0m.gi_access_minor, g0m.ci_access_minor))
    assert [r.minor for r in e.cgroup_rules if r.major == CAPS_MAJOR] == [1, 2] + g0_minors


def test_mig_config_all_drops_mig_access(mig_driver):
    """configure.c: with mig-config/monitor "all", the selected MIG devices' own access
    caps are not given (the GPU-wide ones stand in), on MIG-capable visible GPUs only."""
    e = plan(req(devices="all", mig_config="all"), mig_driver)
    assert [d.path for d in e.device_nodes if d.kind == "mig"] == ["/dev/nvidia-caps/nvidia-cap1"]
    assert not any("/gi" in f for f in e.procfs.files)
    assert plan(req(devices="all", mig_config="all,0"), mig_driver) == e   # the list ends at "all"
    plain = make_driver(Path(mig_driver.root).parent / "plain", ngpus=2)
    e = plan(req(devices="all", mig_config="all"), plain)       # no MIG-capable GPU: nothing
    assert [d.kind for d in e.device_nodes].count("mig") == 0
    assert "capabilities/mig/config" not in e.procfs.files


@pytest.mark.parametrize("devices,ids,msg", [
    ("all", "0", "mig-config error: 0: only 'all' devices are currently supported"),
    ("all", "0,all", "mig-config error: 0: only 'all' devices are currently supported"),
    ("1:0", "all", "mig-config error: all: cannot enable mig-config with specific MIG devices selected"),
])
def test_mig_config_refused(mig_driver, devices, ids, msg):
    with pytest.raises(NvhookError, match=f"^{msg}$"):
        plan(req(devices=devices, mig_config=ids), mig_driver)
    with pytest.raises(NvhookError, match="^" + msg.replace("config", "monitor") + "$"):
        plan(req(devices=devices, mig_monitor=ids), mig_driver)


def test_mig_cap_nodes_come_from_discovery(mig_driver):
    """The planner stats nothing: a cap node discovery did not find is an error, even if
    it exists on the host now."""
    from libinject.record import replace
    m = mig_driver.info.gpus[1].mig_devices[0]
    caps = Path(mig_driver.dev_root) / "dev/nvidia-caps"
    caps.mkdir(parents=True)
    os.mknod(caps / f"nvidia-cap{m.gi_access_minor}", 0o600 | 0o020000,
             os.makedev(CAPS_MAJOR, m.gi_access_minor))
    with pytest.raises(NvhookError, match=f"^missing MIG capability device {caps}/nvidia-cap{m.gi_access_minor}$"):
        plan(req(devices="1:0"), replace(mig_driver, cap_devices=()))


def test_ipc_socket():
    from libinject.constants import FABRICMANAGER_SOCKET, PERSISTENCED_SOCKET
    from libinject.plan.planner import ipc_socket
    assert ipc_socket("/run/nvidia-persistenced/socket") == PERSISTENCED_SOCKET
    assert ipc_socket("/var/run/nvidia-persistenced/socket") == PERSISTENCED_SOCKET   # /run -> /var/run
    assert ipc_socket("/run/nvidia-fabricmanager/socket") == FABRICMANAGER_SOCKET
    assert ipc_socket("/tmp/nvidia-mps") is None and ipc_socket("/run/other/socket") is None


def test_imex(driver):
    e = plan(req(imex_channels="0,2"), driver)
    assert [d.path for d in e.device_nodes if d.kind == "imex"] == [
        "/dev/nvidia-caps-imex-channels/channel0", "/dev/nvidia-caps-imex-channels/channel2"]
    assert CgroupRule(234, 2) in e.cgroup_rules
    assert len([d for d in plan(req(imex_channels="all"), driver).device_nodes if d.kind == "imex"]) == 3
    with pytest.raises(NvhookError, match="unknown IMEX channel: 9"):
        plan(req(imex_channels="9"), driver)


def test_json_roundtrip_and_describe(driver):
    e = plan(req(capabilities=frozenset({"all"}), mig_config=None), driver)
    again = ContainerEdits.from_dict(json.loads(json.dumps(e.to_dict())))
    assert again == e
    text = describe(e)
    assert "/dev/nvidia3" in text and "libcuda.so" in text


def test_flags_table():
    assert Flags.of({"video"}).compute_libs and not Flags.of({"video"}).compute_bins
    assert Flags.of({"display"}).graphics_libs
    assert not Flags.of(set()).utility_libs


def test_container_lib_dirs(tmp_path):
    deb = tmp_path / "deb"
    (deb / "etc").mkdir(parents=True)
    (deb / "etc/debian_version").write_text("12\n")
    assert container_lib_dirs(str(deb)) == (LIB, LIB32)
    multi = tmp_path / "multi"
    (multi / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    assert container_lib_dirs(str(multi)) == (LIB, LIB32)
    rpm = tmp_path / "rpm"
    (rpm / "usr/lib64").mkdir(parents=True)
    assert container_lib_dirs(str(rpm)) == ("/usr/lib64", "/usr/lib")


def test_container_lib_dirs_never_leave_rootfs(tmp_path):
    # The host has /usr/lib/x86_64-linux-gnu and /etc/debian_version; an image whose
    # /usr and /etc are absolute symlinks to the host's must still read as non-Debian.
    hostile = tmp_path / "hostile"
    hostile.mkdir()
    (hostile / "usr").symlink_to("/usr")
    (hostile / "etc").symlink_to("/etc")
    (hostile / "x").symlink_to("../../../../../../")
    assert os.path.isdir("/usr/lib/x86_64-linux-gnu")
    assert container_lib_dirs(str(hostile)) == ("/usr/lib64", "/usr/lib")
    # In-root absolute symlinks do resolve (merged-usr style).
    merged = tmp_path / "merged"
    (merged / "real/lib/x86_64-linux-gnu").mkdir(parents=True)
    (merged / "usr").symlink_to("/real")
    assert container_lib_dirs(str(merged)) == (LIB, LIB32)


def test_container_lib_dirs_retries_racing_lookup(tmp_path, monkeypatch):
    """openat2(RESOLVE_IN_ROOT) answers EAGAIN when a '..' walk raced with a rename or
    mount anywhere on the system; that is "try again", not "absent"."""
    from libinject.linux import native
    deb = tmp_path / "deb"
    (deb / "etc").mkdir(parents=True)
    (deb / "etc/debian_version").write_text("12\n")
    real = native.openat2
    calls = []

    def flaky(*a, **kw):
        calls.append(a[1])
        if len(calls) <= 2:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return real(*a, **kw)
    monkeypatch.setattr(native, "openat2", flaky)
    assert container_lib_dirs(str(deb)) == (LIB, LIB32)
    assert len(calls) == 3


def test_procfs_comes_from_discovery(tmp_path):
    """The masked procfs is made of what discovery read (Driver.procfs, .gpu_procfs):
    the host's files gone or changed after discovery change nothing in the plan."""
    import shutil
    from libinject.record import replace

    d = make_driver(tmp_path / "host", ngpus=2, mig=True)
    want = plan(req(devices="all"), d)
    assert want.procfs.files["version"] == d.procfs["version"]
    assert {f"capabilities/gpu{g.minor}/mig/gi{m.gi}/ci{m.ci}/access"
            for g in d.info.gpus for m in g.mig_devices} <= {rel for _, rel in want.procfs.bound_files}
    shutil.rmtree(d.procfs_dir)
    assert plan(req(devices="all"), d) == want
    g = d.info.gpus[1]
    with pytest.raises(NvhookError, match=f"^GPU 1 \\({g.bus_id}\\): {d.procfs_dir}/gpus/{g.procfs_name} not found$"):
        plan(req(devices="1"), replace(d, gpu_procfs={}))
    # a GPU dir in the 32-bit domain form is used by that name
    e = plan(req(devices="1"), replace(d, gpu_procfs={g.bus_id: g.bus_id}))
    assert e.procfs.gpu_dirs == ((f"{d.procfs_dir}/gpus/{g.bus_id}", g.bus_id),)
    # no procfs dir on the host: an empty tmpfs, as before
    e = plan(req(devices="all"), replace(d, procfs_dir=""))
    assert e.procfs.files == {} and e.procfs.gpu_dirs == ()


@pytest.mark.parametrize("kw", [dict(devices="all"), dict(devices="1:0"),
                                dict(devices="0", mig_config="all", mig_monitor="all"),
                                dict(devices="all", imex_channels="all", cuda_compat_mode="mount",
                                     capabilities=frozenset({"all"}))])
def test_planner_does_no_io(tmp_path, monkeypatch, kw):
    import builtins
    import io

    d = make_driver(tmp_path / "host", ngpus=2, mig=True)
    want = plan(req(**kw), d)       # imports done, caches warm
    calls: list[str] = []

    def refuse(what):
        def call(*a, **k):
            calls.append(f"{what}{a!r}")
            raise PermissionError(13, f"no I/O in the planner: {what}")
        return call
    with monkeypatch.context() as m:
        for mod, names in ((builtins, ("open",)), (io, ("open", "open_code")),
                           (os, ("open", "stat", "lstat", "scandir", "listdir", "access", "readlink"))):
            for name in names:
                m.setattr(mod, name, refuse(f"{mod.__name__}.{name}"))
        got = plan(req(**kw), d)
    assert calls == [] and got == want
