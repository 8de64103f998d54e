"""podman 4.3.1 applies our generated CDI spec (RUNTIMES.md): the container sees exactly
the requested GPUs, and its cgroup allows exactly them (ENXIO = allowed, no driver;
EPERM = denied by the device cgroup).

podman reads only /etc/cdi and /var/run/cdi: it runs in a private mount namespace with
an overlay on /etc and our spec dir bound on /etc/cdi; its own containers.conf,
storage.conf and state dir; an empty hooks dir; `--rootfs DIR:O` (throw-away overlay).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import NVHOOK, run

PODMAN_SH = r'''
set -e
S=$1; SPECS=$2; shift 2
mount -t overlay overlay -o lowerdir=/etc,upperdir=$S/etc-upper,workdir=$S/etc-work /etc
mkdir -p /etc/cdi
mount --bind "$SPECS" /etc/cdi
if [ -d /var/run/cdi ]; then mount -t tmpfs tmpfs /var/run/cdi; fi
exec podman --hooks-dir "$S/hooks" "$@"
'''


class Podman:
    """podman with a private config/state under `state`, CDI specs from `spec_dir`."""

    def __init__(self, state: Path, spec_dir: Path):
        self.state, self.spec_dir = state, spec_dir
        for d in ("etc-upper", "etc-work", "hooks", "tmp", "networks", "root", "runroot", "xdg"):
            (state / d).mkdir(parents=True, exist_ok=True)
        s = str(state)
        (state / "containers.conf").write_text(f'''[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
netns = "none"
[network]
network_config_dir = "{s}/networks"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "{s}/events.log"
tmp_dir = "{s}/tmp"
static_dir = "{s}/root/libpod"
volume_path = "{s}/root/volumes"
''')
        (state / "storage.conf").write_text(f'''[storage]
driver = "vfs"
graphroot = "{s}/root"
runroot = "{s}/runroot"
''')
        (state / "registries.conf").write_text("")
        self.env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
                    "CONTAINERS_CONF": f"{s}/containers.conf",
                    "CONTAINERS_STORAGE_CONF": f"{s}/storage.conf",
                    "CONTAINERS_REGISTRIES_CONF": f"{s}/registries.conf",
                    "XDG_RUNTIME_DIR": f"{s}/xdg"}

    def run(self, rootfs: Path, devices: list[str], script: str,
            timeout: float = 120) -> subprocess.CompletedProcess:
        args = ["run", "--rm"]
        for d in devices:
            args += ["--device", d]
        args += ["--rootfs", f"{rootfs}:O", "sh", "-c", script]
        return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", PODMAN_SH,
                               "sh", str(self.state), str(self.spec_dir), *args],
                              env=self.env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cdi_setup(sim_host, tmp_path_factory):
    """(host, driver, spec dir with the generated spec, a busybox+glibc rootfs)."""
    from libinject.discover.driver import discover
    from libinject.sim.rootfs import build_rootfs

    host = sim_host("a100x8")
    base = tmp_path_factory.mktemp("cdipodman")
    specs = base / "specs"
    specs.mkdir()
    r = run([NVHOOK, "cdi", "generate", "--driver-root", str(host), "-o", str(specs / "nvidia.yaml")])
    assert r.returncode == 0, r.stderr
    rootfs = build_rootfs(base / "rootfs")
    # podman's state under a short path: with a long one (pytest's tmp dirs) conmon's
    # socket paths overflow and every `podman run --rm` waits 20 s to clean up
    state = Path(tempfile.mkdtemp(prefix="nvpm", dir="/tmp"))
    try:
        yield host, discover(str(host), snapshot=False), specs, rootfs, state
    finally:
        shutil.rmtree(state, ignore_errors=True)


PROBE = ("nvidia-smi -L; for m in {minors}; do "
         "if [ -e /dev/nvidia$m ]; then p=/dev/nvidia$m; else mknod /dev/probe$m c 195 $m; p=/dev/probe$m; fi; "
         "if dd if=$p of=/dev/null count=0 2>/tmp/e; then echo \"open $m OK\"; "
         "else echo \"open $m $(cat /tmp/e)\"; fi; done; ls /proc/driver/nvidia/gpus")


def _opens(out: str) -> dict[int, str]:
    res = {}
    for m in re.finditer(r"^open (\d+) (.*)$", out, re.M):
        text = m[2]
        res[int(m[1])] = ("ENXIO" if "No such device or address" in text else
                          "EPERM" if "Operation not permitted" in text else text)
    return res


@pytest.mark.parametrize("request_id", ["1", "all", "uuid3"])
def test_podman_cdi_sees_exactly_the_requested_gpus(cdi_setup, request_id):
    host, driver, specs, rootfs, base = cdi_setup
    gpus = driver.info.gpus
    if request_id == "all":
        want = list(gpus)
        name = "all"
    elif request_id == "uuid3":
        want = [gpus[3]]
        name = gpus[3].uuid
    else:
        want = [gpus[1]]
        name = "1"
    pm = Podman(base / f"s-{request_id}", specs)
    minors = " ".join(str(g.minor) for g in gpus)
    r = pm.run(rootfs, [f"nvidia.com/gpu={name}"], PROBE.format(minors=minors))
    assert r.returncode == 0, r.stdout + r.stderr
    listed = re.findall(r"^GPU (\d+): (.*) \(UUID: (GPU-[0-9a-f-]+)\)$", r.stdout, re.M)
    assert [u for _, _, u in listed] == [g.uuid for g in want]
    opens = _opens(r.stdout)
    wanted = {g.minor for g in want}
    assert opens == {g.minor: ("ENXIO" if g.minor in wanted else "EPERM") for g in gpus}
    # /proc/driver/nvidia is masked to the same GPUs (the spec's mask-procfs hook)
    assert sorted(r.stdout.split("\n")[-len(want) - 1:-1]) == sorted(g.procfs_name for g in want)


def test_podman_rejects_unknown_cdi_device(cdi_setup):
    host, driver, specs, rootfs, base = cdi_setup
    pm = Podman(base / "s-bad", specs)
    r = pm.run(rootfs, ["nvidia.com/gpu=99"], "true")
    assert r.returncode != 0 and "nvidia.com/gpu=99" in r.stderr
