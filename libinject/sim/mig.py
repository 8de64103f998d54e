"""MIG reconfiguration of a simulated host, as `nvidia-smi mig -cgi/-cci` and `-dci/-dgi`
change a real one: `nvhook sim mig ROOT --gpu N (--create PROFILE | --destroy GI[:CI])`.

A MIG device (a GPU instance with one compute instance) created shows, in this order:
the GPU's NVML data (proc/driver/nvidia/gpus/<bus>/nvhook-sim, what the simulated
NVML reads; replaced by rename, never half-written), its nvidia-caps nodes
(dev/nvidia-caps/nvidia-cap<minor>, as nvidia-modprobe makes them) and its capability
files (proc/driver/nvidia/capabilities/gpu<N>/mig/gi<G>/[ci<C>/]access). Destroying goes
the other way round. The profile copy (etc/nvhook-sim/profile.json) follows. The GPU
must be in MIG mode. One change at a time (a lock file beside the profile copy).
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import stat
from pathlib import Path

from libinject.errors import NvhookError
from libinject.record import asdict
from libinject.sim import build
from libinject.sim.profile import GpuSpec, MigSpec, _derived_uuid

_PROFILE = re.compile(r"(?:[1-7]c\.)?([1-7])g\.([0-9]{1,3})gb(?:\+me)?")
MAX_GI = 14


def _load(root: Path) -> dict:
    try:
        return json.loads((root / "etc/nvhook-sim/profile.json").read_text())
    except (OSError, ValueError) as e:
        raise NvhookError(f"sim mig: {root}: not a simulated host ({e})") from None


def _gpu_spec(d: dict) -> GpuSpec:
    return GpuSpec(**{**d, "cc": tuple(d["cc"]), "mig": tuple(MigSpec(**m) for m in d["mig"])})


def _write_atomic(path: Path, text: str, mode: int = 0o444) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _gpu(data: dict, minor: int) -> dict:
    g = next((g for g in data["gpus"] if g["minor"] == minor), None)
    if g is None:
        raise NvhookError(f"sim mig: no GPU with minor {minor}")
    if not g["mig_enabled"]:
        raise NvhookError(f"sim mig: GPU {minor} is not in MIG mode")
    return g


def change(root: str | os.PathLike[str], gpu_minor: int, *, create: str | None = None,
           destroy: tuple[int, int] | None = None) -> MigSpec:
    """Create a MIG device of profile `create` ("1g.10gb": GPU instance at the lowest free
    id, compute instance 0) or destroy the one at (gi, ci); the device."""
    root = Path(os.path.abspath(root))
    try:
        lock = os.open(root / "etc/nvhook-sim", os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise NvhookError(f"sim mig: {root}: not a simulated host ({root}/etc/nvhook-sim: {e.strerror})") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = _load(root)
        g = _gpu(data, gpu_minor)
        migs = [MigSpec(**m) for m in g["mig"]]
        if create is not None:
            m = _PROFILE.fullmatch(create)
            if not m:
                raise NvhookError(f"sim mig: {create!r}: expected a MIG profile like '1g.10gb'")
            used = {x.gi for x in migs}
            gi = next((i for i in range(1, MAX_GI + 1) if i not in used), None)
            if gi is None:
                raise NvhookError(f"sim mig: GPU {gpu_minor} has no free GPU instance id")
            dev = MigSpec(gi, 0, create, _derived_uuid("MIG", g["uuid"], gi, 0), int(m.group(2)) * 1024 - 256)
            migs.append(dev)
        elif destroy is not None:
            dev = next((x for x in migs if (x.gi, x.ci) == destroy), None)
            if dev is None:
                raise NvhookError(f"sim mig: GPU {gpu_minor} has no MIG device gi {destroy[0]} ci {destroy[1]}")
            migs.remove(dev)
        else:
            raise NvhookError("sim mig: --create or --destroy")
        g["mig"] = [asdict(x) for x in migs]
        spec = _gpu_spec(g)
        caps = root / "proc/driver/nvidia/capabilities" / f"gpu{gpu_minor}/mig/gi{dev.gi}"
        node_gi = root / f"dev/nvidia-caps/nvidia-cap{build.gi_minor(gpu_minor, dev.gi)}"
        node_ci = root / f"dev/nvidia-caps/nvidia-cap{build.ci_minor(gpu_minor, dev.gi, dev.ci)}"
        sim_data = root / "proc/driver/nvidia/gpus" / spec.procfs_name / "nvhook-sim"
        if create is not None:
            _write_atomic(sim_data, build._sim_data(spec))
            for node, minor in ((node_gi, build.gi_minor(gpu_minor, dev.gi)),
                                (node_ci, build.ci_minor(gpu_minor, dev.gi, dev.ci))):
                if not node.exists():
                    build._mknod(node, data["caps_major"], minor, 0o444)
            (caps / f"ci{dev.ci}").mkdir(parents=True, exist_ok=True)
            _write_atomic(caps / "access", build._cap_file(build.gi_minor(gpu_minor, dev.gi), 292))
            _write_atomic(caps / f"ci{dev.ci}/access",
                          build._cap_file(build.ci_minor(gpu_minor, dev.gi, dev.ci), 292))
        else:
            gi_left = any(x.gi == dev.gi for x in migs)     # other compute instances of the GI
            shutil.rmtree(caps / f"ci{dev.ci}" if gi_left else caps, ignore_errors=True)
            for node in (node_ci,) if gi_left else (node_ci, node_gi):
                try:
                    if stat.S_ISCHR(node.lstat().st_mode):
                        node.unlink()
                except FileNotFoundError:
                    pass
            _write_atomic(sim_data, build._sim_data(spec))
        _write_atomic(root / "etc/nvhook-sim/profile.json", json.dumps(data, indent=2) + "\n", 0o644)
        return dev
    finally:
        os.close(lock)
