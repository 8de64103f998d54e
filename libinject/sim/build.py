"""Build a simulated GPU host: a directory laid out like a GPU host's driver root.

    create_host(dest, profile="a100x8")      # or profile_file="my.json"

Everything is real except the GPU: ELF libraries with the driver's SONAMEs and its
.note.ABI-tag (NVIDIA's own nvidia-container-cli checks it), a C mock
of libnvidia-ml (native/nvml_mock.c) that answers from the files of the root it is
loaded from, an nvidia-smi that links it, device nodes made with mknod, procfs files
in the driver's formats, sockets under run/ (var/run links to ../run, as /var/run is /run
on a real host), and an etc/ld.so.cache made by `ldconfig -r`. A graphics profile adds
the loaders' files (EGL, GBM, Vulkan ICD and layer, X), the X driver modules and DRM
nodes; its libGLX_nvidia is a Vulkan ICD that lists the GPUs of /proc/driver/nvidia.
The root also holds the host's glibc (lib/x86_64-linux-gnu) so `chroot ROOT
/usr/bin/nvidia-smi` works, as it does on a real GPU host. The host's architecture
(x86_64 or aarch64, libinject.sim.machine) says the multiarch dirs; an x86_64 host also
gets the i386 libraries where its compiler builds them (gcc-multilib).

C is compiled once per (sources, flags, driver version, arch) into a cache dir:
$NVHOOK_SIM_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/nvhook/sim. An installed package
carries the built-in profiles' objects prebuilt (sim/prebuilt, made by
packaging/build_bundle.py, cross-compiled for an arm64 package: build_artifacts' cc),
so a node without a compiler builds those hosts too.
The host is built in a temp dir next to dest and renamed into place at the end, so a
failure leaves nothing behind.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from libinject.errors import NvhookError
from libinject.record import asdict
from libinject.sim import machine as machmod
from libinject.sim import profile as profmod
from libinject.sim.profile import DRM_MAJOR, GpuSpec, LibSpec, Profile

NATIVE = Path(__file__).resolve().parent / "native"
# Read-only objects a package ships, named as the cache names them.
PREBUILT = Path(__file__).resolve().parent / "prebuilt"
CACHE_FORMAT = "6"   # bump when the compile recipe changes
CC = "gcc"
CFLAGS = ("-O2", "-Wall", "-Wno-format-truncation", "-fPIC", "-fvisibility=hidden")
# arch -> (multiarch dir, its compiler flags)
ARCHES = {"x86_64": ("x86_64-linux-gnu", ()), "i386": ("i386-linux-gnu", ("-m32",)),
          "aarch64": ("aarch64-linux-gnu", ())}
NVIDIA_MAJOR = 195
RENDER_MINOR_BASE = 128     # /dev/dri/renderD<128+i> is 226:<128+i>
# Dev links the .run installer makes besides the SONAME links.
DEV_LINKS = ("libcuda", "libnvidia-ml", "libnvcuvid", "libnvidia-encode", "libnvidia-opticalflow")
# Kernel version in the libraries' .note.ABI-tag (native/abi_note.S). libnvidia-container
# selects libnvidia-tls.so.* only when it says Linux 2.3.99 (the driver's TLS library
# for the NPTL ABI); the driver's other libraries are built the same way.
ABI_TAG = (2, 3, 99)


# ---------------------------------------------------------------- compile cache

def cache_dir() -> Path:
    env = os.environ.get("NVHOOK_SIM_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nvhook" / "sim"


def _compile(sources: list[str], flags: list[str], out_name: str, link: list[Path] = (),
             cc: tuple[str, ...] = (CC,)) -> Path:
    """gcc sources -> cache/<hash>-out_name (compiled only on a cache miss). cc: the
    compiler's command (a cross compiler for another machine's prebuilt objects: not
    part of the hash, so they are named as that machine's gcc would name them)."""
    h = hashlib.sha256(CACHE_FORMAT.encode())
    for name in sorted({*sources, "nvml.h", "nvml_sim.h"}):
        h.update(name.encode() + b"\0" + (NATIVE / name).read_bytes())
    # A linked object by its name (its own hash), not its dir: a prebuilt one names the same.
    for part in (*flags, *(p.name for p in link)):
        h.update(b"\0" + part.encode())
    name = f"{h.hexdigest()[:20]}-{out_name}"
    if (PREBUILT / name).is_file():
        return PREBUILT / name
    cdir = cache_dir()
    out = cdir / name
    if out.exists():
        return out
    if not shutil.which(cc[0]):
        raise NvhookError(f"simulated GPU: {out_name} is not among this install's prebuilt objects (built-in "
                          f"profiles only) and building it needs {cc[0]} (apt-get install gcc libc6-dev)")
    cdir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=cdir)
    os.close(fd)
    cmd = [*cc, *CFLAGS, *flags, f"-I{NATIVE}", "-o", tmp, *(str(NATIVE / s) for s in sources),
           *(str(p) for p in link)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            err = (r.stderr.strip().splitlines() or ["?"])[-1]
            raise NvhookError(f"compiling {out_name} failed: {err}")
        os.replace(tmp, out)   # atomic: concurrent builders race harmlessly
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _defines(prof: Profile) -> list[str]:
    return [f'-DSIM_DRIVER_VERSION="{prof.driver_version}"', f"-DSIM_CUDA_VERSION={prof.cuda_int}"]


def vk_driver_version(version: str) -> int:
    """The driver version as NVIDIA's Vulkan driver reports it in driverVersion:
    major 10 bits, minor 8, patch 8, then 6 unused ("550.163.01" -> 550, 163, 1)."""
    major, minor, patch = (int(x) for x in (version.split(".") + ["0"])[:3])
    return (major & 0x3FF) << 22 | (minor & 0xFF) << 14 | (patch & 0xFF) << 6


def _so_flags(prof: Profile, arch: str, soname: str | None) -> list[str]:
    # --no-as-needed -lc: DT_NEEDED libc.so.6 like the real libraries (ldconfig then tags
    # 32-bit entries "libc6" rather than plain "ELF").
    # abi_note.S: a .note.ABI-tag, as the driver's libraries carry. --build-id=none: so
    # that it is also the first (only) SHT_NOTE section: older libnvidia-container read
    # the first one, newer ones look it up by name.
    return [*ARCHES[arch][1], "-shared", *([f"-Wl,-soname,{soname}"] if soname else []),
            "-Wl,--no-as-needed", "-lc", "-Wl,--build-id=none", *_defines(prof),
            *(f"-DSIM_ABI_{k}={v}" for k, v in zip(("MAJOR", "MINOR", "PATCH"), ABI_TAG))]


def _build_lib(prof: Profile, lib: LibSpec, arch: str, cc: tuple[str, ...]) -> Path:
    flags = _so_flags(prof, arch, lib.real_soname(prof.driver_version))
    out_name = f"{arch}-{lib.file_name(prof.driver_version)}"
    if lib.name == "libnvidia-ml":
        return _compile(["nvml_mock.c", "nvml_mig.c", "nvml_stubs.c", "abi_note.S"], [*flags, "-lpthread", "-lm"],
                        out_name, cc=cc)
    flags.append(f'-DSIM_LIB="{lib.name}"')
    if lib.name == "libnvidia-sandboxutils":
        # nvSandboxUtils* answered from the NVML next to it (native/sandboxutils.c)
        return _compile(["driver_lib.c", "sandboxutils.c", "abi_note.S"], [*flags, "-ldl"], out_name, cc=cc)
    if lib.name == "libcuda":
        flags.append("-DSIM_LIBCUDA")
    if lib.name == "libGLX_nvidia":
        flags += ["-DSIM_LIBGLX", f"-DSIM_VK_DRIVER_VERSION={vk_driver_version(prof.driver_version)}u"]
    return _compile(["driver_lib.c", "abi_note.S"], flags, out_name, cc=cc)


def xorg_modules(prof: Profile) -> dict[str, str | None]:
    """The X server modules of a graphics host: {path in the root: SONAME or None}."""
    glx = f"libglxserver_nvidia.so.{prof.driver_version}"
    return {"usr/lib/xorg/modules/drivers/nvidia_drv.so": None,
            f"usr/lib/xorg/modules/extensions/{glx}": glx}


# Programs and X modules are named with their machine too ("aarch64-nvidia-smi"): their
# flags alone do not tell the machines apart.
def _build_module(prof: Profile, path: str, soname: str | None, arch: str, cc: tuple[str, ...]) -> Path:
    name = path.rpartition("/")[2]
    return _compile(["driver_lib.c", "abi_note.S"], [*_so_flags(prof, arch, soname), f'-DSIM_LIB="{name}"'],
                    f"{arch}-xorg-{name}", cc=cc)


def _build_tool(prof: Profile, name: str, nvml: Path, arch: str, cc: tuple[str, ...]) -> Path:
    if name == "nvidia-smi":
        # Linked against the mock so DT_NEEDED is its SONAME, libnvidia-ml.so.1.
        return _compile(["nvidia_smi.c"], [], f"{arch}-{name}", link=[nvml], cc=cc)
    return _compile(["tool.c"], [f'-DSIM_TOOL="{name}"', *_defines(prof)], f"{arch}-{name}", cc=cc)


def _m32_works() -> bool:
    marker = cache_dir() / f"m32-{CACHE_FORMAT}.ok"
    if marker.exists():
        return True
    try:
        _compile(["driver_lib.c"], ["-m32", "-shared", '-DSIM_LIB="probe"',
                                    '-DSIM_DRIVER_VERSION="0"', "-DSIM_CUDA_VERSION=0"], "m32-probe.so")
    except (NvhookError, OSError):
        return False
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:   # a read-only home: probed again next time
        pass
    return True


def build_artifacts(prof: Profile, machine: str | None = None, cc: tuple[str, ...] | None = None
                    ) -> tuple[dict[tuple[str, str], Path], dict[str, Path], dict[str, Path]]:
    """Compile (or take from the cache) what the profile needs. Returns
    ({(arch, lib name): .so}, {binary name: executable}, {X module path in the root: .so}).
    machine: the host's (uname -m) by default; another with cc, its cross compiler's
    command (packaging/build_bundle.py: an arm64 package's prebuilt objects)."""
    mach = machmod.native() if machine is None else machmod.get(machine)
    cc = (CC,) if cc is None else tuple(cc)
    arches = [mach.name]
    if (mach.compat32 and machine is None and prof.compat32 and any(lib.i386 for lib in prof.libraries)
            and _m32_works()):
        arches.append(mach.compat32)
    jobs = [(arch, lib) for arch in arches for lib in prof.libraries if arch == mach.name or lib.i386]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futs = {(arch, lib.name): pool.submit(_build_lib, prof, lib, arch, cc) for arch, lib in jobs}
        nvml = futs[(mach.name, "libnvidia-ml")].result()
        bins = {b: pool.submit(_build_tool, prof, b, nvml, mach.name, cc) for b in prof.binaries}
        mods = {p: pool.submit(_build_module, prof, p, soname, mach.name, cc)
                for p, soname in (xorg_modules(prof).items() if prof.graphics else ())}
        libs = {k: f.result() for k, f in futs.items()}
        tools = {k: f.result() for k, f in bins.items()}
        modules = {k: f.result() for k, f in mods.items()}
    return libs, tools, modules


# ---------------------------------------------------------------- file formats

def _version_file(prof: Profile, mach: machmod.Machine) -> str:
    return (f"NVRM version: NVIDIA UNIX {mach.name} Kernel Module  {prof.driver_version}  "
            f"Tue Apr  8 12:27:59 UTC 2025\n"
            f"GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")


PARAMS = """ResmanDebugLevel: 4294967295
RmLogonRC: 1
ModifyDeviceFiles: 1
DeviceFileUID: 0
DeviceFileGID: 0
DeviceFileMode: 438
InitializeSystemMemoryAllocations: 1
UsePageAttributeTable: 4294967295
EnableMSI: 1
EnablePCIeGen3: 0
MemoryPoolSize: 0
KMallocHeapMaxSize: 0
VMallocHeapMaxSize: 0
IgnoreMMIOCheck: 0
TCEBypassMode: 0
EnableStreamMemOPs: 0
EnableUserNUMAManagement: 1
NvLinkDisable: 0
RmProfilingAdminOnly: 1
PreserveVideoMemoryAllocations: 0
EnableS0ixPowerManagement: 0
S0ixPowerManagementVideoMemoryThreshold: 256
DynamicPowerManagement: 3
DynamicPowerManagementVideoMemoryThreshold: 200
RegisterPCIDriver: 1
EnablePCIERelaxedOrderingMode: 0
EnableResizableBar: 0
EnableGpuFirmware: 18
EnableGpuFirmwareLogs: 2
RmNvlinkBandwidthLinkCount: 0
EnableDbgBreakpoint: 0
OpenRmEnableUnsupportedGpus: 1
DmaRemapPeerMmio: 1
ImexChannelCount: 2048
CreateImexChannel0: 0
GrdmaPciTopoCheckOverride: 0
RegistryDwords: ""
RegistryDwordsPerDevice: ""
RmMsg: ""
GpuBlacklist: ""
TemporaryFilePath: ""
ExcludedGpus: ""
"""


def _information(prof: Profile, g: GpuSpec) -> str:
    return (f"Model: \t\t {g.name}\n"
            f"IRQ:   \t\t {150 + g.minor}\n"
            f"GPU UUID: \t {g.uuid}\n"
            f"Video BIOS: \t 92.00.45.00.03\n"
            f"Bus Type: \t PCIe\n"
            f"DMA Size: \t 47 bits\n"
            f"DMA Mask: \t 0x7fffffffffff\n"
            f"Bus Location: \t {g.procfs_name}\n"
            f"Device Minor: \t {g.minor}\n"
            f"GPU Firmware: \t {prof.driver_version}\n"
            f"GPU Excluded:\t No\n")


def _sim_data(g: GpuSpec) -> str:
    """What the kernel would tell NVML about this GPU (read by nvml_mock.c)."""
    lines = [f"Brand: {g.brand_value} ({g.brand})",
             f"Architecture: {g.arch_value} ({g.architecture})",
             f"ComputeCapability: {g.cc[0]}.{g.cc[1]}",
             f"MemoryMiB: {g.memory_mib}",
             f"PciDeviceId: 0x{g.pci_device_id:08X}",
             f"PciSubSystemId: 0x{g.pci_subsystem_id:08X}",
             f"MigCapable: {int(g.mig_capable)}",
             f"MigMode: {int(g.mig_enabled)}"]
    lines += [f"MigDevice: {m.gi} {m.ci} {m.memory_mib} {m.name} {m.uuid}" for m in g.mig]
    return "# nvhook simulated GPU data (read by the simulated libnvidia-ml)\n" + "\n".join(lines) + "\n"


def gi_minor(gpu_minor: int, gi: int) -> int:
    """nvidia-caps minor of gpu<N>/gi<G>/access (the driver's fixed table)."""
    return 3 + gpu_minor * 135 + gi * 9


def ci_minor(gpu_minor: int, gi: int, ci: int) -> int:
    return gi_minor(gpu_minor, gi) + 1 + ci


def mig_minors_file() -> str:
    lines = ["config 1", "monitor 2"]
    for gpu in range(32):
        for gi in range(15):
            lines.append(f"gpu{gpu}/gi{gi}/access {gi_minor(gpu, gi)}")
            lines += [f"gpu{gpu}/gi{gi}/ci{ci}/access {ci_minor(gpu, gi, ci)}" for ci in range(8)]
    return "\n".join(lines) + "\n"


def _cap_file(minor: int, mode: int) -> str:
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"


# ---------------------------------------------------------------- building

def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)


def _mknod(path: Path, major: int, minor: int, mode: int = 0o666) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
    except PermissionError:
        raise NvhookError(f"mknod {path.name}: permission denied (creating a simulated host needs root)") from None
    os.chmod(path, mode)


def _unix_socket(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Bind through /proc/self/fd/N so deep paths don't hit the 108-byte sun_path limit.
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.bind(f"/proc/self/fd/{dfd}/{path.name}")
        finally:
            s.close()
    finally:
        os.close(dfd)
    os.chmod(path, 0o666)


def _copy(src: Path, dst: Path, mode: int) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    os.chmod(dst, mode)


def _install_glibc(root: Path, mach: machmod.Machine) -> None:
    from libinject.sim.rootfs import GLIBC_LIBS

    libdir = root / "lib" / mach.triplet
    for lib in (mach.loader, *GLIBC_LIBS):
        _copy(Path(os.path.realpath(f"/lib/{mach.triplet}/{lib}")), libdir / lib, 0o755)
    link = root / mach.loader_link
    link.parent.mkdir(exist_ok=True)
    if not link.exists():
        link.symlink_to(f"/lib/{mach.triplet}/{mach.loader}")


def _install_libraries(root: Path, prof: Profile, libs: dict[tuple[str, str], Path]) -> list[str]:
    ver = prof.driver_version
    arches = sorted({arch for arch, _ in libs})
    for (arch, name), src in libs.items():
        spec = next(s for s in prof.libraries if s.name == name)
        libdir = root / "usr/lib" / ARCHES[arch][0]
        fname = spec.file_name(ver)
        _copy(src, libdir / fname, 0o755)
        soname = spec.real_soname(ver)
        if soname != fname:
            (libdir / soname).symlink_to(fname)
        if name in DEV_LINKS:
            (libdir / f"{name}.so").symlink_to(soname)
        if name == "libGLX_nvidia":
            (libdir / "libGLX_indirect.so.0").symlink_to(soname)
    names = {s.name for s in prof.libraries}
    if "libEGL_nvidia" in names:
        _write(root / "usr/share/glvnd/egl_vendor.d/10_nvidia.json",
               json.dumps({"file_format_version": "1.0.0",
                           "ICD": {"library_path": "libEGL_nvidia.so.0"}}, indent=4) + "\n")
    if "libGLX_nvidia" in names:
        _write(root / "usr/share/vulkan/icd.d/nvidia_icd.json",
               json.dumps({"file_format_version": "1.0.1",
                           "ICD": {"library_path": "libGLX_nvidia.so.0", "api_version": "1.3.277"}},
                          indent=4) + "\n")
    if "libnvidia-opencl" in names:
        _write(root / "etc/OpenCL/vendors/nvidia.icd", "libnvidia-opencl.so.1\n")
    return arches


def _install_ldconf(root: Path, arches: list[str], mach: machmod.Machine) -> None:
    _write(root / "etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
    _write(root / f"etc/ld.so.conf.d/{mach.triplet}.conf",
           f"# Multiarch support\n/lib/{mach.triplet}\n/usr/lib/{mach.triplet}\n")
    if "i386" in arches:
        _write(root / "etc/ld.so.conf.d/i386-linux-gnu.conf",
               "# Multiarch support\n/usr/lib/i386-linux-gnu\n")


# ---------------------------------------------------------------- graphics hosts

# egl/egl_external_platform.d/<file>: the EGL platform library each names (EGL's
# external platform loader reads them in name order).
EGL_PLATFORMS = {"09_nvidia_wayland2.json": "libnvidia-egl-wayland2.so.1",
                 "10_nvidia_wayland.json": "libnvidia-egl-wayland.so.1",
                 "15_nvidia_gbm.json": "libnvidia-egl-gbm.so.1",
                 "20_nvidia_xcb.json": "libnvidia-egl-xcb.so.1",
                 "20_nvidia_xlib.json": "libnvidia-egl-xlib.so.1"}
VULKAN_API = "1.3.277"
# The driver's implicit Vulkan layer (PRIME render offload): the loader enables it only
# when __NV_PRIME_RENDER_OFFLOAD=1, so by default it is read and skipped.
VULKAN_LAYER = {"file_format_version": "1.0.0",
                "layer": {"name": "VK_LAYER_NV_optimus", "type": "INSTANCE",
                          "library_path": "libGLX_nvidia.so.0", "api_version": VULKAN_API,
                          "implementation_version": "1", "description": "NVIDIA Optimus layer",
                          "functions": {"vkGetInstanceProcAddr": "vk_optimusGetInstanceProcAddr",
                                        "vkGetDeviceProcAddr": "vk_optimusGetDeviceProcAddr"},
                          "enable_environment": {"__NV_PRIME_RENDER_OFFLOAD": "1"},
                          "disable_environment": {"DISABLE_LAYER_NV_OPTIMUS_1": ""}}}
_OUTPUT_CLASS = 'Section "OutputClass"\n    Identifier "nvidia"\n    MatchDriver "nvidia-drm"\n    Driver "nvidia"\n'
# Distribution packages' snippet, and the .run installer's: both make the X server load
# nvidia_drv.so for a device the nvidia-drm kernel module drives.
XORG_CONF = _OUTPUT_CLASS + '    Option "AllowEmptyInitialConfiguration"\nEndSection\n'
XORG_OUTPUTCLASS_CONF = ("# Loads the nvidia X driver for devices driven by the nvidia-drm kernel module\n"
                         "# (X server 1.16 or later).\n\n" + _OUTPUT_CLASS + "EndSection\n")
APP_PROFILE_KEYS = """This file documents the keys of the NVIDIA driver's application profiles
(nvidia-application-profiles-rc): each profile sets driver settings, each rule applies a
profile to the processes it matches.

GLSyncToVblank          boolean   sync buffer swaps to the display's vertical refresh
GLShaderDiskCache       boolean   keep compiled shaders in a cache on disk
GLThreadedOptimizations boolean   run OpenGL work on a separate thread
"""


def drm_nodes(prof: Profile) -> list[tuple[GpuSpec, str, str, int]]:
    """(GPU, by-path kind, node name, minor) of a graphics host's DRM nodes: the GPU at
    position i (PCI order) has card<i> (226:i) and renderD<128+i> (226:128+i)."""
    out = []
    for i, g in enumerate(prof.gpus):
        out += [(g, "card", f"card{i}", i), (g, "render", f"renderD{RENDER_MINOR_BASE + i}", RENDER_MINOR_BASE + i)]
    return out


def _json(path: Path, data: dict) -> None:
    _write(path, json.dumps(data, indent=4) + "\n")


def _install_graphics(root: Path, prof: Profile, modules: dict[str, Path], mach: machmod.Machine) -> None:
    ver = prof.driver_version
    libdir = root / "usr/lib" / mach.triplet
    (libdir / "gbm").mkdir()
    (libdir / "gbm/nvidia-drm_gbm.so").symlink_to("../libnvidia-allocator.so.1")   # Mesa's GBM backend dir
    share = root / "usr/share"
    for name, lib in EGL_PLATFORMS.items():
        _json(share / "egl/egl_external_platform.d" / name,
              {"file_format_version": "1.0.0", "ICD": {"library_path": lib}})
    _json(share / "vulkan/implicit_layer.d/nvidia_layers.json", VULKAN_LAYER)
    _write(share / f"nvidia/nvidia-application-profiles-{ver}-rc",
           json.dumps({"rules": [], "profiles": []}, indent=4) + "\n")
    _write(share / f"nvidia/nvidia-application-profiles-{ver}-key-documentation", APP_PROFILE_KEYS)
    _write(share / "nvidia/nvoptix.bin", f"nvhook simulated OptiX data for driver {ver}\n")
    _write(share / "X11/xorg.conf.d/10-nvidia.conf", XORG_CONF)
    _write(share / "X11/xorg.conf.d/nvidia-drm-outputclass.conf", XORG_OUTPUTCLASS_CONF)
    for path, src in modules.items():
        _copy(src, root / path, 0o755)
    ext = root / "usr/lib/xorg/modules/extensions"
    (ext / "libglxserver_nvidia.so").symlink_to(f"libglxserver_nvidia.so.{ver}")
    # DRM nodes as udev makes them (by-path links), and the sysfs view that hosts
    # without udev links are read through.
    dri = root / "dev/dri"
    for g, kind, node, minor in drm_nodes(prof):
        bus = g.procfs_name
        _mknod(dri / node, DRM_MAJOR, minor)
        _symlink(dri / f"by-path/pci-{bus}-{kind}", f"../{node}")
        _write(root / f"sys/bus/pci/devices/{bus}/drm/{node}/dev", f"{DRM_MAJOR}:{minor}\n", 0o444)
        _symlink(root / f"sys/class/drm/{node}", f"../../bus/pci/devices/{bus}/drm/{node}")


def _symlink(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def _install_devices(root: Path, prof: Profile) -> None:
    dev = root / "dev"
    for g in prof.gpus:
        _mknod(dev / f"nvidia{g.minor}", NVIDIA_MAJOR, g.minor)
    _mknod(dev / "nvidiactl", NVIDIA_MAJOR, 255)
    _mknod(dev / "nvidia-uvm", prof.uvm_major, 0)
    _mknod(dev / "nvidia-uvm-tools", prof.uvm_major, 1)
    if prof.modeset:
        _mknod(dev / "nvidia-modeset", NVIDIA_MAJOR, 254)
    for n in range(prof.imex_channels):
        _mknod(dev / f"nvidia-caps-imex-channels/channel{n}", prof.imex_major, n)
    if prof.mig_capable:
        caps = dev / "nvidia-caps"
        _mknod(caps / "nvidia-cap1", prof.caps_major, 1, 0o400)
        _mknod(caps / "nvidia-cap2", prof.caps_major, 2, 0o444)
        for g in prof.gpus:
            for gi in sorted({m.gi for m in g.mig}):
                _mknod(caps / f"nvidia-cap{gi_minor(g.minor, gi)}", prof.caps_major, gi_minor(g.minor, gi), 0o444)
            for m in g.mig:
                n = ci_minor(g.minor, m.gi, m.ci)
                _mknod(caps / f"nvidia-cap{n}", prof.caps_major, n, 0o444)


def _install_procfs(root: Path, prof: Profile) -> None:
    proc = root / "proc/driver/nvidia"
    _write(proc / "version", _version_file(prof, machmod.native()), 0o444)
    _write(proc / "params", PARAMS, 0o444)
    _write(proc / "registry", 'Binary: ""\n', 0o444)
    for g in prof.gpus:
        d = proc / "gpus" / g.procfs_name
        _write(d / "information", _information(prof, g), 0o444)
        _write(d / "registry", 'Binary: ""\n', 0o444)
        _write(d / "power", "Runtime D3 status:          Not supported\nVideo Memory:               Active\n", 0o444)
        _write(d / "nvhook-sim", _sim_data(g), 0o444)
    if prof.mig_capable:
        caps = proc / "capabilities"
        _write(caps / "mig/config", _cap_file(1, 256), 0o444)
        _write(caps / "mig/monitor", _cap_file(2, 292), 0o444)
        for g in prof.gpus:
            for m in g.mig:
                gdir = caps / f"gpu{g.minor}/mig/gi{m.gi}"
                _write(gdir / "access", _cap_file(gi_minor(g.minor, m.gi), 292), 0o444)
                _write(gdir / f"ci{m.ci}/access", _cap_file(ci_minor(g.minor, m.gi, m.ci), 292), 0o444)
    _write(root / "proc/driver/nvidia-caps/mig-minors", mig_minors_file(), 0o444)
    # Majors as the kernel lists them, in major order (tools read nvidia-uvm's and
    # nvidia-caps' majors here).
    majors = [(NVIDIA_MAJOR, "nvidia-frontend"), (prof.uvm_major, "nvidia-uvm"), (prof.caps_major, "nvidia-caps")]
    if prof.graphics:
        majors.append((DRM_MAJOR, "drm"))
    if prof.imex_channels:
        majors.append((prof.imex_major, "nvidia-caps-imex-channels"))
    chars = "".join(f"{major} {name}\n" for major, name in sorted(majors))
    _write(root / "proc/devices", f"Character devices:\n{chars}\nBlock devices:\n", 0o444)


def _install_sysfs(root: Path, prof: Profile) -> None:
    """sys/bus/pci/devices/<bus>/ of each GPU: the PCI identity files tools read there
    (NVIDIA's go-nvlib nvpci: vendor, device, class, subsystem ids, NUMA node)."""
    for g in prof.gpus:
        d = root / "sys/bus/pci/devices" / g.procfs_name
        # display controllers: VGA (0x0300) where the board drives displays, else 3D (0x0302)
        cls = 0x030000 if g.brand in profmod.GRAPHICS_BRANDS else 0x030200
        files = {"vendor": f"0x{g.pci_device_id & 0xFFFF:04x}", "device": f"0x{g.pci_device_id >> 16:04x}",
                 "class": f"0x{cls:06x}", "subsystem_vendor": f"0x{g.pci_subsystem_id & 0xFFFF:04x}",
                 "subsystem_device": f"0x{g.pci_subsystem_id >> 16:04x}", "numa_node": "-1",
                 "irq": str(150 + g.minor)}
        for name, text in files.items():
            _write(d / name, text + "\n", 0o444)


def _build(root: Path, prof: Profile) -> None:
    libs, tools, modules = build_artifacts(prof)
    mach = machmod.native()
    for d in ("etc", "tmp", "run", "usr/bin", f"usr/lib/{mach.triplet}"):
        (root / d).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "tmp", 0o1777)
    _install_glibc(root, mach)
    arches = _install_libraries(root, prof, libs)
    for name, src in tools.items():
        _copy(src, root / "usr/bin" / name, 0o755)
    for fw in prof.firmware:
        _write(root / f"lib/firmware/nvidia/{prof.driver_version}/{fw}",
               f"nvhook simulated GSP firmware {fw} for driver {prof.driver_version}\n")
    _install_devices(root, prof)
    _install_procfs(root, prof)
    _install_sysfs(root, prof)
    if prof.graphics:
        _install_graphics(root, prof, modules, mach)
    # As on a real host, /var/run is /run: NVIDIA's tools name the sockets /var/run/...
    # Relative, so that it resolves inside the root wherever the root is.
    (root / "var").mkdir(exist_ok=True)
    (root / "var/run").symlink_to("../run")
    if "nvidia-persistenced" in prof.binaries:
        _unix_socket(root / "run/nvidia-persistenced/socket")
    if "nv-fabricmanager" in prof.binaries:
        _unix_socket(root / "run/nvidia-fabricmanager/socket")
    _write(root / "etc/nvhook-sim/nvml.conf",
           "# Test knobs of the simulated NVML (environment variables win):\n"
           "#   delay_ms=N     nvmlInit sleeps N ms      (NVHOOK_SIM_NVML_DELAY_MS)\n"
           "#   error=NAME|N   nvmlInit fails with it    (NVHOOK_SIM_NVML_ERROR), e.g. DRIVER_NOT_LOADED\n")
    data = asdict(prof)
    data["libraries"] = [asdict(s) for s in prof.libraries]
    _write(root / "etc/nvhook-sim/profile.json", json.dumps(data, indent=2) + "\n")
    _install_ldconf(root, arches, mach)
    r = subprocess.run(["ldconfig", "-r", str(root)], capture_output=True, text=True)
    if r.returncode != 0:
        raise NvhookError(f"ldconfig -r {root} failed: {r.stderr.strip().splitlines()[-1:]}")


def create_host(dest: str | os.PathLike[str], profile: str | None = None,
                profile_file: str | os.PathLike[str] | None = None) -> Path:
    """Build a simulated GPU host at dest (which must not exist, or be an empty dir).
    profile: a built-in profile name (default a100x8); profile_file: a JSON profile."""
    if profile is not None and profile_file is not None:
        raise NvhookError("give a profile name or a profile file, not both")
    if profile_file is not None:
        prof = profmod.load_file(profile_file)
    else:
        prof = profmod.load_profile(profile or profmod.DEFAULT_PROFILE)
    dest = Path(os.path.abspath(dest))
    if dest.is_symlink() or (dest.exists() and (not dest.is_dir() or any(dest.iterdir()))):
        raise NvhookError(f"{dest} exists and is not an empty directory")
    if not dest.parent.is_dir():
        raise NvhookError(f"{dest.parent} is not a directory")
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    # A driver root is world-readable whatever the caller's umask (containers may run as non-root).
    old_umask = os.umask(0o022)
    try:
        os.chmod(tmp, 0o755)
        _build(tmp, prof)
        os.rename(tmp, dest)   # replaces an empty dest dir atomically
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.umask(old_umask)
    return dest
