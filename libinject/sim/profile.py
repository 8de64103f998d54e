"""Simulated GPU host profiles: JSON data files that say what a host has.

Built-in profiles live in libinject/sim/profiles/<name>.json; `--profile-file` takes
any file in the same format. Fields (all optional unless marked required):

    description       one line shown by `nvhook sim profiles`
    driver_version    "550.163.01" (default); file names end in it, NVML reports it
    cuda_version      "12.4" (default); NVML reports 12040
    gpus              required, non-empty list, NVML index order = PCI bus id order:
      name            required, NVML name, e.g. "NVIDIA A100-SXM4-80GB"
      brand           NVML brand: Nvidia, Tesla, GeForce, Quadro, NvidiaRTX, Titan, ...
                      (default from the name: "Tesla ..." -> Tesla, "... GeForce ..." -> GeForce, else Nvidia)
      uuid            "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (default: derived from name and index)
      bus_id          PCI address, "0000:07:00.0" or NVML's "00000000:07:00.0" (default 0000:<index+1>:00.0)
      minor           /dev/nvidia<minor>, 0..254, unique (default: the GPU's position in the list)
      cc              compute capability "8.0" (default from architecture)
      architecture    Kepler, Maxwell, Pascal, Volta, Turing, Ampere, Ada, Hopper, Blackwell
                      (default from cc); at least one of cc/architecture is required
      memory_mib      required, total memory in MiB
      pci_device_id   e.g. "0x20B210DE" (device << 16 | vendor; default 0x000010DE)
      pci_subsystem_id  e.g. "0x147F10DE" (default 0)
      mig_capable     bool (default: true for A100/A30/A800/H100/H200/H800/B200/GH200 names or when mig is set)
      mig_enabled     bool, MIG mode (default: true when mig is non-empty)
      mig             list of MIG devices (GPU instance + compute instance); needs minor < 32:
        gi            GPU instance id, 0..14      ci  compute instance id, 0..7; (gi, ci) unique
        name          profile as nvidia-smi prints it, e.g. "3g.40gb" or "1c.3g.40gb"
        uuid          "MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (default: derived)
        memory_mib    required
    libraries         list of driver libraries (default: every library in LIBRARIES below,
                      libnvidia-nscq only with nv-fabricmanager, the GRAPHICS_ONLY ones only
                      with graphics); an item is a known name ("libcuda") or
                      {"name": "libfoo_nvidia", "soname": "libfoo_nvidia.so.1" (omit for a
                      versioned SONAME), "capability": "compute", "i386": false,
                      "version": "1.0.0" (file libfoo_nvidia.so.1.0.0; omit: the driver's)}
    compat32          bool (default true): also build 32-bit copies (usr/lib/i386-linux-gnu)
                      of the libraries that have one, when `gcc -m32` works
    binaries          usr/bin programs (default: nvidia-smi nvidia-debugdump nvidia-persistenced
                      nvidia-cuda-mps-control nvidia-cuda-mps-server); nv-fabricmanager adds
                      run/nvidia-fabricmanager/socket, nvidia-persistenced adds its socket
    firmware          lib/firmware/nvidia/<ver>/ files (default gsp_ga10x.bin gsp_tu10x.bin)
    modeset           bool (default false): dev/nvidia-modeset (195:254), the display capability
    graphics          bool (default: true when a GPU's brand is GeForce, GeForceRTX, Quadro,
                      QuadroRTX, NvidiaRTX, Titan or TitanRTX): the graphics/display surface:
                      the EGL platform, GBM, Wayland and Vulkan-producer libraries (added to
                      `libraries` with the ones they need: libGLX_nvidia, libEGL_nvidia,
                      libnvidia-allocator), the EGL/Vulkan/X loaders' files, the X driver
                      modules, and each GPU's DRM nodes (dev/dri, by-path links, sysfs)
    uvm_major         char major of nvidia-uvm(-tools) (default 235: unregistered here -> ENXIO)
    caps_major        char major of dev/nvidia-caps/* (default 236)
    imex_channels     number of IMEX channels, 0..2048 (default 0): dev/nvidia-caps-imex-channels/
                      channel0..N-1 and the /proc/devices entry nvidia-caps-imex-channels
    imex_major        char major of the IMEX channels (default 237)

A bad file raises NvhookError naming the field: "profile gpus[2].uuid: expected 'GPU-' uuid".
Every pattern is matched whole and ASCII-only (no trailing "\n", no "١"), strings are
one printable line, and sizes have sane bounds: a profile becomes file names, procfs
text and C-read config lines.
"""
from __future__ import annotations

import json
import re
import uuid as uuidlib
from pathlib import Path

from libinject.errors import NvhookError
from libinject.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
DEFAULT_PROFILE = "a100x8"


@record(frozen=True)
class LibSpec:
    name: str               # "libcuda"
    soname: str | None      # "libcuda.so.1"; None: versioned, "<name>.so.<driver version>"
    capability: str         # which capability injects it (libinject/discover/libraries.py)
    i386: bool = False      # the driver ships a 32-bit copy
    version: str | None = None  # its own version ("1.1.13" for libnvidia-egl-wayland);
                                # None: the driver version

    def file_name(self, version: str) -> str:
        """The real file's name; `version` is the driver version."""
        return f"{self.name}.so.{self.version or version}"

    def real_soname(self, version: str) -> str:
        return self.soname or self.file_name(version)


def _lib(name: str, soname: str | None, cap: str, i386: bool = False, version: str | None = None) -> LibSpec:
    return LibSpec(name, soname, cap, i386, version)


# The driver's libraries with their real SONAMEs (None = versioned SONAME).
LIBRARIES: dict[str, LibSpec] = {s.name: s for s in (
    _lib("libnvidia-ml", "libnvidia-ml.so.1", "utility", True),
    _lib("libnvidia-cfg", "libnvidia-cfg.so.1", "utility"),
    _lib("libnvidia-nscq", "libnvidia-nscq.so.2", "utility"),
    _lib("libcuda", "libcuda.so.1", "compute", True),
    _lib("libcudadebugger", "libcudadebugger.so.1", "compute"),
    _lib("libnvidia-opencl", "libnvidia-opencl.so.1", "compute", True),
    _lib("libnvidia-gpucomp", None, "compute", True),
    _lib("libnvidia-ptxjitcompiler", "libnvidia-ptxjitcompiler.so.1", "compute", True),
    _lib("libnvidia-allocator", "libnvidia-allocator.so.1", "compute", True),
    _lib("libnvidia-pkcs11", None, "compute"),
    _lib("libnvidia-pkcs11-openssl3", None, "compute"),
    _lib("libnvidia-nvvm", "libnvidia-nvvm.so.4", "compute", True),
    _lib("libvdpau_nvidia", "libvdpau_nvidia.so.1", "video", True),
    _lib("libnvidia-encode", "libnvidia-encode.so.1", "video", True),
    _lib("libnvidia-opticalflow", "libnvidia-opticalflow.so.1", "video", True),
    _lib("libnvcuvid", "libnvcuvid.so.1", "video", True),
    _lib("libnvidia-eglcore", None, "graphics", True),
    _lib("libnvidia-glcore", None, "graphics", True),
    _lib("libnvidia-tls", None, "graphics", True),
    _lib("libnvidia-glsi", None, "graphics", True),
    _lib("libnvidia-fbc", "libnvidia-fbc.so.1", "graphics", True),
    _lib("libnvidia-rtcore", None, "graphics"),
    _lib("libnvoptix", "libnvoptix.so.1", "graphics"),
    _lib("libGLX_nvidia", "libGLX_nvidia.so.0", "graphics", True),
    _lib("libEGL_nvidia", "libEGL_nvidia.so.0", "graphics", True),
    _lib("libGLESv2_nvidia", "libGLESv2_nvidia.so.2", "graphics", True),
    _lib("libGLESv1_CM_nvidia", "libGLESv1_CM_nvidia.so.1", "graphics", True),
    _lib("libnvidia-glvkspirv", None, "graphics", True),
    _lib("libnvidia-ngx", "libnvidia-ngx.so.1", "ngx"),
    # Not in NVIDIA's fixed lists (newer drivers ship it): found by the lib*nvidia*.so.<ver> rule.
    _lib("libnvidia-sandboxutils", "libnvidia-sandboxutils.so.1", "utility"),
    # Graphics hosts only (GRAPHICS_ONLY): the EGL external platforms ship with their own
    # versions, not the driver's.
    _lib("libnvidia-egl-gbm", "libnvidia-egl-gbm.so.1", "graphics", version="1.1.1"),
    _lib("libnvidia-egl-wayland", "libnvidia-egl-wayland.so.1", "graphics", version="1.1.13"),
    _lib("libnvidia-egl-wayland2", "libnvidia-egl-wayland2.so.1", "graphics", version="1.0.0"),
    _lib("libnvidia-egl-xcb", "libnvidia-egl-xcb.so.1", "graphics", version="1.0.0"),
    _lib("libnvidia-egl-xlib", "libnvidia-egl-xlib.so.1", "graphics", version="1.0.0"),
    _lib("libnvidia-vulkan-producer", None, "graphics"),
)}
# The libraries above that only graphics hosts have; what a graphics host adds to its
# library list: those, and the ones its loader files name (Vulkan ICD and layer, EGL
# vendor, GBM backend).
GRAPHICS_ONLY = ("libnvidia-egl-gbm", "libnvidia-egl-wayland", "libnvidia-egl-wayland2",
                 "libnvidia-egl-xcb", "libnvidia-egl-xlib", "libnvidia-vulkan-producer")
GRAPHICS_LIBRARIES = ("libGLX_nvidia", "libEGL_nvidia", "libnvidia-allocator", *GRAPHICS_ONLY)
# NVML brands of cards that drive displays: their hosts default to graphics.
GRAPHICS_BRANDS = ("GeForce", "GeForceRTX", "Quadro", "QuadroRTX", "NvidiaRTX", "Titan", "TitanRTX")

DEFAULT_BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced",
                    "nvidia-cuda-mps-control", "nvidia-cuda-mps-server")
KNOWN_BINARIES = DEFAULT_BINARIES + ("nv-fabricmanager",)
DEFAULT_FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")
DRM_MAJOR = 226
CAPABILITIES = ("utility", "compute", "video", "graphics", "display", "ngx")

# nvmlBrandType_t values, keyed by the names nvidia-container-cli prints.
BRANDS = {"Unknown": 0, "Quadro": 1, "Tesla": 2, "NVS": 3, "Grid": 4, "GeForce": 5, "Titan": 6,
          "NvidiaVApps": 7, "NvidiaVPC": 8, "NvidiaVCS": 9, "NvidiaVWS": 10,
          "NvidiaCloudGaming": 11, "QuadroRTX": 12, "NvidiaRTX": 13, "Nvidia": 14,
          "GeForceRTX": 15, "TitanRTX": 16}
# nvmlDeviceArchitecture_t values and each architecture's usual compute capability.
ARCHITECTURES = {"Kepler": (2, (3, 5)), "Maxwell": (3, (5, 2)), "Pascal": (4, (6, 0)),
                 "Volta": (5, (7, 0)), "Turing": (6, (7, 5)), "Ampere": (7, (8, 0)),
                 "Ada": (8, (8, 9)), "Hopper": (9, (9, 0)), "Blackwell": (10, (10, 0))}
_MIG_NAMES = re.compile(r"\b(A100|A30|A800|H100|H200|H800|B200|GH200|GB200)\b")
# Used with fullmatch only: "$" would also take a trailing "\n".
_UUID_BODY = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_GPU_UUID = re.compile(rf"GPU-{_UUID_BODY}")
_MIG_UUID = re.compile(rf"MIG-{_UUID_BODY}")
_BUS_ID = re.compile(r"([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])")
_VERSION = re.compile(r"[0-9]{1,6}\.[0-9]{1,6}(\.[0-9]{1,6})?")
_LIB_VERSION = re.compile(r"[0-9]{1,6}(\.[0-9]{1,6}){0,3}")
_CUDA = re.compile(r"([0-9]{1,3})\.([0-9])")
_CC = re.compile(r"([0-9]{1,2})\.([0-9])")
_LIBNAME = re.compile(r"lib[A-Za-z0-9_+-]{1,100}")
_FILENAME = re.compile(r"[A-Za-z0-9._+-]{1,128}")
_HEX = re.compile(r"0[xX][0-9a-fA-F]{1,8}|[0-9]{1,10}")
MAX_PROFILE_BYTES = 1 << 20
MAX_MEMORY_MIB = 1 << 24        # 16 TiB; NVML reports bytes in 64 bits (MiB << 20)
MAX_DESCRIPTION = 200
MAX_LIST = 256                  # libraries, binaries, firmware
MAX_IMEX_CHANNELS = 2048        # the driver's default NVreg_ImexChannelCount

TOP_FIELDS = {"description", "driver_version", "cuda_version", "gpus", "libraries", "compat32",
              "binaries", "firmware", "modeset", "graphics", "uvm_major", "caps_major",
              "imex_channels", "imex_major"}
GPU_FIELDS = {"name", "brand", "uuid", "bus_id", "minor", "cc", "architecture", "memory_mib",
              "pci_device_id", "pci_subsystem_id", "mig_capable", "mig_enabled", "mig"}
MIG_FIELDS = {"gi", "ci", "name", "uuid", "memory_mib"}


@record(frozen=True)
class MigSpec:
    gi: int
    ci: int
    name: str             # "3g.40gb"
    uuid: str             # "MIG-..."
    memory_mib: int


@record(frozen=True)
class GpuSpec:
    name: str
    brand: str            # key of BRANDS
    uuid: str
    bus_id: str           # NVML format "00000000:07:00.0"
    minor: int
    cc: tuple[int, int]
    architecture: str     # key of ARCHITECTURES
    memory_mib: int
    pci_device_id: int
    pci_subsystem_id: int
    mig_capable: bool
    mig_enabled: bool
    mig: tuple[MigSpec, ...] = ()

    @property
    def procfs_name(self) -> str:
        """proc/driver/nvidia/gpus/<this>: "0000:07:00.0"."""
        dom, bus, rest = self.bus_id.split(":")
        return f"{int(dom, 16):04x}:{bus.lower()}:{rest.lower()}"

    @property
    def brand_value(self) -> int:
        return BRANDS[self.brand]

    @property
    def arch_value(self) -> int:
        return ARCHITECTURES[self.architecture][0]


@record(frozen=True)
class Profile:
    name: str
    description: str
    driver_version: str
    cuda_version: str
    gpus: tuple[GpuSpec, ...]
    libraries: tuple[LibSpec, ...]
    compat32: bool
    binaries: tuple[str, ...]
    firmware: tuple[str, ...]
    modeset: bool
    graphics: bool
    uvm_major: int
    caps_major: int
    imex_channels: int = 0
    imex_major: int = 237

    @property
    def cuda_int(self) -> int:
        """NVML's form: 12.4 -> 12040."""
        major, minor = self.cuda_version.split(".")
        return int(major) * 1000 + int(minor) * 10

    @property
    def mig_capable(self) -> bool:
        return any(g.mig_capable for g in self.gpus)

    def summary(self) -> str:
        names: dict[str, int] = {}
        for g in self.gpus:
            names[g.name] = names.get(g.name, 0) + 1
        gpus = ", ".join(f"{n} x {name}" for name, n in names.items())
        mig = sum(len(g.mig) for g in self.gpus)
        extra = f", {mig} MIG devices" if mig else ""
        return f"{gpus}; driver {self.driver_version}, CUDA {self.cuda_version}{extra}"


def _err(where: str, msg: str) -> NvhookError:
    return NvhookError(f"profile {where}: {msg}" if where else f"profile: {msg}")


def _get(d: dict, key: str, where: str, kind: type | tuple, default: Any = ...) -> Any:
    path = f"{where}.{key}" if where else key
    if key not in d:
        if default is ...:
            raise _err(path, "required field missing")
        return default
    v = d[key]
    # bool is an int in Python: keep them apart.
    if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
        raise _err(path, f"expected an integer, got {_show(v)}")
    if not isinstance(v, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise _err(path, f"expected {names}, got {_show(v)}")
    return v


def _unknown(d: dict, allowed: set[str], where: str) -> None:
    extra = sorted(set(d) - allowed)
    if extra:
        path = f"{where}.{extra[0]}" if where else extra[0]
        raise _err(path, f"unknown field (known: {', '.join(sorted(allowed))})")


def _show(v: Any) -> str:
    """v for an error line, cut short (a profile string may be a megabyte)."""
    text = repr(v) if not isinstance(v, int) or abs(v) < 10**60 else "a huge number"
    return text if len(text) <= 80 else text[:80] + "..."


def _line(v: str, path: str, limit: int) -> str:
    """v as one printable line of at most `limit` characters (it ends up in procfs text,
    nvidia-smi output and the mock NVML's line-based data file)."""
    if len(v) > limit or not v.isprintable():
        raise _err(path, f"expected one printable line of at most {limit} characters, got {_show(v)}")
    return v


def _hex(v: Any, path: str) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        n = v
    elif isinstance(v, str) and _HEX.fullmatch(v):
        n = int(v, 16) if v[:2] in ("0x", "0X") else int(v)     # int(v, 0) refuses "0123"
    else:
        raise _err(path, f"expected a hex number like '0x20B210DE', got {_show(v)}")
    if not 0 <= n <= 0xFFFFFFFF:
        raise _err(path, "out of range (32-bit)")
    return n


def _derived_uuid(prefix: str, *parts: object) -> str:
    return f"{prefix}-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, 'nvhook-sim/' + '/'.join(map(str, parts)))}"


def _parse_mig(d: Any, where: str, gpu_uuid: str) -> MigSpec:
    if not isinstance(d, dict):
        raise _err(where, "expected an object")
    _unknown(d, MIG_FIELDS, where)
    gi = _get(d, "gi", where, int)
    ci = _get(d, "ci", where, int)
    if not 0 <= gi <= 14:
        raise _err(f"{where}.gi", "GPU instance id must be 0..14")
    if not 0 <= ci <= 7:
        raise _err(f"{where}.ci", "compute instance id must be 0..7")
    name = _get(d, "name", where, str)
    if not re.fullmatch(r"[0-9a-z.+]{1,32}", name):
        raise _err(f"{where}.name", f"expected a MIG profile name like '3g.40gb', got {_show(name)}")
    uuid = _get(d, "uuid", where, str, _derived_uuid("MIG", gpu_uuid, gi, ci))
    if not _MIG_UUID.fullmatch(uuid):
        raise _err(f"{where}.uuid", f"expected 'MIG-' uuid, got {_show(uuid)}")
    mem = _get(d, "memory_mib", where, int)
    if not 0 < mem <= MAX_MEMORY_MIB:
        raise _err(f"{where}.memory_mib", f"must be 1..{MAX_MEMORY_MIB}")
    return MigSpec(gi, ci, name, uuid, mem)


def _parse_gpu(d: Any, i: int, where: str) -> GpuSpec:
    if not isinstance(d, dict):
        raise _err(where, "expected an object")
    _unknown(d, GPU_FIELDS, where)
    name = _get(d, "name", where, str)
    if not name.strip() or len(name) >= 96 or not name.isprintable():
        raise _err(f"{where}.name", "expected a non-empty one-line name shorter than 96 characters")
    default_brand = "Tesla" if name.startswith("Tesla") else "GeForce" if "GeForce" in name else "Nvidia"
    brand_in = _get(d, "brand", where, str, default_brand)
    brand = next((b for b in BRANDS if b.lower() == brand_in.lower()), None)
    if brand is None:
        raise _err(f"{where}.brand", f"unknown brand {_show(brand_in)} (known: {', '.join(BRANDS)})")
    uuid = _get(d, "uuid", where, str, _derived_uuid("GPU", name, i))
    if not _GPU_UUID.fullmatch(uuid):
        raise _err(f"{where}.uuid", f"expected 'GPU-' uuid, got {_show(uuid)}")
    bus_in = _get(d, "bus_id", where, str, f"0000:{i + 1:02x}:00.0")
    m = _BUS_ID.fullmatch(bus_in)
    if not m:
        raise _err(f"{where}.bus_id", f"expected a PCI address like '0000:07:00.0', got {_show(bus_in)}")
    dom, bus, dev, fn = (int(x, 16) for x in m.groups())
    if dev > 31:
        raise _err(f"{where}.bus_id", "PCI device number must be 0..1f")
    bus_id = f"{dom:08X}:{bus:02X}:{dev:02X}.{fn:X}"
    minor = _get(d, "minor", where, int, i)
    if not 0 <= minor <= 254:
        raise _err(f"{where}.minor", "must be 0..254 (255 is nvidiactl)")
    arch_in = _get(d, "architecture", where, str, None)
    cc_in = _get(d, "cc", where, (str, int, float), None)
    if arch_in is None and cc_in is None:
        raise _err(f"{where}.architecture", "required field missing (give architecture or cc)")
    arch = None
    if arch_in is not None:
        arch = next((a for a in ARCHITECTURES if a.lower() == arch_in.lower()), None)
        if arch is None:
            raise _err(f"{where}.architecture", f"unknown architecture {_show(arch_in)} (known: {', '.join(ARCHITECTURES)})")
    if cc_in is not None:
        cm = _CC.fullmatch(str(cc_in))
        if not cm:
            raise _err(f"{where}.cc", f"expected a compute capability like '8.0', got {_show(cc_in)}")
        cc = (int(cm.group(1)), int(cm.group(2)))
    else:
        cc = ARCHITECTURES[arch][1]
    if arch is None:
        arch = max((a for a, (_, acc) in ARCHITECTURES.items() if acc <= cc),
                   key=lambda a: ARCHITECTURES[a][1], default="Kepler")
    mem = _get(d, "memory_mib", where, int)
    if not 0 < mem <= MAX_MEMORY_MIB:
        raise _err(f"{where}.memory_mib", f"must be 1..{MAX_MEMORY_MIB}")
    dev_id = _hex(d.get("pci_device_id", 0x10DE), f"{where}.pci_device_id")
    sub_id = _hex(d.get("pci_subsystem_id", 0), f"{where}.pci_subsystem_id")
    mig_in = _get(d, "mig", where, list, [])
    if len(mig_in) > 15 * 8:    # (gi, ci) pairs are unique: more cannot be valid
        raise _err(f"{where}.mig", "at most 120 MIG devices")
    mig = tuple(_parse_mig(x, f"{where}.mig[{j}]", uuid) for j, x in enumerate(mig_in))
    seen: set[tuple[int, int]] = set()
    for j, md in enumerate(mig):
        if (md.gi, md.ci) in seen:
            raise _err(f"{where}.mig[{j}]", f"duplicate gi {md.gi} ci {md.ci}")
        seen.add((md.gi, md.ci))
    mig_enabled = _get(d, "mig_enabled", where, bool, bool(mig))
    mig_capable = _get(d, "mig_capable", where, bool, bool(mig) or mig_enabled or bool(_MIG_NAMES.search(name)))
    if mig and not mig_enabled:
        raise _err(f"{where}.mig_enabled", "MIG devices given but mig_enabled is false")
    if mig_enabled and not mig_capable:
        raise _err(f"{where}.mig_capable", "mig_enabled needs a MIG-capable GPU")
    if mig_capable and minor > 31:
        raise _err(f"{where}.minor", "MIG-capable GPUs need a minor below 32 (nvidia-caps mig-minors)")
    return GpuSpec(name=name, brand=brand, uuid=uuid, bus_id=bus_id, minor=minor, cc=cc,
                   architecture=arch, memory_mib=mem, pci_device_id=dev_id, pci_subsystem_id=sub_id,
                   mig_capable=mig_capable, mig_enabled=mig_enabled, mig=mig)


def _parse_library(v: Any, where: str) -> LibSpec:
    if isinstance(v, str):
        if v not in LIBRARIES:
            raise _err(where, f"unknown library {_show(v)} (give {{\"name\", \"soname\"}} for a new one)")
        return LIBRARIES[v]
    if not isinstance(v, dict):
        raise _err(where, "expected a library name or an object")
    _unknown(v, {"name", "soname", "capability", "i386", "version"}, where)
    name = _get(v, "name", where, str)
    if not _LIBNAME.fullmatch(name):
        raise _err(f"{where}.name", f"expected a library base name like 'libcuda', got {_show(name)}")
    known = LIBRARIES.get(name)
    soname = _get(v, "soname", where, (str, type(None)), known.soname if known else None)
    if soname is not None and not (soname.startswith(name + ".so.") and _FILENAME.fullmatch(soname)):
        raise _err(f"{where}.soname", f"expected '{name}.so.N', got {_show(soname)}")
    cap = _get(v, "capability", where, str, known.capability if known else "utility")
    if cap not in CAPABILITIES:
        raise _err(f"{where}.capability", f"unknown capability {_show(cap)} (known: {', '.join(CAPABILITIES)})")
    i386 = _get(v, "i386", where, bool, known.i386 if known else False)
    version = _get(v, "version", where, (str, type(None)), known.version if known else None)
    if version is not None and not _LIB_VERSION.fullmatch(version):
        raise _err(f"{where}.version", f"expected a version like '1.1.13', got {_show(version)}")
    return LibSpec(name, soname, cap, i386, version)


def _names(d: dict, key: str, default: tuple[str, ...], allowed: tuple[str, ...] | None) -> tuple[str, ...]:
    v = _get(d, key, "", list, list(default))
    if len(v) > MAX_LIST:
        raise _err(key, f"at most {MAX_LIST} entries")
    for j, x in enumerate(v):
        if not isinstance(x, str) or not _FILENAME.fullmatch(x) or x in (".", ".."):
            raise _err(f"{key}[{j}]", f"expected a file name, got {_show(x)}")
        if allowed is not None and x not in allowed:
            raise _err(f"{key}[{j}]", f"unknown {key[:-1]} {_show(x)} (known: {', '.join(allowed)})")
    if len(set(v)) != len(v):
        raise _err(key, "duplicate entries")
    return tuple(v)


def parse_profile(data: Any, name: str = "custom") -> Profile:
    """Validate profile JSON data; raises NvhookError naming the bad field."""
    if not isinstance(data, dict):
        raise _err("", "expected a JSON object at the top level")
    _unknown(data, TOP_FIELDS, "")
    description = _line(_get(data, "description", "", str, ""), "description", MAX_DESCRIPTION)
    driver_version = _get(data, "driver_version", "", str, "550.163.01")
    if not _VERSION.fullmatch(driver_version):
        raise _err("driver_version", f"expected a version like '550.163.01', got {_show(driver_version)}")
    cuda_version = _get(data, "cuda_version", "", str, "12.4")
    if not _CUDA.fullmatch(cuda_version):
        raise _err("cuda_version", f"expected a version like '12.4', got {_show(cuda_version)}")
    gpus_in = _get(data, "gpus", "", list)
    if not gpus_in:
        raise _err("gpus", "at least one GPU is required")
    if len(gpus_in) > 64:
        raise _err("gpus", "at most 64 GPUs")
    gpus = [_parse_gpu(g, i, f"gpus[{i}]") for i, g in enumerate(gpus_in)]
    for field in ("uuid", "bus_id", "minor"):
        seen: dict[object, int] = {}
        for i, g in enumerate(gpus):
            val = getattr(g, field)
            if val in seen:
                raise _err(f"gpus[{i}].{field}", f"same as gpus[{seen[val]}].{field} ({val})")
            seen[val] = i
    mig_uuids = [m.uuid for g in gpus for m in g.mig]
    if len(set(mig_uuids)) != len(mig_uuids):
        raise _err("gpus", "MIG uuids must be unique")
    gpus.sort(key=lambda g: g.bus_id)   # NVML enumerates in PCI order
    binaries = _names(data, "binaries", DEFAULT_BINARIES, KNOWN_BINARIES)
    firmware = _names(data, "firmware", DEFAULT_FIRMWARE, None)
    if "libraries" in data:
        libs_in = _get(data, "libraries", "", list)
        if len(libs_in) > MAX_LIST:
            raise _err("libraries", f"at most {MAX_LIST} entries")
        libs = [_parse_library(x, f"libraries[{j}]") for j, x in enumerate(libs_in)]
    else:
        libs = [s for s in LIBRARIES.values() if s.name not in GRAPHICS_ONLY
                and (s.name != "libnvidia-nscq" or "nv-fabricmanager" in binaries)]
    graphics = _get(data, "graphics", "", bool, any(g.brand in GRAPHICS_BRANDS for g in gpus))
    if graphics:
        have = {s.name for s in libs}
        libs += [LIBRARIES[n] for n in GRAPHICS_LIBRARIES if n not in have]
    if not any(s.name == "libnvidia-ml" for s in libs):
        raise _err("libraries", "libnvidia-ml is required (it is the simulated NVML)")
    if len({s.name for s in libs}) != len(libs):
        raise _err("libraries", "duplicate entries")
    compat32 = _get(data, "compat32", "", bool, True)
    modeset = _get(data, "modeset", "", bool, False)
    uvm_major = _get(data, "uvm_major", "", int, 235)
    caps_major = _get(data, "caps_major", "", int, 236)
    imex_channels = _get(data, "imex_channels", "", int, 0)
    if not 0 <= imex_channels <= MAX_IMEX_CHANNELS:
        raise _err("imex_channels", f"must be 0..{MAX_IMEX_CHANNELS}")
    imex_major = _get(data, "imex_major", "", int, 237)
    majors = (("uvm_major", uvm_major), ("caps_major", caps_major), ("imex_major", imex_major))
    for key, val in majors:
        if not 1 <= val <= 511 or val == 195:
            raise _err(key, "must be 1..511 and not 195")
    if uvm_major == caps_major:
        raise _err("caps_major", "must differ from uvm_major")
    if imex_major in (uvm_major, caps_major):
        raise _err("imex_major", "must differ from uvm_major and caps_major")
    for key, val in majors:
        if graphics and val == DRM_MAJOR:
            raise _err(key, f"must not be {DRM_MAJOR} (DRM's) on a graphics host")
    return Profile(name=name, description=description, driver_version=driver_version,
                   cuda_version=cuda_version, gpus=tuple(gpus), libraries=tuple(libs),
                   compat32=compat32, binaries=binaries, firmware=firmware, modeset=modeset,
                   graphics=graphics, uvm_major=uvm_major, caps_major=caps_major,
                   imex_channels=imex_channels, imex_major=imex_major)


def list_profiles() -> list[str]:
    """Names of the built-in profiles."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json"))


def load_file(path: str | Path, name: str | None = None) -> Profile:
    from libinject.linux.files import read_bounded

    p = Path(path)
    raw = read_bounded(str(p), MAX_PROFILE_BYTES, "profile")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise NvhookError(f"profile {p}: not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise NvhookError(f"profile {p}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise NvhookError(f"profile {p}: invalid JSON: nested too deeply") from None
    except ValueError:  # int() of a number with thousands of digits
        raise NvhookError(f"profile {p}: invalid JSON: a number has too many digits") from None
    return parse_profile(data, name or p.stem)


def load_profile(name: str) -> Profile:
    if name not in list_profiles():
        raise NvhookError(f"unknown profile {name!r} (built-in: {', '.join(list_profiles())})")
    return load_file(PROFILES_DIR / f"{name}.json", name)
