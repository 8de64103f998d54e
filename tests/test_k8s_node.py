"""The Kubernetes DaemonSet's pod, for real, on a node (issue 22): the image `make image`
builds (packaging/build_image.py: the bundle, busybox, nsenter), and a fresh Debian 12
root booted with systemd-nspawn standing as the node, with its own systemd, containerd
1.6 (CRI on, a locally imported pause image) and runc, and no Python at all.

The pod's containers run their commands from deployments/kubernetes/daemonset.yaml as
written: "install" in the image (podman, its one hostPath bound at the node's
/usr/local/lib/nvhook, read-only, no capabilities), the others in the node (nsenter into
its namespaces, where their own `nsenter --target=1` reaches the node's systemd).
Then, through containerd's CRI (tests/support/cri.py, what a kubelet sends), a GPU pod
sees exactly its GPU and its start is served; an upgrade to a second image version
keeps a stream of GPU pods starting, needs no engine restart and leaves the node on the
new version; the uninstall the preStop runs on the DaemonSet's deletion puts the node's
files back byte for byte.
"""
from __future__ import annotations

import re
import threading
import time
import uuid as _uuid
from pathlib import Path

import pytest

from support.hookenv import gpu_uuids as sim_uuids
from support.k8snode import INSTALL, KEPT, V1, V2, Node, build_images, containers, files_under


@pytest.fixture(scope="module")
def podman():
    from support.podman import Podman, state_dir

    with state_dir("k8") as d:
        yield Podman(d)


@pytest.fixture(scope="module")
def images(tmp_path_factory, podman):
    """Both image versions, as `make image` builds them."""
    work = tmp_path_factory.mktemp("images")
    build_images(work, podman.env(), (V1, V2))
    return work


@pytest.fixture(scope="module")
def node(tmp_path_factory, a100_host, images):
    n = Node(tmp_path_factory.mktemp("k8node"), a100_host)
    try:
        yield n
    finally:
        n.close()


def uuids_in(out: str) -> list[str]:
    return re.findall(r"UUID: (GPU-[0-9a-f-]+)", out)


def test_the_pod_installs_sets_up_and_serves_a_gpu_pod(node, podman, a100_host):
    uuids = sim_uuids(a100_host)
    r = node.install(podman, V1)
    assert r.returncode == 0, r.stderr
    assert (node.root / INSTALL / "current").readlink() == Path(V1)
    # The copy runs on the node, which has no Python of its own.
    r = node.machine.run(f"/{INSTALL}/current/bin/nvhook", "--version")
    assert r.stdout == f"nvhook {V1}\n", r.stderr
    r = node.machine.run(*node.node_command("setup"), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "containerd" in r.stdout and "restart" in r.stdout, r.stdout
    # What auto wrote names the install through `current`: it survives upgrades.
    toml = (node.root / "etc/containerd/config.toml").read_text()
    assert f'"/{INSTALL}/current/bin/nvhook-runtime"' in toml, toml
    node.start("serve")
    node.start("cdi-refresh")
    deadline = time.monotonic() + 60
    while not (node.root / "run/nvhook/hook.sock").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    code, out = node.gpu_pod("envvar", env={"NVIDIA_VISIBLE_DEVICES": uuids[1]})
    assert (code, uuids_in(out)) == (0, [uuids[1]]), out
    key = f"nvidia.cdi.k8s.io/nvidia-device-plugin_{_uuid.uuid4()}"
    code, out = node.gpu_pod("annotations", annotations={key: f"nvidia.com/gpu={uuids[1]}"})
    assert (code, uuids_in(out)) == (0, [uuids[1]]), out
    assert node.served() >= 2, node.log("serve")


def test_an_upgrade_keeps_gpu_pods_starting(node, podman, a100_host):
    uuids = sim_uuids(a100_host)
    results: list[tuple[int, list[str]]] = []
    stop = threading.Event()

    def stream() -> None:
        i = 0
        while not stop.is_set() or i < 3:
            code, out = node.gpu_pod(f"stream-{i}", env={"NVIDIA_VISIBLE_DEVICES": uuids[1]})
            results.append((code, uuids_in(out)))
            i += 1

    t = threading.Thread(target=stream)
    t.start()
    try:
        time.sleep(1)
        r = node.install(podman, V2)                       # the new pod's init containers
        assert r.returncode == 0, r.stderr
        node.stop("serve")                                 # the old pod goes (preStop: exit 3, nothing undone)
        node.stop("cdi-refresh")
        setup = node.machine.run(*node.node_command("setup"), timeout=300)
        node.start("serve")
        node.start("cdi-refresh")
        time.sleep(2)
    finally:
        stop.set()
        t.join(600)
    assert setup.returncode == 0, setup.stdout + setup.stderr
    assert "restart" not in setup.stdout, setup.stdout     # nothing changed: no engine restart
    assert (node.root / INSTALL / "current").readlink() == Path(V2)
    assert (node.root / INSTALL / V1).is_dir()             # containers started with it may still use it
    assert len(results) >= 4 and all(r == (0, [uuids[1]]) for r in results), results
    code, out = node.gpu_pod("after", env={"NVIDIA_VISIBLE_DEVICES": uuids[1]})
    assert (code, uuids_in(out)) == (0, [uuids[1]]), out


def test_deleting_the_daemonset_gives_the_node_its_files_back(node):
    """What serve's preStop runs once `nvhook setup k8s-removed` says the DaemonSet is
    gone (tests/test_setup_k8s.py asks the API server; here the answer is yes)."""
    script = containers()["serve"]["lifecycle"]["preStop"]["exec"]["command"][-1]
    joined = re.sub(r"\\\n\s*", " ", script)            # the shell's line continuations
    undo = re.search(r"exec (nsenter [^\n]*)", joined).group(1).split()
    node.stop("serve")
    node.stop("cdi-refresh")
    r = node.machine.run(*undo, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert files_under(node.root, KEPT) == node.before
