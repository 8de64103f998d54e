"""CDI refresh: keep a generated CDI spec current as the driver and its GPUs change
(what NVIDIA ships as nvidia-cdi-refresh; `nvhook cdi refresh [--watch]`).

A Refresher holds one spec file and how to make it: discovery's options (so a refresh
also re-warms the discovery snapshot, libinject.discover.snapshot) and a render
function (driver -> spec text, built by the CLI from the `cdi generate` options).
refresh() discovers, renders and compares bytes with the file there: only different
content is written (atomically, libinject.linux.atomic via cdi.write_atomic); an equal
file is left alone, mtime and inode included, so runtimes watching the spec dir see
no event.

watch() keeps it current: it rechecks the discovery fingerprint (snapshot.fingerprint,
the digest of every host input discovery's answer depends on) and refreshes when it
differs from the one the spec was made at (two discoveries agreeing, each with equal
fingerprints before and after it: Refresher.discover_steady),
  - shortly after kernel uevents that may mean a change (a netlink
    NETLINK_KOBJECT_UEVENT socket through pyroute2, kernel multicast group only):
    an nvidia* kernel module loaded or removed, any PCI or DRM device event (rare on
    a host, and a GPU appearing, going or being (un)bound is one), or any device
    whose node is named nvidia* or whose subsystem is nvidia*; a burst is debounced
    (checked `debounce` s after the last event, at most 5 x debounce after the first);
  - and every `interval` s regardless: not every change comes with a uevent (the
    /dev/nvidia* nodes are made by nvidia-modprobe, not by the kernel; a simulated
    host produces none at all; a lost event: the socket buffer overflowed);
  - on a MIG-capable host (proc/driver/nvidia-caps/mig-minors), every `mig_interval` s
    too: creating or destroying MIG instances makes no uevent, only new capability
    entries under proc/driver/nvidia/capabilities and nodes in dev/nvidia-caps, which
    the fingerprint covers (a check that finds it unchanged: ~1.5 ms, stat calls and
    small reads).
An edited config file (its fixed path, stat'ed at each check) is read again and the spec
refreshed with it; one that does not load is reported and the previous one kept.
A uevent is only a hint: the fingerprint decides. Only the kernel's count (sender port
id 0); any other datagram (a CAP_NET_ADMIN process of the host's network namespace can
send one) is dropped and counted, the count reported (one line when it changed, at
most once a check). Errors
while watching are reported as one `nvhook: ` line (once until the message changes)
and the watch goes on: a driver that is not loaded yet at boot is what it waits for.
SIGTERM or SIGINT stops it (after the refresh in progress, bounded by discovery's
NVML timeout); every wait has a deadline.
"""
from __future__ import annotations

import os
import stat
import time

from libinject.errors import NvhookError, error_line

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping

DEFAULT_OUTPUT = "/var/run/cdi/nvidia.yaml"     # where nvidia-cdi-refresh writes it
DEFAULT_INTERVAL = 60.0                         # seconds between fingerprint checks
DEFAULT_DEBOUNCE = 1.0                          # seconds of quiet after a uevent burst
DEFAULT_MIG_INTERVAL = 2.0                      # seconds between checks on a MIG-capable host
MAX_DEBOUNCES = 5                               # a burst delays a check at most this many debounces
KERNEL_GROUP = 1                                # uevent multicast group of the kernel (2: udevd's)
# Kernel modules whose loading or removal changes what discovery finds.
MODULES = frozenset(("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_peermem",
                     "nvidia_fs", "nvidia_vgpu_vfio"))
SUBSYSTEMS = frozenset(("pci", "drm"))
MAX_SPEC_BYTES = 64 << 20
MAX_WAIT = 3600.0                               # seconds: the longest single wait (then rechecked)
STEADY_TRIES = 3                                # discoveries per refresh while the host changes under it


# ----------------------------------------------------------------------------- uevents

def parse_uevent(data: bytes) -> dict[str, str] | None:
    """A kernel uevent datagram ("ACTION@DEVPATH\\0KEY=VALUE\\0...") as its KEY=VALUE
    pairs; None for anything else (udevd's "libudev" messages, garbage)."""
    parts = data.split(b"\0")
    head = parts[0].decode(errors="replace")
    if "@" not in head or head.startswith("libudev"):
        return None
    out: dict[str, str] = {}
    for p in parts[1:]:
        key, sep, value = p.partition(b"=")
        if sep and key:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    action, _, devpath = head.partition("@")
    out.setdefault("ACTION", action)
    out.setdefault("DEVPATH", devpath)
    return out


def wanted(event: Mapping[str, str]) -> bool:
    """Whether a uevent may mean that what discovery finds changed (see the module doc)."""
    subsystem = event.get("SUBSYSTEM", "")
    if subsystem == "module":
        return event.get("DEVPATH", "").rsplit("/", 1)[-1] in MODULES
    if subsystem in SUBSYSTEMS or subsystem.startswith("nvidia"):
        return True
    return event.get("DEVNAME", "").startswith("nvidia")


class Debounce:
    """When to check after a burst of events: `delay` s after the last one, but no
    later than MAX_DEBOUNCES x delay after the first (a steady stream still gets
    checked). Times are the caller's (time.monotonic())."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.first: float | None = None
        self.due: float | None = None

    def event(self, now: float) -> None:
        if self.first is None:
            self.first = now
        self.due = min(now + self.delay, self.first + MAX_DEBOUNCES * self.delay)

    def ready(self, now: float) -> bool:
        """True (once, and the burst is over) when the check is due."""
        if self.due is None or now < self.due:
            return False
        self.first = self.due = None
        return True


class Uevents:
    """The kernel's uevents, through pyroute2's asyncio netlink socket: wait() returns
    once a wanted one came. Each datagram is judged in pyroute2's receive callback,
    before its own parsing (which raises there on a datagram shorter than a netlink
    header, or a head that is not UTF-8: a traceback each, or a dead listener): one
    not from the kernel (sender port id 0: no other socket can have it) or not a
    uevent is dropped and counted in `dropped`. Sending to this socket at all needs
    CAP_NET_ADMIN in its network namespace (the kernel's rule for this family)."""

    def __init__(self, sock: Any) -> None:
        import asyncio

        self.sock = sock
        self.dropped = 0
        self._hint = asyncio.Event()

    @classmethod
    async def open(cls) -> Uevents:
        """Raises NvhookError if it cannot listen (no pyroute2, no netlink)."""
        try:
            from pyroute2.netlink.uevent import AsyncUeventSocket
        except ImportError as e:
            raise NvhookError(f"cannot listen to uevents: pyroute2 is not installed "
                              f"(the nvhook[refresh] extra): {e}") from None

        listener: Uevents | None = None

        class Socket(AsyncUeventSocket):
            def enqueue(self, data: bytes, addr: Any) -> None:     # every datagram
                if listener is not None:
                    listener.datagram(data, addr)

        try:
            sock = Socket()
            listener = cls(sock)
            try:
                await sock.bind(groups=KERNEL_GROUP)
            except BaseException:
                sock.close()
                raise
        except OSError as e:
            raise NvhookError(f"cannot listen to uevents: {e.strerror or e}") from None
        return listener

    def datagram(self, data: Any, addr: Any) -> None:
        """One datagram (runs in pyroute2's callback: never raises)."""
        try:
            if addr is None:
                # pyroute2's own note of a socket error (ENOBUFS: the buffer overflowed):
                # events may have been lost, so look.
                self._hint.set()
                return
            event = parse_uevent(bytes(data)) if addr[0] == 0 else None
        except Exception:
            event = None
        if event is None:
            self.dropped += 1
        elif wanted(event):
            self._hint.set()

    async def wait(self) -> None:
        """Until a wanted uevent came since the last return (the caller bounds it)."""
        await self._hint.wait()
        self._hint.clear()

    def close(self) -> None:
        try:
            self.sock.close()
        except Exception:
            pass


# ----------------------------------------------------------------------------- refresh

def _fresh(*args: Any, **kw: Any) -> Any:
    """libinject.discover.driver.discover, reading the host (never a snapshot)."""
    from libinject.discover.driver import discover

    return discover(*args, **{**kw, "snapshot": False})


def _read_existing(path: str, limit: int) -> bytes | None:
    """The file's bytes if it is a regular file (not followed if a symlink) of at most
    `limit` bytes; None otherwise (then it is replaced)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        chunks, left = [], limit + 1
        while left > 0 and (b := os.read(fd, left)):
            chunks.append(b)
            left -= len(b)
        data = b"".join(chunks)
        return data if len(data) <= limit else None
    except OSError:
        return None
    finally:
        os.close(fd)


def check_output(path: str) -> str:
    """The absolute spec path, if its directory exists and is writable (checked before
    anything is discovered or written); NvhookError otherwise."""
    path = os.path.abspath(path)
    d = os.path.dirname(path)
    if os.path.basename(path) in ("", ".", ".."):
        raise NvhookError(f"cannot write {path}: not a file name")
    if not os.path.isdir(d):
        raise NvhookError(f"cannot write {path}: directory {d} does not exist")
    if not os.access(d, os.W_OK | os.X_OK):
        import errno

        why = os.strerror(errno.EROFS if _read_only(d) else errno.EACCES)
        raise NvhookError(f"cannot write {path}: {why}")
    if os.path.isdir(path):
        raise NvhookError(f"cannot write {path}: a directory")
    return path


def _read_only(d: str) -> bool:
    try:
        return bool(os.statvfs(d).f_flag & os.ST_RDONLY)
    except OSError:
        return False


class Refresher:
    """One spec file kept current. options: libinject.discover.options.DiscoverOptions;
    render(driver) -> the spec's text."""

    def __init__(self, output: str, options: Any, render: Callable[[Any], str],
                 log: Callable[[str], None] | None = None,
                 reload: Callable[[], tuple[Any, Callable[[Any], str]] | None] | None = None) -> None:
        """reload() -> (options, render) made anew from the config file when it changed
        since the last call, else None (the watch asks before each check)."""
        self.output = os.path.abspath(output)
        self.options = options
        self.render = render
        self.log = log
        self.reload = reload
        self._watch_dirs: list[str] | None = None
        self.made_at: str | None = None     # fingerprint the last refresh's spec is of

    def discover_steady(self) -> Any:
        """The Driver, and self.made_at: the fingerprint of the host state it describes.
        Two readings must agree: each discovery is fingerprinted before and after (equal:
        nothing it reads changed meanwhile), and two discoveries in a row, the second
        fresh (not from the snapshot), must find the same Driver under the same
        fingerprint. Equal fingerprints alone are not enough: a GPU entry that went and
        came back within one discovery leaves them equal and the answer without the GPU,
        and remembering that fingerprint would keep that spec for good (every later
        check equal to it). A snapshot that disagrees with the agreed answer is written
        anew (the hook's discovery reads it too). A host that never holds still within
        2 x STEADY_TRIES discoveries leaves made_at None: the next check discovers again."""
        self.made_at = None
        prev: tuple[str, Any] | None = None
        first = driver = None
        for n in range(2 * STEADY_TRIES):
            before = self.fingerprint()
            driver = self.options.discover(None if n == 0 else _fresh, log=self.log)
            if n == 0:
                first = driver
            if self.fingerprint() != before:
                prev = None
                continue
            if prev is not None and prev == (before, driver):
                self.made_at = before
                if driver != first:
                    self._resave(before, driver)
                break
            prev = (before, driver)
        return driver

    def _resave(self, key: str, driver: Any) -> None:
        """The snapshot discovery keeps for this host, made from driver (key: its
        fingerprint), where snapshots are on."""
        from libinject.discover import driver as D
        from libinject.discover import snapshot

        o = self.options
        if not getattr(o, "snapshot", False):
            return
        root = os.path.realpath(o.root)
        dev_root = os.path.realpath(o.dev_root) if o.dev_root else root
        cache = os.path.join(root, (o.ldcache or D.DEFAULT_LDCACHE).lstrip("/"))
        snapshot.save(snapshot.path_for(o.snapshot_dir or snapshot.DEFAULT_DIR, root, dev_root, cache),
                      key, driver)

    def reload_config(self) -> bool:
        """Take the options and render of a config that changed (self.reload); True if
        taken. NvhookError for a config that does not load (the old ones are kept)."""
        new = self.reload() if self.reload is not None else None
        if new is None:
            return False
        self.options, self.render = new
        return True

    def _remove(self) -> bool:
        """Remove the spec file; False if there was none. Through its directory's fd,
        opened as the write opens it (no link followed there: a writer of the host's /run
        who made /var/run/cdi a link would otherwise have another dir's spec removed)."""
        from libinject.linux import atomic

        try:
            dfd = atomic.open_dir(os.path.dirname(self.output))
            try:
                os.unlink(os.path.basename(self.output), dir_fd=dfd)
            finally:
                os.close(dfd)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise NvhookError(f"cannot remove {self.output}: {e.strerror}") from None
        return True

    def fingerprint(self) -> str:
        """Discovery's fingerprint of the host now, with the inputs discovery uses
        (libinject.discover.driver.discover): equal while its answer cannot have changed."""
        from libinject.discover import driver as D
        from libinject.discover import snapshot

        o = self.options
        if self._watch_dirs is None:
            self._watch_dirs = D._watch_dirs()
        root = os.path.realpath(o.root)
        dev_root = os.path.realpath(o.dev_root) if o.dev_root else root
        cache = os.path.join(root, (o.ldcache or D.DEFAULT_LDCACHE).lstrip("/"))
        return snapshot.fingerprint(root, dev_root, cache, self._watch_dirs)

    def refresh(self) -> bool:
        """Discover (through the snapshot, which this re-warms), render, and write the
        spec if its bytes differ from the file's. True if written. NvhookError on failure
        (nothing written then); cdi.NoDevices when the host has no device for the spec,
        the file removed then (its message says so when there was one). Sets made_at
        (see discover_steady)."""
        from libinject.apply import cdi

        driver = self.discover_steady()
        try:
            data = self.render(driver).encode()
        except cdi.NoDevices as e:
            # A spec naming devices that are gone would be handed to containers (and
            # no spec can say "none"): the file goes.
            if self._remove():
                raise cdi.NoDevices(f"{e}; removed {self.output}") from None
            raise
        if _read_existing(self.output, MAX_SPEC_BYTES) == data:
            return False
        cdi.write_atomic(self.output, data.decode())
        return True


# ----------------------------------------------------------------------------- watch

def check_timing(interval: float, debounce: float, mig_interval: float = DEFAULT_MIG_INTERVAL) -> None:
    import math

    if not (math.isfinite(interval) and interval > 0):
        raise NvhookError(f"--interval must be a number of seconds > 0, not {interval!r}")
    if not (math.isfinite(mig_interval) and mig_interval > 0):
        raise NvhookError(f"--mig-interval must be a number of seconds > 0, not {mig_interval!r}")
    if not (math.isfinite(debounce) and debounce >= 0):
        raise NvhookError(f"--debounce must be a number of seconds >= 0, not {debounce!r}")


class _Reporter:
    """Error lines, each message once until a different one (or a success) comes."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.last = ""

    def error(self, e: BaseException | str) -> None:
        line = error_line(e)
        if line != self.last:
            self.last = line
            try:
                self.stream.write(line)
                self.stream.flush()
            except (OSError, ValueError):
                pass

    def ok(self) -> None:
        self.last = ""

    def note(self, message: str) -> None:
        """A line outside the error dedup (its caller limits how often)."""
        try:
            self.stream.write(error_line(message))
            self.stream.flush()
        except (OSError, ValueError):
            pass


def mig_capable(refresher: Refresher) -> bool:
    """Whether the host can have MIG devices (its driver lists the MIG minors)."""
    o = refresher.options
    dev_root = o.dev_root or o.root
    return os.path.isfile(os.path.join(dev_root, "proc/driver/nvidia-caps/mig-minors"))


def poll_interval(refresher: Refresher, interval: float, mig_interval: float) -> float:
    """Seconds to the next periodic check: mig_interval on a MIG-capable host (MIG
    reconfiguration makes no uevent), else interval."""
    return min(interval, mig_interval) if mig_capable(refresher) else interval


def watch(refresher: Refresher, *, interval: float = DEFAULT_INTERVAL,
          debounce: float = DEFAULT_DEBOUNCE, uevents: bool = True,
          say: Callable[[str], None] | None = None, stderr: Any = None,
          mig_interval: float = DEFAULT_MIG_INTERVAL) -> int:
    """Refresh now, then whenever the fingerprint changes (see the module doc) until
    SIGTERM/SIGINT; returns 0 then. say(line): "updated FILE" / "unchanged FILE"
    (the first refresh) and "updated FILE" (later ones). Errors: one line on stderr."""
    import asyncio
    import sys

    check_timing(interval, debounce, mig_interval)
    reporter = _Reporter(stderr if stderr is not None else sys.stderr)
    return asyncio.run(_watch(refresher, interval, debounce, uevents,
                              say or (lambda line: None), reporter, mig_interval))


async def _watch(refresher: Refresher, interval: float, debounce: float, uevents: bool,
                 say: Callable[[str], None], reporter: _Reporter,
                 mig_interval: float = DEFAULT_MIG_INTERVAL) -> int:
    import asyncio
    import signal

    from libinject.apply import cdi

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    listener: Uevents | None = None
    if uevents:
        try:
            listener = await asyncio.wait_for(Uevents.open(), 10)
        except (NvhookError, asyncio.TimeoutError) as e:
            reporter.error(f"{e or 'cannot listen to uevents: timed out'}; "
                           f"checking every {interval:g} s only")
    burst = Debounce(debounce)
    current: str | None = None      # fingerprint the spec was last made at

    dropped = 0                     # the listener's count, as last reported

    def report_dropped() -> None:
        # One line when the count changed, at most once a check: a sender cannot flood
        # the log, and the administrator still learns that something sends here.
        nonlocal dropped
        if listener is not None and listener.dropped != dropped:
            dropped = listener.dropped
            reporter.note(f"uevents: dropped {dropped} datagram(s) so far that were not "
                          "kernel uevents")

    def check(first: bool = False) -> None:
        nonlocal current
        report_dropped()
        try:
            if refresher.reload_config():
                current = None          # the same host may make another spec now
            if refresher.fingerprint() == current:
                return
            changed = refresher.refresh()
        except NvhookError as e:
            reporter.error(e)
            if isinstance(e, cdi.NoDevices):
                current = refresher.made_at     # no spec is what this host state makes
            return
        except Exception as e:  # a bug: one line, and the watch goes on
            reporter.error(f"internal error: {type(e).__name__}: {e}")
            return
        reporter.ok()
        current = refresher.made_at     # what the spec was made from, not what was seen before
        if changed or first:
            say(f"{'updated' if changed else 'unchanged'} {refresher.output}")

    check(first=True)
    poll_at = time.monotonic() + poll_interval(refresher, interval, mig_interval)
    stopping = asyncio.ensure_future(stop.wait())
    receiving = asyncio.ensure_future(listener.wait()) if listener else None
    try:
        while not stop.is_set():
            now = time.monotonic()
            if burst.ready(now) or now >= poll_at:
                check()
                poll_at = time.monotonic() + poll_interval(refresher, interval, mig_interval)
                continue
            due = min(poll_at, burst.due if burst.due is not None else poll_at)
            waiting = {stopping} | ({receiving} if receiving else set())
            done, _ = await asyncio.wait(waiting, timeout=min(max(due - now, 0.001), MAX_WAIT),
                                         return_when=asyncio.FIRST_COMPLETED)
            if receiving is not None and receiving in done:
                burst.event(time.monotonic())
                receiving = asyncio.ensure_future(listener.wait())
    finally:
        for t in (stopping, receiving):
            if t is not None:
                t.cancel()
        if listener is not None:
            report_dropped()
            listener.close()
    return 0
