"""vkprobe (vkprobe.c beside this file): lists the Vulkan devices a real Vulkan loader
(Debian's libvulkan1) finds, one line each: "VK <deviceName> vendor=0x10de type=2",
or "VK none"; "-v" adds " device=0x<id> driver=0x<version> api=<x.y.z>".

    probe = vkprobe_binary(tmp_path_factory.mktemp("vkprobe"))   # compiled once per session
    r = run([probe], env=on_host_env(sim_root))                  # the sim's ICD, on this host
    rootfs = build_rootfs(dir, vulkan=True)                       # an image with a loader; copy
                                                                  # probe in and run it there
"""
from __future__ import annotations

import subprocess
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "vkprobe.c"
LIBDIR = "usr/lib/x86_64-linux-gnu"
COMPILE_TIMEOUT = 60
_built: Path | None = None


def vkprobe_binary(tmpdir: Path) -> Path:
    """The compiled vkprobe: built into tmpdir on the first call, the same file after."""
    global _built
    if _built is None or not _built.exists():
        out = Path(tmpdir) / "vkprobe"
        subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-o", str(out), str(SOURCE)],
                       check=True, capture_output=True, timeout=COMPILE_TIMEOUT)
        _built = out
    return _built


def on_host_env(sim_root: Path, procfs: Path | None = None) -> dict[str, str]:
    """Environment for vkprobe run on this host against a simulated host's driver: the
    loader reads only its nvidia_icd.json, the dynamic linker finds its libGLX_nvidia.so.0,
    and the ICD lists the GPUs of `procfs` (default: the sim root's proc/driver/nvidia)."""
    return {"PATH": "/usr/bin:/bin",
            "VK_ICD_FILENAMES": str(sim_root / "usr/share/vulkan/icd.d/nvidia_icd.json"),
            "LD_LIBRARY_PATH": str(sim_root / LIBDIR),
            "NVHOOK_SIM_PROCFS": str(procfs if procfs is not None else sim_root / "proc/driver/nvidia")}
