"""The DaemonSet's pod on a node whose containerd applies CDI itself: Debian 13's
containerd 1.7 (tests/support/k8snode.py; Debian 12's 1.6 is tests/test_k8s_node.py).
`nvhook setup auto` (the pod's "setup", as the DaemonSet runs it) sees 1.7 in
containerd's own effective config, turns its CDI on with the spec's directory and leaves
its default runtime alone; then the device plugin's cdi-cri strategy (the CRI's
CDI_devices field, which 1.6 drops) and cdi-annotations (`cdi.k8s.io/`) each give a pod
exactly its GPU, through containerd's CRI, with the spec's createRuntime hook served
by the pod's `nvhook serve`.
"""
from __future__ import annotations

import re
import time
import tomllib
import uuid as _uuid

import pytest

from support.hookenv import gpu_uuids as sim_uuids
from support.k8snode import V1, Node, build_images


@pytest.fixture(scope="module")
def podman():
    from support.podman import Podman, state_dir

    with state_dir("k9") as d:
        yield Podman(d)


@pytest.fixture(scope="module")
def node(tmp_path_factory, a100_host, podman):
    build_images(tmp_path_factory.mktemp("images"), podman.env(), (V1,))
    n = Node(tmp_path_factory.mktemp("k8node13"), a100_host, suite="trixie")
    try:
        r = n.install(podman, V1)
        assert r.returncode == 0, r.stderr
        n.setup = n.machine.run(*n.node_command("setup"), timeout=300)
        assert n.setup.returncode == 0, n.setup.stdout + n.setup.stderr
        n.start("serve")
        deadline = time.monotonic() + 60
        while not (n.root / "run/nvhook/hook.sock").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        yield n
    finally:
        n.close()


def uuids_in(out: str) -> list[str]:
    return re.findall(r"UUID: (GPU-[0-9a-f-]+)", out)


def test_setup_auto_turns_on_containerds_own_cdi(node):
    version = node.machine.run("containerd", "--version").stdout
    assert " 1.7." in version, version
    dump = tomllib.loads(node.machine.run("containerd", "config", "dump").stdout)
    cri = dump["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["enable_cdi"] is True and "/var/run/cdi" in cri["cdi_spec_dirs"], node.setup.stdout
    assert cri["containerd"]["default_runtime_name"] == "runc"        # left alone
    assert "nvidia" in cri["containerd"]["runtimes"]
    # the spec auto wrote, in the node's /var/run/cdi (a tmpfs there: read it inside)
    spec = node.machine.run("cat", "/var/run/cdi/nvidia.yaml")
    assert spec.returncode == 0 and "createRuntime" in spec.stdout, spec.stderr


def test_cdi_cri(node, a100_host):
    uuids = sim_uuids(a100_host)
    before = node.served()
    code, out = node.gpu_pod("cdi-cri", cdi_devices=[f"nvidia.com/gpu={uuids[1]}"])
    assert (code, uuids_in(out)) == (0, [uuids[1]]), out
    assert node.served() == before + 1, node.log("serve")     # the spec's createRuntime hook


def test_cdi_annotations(node, a100_host):
    uuids = sim_uuids(a100_host)
    key = f"cdi.k8s.io/nvidia-device-plugin_{_uuid.uuid4()}"
    code, out = node.gpu_pod("cdi-annotations", annotations={key: f"nvidia.com/gpu={uuids[1]}"})
    assert (code, uuids_in(out)) == (0, [uuids[1]]), out
