"""The simulated host's graphics/display surface (profile option `graphics`): the EGL,
GBM, Wayland and Vulkan-producer libraries, the files the EGL/Vulkan/X loaders read,
the X driver modules, DRM nodes with their by-path links and sysfs view, and the Vulkan
ICD in the simulated libGLX_nvidia, driven by a real Vulkan loader (Debian's libvulkan1)
on this host and in a chroot.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path

import pytest

from conftest import run
from libinject.errors import NvhookError
from libinject.sim import build
from libinject.sim.build import create_host
from libinject.sim.profile import GRAPHICS_ONLY, PROFILES_DIR, load_profile, parse_profile
from libinject.sim.rootfs import build_rootfs
from support.vkprobe import on_host_env, vkprobe_binary

LIBDIR = "usr/lib/x86_64-linux-gnu"
VER = "550.163.01"
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"
# (file, SONAME) of the libraries only a graphics host has
GRAPHICS_LIBS = [("libnvidia-egl-gbm.so.1.1.1", "libnvidia-egl-gbm.so.1"),
                 ("libnvidia-egl-wayland.so.1.1.13", "libnvidia-egl-wayland.so.1"),
                 ("libnvidia-egl-wayland2.so.1.0.0", "libnvidia-egl-wayland2.so.1"),
                 ("libnvidia-egl-xcb.so.1.0.0", "libnvidia-egl-xcb.so.1"),
                 ("libnvidia-egl-xlib.so.1.0.0", "libnvidia-egl-xlib.so.1"),
                 (f"libnvidia-vulkan-producer.so.{VER}", f"libnvidia-vulkan-producer.so.{VER}")]
EGL_PLATFORMS = {"09_nvidia_wayland2.json": "libnvidia-egl-wayland2.so.1",
                 "10_nvidia_wayland.json": "libnvidia-egl-wayland.so.1",
                 "15_nvidia_gbm.json": "libnvidia-egl-gbm.so.1",
                 "20_nvidia_xcb.json": "libnvidia-egl-xcb.so.1",
                 "20_nvidia_xlib.json": "libnvidia-egl-xlib.so.1"}
# Everything a graphics host adds (a non-graphics host has none of it).
GRAPHICS_PATHS = [*(f"{LIBDIR}/{f}" for f, _ in GRAPHICS_LIBS), f"{LIBDIR}/gbm/nvidia-drm_gbm.so",
                  *(f"usr/share/egl/egl_external_platform.d/{n}" for n in EGL_PLATFORMS),
                  "usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
                  f"usr/share/nvidia/nvidia-application-profiles-{VER}-rc",
                  f"usr/share/nvidia/nvidia-application-profiles-{VER}-key-documentation",
                  "usr/share/nvidia/nvoptix.bin", "usr/lib/xorg", "usr/share/X11", "dev/dri", "sys/class"]
# Two workstation GPUs given out of PCI order, one in PCI domain 1.
TWO_GPUS = {"description": "two RTX A6000", "compat32": False,
            "gpus": [{"name": "NVIDIA RTX A6000", "brand": "NvidiaRTX", "architecture": "Ampere",
                      "memory_mib": 49140, "bus_id": "00000001:02:00.0", "pci_device_id": "0x223010DE"},
                     {"name": "NVIDIA RTX A4000", "brand": "NvidiaRTX", "architecture": "Ampere",
                      "memory_mib": 16376, "bus_id": "0000:41:00.0", "pci_device_id": "0x24B010DE"}]}


def gpu(brand: str | None = None, name: str = "G") -> dict:
    return {"name": name, "cc": "8.6", "memory_mib": 1, **({"brand": brand} if brand else {})}


def ldcache(root: Path) -> dict[str, str]:
    """{SONAME: path} of root's 64-bit ld.so.cache entries, as ldconfig prints them."""
    r = run(["ldconfig", "-p", "-C", str(root / "etc/ld.so.cache")])
    assert r.returncode == 0, r.stderr
    return dict(re.findall(r"^\s+(\S+) \(libc6,x86-64\) => (\S+)$", r.stdout, re.M))


def readelf_dynamic(path: Path) -> str:
    r = run(["readelf", "-d", str(path)])
    assert r.returncode == 0, r.stderr
    return r.stdout


def soname(path: Path) -> str | None:
    m = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", readelf_dynamic(path))
    return m.group(1) if m else None


def chr_dev(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    assert stat.S_ISCHR(st.st_mode), path
    return os.major(st.st_rdev), os.minor(st.st_rdev)


@pytest.fixture(scope="session")
def vkprobe(tmp_path_factory) -> Path:
    return vkprobe_binary(tmp_path_factory.mktemp("vkprobe"))


@pytest.fixture(scope="session")
def two_gpu_host(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("twogpu")
    (d / "two.json").write_text(json.dumps(TWO_GPUS))
    return create_host(d / "host", profile_file=d / "two.json")


# ---------------------------------------------------------------- the profile option

@pytest.mark.parametrize("brands,expected", [
    (["GeForce"], True), (["GeForceRTX"], True), (["Quadro"], True), (["QuadroRTX"], True),
    (["NvidiaRTX"], True), (["Titan"], True), (["TitanRTX"], True),
    (["Tesla"], False), (["Nvidia"], False), (["Grid"], False),
    (["Tesla", "Quadro"], True), ([None], False)])
def test_graphics_defaults_from_the_brands(brands, expected):
    gpus = [{**gpu(b), "bus_id": f"0000:{i + 1:02x}:00.0"} for i, b in enumerate(brands)]
    prof = parse_profile({"gpus": gpus})
    assert prof.graphics is expected
    names = {s.name for s in prof.libraries}
    assert set(GRAPHICS_ONLY) & names == (set(GRAPHICS_ONLY) if expected else set())


def test_graphics_default_from_a_geforce_name():
    assert parse_profile({"gpus": [gpu(name="NVIDIA GeForce RTX 3090")]}).graphics


def test_builtin_profiles():
    assert load_profile("rtx4090x1").graphics
    raw = json.loads((PROFILES_DIR / "rtx4090x1.json").read_text())
    assert raw["graphics"] is True                                  # said, not just defaulted
    assert not any(load_profile(n).graphics for n in ("a100x8", "h100x8-mig", "t4x1"))


def test_graphics_explicit_wins_over_the_brand():
    off = parse_profile({"gpus": [gpu("GeForce")], "graphics": False})
    assert not off.graphics and not {s.name for s in off.libraries} & set(GRAPHICS_ONLY)
    on = parse_profile({"gpus": [gpu("Tesla")], "graphics": True})
    assert on.graphics and set(GRAPHICS_ONLY) <= {s.name for s in on.libraries}


def test_graphics_adds_the_libraries_its_files_name():
    prof = parse_profile({"gpus": [gpu("Tesla")], "graphics": True, "libraries": ["libnvidia-ml", "libcuda"]})
    names = [s.name for s in prof.libraries]
    assert names[:2] == ["libnvidia-ml", "libcuda"]
    assert {"libGLX_nvidia", "libEGL_nvidia", "libnvidia-allocator", *GRAPHICS_ONLY} <= set(names)
    assert len(names) == len(set(names))


def test_library_versions_of_their_own():
    libs = {s.name: s for s in load_profile("rtx4090x1").libraries}
    assert libs["libnvidia-egl-wayland"].file_name(VER) == "libnvidia-egl-wayland.so.1.1.13"
    assert libs["libnvidia-egl-wayland"].real_soname(VER) == "libnvidia-egl-wayland.so.1"
    assert libs["libnvidia-vulkan-producer"].real_soname(VER) == f"libnvidia-vulkan-producer.so.{VER}"
    assert libs["libcuda"].file_name(VER) == f"libcuda.so.{VER}"
    custom = parse_profile({"gpus": [gpu()], "libraries": [
        "libnvidia-ml", {"name": "libnvidia-egl-foo", "soname": "libnvidia-egl-foo.so.1", "version": "1.2.3"}]})
    assert custom.libraries[1].file_name(VER) == "libnvidia-egl-foo.so.1.2.3"


@pytest.mark.parametrize("data,message", [
    ({"gpus": [gpu()], "graphics": "yes"}, "profile graphics: expected bool, got 'yes'"),
    ({"gpus": [gpu()], "graphics": 1}, "profile graphics: expected bool, got 1"),
    ({"gpus": [gpu("GeForce")], "uvm_major": 226},
     "profile uvm_major: must not be 226 (DRM's) on a graphics host"),
    ({"gpus": [gpu()], "libraries": ["libnvidia-ml", {"name": "libnvidia-egl-foo", "version": "1.x"}]},
     "profile libraries[1].version: expected a version like '1.1.13', got '1.x'"),
])
def test_bad_graphics_profile_is_one_line_and_leaves_nothing(tmp_path, data, message):
    (tmp_path / "bad.json").write_text(json.dumps(data))
    (tmp_path / "out").mkdir()
    with pytest.raises(NvhookError) as e:
        create_host(tmp_path / "out/host", profile_file=tmp_path / "bad.json")
    assert str(e.value) == message
    assert list((tmp_path / "out").iterdir()) == []


def test_no_drm_major_clash_without_graphics():
    assert parse_profile({"gpus": [gpu("Tesla")], "uvm_major": 226}).uvm_major == 226


# ---------------------------------------------------------------- the layout

def test_graphics_libraries_are_real_and_in_the_ldcache(sim_host):
    root = sim_host("rtx4090x1")
    cache = ldcache(root)
    for fname, so in GRAPHICS_LIBS:
        real = root / LIBDIR / fname
        assert real.is_file() and not real.is_symlink() and real.read_bytes()[:4] == b"\x7fELF"
        assert soname(real) == so
        assert "Shared library: [libc.so.6]" in readelf_dynamic(real)
        assert cache[so] == f"/{LIBDIR}/{so}"
        assert os.path.realpath(root / LIBDIR / so) == str(real)
        assert not (root / "usr/lib/i386-linux-gnu" / fname).exists()     # 64-bit only
    gbm = root / LIBDIR / "gbm/nvidia-drm_gbm.so"
    assert os.readlink(gbm) == "../libnvidia-allocator.so.1"
    assert soname(gbm.resolve()) == "libnvidia-allocator.so.1"


def test_loader_files_name_libraries_of_the_ldcache(sim_host):
    root = sim_host("rtx4090x1")
    cache = ldcache(root)
    share = root / "usr/share"

    def manifest(rel: str) -> dict:
        data = json.loads((share / rel).read_text())
        lib = (data.get("ICD") or data["layer"])["library_path"]
        assert lib in cache and (root / cache[lib].lstrip("/")).is_file(), (rel, lib)
        return data

    assert manifest("glvnd/egl_vendor.d/10_nvidia.json") == {
        "file_format_version": "1.0.0", "ICD": {"library_path": "libEGL_nvidia.so.0"}}
    platforms = sorted(p.name for p in (share / "egl/egl_external_platform.d").iterdir())
    assert platforms == sorted(EGL_PLATFORMS)
    for name, lib in EGL_PLATFORMS.items():
        assert manifest(f"egl/egl_external_platform.d/{name}") == {
            "file_format_version": "1.0.0", "ICD": {"library_path": lib}}
    icd = manifest("vulkan/icd.d/nvidia_icd.json")
    assert icd["ICD"] == {"library_path": "libGLX_nvidia.so.0", "api_version": "1.3.277"}
    assert manifest("vulkan/implicit_layer.d/nvidia_layers.json") == {
        "file_format_version": "1.0.0",
        "layer": {"name": "VK_LAYER_NV_optimus", "type": "INSTANCE", "library_path": "libGLX_nvidia.so.0",
                  "api_version": "1.3.277", "implementation_version": "1",
                  "description": "NVIDIA Optimus layer",
                  "functions": {"vkGetInstanceProcAddr": "vk_optimusGetInstanceProcAddr",
                                "vkGetDeviceProcAddr": "vk_optimusGetDeviceProcAddr"},
                  "enable_environment": {"__NV_PRIME_RENDER_OFFLOAD": "1"},
                  "disable_environment": {"DISABLE_LAYER_NV_OPTIMUS_1": ""}}}
    assert "libnvidia-opencl.so.1" in cache
    assert (root / "etc/OpenCL/vendors/nvidia.icd").read_text() == "libnvidia-opencl.so.1\n"


def test_application_profiles_optix_and_x_files(sim_host):
    root = sim_host("rtx4090x1")
    nv = root / "usr/share/nvidia"
    assert json.loads((nv / f"nvidia-application-profiles-{VER}-rc").read_text()) == {"rules": [], "profiles": []}
    assert "GLShaderDiskCache" in (nv / f"nvidia-application-profiles-{VER}-key-documentation").read_text()
    assert (nv / "nvoptix.bin").stat().st_size > 0
    for conf in ("10-nvidia.conf", "nvidia-drm-outputclass.conf"):
        text = (root / "usr/share/X11/xorg.conf.d" / conf).read_text()
        section = text[text.index('Section "OutputClass"'):]
        assert re.search(r'^\s+MatchDriver "nvidia-drm"$', section, re.M), conf
        assert re.search(r'^\s+Driver "nvidia"$', section, re.M), conf
        assert section.rstrip().endswith("EndSection"), conf
    mods = root / "usr/lib/xorg/modules"
    drv = mods / "drivers/nvidia_drv.so"
    assert drv.is_file() and not drv.is_symlink() and drv.read_bytes()[:4] == b"\x7fELF"
    assert soname(drv) is None
    glx = mods / f"extensions/libglxserver_nvidia.so.{VER}"
    assert glx.is_file() and not glx.is_symlink() and soname(glx) == glx.name
    assert os.readlink(mods / "extensions/libglxserver_nvidia.so") == glx.name
    assert "libglxserver_nvidia.so" not in " ".join(ldcache(root))     # not a library dir


@pytest.mark.parametrize("which", ["rtx4090x1", "two"])
def test_drm_nodes_links_and_sysfs_agree(sim_host, two_gpu_host, which):
    root = sim_host("rtx4090x1") if which == "rtx4090x1" else two_gpu_host
    buses = ["0000:01:00.0"] if which == "rtx4090x1" else ["0000:41:00.0", "0001:02:00.0"]   # PCI order
    dri = root / "dev/dri"
    assert sorted(p.name for p in dri.iterdir()) == sorted(
        ["by-path", *(f"card{i}" for i in range(len(buses))), *(f"renderD{128 + i}" for i in range(len(buses)))])
    for i, bus in enumerate(buses):
        for kind, node, minor in (("card", f"card{i}", i), ("render", f"renderD{128 + i}", 128 + i)):
            assert chr_dev(dri / node) == (226, minor)
            assert stat.S_IMODE(os.lstat(dri / node).st_mode) == 0o666
            assert os.readlink(dri / f"by-path/pci-{bus}-{kind}") == f"../{node}"
            sysdir = root / f"sys/bus/pci/devices/{bus}/drm/{node}"
            assert sysdir.is_dir() and not sysdir.is_symlink()
            assert (sysdir / "dev").read_text() == f"226:{minor}\n"
            link = root / f"sys/class/drm/{node}"
            assert os.readlink(link) == f"../../bus/pci/devices/{bus}/drm/{node}"
            assert link.resolve() == sysdir.resolve()
    assert sorted(p.name for p in (dri / "by-path").iterdir()) == sorted(
        f"pci-{b}-{k}" for b in buses for k in ("card", "render"))
    devices = (root / "proc/devices").read_text()
    assert re.search(r"^Character devices:\n195 nvidia-frontend\n226 drm\n235 nvidia-uvm\n236 nvidia-caps\n\n",
                     devices), devices


def test_modeset_node_stays(sim_host):
    assert chr_dev(sim_host("rtx4090x1") / "dev/nvidia-modeset") == (195, 254)


@pytest.mark.parametrize("name", ["a100x8", "t4x1"])
def test_non_graphics_host_is_as_before(sim_host, name):
    root = sim_host(name)
    assert [p for p in GRAPHICS_PATHS if os.path.lexists(root / p)] == []
    # every host has its GPUs' PCI identity in sysfs; only graphics hosts their DRM nodes
    assert not list(root.glob("sys/bus/pci/devices/*/drm"))
    assert not list(root.glob(f"{LIBDIR}/libnvidia-egl-*"))
    assert "drm" not in (root / "proc/devices").read_text()
    # what such a host made before stays
    for p in ("usr/share/glvnd/egl_vendor.d/10_nvidia.json", "usr/share/vulkan/icd.d/nvidia_icd.json",
              "etc/OpenCL/vendors/nvidia.icd", f"{LIBDIR}/libGLX_nvidia.so.0"):
        assert (root / p).is_file(), p


def test_graphics_can_be_turned_off(tmp_path):
    data = json.loads((PROFILES_DIR / "rtx4090x1.json").read_text())
    (tmp_path / "p.json").write_text(json.dumps({**data, "graphics": False}))
    root = create_host(tmp_path / "h", profile_file=tmp_path / "p.json")
    assert [p for p in GRAPHICS_PATHS if os.path.lexists(root / p)] == []
    assert (root / "dev/nvidia-modeset").exists()


def test_drm_minors_follow_pci_order_not_nvidia_minors(tmp_path):
    data = {**TWO_GPUS, "gpus": [{**TWO_GPUS["gpus"][0], "minor": 0}, {**TWO_GPUS["gpus"][1], "minor": 7}]}
    (tmp_path / "p.json").write_text(json.dumps(data))
    root = create_host(tmp_path / "h", profile_file=tmp_path / "p.json")
    assert os.readlink(root / "dev/dri/by-path/pci-0000:41:00.0-card") == "../card0"    # /dev/nvidia7
    assert os.readlink(root / "dev/dri/by-path/pci-0001:02:00.0-card") == "../card1"    # /dev/nvidia0


# ---------------------------------------------------------------- the Vulkan ICD

def test_libglx_exports_only_the_icd_entry_points(sim_host):
    root = sim_host("rtx4090x1")
    r = run(["readelf", "--dyn-syms", "-W", str(root / LIBDIR / "libGLX_nvidia.so.0")])
    exported = set(re.findall(r"\s(?:FUNC|OBJECT)\s+GLOBAL\s+DEFAULT\s+\d+\s+(\S+)$", r.stdout, re.M))
    assert {"vk_icdNegotiateLoaderICDInterfaceVersion", "vk_icdGetInstanceProcAddr",
            "vk_icdGetPhysicalDeviceProcAddr"} <= exported
    assert not [s for s in exported if s.startswith("vk") and not s.startswith("vk_icd")]   # no clash with libvulkan
    # the 32-bit copy is an ICD too
    r = run(["readelf", "--dyn-syms", "-W", str(root / "usr/lib/i386-linux-gnu/libGLX_nvidia.so.0")])
    assert "vk_icdGetInstanceProcAddr" in r.stdout
    # other libraries are not
    r = run(["readelf", "--dyn-syms", "-W", str(root / LIBDIR / "libEGL_nvidia.so.0")])
    assert "vk_icd" not in r.stdout


def test_vk_driver_version_encoding():
    v = build.vk_driver_version("550.163.01")
    assert (v >> 22, v >> 14 & 0xFF, v >> 6 & 0xFF, v & 0x3F) == (550, 163, 1, 0)
    assert build.vk_driver_version("535.54") == 535 << 22 | 54 << 14


def test_vulkan_loader_lists_the_gpu(sim_host, vkprobe):
    root = sim_host("rtx4090x1")
    r = run([str(vkprobe)], env=on_host_env(root))
    assert (r.returncode, r.stdout) == (0, "VK NVIDIA GeForce RTX 4090 vendor=0x10de type=2\n"), r.stderr
    r = run([str(vkprobe), "-v"], env=on_host_env(root))
    assert r.stdout == (f"VK NVIDIA GeForce RTX 4090 vendor=0x10de type=2 device=0x2684 "
                        f"driver=0x{build.vk_driver_version(VER):x} api=1.3.277\n")


def test_loader_read_our_manifest_and_loaded_our_library(sim_host, vkprobe):
    root = sim_host("rtx4090x1")
    r = run([str(vkprobe)], env={**on_host_env(root), "VK_LOADER_DEBUG": "driver", "LD_DEBUG": "libs"})
    assert r.returncode == 0 and r.stdout.startswith("VK NVIDIA GeForce RTX 4090 "), r.stdout + r.stderr
    icd = root / "usr/share/vulkan/icd.d/nvidia_icd.json"
    assert f'Found ICD manifest file {icd}, version "1.0.1"' in r.stderr
    assert "Searching for ICD drivers named libGLX_nvidia.so.0" in r.stderr
    assert "[0] NVIDIA GeForce RTX 4090" in r.stderr                # the loader's own device list
    # the dynamic linker's account: the library the loader asked for came from the sim root
    assert re.search(rf"calling init: {re.escape(str(root / LIBDIR))}/libGLX_nvidia\.so\.0$", r.stderr, re.M)


def test_two_gpus_in_pci_order_and_only_those_in_procfs(two_gpu_host, vkprobe, tmp_path):
    root = two_gpu_host
    r = run([str(vkprobe), "-v"], env=on_host_env(root))
    lines = r.stdout.splitlines()
    assert [line.split(" vendor=")[0] for line in lines] == ["VK NVIDIA RTX A4000", "VK NVIDIA RTX A6000"]
    assert ["device=0x24b0" in lines[0], "device=0x2230" in lines[1]] == [True, True]
    # As a container sees it: nvhook's masked /proc/driver/nvidia holds the injected GPUs only.
    masked = tmp_path / "nvidia"
    shutil.copytree(root / "proc/driver/nvidia", masked)
    shutil.rmtree(masked / "gpus/0000:41:00.0")
    r = run([str(vkprobe)], env=on_host_env(root, masked))
    assert r.stdout == "VK NVIDIA RTX A6000 vendor=0x10de type=2\n"


@pytest.mark.parametrize("procfs", ["empty", "missing", "no-model"])
def test_no_gpu_prints_none(sim_host, vkprobe, tmp_path, procfs):
    root = sim_host("rtx4090x1")
    d = tmp_path / "nvidia"
    if procfs == "empty":
        (d / "gpus").mkdir(parents=True)
    elif procfs == "no-model":        # a GPU dir whose information has no Model: line
        (d / "gpus/0000:01:00.0").mkdir(parents=True)
        (d / "gpus/0000:01:00.0/information").write_text("IRQ: 150\n")
    r = run([str(vkprobe)], env={**on_host_env(root, d), "VK_LOADER_DEBUG": "driver"})
    assert (r.returncode, r.stdout) == (0, "VK none\n"), r.stderr
    assert "Searching for ICD drivers named libGLX_nvidia.so.0" in r.stderr     # the ICD was there


def test_loader_without_our_icd_is_a_failure(vkprobe, tmp_path):
    r = run([str(vkprobe)], env={"PATH": "/usr/bin:/bin", "VK_ICD_FILENAMES": str(tmp_path / "none.json")})
    assert (r.returncode, r.stdout) == (1, "VK error: vkCreateInstance: VkResult -9\n")   # INCOMPATIBLE_DRIVER


def test_loader_finds_icd_and_skips_the_implicit_layer_by_default(sim_host, vkprobe, tmp_path):
    """Found by the loader's own search (XDG_DATA_DIRS/vulkan/...) as in an image's
    /usr/share: the ICD is used, the Optimus layer read but left off (no PRIME offload)."""
    root = sim_host("rtx4090x1")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_CONFIG_DIRS": str(tmp_path),
           "XDG_DATA_DIRS": str(root / "usr/share"), "LD_LIBRARY_PATH": str(root / LIBDIR),
           "NVHOOK_SIM_PROCFS": str(root / "proc/driver/nvidia"), "VK_LOADER_DEBUG": "layer,driver,info"}
    r = run([str(vkprobe)], env=env)
    assert r.stdout == "VK NVIDIA GeForce RTX 4090 vendor=0x10de type=2\n", r.stderr
    assert f"Found manifest file {root}/usr/share/vulkan/implicit_layer.d/nvidia_layers.json" in r.stderr
    assert f"Found ICD manifest file {root}/usr/share/vulkan/icd.d/nvidia_icd.json" in r.stderr
    assert "VK_LAYER_NV_optimus" not in r.stderr.split("layer callstack setup to")[1]


# ---------------------------------------------------------------- an image with a loader

def test_rootfs_with_vulkan_loader(tmp_path):
    plain = build_rootfs(tmp_path / "plain")
    assert not list(plain.rglob("libvulkan*"))
    root = build_rootfs(tmp_path / "vk", vulkan=True)
    link = root / LIBDIR / "libvulkan.so.1"
    real = root / LIBDIR / os.readlink(link)
    assert real.name == os.path.basename(os.path.realpath(f"/{LIBDIR}/libvulkan.so.1"))
    assert real.is_file() and not real.is_symlink() and soname(real) == "libvulkan.so.1"
    rpm = build_rootfs(tmp_path / "rpm", lib_layout="rpm", vulkan=True)
    assert (rpm / "usr/lib64/libvulkan.so.1").resolve().is_file()


def test_vkprobe_in_a_chroot_with_the_driver_files(sim_host, vkprobe, tmp_path):
    """The image's own loader, default search paths and an ld.so.cache-less dlopen, and
    the ICD's default /proc/driver/nvidia: the driver files placed where nvhook mounts
    them, the procfs as the container's masked one (copied: a chroot mounts nothing)."""
    host = sim_host("rtx4090x1")
    root = build_rootfs(tmp_path / "rootfs", vulkan=True)
    for rel in (f"{LIBDIR}/libGLX_nvidia.so.{VER}", "usr/share/vulkan/icd.d/nvidia_icd.json",
                "usr/share/vulkan/implicit_layer.d/nvidia_layers.json"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(host / rel, root / rel)
    (root / LIBDIR / "libGLX_nvidia.so.0").symlink_to(f"libGLX_nvidia.so.{VER}")
    shutil.copy2(vkprobe, root / "usr/bin/vkprobe")
    r = run([CHROOT, str(root), "/usr/bin/vkprobe"], env={"PATH": "/usr/bin:/bin"})
    assert (r.returncode, r.stdout) == (0, "VK none\n"), r.stderr     # no /proc/driver/nvidia yet
    shutil.copytree(host / "proc/driver/nvidia", root / "proc/driver/nvidia")
    r = run([CHROOT, str(root), "/usr/bin/vkprobe"], env={"PATH": "/usr/bin:/bin"})
    assert (r.returncode, r.stdout) == (0, "VK NVIDIA GeForce RTX 4090 vendor=0x10de type=2\n"), r.stderr
