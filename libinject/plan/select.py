"""Device selection, with nvidia-container-cli's grammar (src/cli/common.c).

A comma list of: `all`; a GPU index; `GPU-<uuid>` (any case); a PCI bus id
("00000000:07:00.0" or "0000:07:00.0", any case); `MIG-<uuid>`; `<gpu>:<mig>`
(indexes). "none", "void" and "" select nothing. `all` selects every GPU and then
every MIG device and ends the list. Selecting a MIG device also makes its parent
GPU visible. Duplicates are dropped, first place kept. Unknown ids are an error.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from libinject.errors import NvhookError
from libinject.discover.model import DeviceNode, Driver, DriverInfo, Gpu, MigDevice

_PCI = re.compile(r"([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.0")
_MIG_INDEX = re.compile(r"(\d+):(\d+)")
NOTHING = ("none", "void", "")


@dataclass(frozen=True)
class Selected:
    gpu: Gpu
    mig: MigDevice | None = None


def _gpu(info: DriverInfo, dev: str) -> Gpu | None:
    if dev[:4].upper() == "GPU-" and len(dev) > 4:
        for g in info.gpus:
            if g.uuid.lower() == dev.lower():
                return g
    m = _PCI.fullmatch(dev)
    if m:
        busid = f"{int(m[1], 16):08x}:{int(m[2], 16):02x}:{int(m[3], 16):02x}.0"
        for g in info.gpus:
            if g.bus_id.lower().startswith(busid):
                return g
    if dev.isdigit() and int(dev) < len(info.gpus):
        return info.gpus[int(dev)]
    return None


def _mig(info: DriverInfo, dev: str) -> tuple[Gpu, MigDevice] | None:
    if dev[:4].upper() == "MIG-" and len(dev) > 4:
        for g in info.gpus:
            for m in g.mig_devices:
                if m.uuid.lower() == dev.lower():
                    return g, m
    m = _MIG_INDEX.fullmatch(dev)
    if m:
        i, j = int(m[1]), int(m[2])
        if i < len(info.gpus) and j < len(info.gpus[i].mig_devices):
            return info.gpus[i], info.gpus[i].mig_devices[j]
    return None


def tokens(ids: str | None) -> list[str]:
    return [t.strip() for t in (ids or "").split(",") if t.strip()]


def selects_all(ids: str | None) -> bool:
    return any(t.lower() == "all" for t in tokens(ids))


def select(info: DriverInfo, ids: str | None) -> list[Selected]:
    out: list[Selected] = []
    seen: set[tuple[int, int | None]] = set()

    def add(gpu: Gpu, mig: MigDevice | None = None) -> None:
        key = (gpu.index, None if mig is None else mig.index)
        if key not in seen:
            seen.add(key)
            out.append(Selected(gpu, mig))

    for dev in tokens(ids):
        low = dev.lower()
        if low in NOTHING:
            continue
        if low == "all":
            for g in info.gpus:
                add(g)
            for g in info.gpus:
                for m in g.mig_devices:
                    add(g, m)
            break
        g = _gpu(info, dev)
        if g is not None:
            add(g)
            continue
        gm = _mig(info, dev)
        if gm is not None:
            add(*gm)
            continue
        raise NvhookError(f"unknown device: {dev}")
    return out


def gpus_of(selected: list[Selected]) -> list[Gpu]:
    """Visible GPUs: the selected ones and the parents of selected MIG devices, in order."""
    out: list[Gpu] = []
    for s in selected:
        if all(g.index != s.gpu.index for g in out):
            out.append(s.gpu)
    return out


def migs_of(selected: list[Selected]) -> list[tuple[Gpu, MigDevice]]:
    return [(s.gpu, s.mig) for s in selected if s.mig is not None]


def mig_caps_gpus(ids: str | None, devices: str | None, selected: list[Selected], kind: str) -> list[Gpu]:
    """GPUs whose MIG `kind` ("mig-config" / "mig-monitor") capability is requested.

    As nvidia-container-cli: only "all" is accepted, meaning the MIG-capable visible
    GPUs, and not together with a choice of specific MIG devices."""
    toks = tokens(ids)
    if not toks:
        return []
    for t in toks:
        if t.lower() != "all":
            raise NvhookError(f"{kind}: {t}: only 'all' devices are currently supported")
    if migs_of(selected) and not selects_all(devices):
        raise NvhookError(f"{kind}: cannot enable {kind} with specific MIG devices selected")
    return [g for g in gpus_of(selected) if g.mig_capable]


def imex_channels(driver: Driver, ids: str | None) -> list[DeviceNode]:
    """IMEX channel nodes for a comma list of channel numbers or "all"."""
    by_id = {int(n.container_path.rsplit("channel", 1)[1]): n for n in driver.imex_channels}
    out: list[DeviceNode] = []
    for t in tokens(ids):
        if t.lower() in NOTHING:
            continue
        if t.lower() == "all":
            wanted = sorted(by_id)
        elif t.isdigit():
            if int(t) not in by_id:
                raise NvhookError(f"unknown IMEX channel: {t}")
            wanted = [int(t)]
        else:
            raise NvhookError(f"invalid IMEX channel: {t}")
        for n in wanted:
            if by_id[n] not in out:
                out.append(by_id[n])
    return out
