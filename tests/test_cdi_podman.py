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
import stat

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


# --- IMEX channels, MIG capabilities and the driver-only device ----------------------------

IMEX_MAJOR = 237            # unregistered here: an allowed open reaches no driver (ENXIO)
CHANNELS = (0, 1, 2, 3)


@pytest.fixture(scope="module")
def extra_setup(tmp_path_factory):
    """(host, driver, spec dir, rootfs, state) for a copy of h100x8-mig with IMEX channel
    nodes channel0..3 (made here: h100x8-mig has none), and the three specs one
    `cdi generate --mode gpu,imex,mig-caps --device-id all,none` writes."""
    from libinject.discover.driver import discover
    from libinject.sim.build import create_host
    from libinject.sim.rootfs import build_rootfs

    base = tmp_path_factory.mktemp("cdiextra")
    host = create_host(base / "host", profile="h100x8-mig")
    chans = host / "dev/nvidia-caps-imex-channels"
    chans.mkdir()
    for n in CHANNELS:
        os.mknod(chans / f"channel{n}", 0o666 | stat.S_IFCHR, os.makedev(IMEX_MAJOR, n))
    specs = base / "specs"
    specs.mkdir()
    r = run([NVHOOK, "cdi", "generate", "--driver-root", str(host), "--mode", "gpu,imex,mig-caps",
             "--device-id", "all,none", "-o", str(specs / "nvidia.yaml")])
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in specs.iterdir()) == [
        "nvidia.imex-channel.yaml", "nvidia.mig-caps.yaml", "nvidia.yaml"]
    rootfs = build_rootfs(base / "rootfs")
    with state_dir() as state:
        yield host, discover(str(host), snapshot=False), specs, rootfs, state


def probe(nodes: dict[int, tuple[str, int]]) -> str:
    """A script printing `open MINOR <verdict>` for each node {minor: (path, major)}: the
    node the container has, else one it makes itself (the cgroup still decides)."""
    lines = []
    for minor, (path, major) in nodes.items():
        lines.append(f'if [ -e {path} ]; then p={path}; else mknod /dev/probe{minor} c {major} {minor}; '
                     f'p=/dev/probe{minor}; fi; if dd if=$p of=/dev/null count=0 2>/tmp/e; then '
                     f'echo "open {minor} OK"; else echo "open {minor} $(cat /tmp/e)"; fi')
    return "\n".join(lines)


def test_podman_imex_channel_device(extra_setup):
    host, driver, specs, rootfs, base = extra_setup
    chan = {n: (f"/dev/nvidia-caps-imex-channels/channel{n}", IMEX_MAJOR) for n in CHANNELS}
    script = "ls /dev/nvidia-caps-imex-channels; ls /dev | grep -c '^nvidia[0-9]' || true\n" + probe(chan)
    r = Podman(base / "s-imex").run(rootfs, ["sh", "-c", script], cdi_specs=specs,
                                    devices=["nvidia.com/imex-channel=1"])
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout.splitlines()
    assert out[:2] == ["channel1", "0"]         # that channel only, and no GPU
    # the cgroup allows channel 1 (the open reaches the missing driver), denies the others
    assert open_verdicts(r.stdout) == {0: "EPERM", 1: "ENXIO", 2: "EPERM", 3: "EPERM"}


def test_podman_mig_config_device(extra_setup):
    host, driver, specs, rootfs, base = extra_setup
    caps_major = os.major(os.stat(host / "dev/nvidia-caps/nvidia-cap1").st_rdev)
    cfg, mon = driver.mig_minors["config"], driver.mig_minors["monitor"]
    script = "ls /dev/nvidia-caps; ls /dev | grep -c '^nvidia[0-9]' || true\n" + probe(
        {cfg: (f"/dev/nvidia-caps/nvidia-cap{cfg}", caps_major),
         mon: (f"/dev/nvidia-caps/nvidia-cap{mon}", caps_major)})
    r = Podman(base / "s-mig").run(rootfs, ["sh", "-c", script], cdi_specs=specs,
                                   devices=["nvidia.com/mig-caps=config"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[:2] == ["nvidia-cap1", "0"]
    assert open_verdicts(r.stdout) == {cfg: "ENXIO", mon: "EPERM"}


def test_podman_gpu_with_mig_monitor_gets_its_procfs_file(extra_setup):
    """A GPU and the monitor capability from two specs: the GPU spec's mask-procfs hook
    sees the capability node and binds the live capabilities dir, as the hook does for
    NVIDIA_MIG_MONITOR_DEVICES (a MIG manager sees instances made after its start)."""
    host, driver, specs, rootfs, base = extra_setup
    script = ("ls /dev/nvidia-caps; find /proc/driver/nvidia/capabilities -path '*/mig/monitor'; "
              "ls /proc/driver/nvidia/gpus; ls /proc/driver/nvidia/capabilities | sort | tr '\\n' ' '")
    # (GPU 4: GPUs 0-3 are in MIG mode, no devices of their own)
    r = Podman(base / "s-migmon").run(rootfs, ["sh", "-c", script], cdi_specs=specs,
                                      devices=["nvidia.com/gpu=4", "nvidia.com/mig-caps=monitor"])
    assert r.returncode == 0, r.stdout + r.stderr
    live = " ".join(sorted(os.listdir(host / "proc/driver/nvidia/capabilities"))) + " "
    assert r.stdout.splitlines() == ["nvidia-cap2", "/proc/driver/nvidia/capabilities/mig/monitor",
                                     driver.info.gpus[4].procfs_name, live]
    assert "gpu0" in live


def test_podman_driver_only_device(extra_setup):
    """nvidia.com/gpu=none: the driver's libraries, binaries and control nodes, no GPU:
    no /dev/nvidia<N>, every GPU minor denied by the cgroup, no GPU under /proc."""
    host, driver, specs, rootfs, base = extra_setup
    gpus = driver.info.gpus
    script = ("ls /dev | grep '^nvidia' | sort | tr '\\n' ' '; echo; "
              "ls /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/bin/nvidia-smi; "
              "echo gpus $(ls /proc/driver/nvidia/gpus | wc -l)\n"
              + probe({g.minor: (f"/dev/nvidia{g.minor}", 195) for g in gpus}))
    r = Podman(base / "s-none").run(rootfs, ["sh", "-c", script], cdi_specs=specs,
                                    devices=["nvidia.com/gpu=none"])
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout.splitlines()
    assert out[0].split() == ["nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"]
    assert out[1:4] == ["/usr/bin/nvidia-smi", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "gpus 0"]
    assert open_verdicts(r.stdout) == {g.minor: "EPERM" for g in gpus}
    # the same device with a GPU next to it: that GPU only
    r = Podman(base / "s-none1").run(rootfs, ["sh", "-c", probe({g.minor: (f"/dev/nvidia{g.minor}", 195)
                                                                  for g in gpus})],
                                     cdi_specs=specs, devices=["nvidia.com/gpu=none", "nvidia.com/gpu=5"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert open_verdicts(r.stdout) == {g.minor: ("ENXIO" if g.index == 5 else "EPERM") for g in gpus}


def test_annotation_gated_hook_steps_aside_where_the_engine_applied_cdi(cdi_setup, tmp_path):
    """CRI-O >= 1.23 applies `cdi.k8s.io/` annotations itself (podman with the spec in
    /etc/cdi and --device stands in for it here); the annotation-gated hooks.d file then
    fires too. The spec's NVIDIA_VISIBLE_DEVICES=void makes the hook step aside: GPU 1,
    once, and the spec's own hooks run. Old code: the hook injected GPU 1 a second time
    and the spec's mask-procfs hook failed the start."""
    from libinject.runtime import hooksd
    from support import hookenv

    host, driver, specs, rootfs, base = cdi_setup
    cfg = hookenv.write_config(tmp_path / "config.toml", host, log=tmp_path / "hook.log")
    hooks = tmp_path / "hooks.d"
    hooksd.install(str(hooks), "annotation", hookenv.ensure_front(), str(cfg))
    minors = " ".join(str(g.minor) for g in driver.info.gpus)
    r = Podman(base / "s-gated").run(rootfs, ["sh", "-c", PROBE.format(minors=minors)], hooks_dir=hooks,
                                     cdi_specs=specs, devices=["nvidia.com/gpu=1"],
                                     annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=1"})
    assert r.returncode == 0, r.stdout + r.stderr
    listed = re.findall(r"\(UUID: (GPU-[0-9a-f-]+)\)$", r.stdout, re.M)
    assert listed == [driver.info.gpus[1].uuid]
    assert "NVIDIA_VISIBLE_DEVICES=void: nothing to do" in (tmp_path / "hook.log").read_text()


def test_podman_cdi_served_by_the_hook_service(sim_host, tmp_path, hook_config):
    """podman with `nvhook serve` beside it (the same mount namespace, as on a node):
    the spec's one createRuntime hook is served (the service's log has its status), the
    container is what the exec'd hook makes; a second podman in a namespace of its own
    (the service refuses the peer) falls back to exec'ing Python, same container."""
    import shutil
    import tempfile
    from pathlib import Path

    from libinject.discover.driver import discover
    from libinject.sim.rootfs import build_rootfs
    from support.podman import CdiNamespace
    from support.serve import Serve

    host = sim_host("a100x8")
    gpus = discover(str(host), snapshot=False).info.gpus
    sockdir = Path(tempfile.mkdtemp(prefix="nvp", dir="/tmp"))
    sock = sockdir / "run/hook.sock"
    specs = tmp_path / "specs"
    specs.mkdir()
    r = run([NVHOOK, "cdi", "generate", "--driver-root", str(host), "--hook-socket", str(sock),
             "-o", str(specs / "nvidia.yaml")])
    assert r.returncode == 0, r.stderr
    rootfs = build_rootfs(tmp_path / "rootfs")
    minors = " ".join(str(g.minor) for g in gpus)
    script = PROBE.format(minors=minors)
    with state_dir() as state, CdiNamespace(state / "ns", specs) as ns:
        server = Serve(hook_config, sock, wrap=ns.wrap)
        try:
            for i, where in enumerate(("served", "exec'd")):
                p = Podman(state / f"s{i}")
                r = p.run(rootfs, ["sh", "-c", script], devices=["nvidia.com/gpu=1"],
                          **({"ns": ns} if where == "served" else {"cdi_specs": specs}))
                assert r.returncode == 0, (where, r.stdout + r.stderr)
                listed = re.findall(r"\(UUID: (GPU-[0-9a-f-]+)\)$", r.stdout, re.M)
                assert listed == [gpus[1].uuid], (where, r.stdout)
                assert open_verdicts(r.stdout) == {g.minor: ("ENXIO" if g.index == 1 else "EPERM")
                                                   for g in gpus}, where
                assert r.stdout.split("\n")[-2] == gpus[1].procfs_name, (where, r.stdout)
                assert server.statuses(1) == [0], (where, server.log())   # the first one only
        finally:
            assert server.stop() == 0, server.log()
            shutil.rmtree(sockdir, ignore_errors=True)
