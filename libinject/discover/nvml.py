"""Ask NVML about the driver and its GPUs, in a child process that cannot hurt the host.

The parent (query()) runs this file as a script: `python -I nvml.py LIBPATH UID GID
ROOT PARENT_PID` with an explicit environment and a timeout, and the child dies with
its parent (PR_SET_PDEATHSIG: a killed hook leaves no query behind). The child
becomes UID:GID (by default 65534:65534, nobody, as nvidia-container-cli's privilege
separation; --user or the config's `user` say otherwise), drops every capability and
sets no-new-privs before touching the library, loads the driver root's
libnvidia-ml.so.1 by path (never the default search path), and prints a JSON
DriverInfo (or {"error": ...}), which the parent checks field by field. A hung driver
is killed, not waited for.

A driver root other than "/" may sit below directories only root can enter (a
root-only temp dir, /root): the child, still root, binds it over /tmp in a private
mount namespace of its own and loads the library from there, so what the
unprivileged child needs is read access to the driver root's own files only (real
drivers: world-readable libraries, /dev/nvidiactl 0666).

Of libinject the child imports only the OS layer (libinject.linux: privileges,
native), not the rest (start-up time, and a smaller surface).
"""
from __future__ import annotations

import json
import os
import sys

_PARENT: int | None = None      # the child's: pid of the process that started it


def _die_with_parent() -> None:
    """SIGKILL this (child) process when its parent dies, so that a killed hook leaves
    no NVML query behind (it runs in a session of its own: nothing else reaches it).
    A parent that died before this took effect shows as another parent pid. Changing
    uid/gid clears the setting: called again after the privileges are dropped."""
    import signal

    import prctl

    if _PARENT is None:
        return
    prctl.set_pdeathsig(signal.SIGKILL)
    if os.getppid() != _PARENT:
        os._exit(1)


if __name__ == "__main__":
    # Run as a script (query()): -I leaves this file's package off sys.path, and the
    # environment (PYTHONPATH) is ignored. The tree this file is in comes first, so
    # the libinject imported is the one this file belongs to.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    if len(sys.argv) > 5 and sys.argv[5].isdigit():
        _PARENT = int(sys.argv[5])
    _die_with_parent()      # first thing: the imports below take a while

from libinject.constants import SAFE_PATH  # noqa: E402
from libinject.linux import native, privileges  # noqa: E402

# nvidia-container-cli's names for nvmlBrandType_t (src/driver.c).
BRANDS = {
    1: "Quadro", 2: "Tesla", 3: "NVS", 4: "GRID", 5: "GeForce", 6: "TITAN",
    7: "NvidiaVApps", 8: "NvidiaVPC", 9: "NvidiaVCS", 10: "NvidiaVWS",
    11: "NvidiaCloudGaming", 12: "QuadroRTX", 13: "NvidiaRTX", 14: "Nvidia",
    15: "GeForceRTX", 16: "TitanRTX",
}


def architecture(cc: tuple[int, int]) -> str:
    """Architecture name from the CUDA compute capability."""
    major, minor = cc
    if major == 7:
        return "Turing" if minor >= 5 else "Volta"
    if major == 8:
        return "Ada" if minor >= 9 else "Ampere"
    return {1: "Tesla", 2: "Fermi", 3: "Kepler", 5: "Maxwell", 6: "Pascal",
            9: "Hopper", 10: "Blackwell", 12: "Blackwell"}.get(major, "Unknown")


# ----------------------------------------------------------------------------- child

def _drop_privileges(user: tuple[int, int] | None = None) -> None:
    """Become `user` (if given), then no-new-privs and empty bounding, ambient,
    effective, permitted and inheritable capability sets."""
    privileges.drop_all(user)


def _expose_root(root: str, libpath: str) -> str:
    """Bind the driver root over /tmp in a private mount namespace (we are still
    root) and return the library's path there. Nothing reaches the host's mounts."""
    import errno

    rel = os.path.relpath(libpath, root)
    if rel.startswith(".."):
        raise OSError(errno.EINVAL, f"{libpath} is not under the driver root {root}")
    native.unshare(native.CLONE_NEWNS)
    native.mount(None, "/", None, native.MS_REC | native.MS_PRIVATE)
    native.mount(root, "/tmp", None, native.MS_BIND | native.MS_REC)
    return os.path.join("/tmp", rel)


def _child(libpath: str, user: tuple[int, int] | None, root: str = "") -> dict:
    import ctypes

    # Python and pynvml are loaded while we may still read them; the driver's
    # library is loaded only after privileges are gone (nvidia-container-cli does
    # the same: drop to the user, then dlopen NVML).
    import pynvml

    if root and root != "/":
        libpath = _expose_root(root, libpath)
    _drop_privileges(user)
    _die_with_parent()      # the change of user cleared it

    try:
        lib = ctypes.CDLL(libpath, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as e:
        return {"error": f"cannot load {libpath}: {e}"}
    pynvml.nvmlLib = lib  # pynvml would otherwise dlopen("libnvidia-ml.so.1") from the search path
    try:
        fn = pynvml._nvmlGetFunctionPointer("nvmlInit_v2")
        pynvml._nvmlCheckReturn(fn())
        try:
            return _query(pynvml)
        finally:
            try:
                pynvml._nvmlGetFunctionPointer("nvmlShutdown")()
            except Exception:
                pass
    except pynvml.NVMLError as e:
        return {"error": str(e)}


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _query(nv) -> dict:
    cuda = nv.nvmlSystemGetCudaDriverVersion()
    out = {
        "driver_version": _s(nv.nvmlSystemGetDriverVersion()),
        "cuda_version": f"{cuda // 1000}.{cuda % 1000 // 10}",
        "gpus": [],
    }
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        pci = nv.nvmlDeviceGetPciInfo_v3(h)
        cc = tuple(nv.nvmlDeviceGetCudaComputeCapability(h))
        name = _s(nv.nvmlDeviceGetName(h))
        # nvidia-container-cli: MIG capable = the MIG mode query works; enabled = current and pending on.
        mig_capable = mig_enabled = False
        try:
            current, pending = nv.nvmlDeviceGetMigMode(h)
            mig_capable = True
            mig_enabled = current == 1 and current == pending
        except nv.NVMLError as e:
            if e.value not in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_FUNCTION_NOT_FOUND):
                raise
        migs = []
        if mig_enabled:
            for j in range(nv.nvmlDeviceGetMaxMigDeviceCount(h)):
                try:
                    m = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                except nv.NVMLError as e:
                    if e.value == nv.NVML_ERROR_NOT_FOUND:
                        break  # as nvidia-container-cli: the first gap ends the list
                    raise
                mname = _s(nv.nvmlDeviceGetName(m))
                migs.append({
                    "index": j,
                    "uuid": _s(nv.nvmlDeviceGetUUID(m)),
                    "gi": nv.nvmlDeviceGetGpuInstanceId(m),
                    "ci": nv.nvmlDeviceGetComputeInstanceId(m),
                    # "NVIDIA A100-SXM4-80GB MIG 3g.40gb" -> "3g.40gb"
                    "name": mname.rsplit("MIG ", 1)[-1] if "MIG " in mname else mname,
                    "memory_total": int(nv.nvmlDeviceGetMemoryInfo(m).total),
                })
        out["gpus"].append({
            "index": i,
            "minor": nv.nvmlDeviceGetMinorNumber(h),
            "uuid": _s(nv.nvmlDeviceGetUUID(h)),
            "name": name,
            "brand": BRANDS.get(nv.nvmlDeviceGetBrand(h), "Unknown"),
            "bus_id": f"{pci.domain:08x}:{pci.bus:02x}:{pci.device:02x}.0",
            "cc": list(cc),
            "architecture": architecture(cc),
            "memory_total": int(nv.nvmlDeviceGetMemoryInfo(h).total),
            "mig_capable": mig_capable,
            "mig_enabled": mig_enabled,
            "mig_devices": migs,
        })
    return out


def _child_main() -> int:
    try:
        user = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else None
        result = _child(sys.argv[1], user, sys.argv[4] if len(sys.argv) > 4 else "")
    except Exception as e:  # one line back to the parent, whatever went wrong
        result = {"error": f"{type(e).__name__}: {e}"}
    sys.stdout.write(json.dumps(result))
    sys.stdout.flush()
    return 0


# ----------------------------------------------------------------------------- parent

DEFAULT_USER = (65534, 65534)   # nobody:nogroup, as nvidia-container-cli


def query(root: str, libpath: str, *, timeout: float = 10.0, user: tuple[int, int] | None = None,
          env: dict[str, str] | None = None):
    """DriverInfo from NVML at `libpath` (a host path inside `root`), via a child process
    running as `user` (default DEFAULT_USER) without capabilities."""
    from libinject.errors import NvhookError
    from libinject.linux import child   # the parent's only: not loaded in the NVML child

    child_env = {"PATH": SAFE_PATH, "LC_ALL": "C"}
    child_env.update(env or {})
    if user is None:
        user = DEFAULT_USER
    argv = [sys.executable, "-I", os.path.abspath(__file__), libpath,
            str(int(user[0])), str(int(user[1])), os.path.abspath(root), str(os.getpid())]
    try:
        code, out, err = child.run(argv, timeout=timeout, env=child_env, cwd="/")
    except TimeoutError:
        raise NvhookError(f"NVML on driver root {root} did not answer within {timeout:g}s (driver hung?)") from None
    except OSError as e:
        raise NvhookError(f"NVML on driver root {root}: cannot start query process: {e.strerror}") from None
    try:
        data = json.loads(out or b"null")
    except ValueError:
        data = None
    if not isinstance(data, dict):
        last = (err.decode(errors="replace").strip().splitlines() or [f"exit status {code}"])[-1]
        raise NvhookError(f"NVML on driver root {root} failed: {last}")
    if "error" in data:
        if os.geteuid() != 0 and str(data["error"]).startswith("PermissionError"):
            # (the query unshares a mount namespace and drops to nobody: root's work)
            raise NvhookError(f"NVML on driver root {root} needs root: run this as root "
                              f"({data['error']})")
        raise NvhookError(f"NVML on driver root {root} failed: {data['error']}")
    try:
        return info_from_dict(data)
    except ValueError as e:
        raise NvhookError(f"NVML on driver root {root}: malformed answer: {e}") from None


def info_from_dict(d: dict):
    """The child's answer as a DriverInfo, checked field by field (libinject.discover.decode):
    the child runs the driver's code, so its answer is data to check, not to trust.
    Raises decode.Invalid (a ValueError)."""
    from libinject.discover import decode

    return decode.driver_info(d, "NVML answer", nvml=True)


if __name__ == "__main__":
    sys.exit(_child_main())
