"""The simulated GPU host: profiles, the mock NVML (through pynvml and ctypes), the
ldcache, device nodes, procfs, chrooted nvidia-smi, visibility, knobs, bad profiles."""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import NVHOOK, run
from libinject.errors import NvhookError
from libinject.sim import build
from libinject.sim.build import ci_minor, create_host, gi_minor
from libinject.sim.profile import ARCHITECTURES, BRANDS, list_profiles, load_profile

PROFILES = ["a100x8", "h100x8-mig", "t4x1", "rtx4090x1"]
LIBDIR = "usr/lib/x86_64-linux-gnu"
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"

# Runs in a child: loads the mock from the given path into pynvml and dumps what NVML says.
PROBE = r"""
import ctypes, json, sys
import pynvml as N
N.nvmlLib = ctypes.CDLL(sys.argv[1])   # instead of CDLL("libnvidia-ml.so.1") via the host's ldcache
try:
    N.nvmlInit()
except N.NVMLError as e:
    print(json.dumps({"init_error": e.value, "text": str(e)}))
    sys.exit(0)
out = {"driver": N.nvmlSystemGetDriverVersion(), "cuda": N.nvmlSystemGetCudaDriverVersion_v2(),
       "cuda_v1": N.nvmlSystemGetCudaDriverVersion(), "nvml": N.nvmlSystemGetNVMLVersion(), "gpus": []}
for i in range(N.nvmlDeviceGetCount()):
    h = N.nvmlDeviceGetHandleByIndex(i)
    pci = N.nvmlDeviceGetPciInfo(h)
    g = {"name": N.nvmlDeviceGetName(h), "uuid": N.nvmlDeviceGetUUID(h),
         "minor": N.nvmlDeviceGetMinorNumber(h), "bus_id": pci.busId, "bus_legacy": pci.busIdLegacy,
         "pci_device_id": pci.pciDeviceId, "cc": list(N.nvmlDeviceGetCudaComputeCapability(h)),
         "brand": N.nvmlDeviceGetBrand(h), "arch": N.nvmlDeviceGetArchitecture(h),
         "memory": N.nvmlDeviceGetMemoryInfo(h).total,
         "memory_v2": N.nvmlDeviceGetMemoryInfo(h, N.nvmlMemory_v2).total,
         "by_uuid": N.nvmlDeviceGetUUID(N.nvmlDeviceGetHandleByUUID(N.nvmlDeviceGetUUID(h))),
         "is_mig": N.nvmlDeviceIsMigDeviceHandle(h).value, "mig": []}
    try:
        g["mig_mode"] = N.nvmlDeviceGetMigMode(h)
    except N.NVMLError as e:
        g["mig_mode"] = e.value
    g["max_mig"] = N.nvmlDeviceGetMaxMigDeviceCount(h)
    for j in range(g["max_mig"]):
        try:
            m = N.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
        except N.NVMLError_NotFound:
            continue
        g["mig"].append({"index": j, "uuid": N.nvmlDeviceGetUUID(m), "name": N.nvmlDeviceGetName(m),
                         "gi": N.nvmlDeviceGetGpuInstanceId(m), "ci": N.nvmlDeviceGetComputeInstanceId(m),
                         "memory": N.nvmlDeviceGetMemoryInfo(m).total,
                         "is_mig": N.nvmlDeviceIsMigDeviceHandle(m).value,
                         "parent": N.nvmlDeviceGetUUID(N.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)),
                         "by_uuid": N.nvmlDeviceGetName(N.nvmlDeviceGetHandleByUUID(N.nvmlDeviceGetUUID(m)))})
    out["gpus"].append(g)
N.nvmlShutdown()
print(json.dumps(out))
"""


def probe(root: Path, env: dict[str, str] | None = None) -> dict:
    r = run([sys.executable, "-c", PROBE, str(root / LIBDIR / "libnvidia-ml.so.1")],
            env={**os.environ, **(env or {})})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def smi(root: Path, *args: str) -> subprocess.CompletedProcess:
    # A clean environment, as a child of a real GPU host's tools would have.
    return run([CHROOT, str(root), "/usr/bin/nvidia-smi", *args], env={"PATH": "/usr/bin:/bin"})


def expected_smi_lines(prof) -> list[str]:
    lines = []
    for i, g in enumerate(prof.gpus):
        lines.append(f"GPU {i}: {g.name} (UUID: {g.uuid})")
        lines += [f"  MIG {m.name:<12}Device {j:>2}: (UUID: {m.uuid})" for j, m in enumerate(g.mig)]
    return lines


def test_builtin_profiles_listed():
    assert set(PROFILES) <= set(list_profiles())
    r = run([NVHOOK, "sim", "profiles"])
    assert r.returncode == 0, r.stderr
    for name in PROFILES:
        assert re.search(rf"^{re.escape(name)}\s+\d+ x ", r.stdout, re.M), r.stdout
    assert "8 x NVIDIA A100-SXM4-80GB; driver 550.163.01, CUDA 12.4" in r.stdout


def test_profile_contents_match_issue():
    a100 = load_profile("a100x8")
    assert (a100.driver_version, a100.cuda_version, len(a100.gpus)) == ("550.163.01", "12.4", 8)
    assert {(g.name, g.cc, g.architecture) for g in a100.gpus} == {("NVIDIA A100-SXM4-80GB", (8, 0), "Ampere")}
    h100 = load_profile("h100x8-mig")
    assert {(g.name, g.cc) for g in h100.gpus} == {("NVIDIA H100 80GB HBM3", (9, 0))}
    assert sum(1 for g in h100.gpus if g.mig) >= 2
    t4 = load_profile("t4x1")
    assert [(g.name, g.cc, g.brand) for g in t4.gpus] == [("Tesla T4", (7, 5), "Tesla")]
    rtx = load_profile("rtx4090x1")
    assert rtx.modeset and rtx.graphics and rtx.gpus[0].brand == "GeForce"
    assert not (a100.graphics or h100.graphics or t4.graphics)
    assert {"libGLX_nvidia", "libEGL_nvidia", "libnvidia-glcore"} <= {s.name for s in rtx.libraries}


@pytest.mark.parametrize("name", PROFILES)
def test_pynvml_reports_the_profile(sim_host, name):
    prof = load_profile(name)
    out = probe(sim_host(name))
    assert out["driver"] == prof.driver_version
    assert out["cuda"] == out["cuda_v1"] == prof.cuda_int == 12040
    assert out["nvml"] == f"12.{prof.driver_version}"
    assert len(out["gpus"]) == len(prof.gpus)
    for i, (got, g) in enumerate(zip(out["gpus"], prof.gpus)):
        assert got["name"] == g.name
        assert got["uuid"] == got["by_uuid"] == g.uuid
        assert got["minor"] == g.minor
        assert got["bus_id"] == g.bus_id
        assert got["bus_legacy"] == g.bus_id[4:]          # "%04X:%02X:%02X.0"
        assert got["pci_device_id"] == g.pci_device_id
        assert tuple(got["cc"]) == g.cc
        assert got["brand"] == BRANDS[g.brand]
        assert got["arch"] == ARCHITECTURES[g.architecture][0]
        assert got["memory"] == got["memory_v2"] == g.memory_mib << 20
        assert got["is_mig"] == 0
        if not g.mig_capable:
            assert got["mig_mode"] == 3                   # NVML_ERROR_NOT_SUPPORTED
        else:
            assert got["mig_mode"] == [int(g.mig_enabled)] * 2
        assert got["max_mig"] == (7 if g.mig_enabled else 0)
        assert len(got["mig"]) == len(g.mig)
        for j, (gm, m) in enumerate(zip(got["mig"], g.mig)):
            assert gm["index"] == j
            assert (gm["uuid"], gm["gi"], gm["ci"]) == (m.uuid, m.gi, m.ci)
            assert gm["name"] == gm["by_uuid"] == f"{g.name} MIG {m.name}"
            assert gm["memory"] == m.memory_mib << 20
            assert gm["is_mig"] == 1 and gm["parent"] == g.uuid
        # NVML enumerates in PCI order
        if i:
            assert out["gpus"][i - 1]["bus_id"] < got["bus_id"]


def test_h100_has_mig_devices(sim_host):
    out = probe(sim_host("h100x8-mig"))
    migs = [m for g in out["gpus"] for m in g["mig"]]
    assert len(migs) == 11
    assert [m["name"].split(" MIG ")[1] for m in out["gpus"][0]["mig"]] == ["3g.40gb", "3g.40gb"]
    assert len(out["gpus"][1]["mig"]) == 7
    assert {(m["gi"], m["ci"]) for m in out["gpus"][2]["mig"]} == {(1, 0), (1, 1)}
    assert out["gpus"][3]["mig_mode"] == [1, 1] and out["gpus"][3]["mig"] == []


def _ldcache(root: Path) -> list[tuple[str, str, str]]:
    r = run(["ldconfig", "-p", "-C", str(root / "etc/ld.so.cache")])
    assert r.returncode == 0, r.stderr
    return re.findall(r"^\s+(\S+) \(([^)]*)\) => (\S+)$", r.stdout, re.M)


def _elf_soname(path: Path) -> str | None:
    r = run(["readelf", "-d", str(path)])
    m = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", r.stdout)
    return m.group(1) if m else None


@pytest.mark.parametrize("name", PROFILES)
def test_ldcache_lists_every_library_with_its_soname(sim_host, name):
    prof = load_profile(name)
    root = sim_host(name)
    entries = _ldcache(root)
    ver = prof.driver_version
    i386 = (root / "usr/lib/i386-linux-gnu").is_dir()
    assert i386, "gcc-multilib is installed: 32-bit libraries expected"
    for lib in prof.libraries:
        soname = lib.real_soname(ver)
        for arch, libdir, flags in (("x86-64", LIBDIR, "libc6,x86-64"), ("i386", "usr/lib/i386-linux-gnu", "libc6")):
            if arch == "i386" and not lib.i386:
                assert not (root / libdir / lib.file_name(ver)).exists()
                continue
            hits = [e for e in entries if e[0] == soname and e[1] == flags]
            assert hits == [(soname, flags, f"/{libdir}/{soname}")], (lib.name, arch)
            real = root / libdir / lib.file_name(ver)
            assert real.is_file() and not real.is_symlink()
            assert os.path.realpath(root / libdir / soname) == str(real)
            assert _elf_soname(real) == soname
            assert real.read_bytes()[:4] == b"\x7fELF"
            assert real.read_bytes()[4] == (2 if arch == "x86-64" else 1)   # ELFCLASS64 / 32
    # the real SONAMEs the issue names
    names = {e[0] for e in entries}
    assert {"libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-nvvm.so.4", "libEGL_nvidia.so.0",
            "libGLESv2_nvidia.so.2", f"libnvidia-eglcore.so.{ver}", f"libnvidia-glcore.so.{ver}"} <= names
    assert "libc.so.6" in names   # the root's own glibc (for chroot)


def test_binaries_link_nvml_and_run(sim_host):
    root = sim_host("a100x8")
    r = run(["readelf", "-d", str(root / "usr/bin/nvidia-smi")])
    assert "Shared library: [libnvidia-ml.so.1]" in r.stdout
    for b in ("nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
              "nvidia-cuda-mps-server", "nv-fabricmanager"):
        r = run([CHROOT, str(root), f"/usr/bin/{b}", "--version"], env={})
        assert r.returncode == 0 and "550.163.01" in r.stdout, (b, r.stderr)
    assert not (sim_host("t4x1") / "usr/bin/nv-fabricmanager").exists()


@pytest.mark.parametrize("name", PROFILES)
def test_device_nodes_have_real_numbers(sim_host, name):
    prof = load_profile(name)
    root = sim_host(name)

    def chr_dev(rel: str) -> tuple[int, int]:
        st = os.lstat(root / "dev" / rel)
        assert stat.S_ISCHR(st.st_mode), rel
        return os.major(st.st_rdev), os.minor(st.st_rdev)

    for g in prof.gpus:
        assert chr_dev(f"nvidia{g.minor}") == (195, g.minor)
    assert chr_dev("nvidiactl") == (195, 255)
    assert chr_dev("nvidia-uvm") == (prof.uvm_major, 0)
    assert chr_dev("nvidia-uvm-tools") == (prof.uvm_major, 1)
    assert (root / "dev/nvidia-modeset").exists() == prof.modeset
    if prof.modeset:
        assert chr_dev("nvidia-modeset") == (195, 254)
    if prof.mig_capable:
        assert chr_dev("nvidia-caps/nvidia-cap1") == (prof.caps_major, 1)
        assert chr_dev("nvidia-caps/nvidia-cap2") == (prof.caps_major, 2)
    for g in prof.gpus:
        for m in g.mig:
            n = ci_minor(g.minor, m.gi, m.ci)
            assert chr_dev(f"nvidia-caps/nvidia-cap{n}") == (prof.caps_major, n)
            n = gi_minor(g.minor, m.gi)
            assert chr_dev(f"nvidia-caps/nvidia-cap{n}") == (prof.caps_major, n)
    # No driver behind these majors: opening gives ENXIO (the cgroup tests rely on it).
    with pytest.raises(OSError) as e:
        os.open(root / "dev/nvidia-uvm", os.O_RDWR)
    assert e.value.errno == 6


@pytest.mark.parametrize("name", PROFILES)
def test_nvidia_smi_under_chroot_lists_every_gpu(sim_host, name):
    prof = load_profile(name)
    r = smi(sim_host(name), "-L")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == expected_smi_lines(prof)


def test_nvidia_smi_table_and_version(sim_host):
    root = sim_host("a100x8")
    r = smi(root)
    assert r.returncode == 0
    assert "Driver Version: 550.163.01" in r.stdout and "CUDA Version: 12.4" in r.stdout
    assert r.stdout.count("NVIDIA A100-SXM4-80GB") == 8
    assert all(len(line) == 91 for line in r.stdout.splitlines())
    r = smi(root, "--version")
    assert "DRIVER version      : 550.163.01" in r.stdout


def test_procfs_and_firmware_and_sockets(sim_host):
    prof = load_profile("h100x8-mig")
    root = sim_host("h100x8-mig")
    proc = root / "proc/driver/nvidia"
    assert re.match(r"NVRM version: NVIDIA UNIX x86_64 Kernel Module  550\.163\.01  ", (proc / "version").read_text())
    assert "ModifyDeviceFiles: 1" in (proc / "params").read_text().splitlines()
    assert (proc / "registry").is_file()
    g = prof.gpus[0]
    info = (proc / "gpus" / g.procfs_name / "information").read_text()
    assert f"GPU UUID: \t {g.uuid}\n" in info and "Device Minor: \t 0\n" in info
    assert f"Bus Location: \t {g.procfs_name}\n" in info and g.procfs_name == "0000:18:00.0"
    minors = (root / "proc/driver/nvidia-caps/mig-minors").read_text().splitlines()
    assert minors[:4] == ["config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4"]
    assert minors[-1] == "gpu31/gi14/ci7/access 4322" and len(minors) == 4322
    assert "gpu3/gi3/ci3/access 439" in minors
    caps = proc / "capabilities"
    assert (caps / "mig/config").read_text().startswith("DeviceFileMinor: 1\n")
    assert (caps / "mig/monitor").read_text().startswith("DeviceFileMinor: 2\n")
    for m in g.mig:
        assert (caps / f"gpu0/mig/gi{m.gi}/access").read_text().startswith(
            f"DeviceFileMinor: {gi_minor(0, m.gi)}\n")
        assert (caps / f"gpu0/mig/gi{m.gi}/ci{m.ci}/access").read_text().startswith(
            f"DeviceFileMinor: {ci_minor(0, m.gi, m.ci)}\n")
        assert f"gpu0/gi{m.gi}/ci{m.ci}/access {ci_minor(0, m.gi, m.ci)}" in minors
    for fw in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
        assert (root / f"lib/firmware/nvidia/550.163.01/{fw}").is_file()
    for sock in ("run/nvidia-persistenced/socket", "run/nvidia-fabricmanager/socket"):
        assert stat.S_ISSOCK(os.lstat(root / sock).st_mode)
    assert "/usr/lib/i386-linux-gnu" in (root / "etc/ld.so.conf.d/i386-linux-gnu.conf").read_text()
    assert (root / "etc/ld.so.conf").read_text() == "include /etc/ld.so.conf.d/*.conf\n"
    t4 = sim_host("t4x1")
    assert not (t4 / "proc/driver/nvidia/capabilities").exists()
    assert not (t4 / "run/nvidia-fabricmanager").exists()


def test_removing_a_gpu_hides_it(fresh_sim_host):
    root = fresh_sim_host("a100x8")
    prof = load_profile("a100x8")
    gone, half = prof.gpus[1], prof.gpus[2]
    # fully removed: procfs entry and node
    os.unlink(root / f"dev/nvidia{gone.minor}")
    for f in (root / "proc/driver/nvidia/gpus" / gone.procfs_name).iterdir():
        f.unlink()
    (root / "proc/driver/nvidia/gpus" / gone.procfs_name).rmdir()
    # only the node removed: hidden too (NVML needs both)
    os.unlink(root / f"dev/nvidia{half.minor}")
    out = probe(root)
    uuids = [g["uuid"] for g in out["gpus"]]
    assert uuids == [g.uuid for g in prof.gpus if g not in (gone, half)]
    lines = smi(root, "-L").stdout.splitlines()
    assert len(lines) == 6 and lines[1].startswith("GPU 1: ") and gone.uuid not in "".join(lines)


def test_only_gpu1_visible_like_in_a_container(fresh_sim_host):
    """What a container given only GPU 1 shows: its procfs dir and its node."""
    root = fresh_sim_host("a100x8")
    prof = load_profile("a100x8")
    for g in prof.gpus:
        if g.minor != 1:
            os.unlink(root / f"dev/nvidia{g.minor}")
    assert smi(root, "-L").stdout.splitlines() == [f"GPU 0: {prof.gpus[1].name} (UUID: {prof.gpus[1].uuid})"]


def test_mig_device_hidden_without_its_caps_node(fresh_sim_host):
    root = fresh_sim_host("h100x8-mig")
    prof = load_profile("h100x8-mig")
    g0 = prof.gpus[0]
    hidden = g0.mig[0]
    os.unlink(root / f"dev/nvidia-caps/nvidia-cap{ci_minor(0, hidden.gi, hidden.ci)}")
    # GPU 1's gi7 access node removed: its MIG device goes too
    os.unlink(root / f"dev/nvidia-caps/nvidia-cap{gi_minor(1, 7)}")
    out = probe(root)
    assert [m["uuid"] for m in out["gpus"][0]["mig"]] == [g0.mig[1].uuid]
    assert out["gpus"][0]["mig"][0]["index"] == 0
    assert len(out["gpus"][1]["mig"]) == 6
    lines = smi(root, "-L").stdout.splitlines()
    assert lines[1] == f"  MIG 3g.40gb     Device  0: (UUID: {g0.mig[1].uuid})"
    assert hidden.uuid not in "\n".join(lines)


def test_moved_root_still_works(fresh_sim_host, tmp_path):
    """No host path is baked in: the mock finds its root from where it is loaded."""
    root = fresh_sim_host("t4x1")
    moved = tmp_path / "elsewhere" / "deeper"
    moved.parent.mkdir()
    root.rename(moved)
    assert probe(moved)["gpus"][0]["name"] == "Tesla T4"
    # relative load path, from another cwd
    r = run([sys.executable, "-c", PROBE, f"./deeper/{LIBDIR}/libnvidia-ml.so.1"], cwd=moved.parent)
    assert json.loads(r.stdout)["gpus"][0]["name"] == "Tesla T4", r.stderr


def test_knob_delay(sim_host):
    root = sim_host("t4x1")
    t0 = time.monotonic()
    out = probe(root, {"NVHOOK_SIM_NVML_DELAY_MS": "400"})
    assert time.monotonic() - t0 >= 0.4
    assert len(out["gpus"]) == 1


def test_knob_error_env(sim_host):
    root = sim_host("t4x1")
    out = probe(root, {"NVHOOK_SIM_NVML_ERROR": "DRIVER_NOT_LOADED"})
    assert out["init_error"] == 9 and out["text"] == "Driver Not Loaded"
    assert probe(root, {"NVHOOK_SIM_NVML_ERROR": "999"})["init_error"] == 999
    assert probe(root, {"NVHOOK_SIM_NVML_ERROR": "NVML_ERROR_GPU_IS_LOST"})["init_error"] == 15


def test_knob_file_reaches_a_clean_env_child(fresh_sim_host):
    root = fresh_sim_host("t4x1")
    conf = root / "etc/nvhook-sim/nvml.conf"
    conf.write_text("delay_ms=300\nerror=LIB_RM_VERSION_MISMATCH\n")
    t0 = time.monotonic()
    r = smi(root, "-L")
    assert time.monotonic() - t0 >= 0.3
    assert r.returncode == 18 and "Driver/library version mismatch" in r.stdout
    conf.write_text("error=6\n")
    assert probe(root)["init_error"] == 6
    conf.write_text("# nothing\n")
    assert smi(root, "-L").returncode == 0


def test_driver_not_loaded_and_version_mismatch(fresh_sim_host):
    root = fresh_sim_host("t4x1")
    version = root / "proc/driver/nvidia/version"
    text = version.read_text()
    version.write_text(text.replace("550.163.01", "550.54.15"))
    assert probe(root)["init_error"] == 18           # NVML_ERROR_LIB_RM_VERSION_MISMATCH
    version.unlink()
    r = smi(root, "-L")
    assert r.returncode == 9 and "couldn't communicate with the NVIDIA driver" in r.stdout


def test_nvml_abi_details(sim_host):
    """Return codes and legacy structs through ctypes, as C callers see them."""
    root = sim_host("h100x8-mig")
    code = r"""
import ctypes, sys
L = ctypes.CDLL(sys.argv[1])
class Pci2(ctypes.Structure):
    _fields_ = [("busId", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("r", ctypes.c_uint * 4)]
n = ctypes.c_uint()
h = ctypes.c_void_p()
out = [L.nvmlDeviceGetCount_v2(ctypes.byref(n))]          # before init: 1
out.append(L.nvmlInit_v2())
out.append(L.nvmlInit())                                   # v1 name exported too; refcounted
out.append(L.nvmlDeviceGetCount(ctypes.byref(n))); out.append(n.value)
out.append(L.nvmlDeviceGetHandleByIndex(0, ctypes.byref(h)))
p = Pci2()
out.append(L.nvmlDeviceGetPciInfo(h, ctypes.byref(p))); out.append(p.busId.decode())
out.append(L.nvmlDeviceGetPciInfo_v2(h, ctypes.byref(p))); out.append(hex(p.pciDeviceId))
buf = ctypes.create_string_buffer(8)
out.append(L.nvmlDeviceGetName(h, buf, 8))                 # 7: INSUFFICIENT_SIZE
out.append(L.nvmlDeviceGetHandleByIndex_v2(99, ctypes.byref(h)))   # 2: INVALID_ARGUMENT
out.append(L.nvmlDeviceGetHandleByUUID(b"GPU-00000000-0000-0000-0000-000000000000", ctypes.byref(h)))  # 6
out.append(L.nvmlDeviceGetHandleByPciBusId_v2(b"0000:2A:00.0", ctypes.byref(h)))
mig = ctypes.c_void_p(); ui = ctypes.c_uint()
out.append(L.nvmlDeviceGetMigDeviceHandleByIndex(h, 7, ctypes.byref(mig)))  # 2: >= max (7)
out.append(L.nvmlDeviceGetGpuInstanceId(h, ctypes.byref(ui)))               # 3: not a MIG handle
out.append(L.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h, ctypes.byref(mig)))  # 2
out.append(L.nvmlDeviceGetHandleByIndex_v2(5, ctypes.byref(h)))
out.append(L.nvmlDeviceGetMigDeviceHandleByIndex(h, 0, ctypes.byref(mig)))  # 3: MIG disabled
L.nvmlErrorString.restype = ctypes.c_char_p
out.append(L.nvmlErrorString(18).decode())
out += [L.nvmlShutdown(), L.nvmlShutdown(), L.nvmlShutdown()]   # 0, 0, then 1: UNINITIALIZED
print(out)
"""
    r = run([sys.executable, "-c", code, str(root / LIBDIR / "libnvidia-ml.so.1")])
    assert r.returncode == 0, r.stderr
    assert eval(r.stdout) == [1, 0, 0, 0, 8, 0, 0, "0000:18:00.0", 0, "0x233010de", 7, 2, 6, 0,
                              2, 3, 2, 0, 3, "RM has detected an NVML/RM version mismatch.", 0, 0, 1]
    r = run(["nm", "-D", "--defined-only", str(root / LIBDIR / "libnvidia-ml.so.1")])
    exported = set(re.findall(r" T (\w+)$", r.stdout, re.M))
    for fn in ("nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags", "nvmlDeviceGetCount", "nvmlDeviceGetCount_v2",
               "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetPciInfo",
               "nvmlDeviceGetPciInfo_v2", "nvmlDeviceGetPciInfo_v3", "nvmlSystemGetCudaDriverVersion_v2"):
        assert fn in exported
    assert not any(s.startswith(("find_root", "load_state")) for s in exported)   # internals stay hidden


BAD = [
    ({"gpus": [{"name": "A", "architecture": "Ampere", "memory_mib": 1},
               {"name": "B", "architecture": "Ampere", "memory_mib": 1},
               {"name": "C", "architecture": "Ampere", "memory_mib": 1, "uuid": "1234"}]},
     "profile gpus[2].uuid: expected 'GPU-' uuid"),
    ({"gpus": [{"architecture": "Ampere", "memory_mib": 1}]}, "profile gpus[0].name: required field missing"),
    ({"gpus": []}, "profile gpus: at least one GPU is required"),
    ({"gpus": [{"name": "A", "cc": "8.0", "memory_mib": 1}], "colour": 1}, "profile colour: unknown field"),
    ({"gpus": [{"name": "A", "cc": "8.0", "memory_mib": "big"}]}, "profile gpus[0].memory_mib: expected an integer"),
    ({"gpus": [{"name": "A", "cc": "8.0", "memory_mib": 1, "minor": 0},
               {"name": "A", "cc": "8.0", "memory_mib": 1, "minor": 0, "bus_id": "0000:09:00.0"}]},
     "profile gpus[1].minor: same as gpus[0].minor"),
    ({"gpus": [{"name": "A100", "cc": "8.0", "memory_mib": 1,
                "mig": [{"gi": 15, "ci": 0, "name": "1g.5gb", "memory_mib": 1}]}]},
     "profile gpus[0].mig[0].gi: GPU instance id must be 0..14"),
    ({"gpus": [{"name": "A", "cc": "8.0", "memory_mib": 1, "bus_id": "07:00"}]}, "profile gpus[0].bus_id: expected a PCI address"),
    ({"gpus": [{"name": "A", "cc": "8.0", "memory_mib": 1, "brand": "Acme"}]}, "profile gpus[0].brand: unknown brand"),
    ({"driver_version": "latest", "gpus": [{"name": "A", "cc": "8.0", "memory_mib": 1}]}, "profile driver_version: expected a version"),
    ({"gpus": [{"name": "A", "cc": "8.0", "memory_mib": 1}], "libraries": ["libcuda"]},
     "profile libraries: libnvidia-ml is required"),
    ({"gpus": [{"name": "A", "cc": "8.0", "memory_mib": 1}], "binaries": ["../../etc/passwd"]},
     "profile binaries[0]: expected a file name"),
    ({"gpus": [{"name": "A", "cc": "8.0", "memory_mib": 1}], "imex_channels": 4096},
     "profile imex_channels: must be 0..2048"),
    ({"gpus": [{"name": "A", "cc": "8.0", "memory_mib": 1}], "imex_channels": 1, "imex_major": 236},
     "profile imex_major: must differ from uvm_major and caps_major"),
]


@pytest.mark.parametrize("data,message", BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_profile_names_the_field_and_leaves_nothing(tmp_path, data, message):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(NvhookError) as e:
        create_host(out / "host", profile_file=bad)
    assert str(e.value).startswith(message), str(e.value)
    assert list(out.iterdir()) == []


def test_bad_profile_via_cli(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"gpus": [{"name": "A", "cc": "8.0", "memory_mib": 1, "uuid": "GPU-x"}]}')
    r = run([NVHOOK, "sim", "create", "--profile-file", str(bad), str(tmp_path / "h")])
    assert r.returncode == 1
    assert r.stderr.startswith("nvhook: profile gpus[0].uuid: expected 'GPU-' uuid")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json"]
    bad.write_text("{not json")
    r = run([NVHOOK, "sim", "create", "--profile-file", str(bad), str(tmp_path / "h")])
    assert r.returncode == 1 and "invalid JSON at line 1" in r.stderr


def test_failure_midway_leaves_nothing(tmp_path, monkeypatch):
    def boom(root, prof):
        raise NvhookError("injected failure")

    monkeypatch.setattr(build, "_install_procfs", boom)
    with pytest.raises(NvhookError, match="injected failure"):
        create_host(tmp_path / "host", profile="t4x1")
    assert list(tmp_path.iterdir()) == []


def test_dest_must_be_new_or_empty(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full/x").write_text("keep me")
    with pytest.raises(NvhookError, match="not an empty directory"):
        create_host(tmp_path / "full", profile="t4x1")
    assert (tmp_path / "full/x").read_text() == "keep me"
    (tmp_path / "empty").mkdir()
    assert create_host(tmp_path / "empty", profile="t4x1") == tmp_path / "empty"
    assert (tmp_path / "empty/usr/bin/nvidia-smi").is_file()
    with pytest.raises(NvhookError, match="not both"):
        create_host(tmp_path / "x", profile="t4x1", profile_file=tmp_path / "p.json")
    with pytest.raises(NvhookError, match="unknown profile 'nope'"):
        create_host(tmp_path / "x", profile="nope")


def test_custom_profile_file_with_defaults(tmp_path):
    p = tmp_path / "mine.json"
    p.write_text(json.dumps({"driver_version": "535.183.01", "cuda_version": "12.2", "compat32": False,
                             "gpus": [{"name": "NVIDIA A10", "architecture": "Ampere", "memory_mib": 23028}],
                             "libraries": ["libnvidia-ml", "libcuda", {"name": "libnvidia-foo", "soname": "libnvidia-foo.so.3"}]}))
    root = create_host(tmp_path / "h", profile_file=p)
    out = probe(root)
    assert out["driver"] == "535.183.01" and out["cuda"] == 12020
    g = out["gpus"][0]
    assert g["uuid"].startswith("GPU-") and g["cc"] == [8, 0] and g["brand"] == BRANDS["Nvidia"]
    assert g["mig_mode"] == 3 and g["bus_id"] == "00000000:01:00.0"
    names = {e[0] for e in _ldcache(root)}
    assert {"libnvidia-ml.so.1", "libcuda.so.1", "libnvidia-foo.so.3"} <= names
    assert not (root / "usr/lib/i386-linux-gnu").exists()
    assert (root / f"{LIBDIR}/libnvidia-foo.so.535.183.01").is_file()


def test_cli_create_and_rootfs(tmp_path):
    r = run([NVHOOK, "sim", "create", "--profile", "rtx4090x1", str(tmp_path / "h")])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tmp_path / "h")
    assert smi(tmp_path / "h", "-L").stdout.startswith("GPU 0: NVIDIA GeForce RTX 4090 (UUID: GPU-")
    r = run([NVHOOK, "sim", "rootfs", "--layout", "rpm", str(tmp_path / "r")])
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "r/lib64/libc.so.6").is_file() and (tmp_path / "r/bin/busybox").is_file()
    assert not list((tmp_path / "r").rglob("libvulkan.so*"))
    r = run([NVHOOK, "sim", "rootfs", "--vulkan", str(tmp_path / "v")])
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "v/usr/lib/x86_64-linux-gnu/libvulkan.so.1").resolve().is_file()


def test_warm_create_is_fast(sim_host, tmp_path):
    sim_host("a100x8")   # compiled artifacts are now in the cache
    t0 = time.monotonic()
    create_host(tmp_path / "h", profile="a100x8")
    assert time.monotonic() - t0 < 1.0


def test_imex_channels_profile(sim_cache):
    """IMEX channels as the driver makes them (NVreg_ImexChannelCount): the nodes under
    dev/nvidia-caps-imex-channels and the major's /proc/devices entry, which
    nvidia-container-cli reads (without them its --imex-channel crashed on the sim)."""
    from support.nvidia_parity import IMEX_PROFILE

    root = create_host(sim_cache / "imex-sim", profile_file=IMEX_PROFILE)
    nodes = sorted((root / "dev/nvidia-caps-imex-channels").iterdir())
    assert [n.name for n in nodes] == ["channel0", "channel1", "channel2", "channel3"]
    assert [(os.major(n.stat().st_rdev), os.minor(n.stat().st_rdev)) for n in nodes] == [(237, i) for i in range(4)]
    assert "237 nvidia-caps-imex-channels\n" in (root / "proc/devices").read_text()
    r = run([NVHOOK, "--root", str(root), "list", "--imex-channel=2"])
    assert "/dev/nvidia-caps-imex-channels/channel2" in r.stdout.splitlines()


def test_sim_mig_makes_and_destroys_a_mig_device(fresh_sim_host):
    """`nvhook sim mig`: what nvidia-smi mig -cgi/-dgi change on a real host (NVML's MIG
    devices, the nvidia-caps nodes, the capability files), checked through the
    simulated nvidia-smi; a bad request is one line and changes nothing."""
    root = fresh_sim_host("h100x8-mig")
    r = run([NVHOOK, "sim", "mig", str(root), "--gpu", "3", "--create", "1g.10gb"])
    assert r.returncode == 0, r.stderr
    uuid = r.stdout.split()[-1]
    assert r.stdout == f"created gi 1 ci 0 1g.10gb {uuid}\n"
    smi = run(["chroot", str(root), "nvidia-smi", "-L"]).stdout
    assert f"  MIG 1g.10gb     Device  0: (UUID: {uuid})" in smi.splitlines()
    assert (root / "proc/driver/nvidia/capabilities/gpu3/mig/gi1/ci0/access").read_text().startswith(
        f"DeviceFileMinor: {ci_minor(3, 1, 0)}\n")
    assert (root / f"dev/nvidia-caps/nvidia-cap{gi_minor(3, 1)}").is_char_device()
    before = sorted(p.name for p in (root / "dev/nvidia-caps").iterdir())
    for where, args, why in ((root, ["--gpu", "4", "--create", "1g.10gb"], "GPU 4 is not in MIG mode"),
                             (root, ["--gpu", "3", "--create", "huge"], "expected a MIG profile"),
                             (root, ["--gpu", "3", "--destroy", "9"], "GPU 3 has no MIG device gi 9 ci 0"),
                             (root, ["--gpu", "3", "--destroy", "x"], "expected GI or GI:CI"),
                             (root / "proc", ["--gpu", "3", "--create", "1g.10gb"], "not a simulated host")):
        bad = run([NVHOOK, "sim", "mig", str(where), *args])
        assert bad.returncode != 0 and bad.stdout == "" and bad.stderr.startswith("nvhook: sim mig"), bad.stderr
        assert why in bad.stderr and len(bad.stderr.splitlines()) == 1
    assert sorted(p.name for p in (root / "dev/nvidia-caps").iterdir()) == before
    r = run([NVHOOK, "sim", "mig", str(root), "--gpu", "3", "--destroy", "1:0"])
    assert r.returncode == 0, r.stderr
    assert uuid not in run(["chroot", str(root), "nvidia-smi", "-L"]).stdout
    assert not (root / "proc/driver/nvidia/capabilities/gpu3").joinpath("mig/gi1").exists()
    assert not (root / f"dev/nvidia-caps/nvidia-cap{gi_minor(3, 1)}").exists()
