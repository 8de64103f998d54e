"""Device selection, with nvidia-container-cli's grammar (src/cli/common.c).

A comma list of: `all`; a GPU index; `GPU-<uuid>` (any case); a PCI bus id
("00000000:07:00.0" or "0000:07:00.0", any case); `MIG-<uuid>`; `<gpu>:<mig>`
(indexes). "none", "void" and "" select nothing. `all` selects every GPU and then
every MIG device and ends the list. Selecting a MIG device also makes its parent
GPU visible. Duplicates are dropped, first place kept. Unknown ids are an error.

The one home of device selection: resolve() answers everything a request selects (GPUs,
MIG devices, MIG config/monitor GPUs, IMEX channels) as a Selection, which both the
planner and `nvhook list` use, so they accept, refuse and pick the same things.
"""
from __future__ import annotations

from libinject.errors import NvhookError
from libinject.discover.model import DeviceNode, Driver, DriverInfo, Gpu, MigDevice
from libinject.record import record

_HEX = "0123456789abcdefABCDEF"
_DIGITS = "0123456789"
NOTHING = ("none", "void", "")
_MAX_INDEX_DIGITS = 9       # past any real index; int() of thousands of digits raises


def _number(text: str) -> int | None:
    """An index or channel number: ASCII digits only ("²" and "١" are digits to
    str.isdigit() and int()), short enough to convert; None otherwise."""
    if text.isascii() and text.isdigit() and len(text.lstrip("0")) <= _MAX_INDEX_DIGITS:
        return int(text)
    return None


def _pci(dev: str) -> tuple[str, str, str] | None:
    """The groups of a fullmatch of ([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\\.0,
    or None (hand-written: `re` costs the hook ~8 ms to import; ASCII hex only)."""
    if not dev.endswith(".0"):
        return None
    parts = dev[:-2].split(":")
    if len(parts) != 3:
        return None
    for part, most in zip(parts, (8, 2, 2)):
        if not 0 < len(part) <= most or part.strip(_HEX):
            return None
    return parts[0], parts[1], parts[2]


def _mig_index(dev: str) -> tuple[str, str] | None:
    """The groups of a fullmatch of ([0-9]+):([0-9]+) (ASCII digits), or None."""
    gpu, colon, mig = dev.partition(":")
    if not colon or not gpu or not mig or gpu.strip(_DIGITS) or mig.strip(_DIGITS):
        return None
    return gpu, mig


def _show(dev: str) -> str:
    """An id for an error line: a container's value may be megabytes long."""
    return dev if len(dev) <= 64 else dev[:64] + "..."


@record(frozen=True)
class Selected:
    gpu: Gpu
    mig: MigDevice | None = None


def _gpu(info: DriverInfo, dev: str) -> Gpu | None:
    if dev[:4].upper() == "GPU-" and len(dev) > 4:
        for g in info.gpus:
            if g.uuid.lower() == dev.lower():
                return g
    m = _pci(dev)
    if m:
        busid = f"{int(m[0], 16):08x}:{int(m[1], 16):02x}:{int(m[2], 16):02x}.0"
        for g in info.gpus:
            if g.bus_id.lower().startswith(busid):
                return g
    n = _number(dev)
    if n is not None and n < len(info.gpus):
        return info.gpus[n]
    return None


def _mig(info: DriverInfo, dev: str) -> tuple[Gpu, MigDevice] | None:
    if dev[:4].upper() == "MIG-" and len(dev) > 4:
        for g in info.gpus:
            for m in g.mig_devices:
                if m.uuid.lower() == dev.lower():
                    return g, m
    m = _mig_index(dev)
    i, j = (_number(m[0]), _number(m[1])) if m else (None, None)
    if i is not None and j is not None:
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
        raise NvhookError(f"unknown device: {_show(dev)}")
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

    As nvidia-container-cli (src/cli/common.c select_mig_config_devices and
    select_mig_monitor_devices): the list is walked up to "all", which means the
    MIG-capable visible GPUs and ends the list; any other id before it is refused
    ("only 'all'"), as is "all" with specific MIG devices selected but not every device."""
    for t in tokens(ids):
        if t.lower() != "all":
            raise NvhookError(f"{kind} error: {_show(t)}: only 'all' devices are currently supported")
        if migs_of(selected) and not selects_all(devices):
            raise NvhookError(f"{kind} error: {_show(t)}: cannot enable {kind} with specific MIG devices selected")
        return [g for g in gpus_of(selected) if g.mig_capable]
    return []


def imex_channels(driver: Driver, ids: str | None) -> list[DeviceNode]:
    """IMEX channel nodes for a comma list of channel numbers or "all"."""
    by_id = {int(n.container_path.rsplit("channel", 1)[1]): n for n in driver.imex_channels}
    out: list[DeviceNode] = []
    for t in tokens(ids):
        if t.lower() in NOTHING:
            continue
        if t.lower() == "all":
            wanted = sorted(by_id)
        elif (n := _number(t)) is not None:
            if n not in by_id:
                raise NvhookError(f"unknown IMEX channel: {_show(t)}")
            wanted = [n]
        else:
            raise NvhookError(f"invalid IMEX channel: {_show(t)}")
        for n in wanted:
            if by_id[n] not in out:
                out.append(by_id[n])
    return out


IMEX_CHANNEL_PATH = "/dev/nvidia-caps-imex-channels/channel{}"


def imex_channel_requests(driver: Driver, ids: str | None) -> list[tuple[int, DeviceNode | None]]:
    """(channel id, its node or None) for each channel asked for: what `list` shows.
    As nvidia-container-cli list (cli/list.c prints NV_CAPS_IMEX_DEVICE_PATH for each id
    parse_imex_info took), a channel number is listed whether or not its node exists;
    "all" is the channels the host has. Injecting one still needs the node
    (imex_channels)."""
    by_id = {int(n.container_path.rsplit("channel", 1)[1]): n for n in driver.imex_channels}
    out: list[tuple[int, DeviceNode | None]] = []
    for t in tokens(ids):
        if t.lower() in NOTHING:
            continue
        if t.lower() == "all":
            wanted = sorted(by_id)
        elif (n := _number(t)) is not None:
            wanted = [n]
        else:
            raise NvhookError(f"invalid IMEX channel: {_show(t)}")
        out += [(n, by_id.get(n)) for n in wanted if n not in {i for i, _ in out}]
    return out


def mig_minors_of(driver: Driver, gpu: Gpu) -> list[tuple[str, int]]:
    """("gpu<N>/gi<G>[/ci<C>]/access", minor) of every MIG capability of a GPU, by minor:
    what creating or watching its MIG devices may open (upstream's setup_mig_minor_cgroups)."""
    prefix = f"gpu{gpu.minor}/"
    return sorted(((k, v) for k, v in driver.mig_minors.items() if k.startswith(prefix)),
                  key=lambda kv: kv[1])


@record(frozen=True)
class Selection:
    """Everything a request selects, resolved against one Driver."""
    gpus: tuple[Gpu, ...] = ()                    # visible: selected GPUs and MIG parents, in order
    migs: tuple[tuple[Gpu, MigDevice], ...] = ()  # selected MIG devices with their parent
    mig_config: tuple[Gpu, ...] | None = None     # None: not asked; else the MIG-capable visible GPUs
    mig_monitor: tuple[Gpu, ...] | None = None
    imex: tuple[DeviceNode, ...] = ()             # IMEX channel nodes

    @property
    def whole_gpus(self) -> tuple[Gpu, ...]:
        """Visible GPUs that are not there as a MIG device's parent (a MIG device has no
        display engine: DRM nodes go with whole GPUs, as NVIDIA's toolkit matches them to
        GPU ids, never MIG ids)."""
        parents = {g.bus_id for g, _ in self.migs}
        return tuple(g for g in self.gpus if g.bus_id not in parents)

    @property
    def mig_access(self) -> tuple[tuple[Gpu, MigDevice], ...]:
        """MIG devices whose access capabilities the container gets: none once mig-config or
        mig-monitor is asked, as configure.c and list.c (the GPU-wide caps stand in)."""
        return () if self.mig_config is not None or self.mig_monitor is not None else self.migs

    @property
    def mig_caps(self) -> tuple[tuple[str, tuple[Gpu, ...]], ...]:
        """("config" | "monitor", GPUs) for each global MIG capability given: asked, and
        at least one MIG-capable visible GPU."""
        return tuple((k, g) for k, g in (("config", self.mig_config), ("monitor", self.mig_monitor)) if g)


def resolve(driver: Driver, devices: str | None, *, mig_config: str | None = None,
            mig_monitor: str | None = None, imex: str | None = None) -> Selection:
    """One request's selection; raises NvhookError for what nvidia-container-cli refuses."""
    selected = select(driver.info, devices)

    def caps(ids: str | None, kind: str) -> tuple[Gpu, ...] | None:
        return tuple(mig_caps_gpus(ids, devices, selected, kind)) if tokens(ids) else None

    return Selection(gpus=tuple(gpus_of(selected)), migs=tuple(migs_of(selected)),
                     mig_config=caps(mig_config, "mig-config"),
                     mig_monitor=caps(mig_monitor, "mig-monitor"),
                     imex=tuple(imex_channels(driver, imex)))
