"""`nvhook cdi refresh [--watch]` (libinject.apply.cdi_refresh) and its systemd unit:
the spec rewritten only when its bytes change, following GPUs that go and come back
on a simulated host, promptly after a real kernel uevent, and stopping on SIGTERM."""
from __future__ import annotations

import glob
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import NVHOOK, REPO, run
from libinject.constants import SAFE_PATH
from support import hookenv
from support.cdi_refresh import GpuAway, Watch, device_names, gpu_entry, uuid_of, write_config
from support.cli import one_error

UNIT = REPO / "libinject/setup/units" / "nvhook-cdi-refresh.service"
ANALYZE = "/usr/bin/systemd-analyze"
# A GPU gone or back shows within this (the watcher checks every 0.5 s here).
DEADLINE = 20


def refresh(config: Path, host: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return run([NVHOOK, "--config", str(config), "cdi", "refresh", "--driver-root", str(host),
                "-o", str(out), *extra], env={"PATH": os.environ["PATH"]})


def expected_names(host: Path, minors) -> list[str]:
    """The spec's device names (index and UUID each, then "all") for GPUs with these
    minors (minor = index on a100x8)."""
    return [n for i in minors for n in (str(i), uuid_of(host, i))] + ["all"]


@pytest.fixture
def host(fresh_sim_host) -> Path:
    return fresh_sim_host("a100x8")


@pytest.fixture
def config(tmp_path) -> Path:
    return write_config(tmp_path)


# -- once ------------------------------------------------------------------------------------

def test_first_refresh_writes_the_spec(tmp_path, config, host):
    out = tmp_path / "nvidia.yaml"
    r = refresh(config, host, out)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"updated {out}\n", "")
    assert device_names(out) == expected_names(host, range(8))


def test_second_refresh_leaves_the_file_alone(tmp_path, config, host):
    out = tmp_path / "nvidia.yaml"
    assert refresh(config, host, out).returncode == 0
    before, data = out.stat(), out.read_bytes()
    time.sleep(0.01)                    # a rewrite would get a later mtime
    r = refresh(config, host, out)
    after = out.stat()
    assert (r.returncode, r.stdout) == (0, f"unchanged {out}\n")
    assert (out.read_bytes(), after.st_ino, after.st_mtime_ns) == (data, before.st_ino, before.st_mtime_ns)


def test_refresh_after_a_gpu_went_drops_it(tmp_path, config, host):
    from libinject.apply import cdi_validate

    out = tmp_path / "nvidia.yaml"
    assert refresh(config, host, out).returncode == 0
    gone = uuid_of(host, 7)
    GpuAway(host, 7, tmp_path)
    r = refresh(config, host, out)
    assert (r.returncode, r.stdout) == (0, f"updated {out}\n"), r.stderr
    names = device_names(out)
    assert "7" not in names and gone not in names and len(names) == 2 * 7 + 1
    assert cdi_validate.validate_file(str(out)) == []


def test_refresh_on_a_host_without_gpus_removes_the_spec(tmp_path, config, host):
    """No CDI spec can list no device (nvidia-ctk cdi generate fails on such a host);
    the old one would hand containers GPUs that are gone: it is removed, and said so."""
    out = tmp_path / "nvidia.yaml"
    assert refresh(config, host, out).returncode == 0
    for minor in range(8):
        GpuAway(host, minor, tmp_path)
    r = refresh(config, host, out)
    one_error(r, "no GPUs found: a CDI spec needs at least one device", f"; removed {out}")
    assert not out.exists()
    r = refresh(config, host, out)      # nothing to remove: the cause alone
    assert (r.returncode, r.stderr) == (1, "nvhook: no GPUs found: a CDI spec needs at least one device\n")


def test_removing_the_spec_follows_no_link_a_writer_of_run_planted(tmp_path, config, host):
    """The spec dir is in the host's /run, which others may write (here a second user,
    nobody, owns the stand-in for it): after a refresh they make `cdi` a link to the
    administrator's spec dir; when the GPUs go, the refresh that removes its spec must not
    remove the administrator's through that link."""
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="nvhcdirun", dir="/tmp"))
    try:
        top.chmod(0o755)
        run_dir, etc = top / "run", top / "etc-cdi"
        run_dir.mkdir()
        etc.mkdir()
        os.chown(run_dir, 65534, 65534)
        (run_dir / "cdi").mkdir()
        out = run_dir / "cdi/nvidia.yaml"
        assert refresh(config, host, out).returncode == 0
        (etc / "nvidia.yaml").write_text("the administrator's spec\n")
        subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-ec",
                        f"mv {run_dir}/cdi {run_dir}/old; ln -s {etc} {run_dir}/cdi"],
                       check=True, capture_output=True, timeout=60)
        for minor in range(8):
            GpuAway(host, minor, tmp_path)
        r = refresh(config, host, out)
        assert (etc / "nvidia.yaml").read_text() == "the administrator's spec\n"
        assert (r.returncode, r.stderr) == (1, f"nvhook: cannot remove {out}: Not a directory\n"), r.stderr
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_refresh_rewarms_the_discovery_snapshot(tmp_path, config, host):
    """After a change, the snapshot discovery left is the one for the host as it is now."""
    from libinject import config as C
    from libinject.apply.cdi_refresh import Refresher

    out = tmp_path / "nvidia.yaml"
    assert refresh(config, host, out).returncode == 0
    GpuAway(host, 7, tmp_path)
    assert refresh(config, host, out).returncode == 0
    options = C.load(str(config)).discover_options(root=str(host))
    now = Refresher(str(out), options, str).fingerprint()
    snaps = glob.glob(f"{tmp_path}/snapshots/driver-*.json")
    assert [Path(s).read_bytes().split(b"\n", 1)[0].decode() for s in snaps] == [now]


# -- bad input -------------------------------------------------------------------------------

def test_unwritable_output_dir_fails_and_writes_nothing(tmp_path, config, host):
    d = tmp_path / "ro"
    d.mkdir()
    # a read-only bind mount in a mount namespace of its own (root may write anywhere else)
    script = (f'mount --bind "{d}" "{d}" && mount -o remount,bind,ro "{d}" && '
              f'exec "{NVHOOK}" --config "{config}" cdi refresh --driver-root "{host}" -o "{d}/nvidia.yaml"')
    r = run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            env={"PATH": os.environ["PATH"]})
    one_error(r, f"cannot write {d}/nvidia.yaml", "Read-only file system")
    assert list(d.iterdir()) == [] and not (tmp_path / "snapshots").exists()


def test_missing_output_dir_fails_and_writes_nothing(tmp_path, config, host):
    r = refresh(config, host, tmp_path / "no/nvidia.yaml", "--watch")
    one_error(r, "directory", "does not exist")
    assert not (tmp_path / "no").exists() and not (tmp_path / "snapshots").exists()


def test_bad_config_fails_and_writes_nothing(tmp_path, host):
    bad = tmp_path / "bad.toml"
    bad.write_text("[nvhook\n")
    out = tmp_path / "nvidia.yaml"
    r = refresh(bad, host, out, "--watch")
    one_error(r, str(bad))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml", "host"]


@pytest.mark.parametrize("args", [("--interval", "0"), ("--interval", "nan"), ("--debounce", "-1")])
def test_bad_timing_fails_before_anything_runs(tmp_path, config, host, args):
    r = refresh(config, host, tmp_path / "nvidia.yaml", "--watch", *args)
    one_error(r, args[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml", "host"]


# -- watch -----------------------------------------------------------------------------------

@pytest.fixture
def watch(tmp_path, config, host):
    """start(*args) -> Watch on `host`, writing tmp_path/nvidia.yaml; stopped after."""
    made: list[Watch] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Watch:
        w = Watch(config, "--driver-root", str(host), "-o", str(tmp_path / "nvidia.yaml"), *args, env=env)
        made.append(w)
        w.started(tmp_path / "nvidia.yaml")
        return w

    yield start
    for w in made:
        w.stop()


def test_watch_drops_a_gpu_that_went(tmp_path, host, watch):
    out = tmp_path / "nvidia.yaml"
    w = watch("--interval", "0.5")
    gone, want = uuid_of(host, 7), expected_names(host, range(7))
    GpuAway(host, 7, tmp_path)
    w.wait_until(lambda: gone not in device_names(out), "GPU 7 dropped", DEADLINE)
    assert device_names(out) == want


def test_watch_lists_a_gpu_again_once_it_is_back(tmp_path, host, watch):
    out = tmp_path / "nvidia.yaml"
    w = watch("--interval", "0.5")
    uuid = uuid_of(host, 3)
    away = GpuAway(host, 3, tmp_path)
    w.wait_until(lambda: uuid not in device_names(out), "GPU 3 dropped", DEADLINE)
    away.back()
    w.wait_until(lambda: uuid in device_names(out), "GPU 3 listed again", DEADLINE)
    assert w.lines() == [f"updated {out}"] * 3


def test_watch_removes_the_spec_when_no_gpu_is_left_and_writes_it_again(tmp_path, host, watch):
    out = tmp_path / "nvidia.yaml"
    w = watch("--interval", "0.2")
    away = [GpuAway(host, minor, tmp_path) for minor in range(8)]
    w.wait_until(lambda: not out.exists(), "the spec removed", DEADLINE)
    time.sleep(1)                       # several checks: the line stays one
    assert w.stderr() == ("nvhook: no GPUs found: a CDI spec needs at least one device; "
                          f"removed {out}\n")
    away[3].back()
    w.wait_until(out.exists, "the spec written again", DEADLINE)
    assert device_names(out) == ["0", uuid_of(host, 3), "all"]     # the only GPU: index 0
    assert w.lines() == [f"updated {out}"] * 2


def test_watch_stops_cleanly_on_sigterm(tmp_path, watch):
    w = watch("--interval", "0.5")
    t0 = time.monotonic()
    assert w.stop(timeout=10) == 0
    assert time.monotonic() - t0 < 10 and w.stderr() == ""


def test_watch_without_pyroute2_says_so_and_still_checks_periodically(tmp_path, host, watch):
    out = tmp_path / "nvidia.yaml"
    shadow = tmp_path / "shadow/pyroute2"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named pyroute2')\n")
    w = watch("--interval", "0.5", env={"PATH": os.environ["PATH"], "PYTHONPATH": str(shadow.parent)})
    gone = uuid_of(host, 7)
    GpuAway(host, 7, tmp_path)
    w.wait_until(lambda: gone not in device_names(out), "GPU 7 dropped", DEADLINE)
    assert w.stderr().splitlines() == [
        "nvhook: cannot listen to uevents: pyroute2 is not installed (the nvhook[refresh] extra): "
        "No module named pyroute2; checking every 0.5 s only"]


def test_watch_waits_for_a_driver_that_is_not_there_yet(tmp_path, config, fresh_sim_host):
    """Discovery failing (no driver root yet, as at boot): one `nvhook: ` line however
    often it is retried, the watch goes on, and writes the spec once the driver is there."""
    out, later = tmp_path / "nvidia.yaml", tmp_path / "later"
    w = Watch(config, "--driver-root", str(later), "-o", str(out), "--interval", "0.2")
    try:
        w.wait_until(lambda: w.stderr() != "", "an error line", DEADLINE)
        time.sleep(1.5)                     # several failed retries
        assert w.stderr().splitlines() == [f"nvhook: cannot read driver root {later}: "
                                           "No such file or directory"] and not out.exists()
        fresh_sim_host("a100x8", name="build").rename(later)
        w.wait_until(lambda: out.exists(), "the spec written", DEADLINE)
        assert len(device_names(out)) == 2 * 8 + 1 and w.lines() == [f"updated {out}"]
    finally:
        code = w.stop()
    assert code == 0


def test_watch_keeps_an_unchanged_spec_untouched(tmp_path, config, host, watch):
    out = tmp_path / "nvidia.yaml"
    assert refresh(config, host, out).returncode == 0
    before = out.stat()
    w = watch("--interval", "0.2")
    time.sleep(1.5)                     # several periodic checks
    after = out.stat()
    assert (w.lines(), after.st_ino, after.st_mtime_ns) == (
        [f"unchanged {out}"], before.st_ino, before.st_mtime_ns)


def test_watch_takes_an_edited_config_without_a_restart(tmp_path, config, host, watch):
    """The config file edited while the watch runs (nothing about the host changed): the
    spec is made anew with it. A bad edit is one line, and the spec stays as it was."""
    out = tmp_path / "nvidia.yaml"
    w = watch("--interval", "0.2")
    good = config.read_text()
    assert "ldconfig.real" not in out.read_text()
    config.write_text(good + "[nvidia-container-cli\n")
    w.wait_until(lambda: w.stderr() != "", "the bad edit reported", DEADLINE)
    assert w.stderr().startswith("nvhook: ") and w.stderr().count("\n") == 1, w.stderr()
    assert "ldconfig.real" not in out.read_text()
    config.write_text(good + '[nvidia-container-cli]\nldconfig = "@/sbin/ldconfig.real"\n')
    w.wait_until(lambda: "@/sbin/ldconfig.real" in out.read_text(), "the edit taken", DEADLINE)
    assert device_names(out) == expected_names(host, range(8))
    assert w.lines() == [f"updated {out}"] * 2


def _spec_of(driver) -> str:
    from libinject.apply import cdi

    return cdi.dump(cdi.generate(driver, hook=cdi.HookOptions(path="/usr/bin/nvhook-hook")), "yaml")


def test_watch_rewrites_a_spec_made_while_a_gpu_blipped(tmp_path, config, host):
    """GPU 7 goes after the watcher fingerprinted the host and before discovery reads it,
    and is back (the host as it was) once that spec is written: the next check rewrites
    the spec with it. Was: the fingerprint from before discovery was remembered, every
    later one equalled it, and the spec lacked GPU 7 for good. In process, so the blip
    is placed exactly; the watch stops itself (SIGTERM) at its 12th fingerprint."""
    from libinject import config as C
    from libinject.apply import cdi_refresh

    out = tmp_path / "nvidia.yaml"
    entry, uuid = gpu_entry(host, 7), uuid_of(host, 7)
    aside = tmp_path / entry.name
    options = C.load(str(config)).discover_options(root=str(host))
    blips = []

    class Blipping:
        """The options, whose first discovery finds GPU 7's procfs entry moved aside."""
        def __getattr__(self, name):
            return getattr(options, name)

        def discover(self, fn=None, log=None):
            if not blips:
                entry.rename(aside)
                blips.append("went")
            return options.discover(fn, log=log)

    class Counted(cdi_refresh.Refresher):
        calls = 0

        def fingerprint(self) -> str:
            Counted.calls += 1
            if Counted.calls == 12:
                os.kill(os.getpid(), signal.SIGTERM)   # the watch's own handler: it stops
            return super().fingerprint()

    lines = []

    def say(line: str) -> None:
        lines.append(line)
        if blips == ["went"]:
            aside.rename(entry)         # the same contents back: the host as it was
            blips.append("back")

    code = cdi_refresh.watch(Counted(str(out), Blipping(), _spec_of), interval=0.01, uevents=False,
                             say=say, stderr=sys.stderr)
    assert (code, blips, lines) == (0, ["went", "back"], [f"updated {out}"] * 2)
    assert device_names(out) == expected_names(host, range(8))


def test_a_gpu_that_blips_within_one_discovery_is_in_the_spec(tmp_path, config, host):
    """GPU 7's procfs entry goes and comes back within the first discovery (the host
    fingerprinted the same before and after it): that reading lacks GPU 7, the next
    ones have it, and the spec and the snapshot are made from the readings that agree.
    Was: equal fingerprints were taken as proof, the spec lacked GPU 7, and the watch,
    its fingerprint unchanged, never rewrote it (nor was the snapshot ever right)."""
    from libinject import config as C
    from libinject.apply import cdi_refresh

    out = tmp_path / "nvidia.yaml"
    entry = gpu_entry(host, 7)
    aside = tmp_path / entry.name
    options = C.load(str(config)).discover_options(root=str(host))
    seen = []

    class Blipping:
        """The options, whose first discovery runs with GPU 7's entry moved aside."""
        def __getattr__(self, name):
            return getattr(options, name)

        def discover(self, fn=None, log=None):
            first = not seen
            if first:
                entry.rename(aside)
            try:
                d = options.discover(fn, log=log)
            finally:
                if first:
                    aside.rename(entry)     # the same contents back: the host as it was
            seen.append(len(d.info.gpus))
            return d

    r = cdi_refresh.Refresher(str(out), Blipping(), _spec_of)
    assert r.refresh()
    assert seen == [7, 8, 8]
    assert device_names(out) == expected_names(host, range(8))
    assert r.made_at == r.fingerprint()
    assert len(options.discover().info.gpus) == 8       # the snapshot is the agreed answer


# -- the uevent path: a real kernel uevent, an interval that never comes -----------------------

def _pci_uevent_file() -> str | None:
    for f in sorted(glob.glob("/sys/bus/pci/devices/*/uevent")):
        if os.access(f, os.W_OK):
            return f
    return None


PCI_UEVENT = _pci_uevent_file()


def trigger(path: str) -> None:
    """The kernel sends a `change` uevent for this device (nothing else happens to it)."""
    with open(path, "w") as f:
        f.write("change")


@pytest.mark.skipif(PCI_UEVENT is None, reason="no PCI device whose uevent can be triggered")
def test_a_pci_uevent_brings_a_prompt_refresh(tmp_path, host, watch):
    out = tmp_path / "nvidia.yaml"
    w = watch("--interval", "3600", "--debounce", "0.2")
    gone = uuid_of(host, 5)
    GpuAway(host, 5, tmp_path)
    time.sleep(0.5)
    assert gone in device_names(out)    # nothing looked: no uevent yet, the interval is an hour
    trigger(PCI_UEVENT)
    took = w.wait_until(lambda: gone not in device_names(out), "refreshed after the uevent", DEADLINE)
    assert took < 5, took


@pytest.mark.skipif(PCI_UEVENT is None, reason="no PCI device whose uevent can be triggered")
def test_without_uevents_the_same_trigger_changes_nothing(tmp_path, host, watch):
    """The test above has teeth: with the listener off, the uevent is not what refreshes."""
    out = tmp_path / "nvidia.yaml"
    w = watch("--interval", "3600", "--debounce", "0.2", "--no-uevents")
    gone = uuid_of(host, 5)
    GpuAway(host, 5, tmp_path)
    trigger(PCI_UEVENT)
    time.sleep(2)
    assert gone in device_names(out) and w.lines() == [f"updated {out}"]


NETLINK_KOBJECT_UEVENT = 15


def _uevent_port(pid: int) -> int:
    """The netlink port id of the uevent socket that process `pid` (or a child) holds."""
    inodes = set()
    for p in [pid, *(int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())]:
        for fd in Path(f"/proc/{p}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = [int(f[2]) for f in (l.split() for l in Path("/proc/net/netlink").read_text().splitlines()[1:])
             if int(f[1]) == NETLINK_KOBJECT_UEVENT and f[-1] in inodes]
    assert len(ports) == 1, ports
    return ports[0]


# What a CAP_NET_ADMIN process of the host's network namespace can send to the listener:
# shorter than a netlink header (pyroute2 raised in its callback: a traceback each), a
# head that is not UTF-8 (pyroute2 raised in the listener: uevents were off for good),
# and a well-formed uevent that is not the kernel's.
HOSTILE = [b"x", b"abc", b"x" * 11, b"\xff\xfe@/devices/pci0000:00\0SUBSYSTEM=pci\0",
           b"change@/devices/pci0000:00/0000:00:07.0\0ACTION=change\0SUBSYSTEM=pci\0"]


@pytest.mark.skipif(PCI_UEVENT is None, reason="no PCI device whose uevent can be triggered")
def test_datagrams_that_are_not_kernel_uevents_are_dropped_and_counted(tmp_path, host, watch):
    """Sent for real to the watcher's uevent socket from the host's network namespace:
    no traceback, one line with the count, and a real uevent after them still brings
    a prompt refresh."""
    out = tmp_path / "nvidia.yaml"
    w = watch("--interval", "3600", "--debounce", "0.2")
    port = _uevent_port(w.proc.pid)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_KOBJECT_UEVENT) as s:
        s.bind((0, 0))
        for data in HOSTILE:
            s.sendto(data, (port, 0))
    gone = uuid_of(host, 5)
    GpuAway(host, 5, tmp_path)
    trigger(PCI_UEVENT)
    w.wait_until(lambda: gone not in device_names(out), "refreshed after the uevent", DEADLINE)
    assert w.stop() == 0
    assert w.stderr() == f"nvhook: uevents: dropped {len(HOSTILE)} datagram(s) so far that were not kernel uevents\n"
    assert w.out.decode().splitlines() == [f"updated {out}"] * 2


# -- the filter and the debounce, on their own -----------------------------------------------

def _uevent(head: str, **env: str) -> bytes:
    return b"\0".join([head.encode(), *(f"{k}={v}".encode() for k, v in env.items())]) + b"\0"


@pytest.mark.parametrize("data,want", [
    (_uevent("add@/module/nvidia", ACTION="add", DEVPATH="/module/nvidia", SUBSYSTEM="module"), True),
    (_uevent("remove@/module/nvidia_uvm", ACTION="remove", DEVPATH="/module/nvidia_uvm",
             SUBSYSTEM="module"), True),
    (_uevent("add@/module/nvme", ACTION="add", DEVPATH="/module/nvme", SUBSYSTEM="module"), False),
    (_uevent("bind@/devices/pci0000:00/0000:00:07.0", ACTION="bind", SUBSYSTEM="pci",
             DRIVER="nvidia", PCI_ID="10DE:20B2"), True),
    (_uevent("add@/devices/pci0000:00/0000:00:07.0/drm/card1", ACTION="add", SUBSYSTEM="drm",
             DEVNAME="dri/card1"), True),
    (_uevent("add@/devices/virtual/nvidia-caps/nvidia-cap1", ACTION="add", SUBSYSTEM="nvidia-caps",
             DEVNAME="nvidia-caps/nvidia-cap1"), True),
    (_uevent("add@/devices/virtual/misc/nvidia-uvm", ACTION="add", SUBSYSTEM="misc",
             DEVNAME="nvidia-uvm"), True),
    (_uevent("change@/devices/virtual/net/lo", ACTION="change", SUBSYSTEM="net", INTERFACE="lo"), False),
    (_uevent("add@/devices/virtual/block/loop0", ACTION="add", SUBSYSTEM="block", DEVNAME="loop0"), False),
    (b"libudev\0\xfe\xed\xca\xfe" + _uevent("x", SUBSYSTEM="pci"), False),     # udevd's, not the kernel's
    (b"garbage", False),
])
def test_uevent_filter(data, want):
    from libinject.apply.cdi_refresh import parse_uevent, wanted

    event = parse_uevent(data)
    assert (event is not None and wanted(event)) == want


def test_debounce_checks_once_a_burst_is_quiet():
    from libinject.apply.cdi_refresh import Debounce

    d = Debounce(1.0)
    d.event(0.0)
    d.event(0.3)
    assert [d.ready(t) for t in (1.0, 1.29, 1.3, 1.4)] == [False, False, True, False]


def test_debounce_still_checks_during_an_endless_burst():
    from libinject.apply.cdi_refresh import MAX_DEBOUNCES, Debounce

    d = Debounce(1.0)
    due = []
    for t in [x / 2 for x in range(40)]:        # an event every 0.5 s for 20 s
        if d.ready(t):
            due.append(t)
        d.event(t)
    assert due == [MAX_DEBOUNCES * 1.0 * k for k in (1, 2, 3)]


# -- the unit --------------------------------------------------------------------------------

def test_unit_runs_the_front_with_watch():
    lines = UNIT.read_text().splitlines()
    assert [l for l in lines if l.startswith(("ExecStart=", "Type="))] == [
        "Type=simple", "ExecStart=/usr/local/libexec/nvhook/nvhook-hook cdi refresh --watch"]


def test_unit_passes_systemd_analyze_verify(tmp_path):
    """Offline (PID 1 is not systemd here), with ExecStart pointed at this install's front
    (the shipped placeholder path does not exist here)."""
    front = hookenv.ensure_front()
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/usr/local/libexec/nvhook/nvhook-hook", front))
    r = run([ANALYZE, "verify", "--man=no", str(unit)], env={"PATH": SAFE_PATH})
    assert r.returncode == 0 and str(unit) not in r.stderr + r.stdout, r.stderr + r.stdout
