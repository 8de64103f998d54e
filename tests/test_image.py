"""The Kubernetes image (`make image`, packaging/build_image.py; issue 29 item 4): only
the bundle and what the DaemonSet's containers run, built once here. Its size, no
setuid/setgid member in any layer, `nvhook` on PATH, tagged with the manifests' name."""
from __future__ import annotations

import json
import subprocess
import tarfile

import pytest

from support import packaging
from support.k8snode import image_name

VERSION = "0.1.0.dev7"    # (a PEP 440 version: setuptools >= 84 refuses others)


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    from support.podman import Podman, state_dir

    with state_dir("im") as d:
        pm = Podman(d)
        work = tmp_path_factory.mktemp("image")
        out = packaging.build("build_image.py", str(work), "--version", VERSION, env=pm.env(), timeout=1800)
        yield pm, out[0], out[1]


def podman(pm, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *argv], capture_output=True, text=True, timeout=300, env=pm.env())


def test_tagged_with_the_manifests_name(image):
    _, tag, _ = image
    assert tag == f"{image_name()}:{VERSION}"


def test_at_most_60_mb(image):
    pm, tag, _ = image
    size = json.loads(podman(pm, "image", "inspect", tag).stdout)[0]["Size"]
    assert size <= 60_000_000, size


def layer_members(archive: str) -> list[tarfile.TarInfo]:
    """Every member of every layer of the saved OCI archive (what a node pulls)."""
    out = []
    with tarfile.open(archive) as oci:
        index = json.load(oci.extractfile("index.json"))
        manifest = json.load(oci.extractfile("blobs/" + index["manifests"][0]["digest"].replace(":", "/")))
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=oci.extractfile("blobs/" + layer["digest"].replace(":", "/"))) as t:
                out += t.getmembers()
    return out


def test_no_setuid_or_setgid_file_in_any_layer(image):
    members = layer_members(image[2])
    assert ([m.name for m in members if m.mode & 0o6000], len(members) > 1000) == ([], True)


def test_only_the_bundle_and_what_the_pod_runs(image):
    # Outside the bundle: busybox (the scripts' shell and tools), util-linux's nsenter
    # (busybox's has no --cgroup) and the libraries nsenter needs. No dpkg, perl, bash, su.
    bundle = f"usr/local/lib/nvhook/{VERSION}/"
    files = {m.name for m in layer_members(image[2]) if m.isfile() and not m.name.startswith(bundle)}
    assert {f for f in files if ".so" not in f} == {"bin/busybox", "usr/bin/nsenter"}


def test_nvhook_on_path(image):
    pm, tag, _ = image
    r = podman(pm, "run", "--rm", "--pull=never", "--net=none", tag, "nvhook", "--version")
    assert (r.returncode, r.stdout.split()[-1:], r.stderr) == (0, [VERSION], "")
    # The containers' commands exec nsenter: util-linux's, with --cgroup.
    r = podman(pm, "run", "--rm", "--pull=never", "--net=none", tag, "nsenter", "--version")
    assert (r.returncode, r.stdout.split()[:2], r.stderr) == (0, ["nsenter", "from"], "")
    assert "util-linux" in r.stdout
    r = podman(pm, "run", "--rm", "--pull=never", "--net=none", tag, "/bin/sh", "-c",
               "readlink /bin/sh; echo $NVHOOK_VERSION")
    assert (r.returncode, r.stdout.split(), r.stderr) == (0, ["busybox", VERSION], "")
