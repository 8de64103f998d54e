"""podman 4.3.1 applies our generated CDI spec (RUNTIMES.md): the container sees exactly
the requested GPUs, and its cgroup allows exactly them (ENXIO = allowed, no driver;
EPERM = denied by the device cgroup).

podman reads only /etc/cdi and /var/run/cdi: it runs in a private mount namespace with
an overlay on /etc and our spec dir bound on /etc/cdi; its own containers.conf,
storage.conf and state dir; an empty hooks dir; `--rootfs DIR:O` (throw-away overlay).
"""
from __future__ import annotations

import re

import pytest

from conftest import NVHOOK, run
from support.driverview import open_verdicts
from support.podman import Podman, state_dir


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
    with state_dir() as state:
        yield host, discover(str(host), snapshot=False), specs, rootfs, state


PROBE = ("nvidia-smi -L; for m in {minors}; do "
         "if [ -e /dev/nvidia$m ]; then p=/dev/nvidia$m; else mknod /dev/probe$m c 195 $m; p=/dev/probe$m; fi; "
         "if dd if=$p of=/dev/null count=0 2>/tmp/e; then echo \"open $m OK\"; "
         "else echo \"open $m $(cat /tmp/e)\"; fi; done; ls /proc/driver/nvidia/gpus")


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
    minors = " ".join(str(g.minor) for g in gpus)
    r = Podman(base / f"s-{request_id}").run(rootfs, ["sh", "-c", PROBE.format(minors=minors)],
                                             cdi_specs=specs, devices=[f"nvidia.com/gpu={name}"])
    assert r.returncode == 0, r.stdout + r.stderr
    listed = re.findall(r"^GPU (\d+): (.*) \(UUID: (GPU-[0-9a-f-]+)\)$", r.stdout, re.M)
    assert [u for _, _, u in listed] == [g.uuid for g in want]
    opens = open_verdicts(r.stdout)
    wanted = {g.minor for g in want}
    assert opens == {g.minor: ("ENXIO" if g.minor in wanted else "EPERM") for g in gpus}
    # /proc/driver/nvidia is masked to the same GPUs (the spec's mask-procfs hook)
    assert sorted(r.stdout.split("\n")[-len(want) - 1:-1]) == sorted(g.procfs_name for g in want)


def test_podman_rejects_unknown_cdi_device(cdi_setup):
    host, driver, specs, rootfs, base = cdi_setup
    r = Podman(base / "s-bad").run(rootfs, ["true"], cdi_specs=specs, devices=["nvidia.com/gpu=99"])
    assert r.returncode != 0 and "nvidia.com/gpu=99" in r.stderr
