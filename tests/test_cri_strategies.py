"""The device plugin's strategies through containerd's CRI, with the configuration
`nvhook setup auto` wrote: what a kubelet does on a node, but for the kubelet itself.

A private containerd (Debian's 1.6: `containerd config default` with its own root,
state and sockets, a locally imported pause image, host-network pods so no CNI) is set
up by `nvhook setup auto` (its own `containerd --version` and `config dump` decide: no
CDI in 1.6, so nvhook's shim in cdi mode as the default runtime), with the CDI spec at
a path of the test's (not /etc/cdi or /var/run/cdi) on the simulated a100x8 host, and
started from what auto wrote. Each test sends what the kubelet sends for the device
plugin's answer (tests/test_device_plugin_strategies.py: `allocate`) over the CRI
(tests/support/cri.py) and reads what the container printed: nvidia-smi -L lists
exactly the allocated GPU 1, its /dev has /dev/nvidia1 only, opening it gets past the
device cgroup (ENXIO: no driver here) while a node for GPU 0 made in the container is
refused (EPERM).

What 1.6 cannot do: the CRI's CDI_devices field (the cdi-cri strategy) is ignored (CDI
came in containerd 1.7); the test for it shows that, so a node on 1.6 must use another
strategy.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
import uuid as _uuid
from pathlib import Path

import pytest

CONTAINERD = "/usr/bin/containerd"
PAUSE = "nvhook.test/pause:1"
IMAGE = "nvhook.test/cuda-like:1"
KIND = "nvidia.com/gpu"
DEVICES_ROOT = "/var/run/nvidia-container-devices"
# What a CUDA base image sets: every GPU unless told otherwise.
IMAGE_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
PROBE = ("nvidia-smi -L; ls /dev | grep '^nvidia[0-9]' | sed 's/^/DEV /'; "
         "mknod /tmp/gpu0 c 195 0; "
         "for d in /tmp/gpu0 /dev/nvidia1; do "
         "dd if=$d of=/dev/null bs=1 count=0 2>&1 | grep -o \"can't open.*\" || echo \"$d: OK\"; done")
# The node's own nvhook config (an administrator's): the simulated driver root, and the
# volume-mounts strategy accepted (NVIDIA's default is not to; the GPU Operator turns it on
# with that strategy). auto adds its keys to it.
NODE_CONFIG = ("accept-nvidia-visible-devices-as-volume-mounts = true\n"
               '\n[nvidia-container-cli]\nroot = "{root}"\n[nvhook]\nsnapshot = false\n')


class Node:
    """containerd + its CRI, set up by `nvhook setup auto`, every file under d."""

    def __init__(self, d: Path, host: Path) -> None:
        import tomlkit

        from libinject.sim.rootfs import build_rootfs
        from support import cri
        from support.engines_daemons import CTR, Containerd, private_containerd_config

        self.d = d
        doc = tomlkit.parse(private_containerd_config(d))
        plugin = doc["plugins"]["io.containerd.grpc.v1.cri"]
        plugin["sandbox_image"] = PAUSE
        # root here lacks CAP_SYS_RESOURCE: no oom_score_adj below containerd's own
        plugin["restrict_oom_score_adj"] = True
        self.config = d / "config.toml"
        self.config.write_text(doc.as_string())
        self.nvhook_config = d / "nvhook/config.toml"
        self.nvhook_config.parent.mkdir()
        self.nvhook_config.write_text(NODE_CONFIG.format(root=host))
        absent = str(d / "absent")
        self.setup_argv = [
            "--config", str(self.nvhook_config), "--root", str(host), "setup", "auto",
            "--containerd-config", str(self.config), "--containerd-bin", CONTAINERD,
            "--crio-bin", absent, "--dockerd-bin", absent, "--docker-bin", absent,
            "--crio-drop-in", str(d / "crio/99-nvhook.toml"), "--hooks-dir", str(d / "hooks.d"),
            "--docker-config", str(d / "docker/daemon.json"), "--hook-dir", str(d / "bin"),
            "--cdi-spec", str(d / "cdi/nvidia.yaml"), "--backup-dir", str(d / "backups")]
        self.setup_out = setup_auto(self.setup_argv)
        self.ctrd = Containerd(d, self.config, {"NVHOOK_CONFIG": str(self.nvhook_config)})
        try:
            rootfs = build_rootfs(d / "rootfs")
            (rootfs / "bin/mknod").symlink_to("busybox")
            (rootfs / "bin/sed").symlink_to("busybox")
            cri.import_image(CTR, self.ctrd.sock, cri.oci_archive(rootfs, PAUSE, d / "pause.tar",
                                                                  ["/bin/sleep", "2147483647"]))
            cri.import_image(CTR, self.ctrd.sock, cri.oci_archive(rootfs, IMAGE, d / "image.tar",
                                                                  ["/bin/sh"], IMAGE_ENV))
            self.cri = cri.CRI(self.ctrd.sock)
        except BaseException:
            self.ctrd.stop()
            raise

    def run(self, name: str, script: str = PROBE, *, env: dict[str, str] | None = None,
            mounts: list[tuple[str, str]] = (), annotations: dict[str, str] | None = None,
            cdi_devices: list[str] = (), pod_annotations: dict[str, str] | None = None) -> tuple[int, str]:
        """A pod with one container running `sh -c script` as the kubelet asks for it:
        (its exit code, what it printed; or the CRI's error)."""
        import grpc

        from support import cri

        logs = self.d / "logs" / name
        sandbox = self.cri.sandbox_config(name, logs, pod_annotations)
        pod = self.cri.run_pod(sandbox)
        try:
            cid = self.cri.create(pod, sandbox, name, IMAGE, ["/bin/sh", "-c", script], env=env,
                                  mounts=mounts, annotations=annotations, cdi_devices=cdi_devices)
            self.cri.start(cid)
            st = self.cri.wait_exited(cid)
            return st.exit_code, cri.log_text(logs / f"{name}.log")
        except grpc.RpcError as e:
            return -1, f"CRI error: {e.details()}"
        finally:
            self.cri.remove_pod(pod)

    def stop(self) -> None:
        self.cri.close()
        self.ctrd.stop()


def setup_auto(argv: list[str]) -> str:
    """`nvhook ARGS` as an administrator (or the DaemonSet) runs it: its output."""
    from conftest import NVHOOK

    r = subprocess.run([NVHOOK, *argv], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def node(a100_host):
    from support.engines_daemons import short_dir

    d = short_dir("ncri")
    try:
        n = Node(d, a100_host)
    except BaseException:
        shutil.rmtree(d, ignore_errors=True)
        raise
    try:
        yield n
    finally:
        n.stop()
        shutil.rmtree(d, ignore_errors=True)


def only_gpu1(out: str, uuids: list[str]) -> tuple:
    """What the container saw, in the order PROBE prints it."""
    return (re.findall(r"UUID: (GPU-[0-9a-f-]+)", out), re.findall(r"^DEV (\S+)", out, re.M),
            "can't open '/tmp/gpu0': Operation not permitted" in out,
            "can't open '/dev/nvidia1': No such device or address" in out)


def expected(uuids: list[str]) -> tuple:
    return ([uuids[1]], ["nvidia1"], True, True)


# ---------------------------------------------------------------- what auto wrote

def test_auto_set_containerd_16_up_for_the_annotations(node):
    dump = tomllib.loads(subprocess.run([CONTAINERD, "--config", str(node.config), "config", "dump"],
                                        capture_output=True, text=True, timeout=60, check=True).stdout)
    cri = dump["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert (cri["default_runtime_name"], cri["runtimes"]["nvidia"]["container_annotations"]) == (
        "nvidia", ["cdi.k8s.io/*", "nvidia.cdi.k8s.io/*"]), node.setup_out
    # 1.6: the CRI plugin's start-up line names the runtime and its annotations
    assert "ContainerAnnotations:[cdi.k8s.io/* nvidia.cdi.k8s.io/*]" in node.ctrd.log.read_text()


# ---------------------------------------------------------------- the four strategies

def test_envvar(node, gpu_uuids):
    code, out = node.run("envvar", env={"NVIDIA_VISIBLE_DEVICES": gpu_uuids[1]})
    assert (code, only_gpu1(out, gpu_uuids)) == (0, expected(gpu_uuids)), out


def test_volume_mounts(node, gpu_uuids):
    code, out = node.run("volume-mounts", env={"NVIDIA_VISIBLE_DEVICES": DEVICES_ROOT},
                         mounts=[("/dev/null", f"{DEVICES_ROOT}/{gpu_uuids[1]}")])
    assert (code, only_gpu1(out, gpu_uuids)) == (0, expected(gpu_uuids)), out


@pytest.mark.parametrize("prefix", ["cdi.k8s.io/", "nvidia.cdi.k8s.io/"])
def test_cdi_annotations(node, gpu_uuids, prefix):
    # The image's NVIDIA_VISIBLE_DEVICES=all stays in the env: the annotation wins.
    key = f"{prefix}nvidia-device-plugin_{_uuid.uuid4()}"
    code, out = node.run("cdi-annotations-" + prefix.split(".")[0],
                         annotations={key: f"{KIND}={gpu_uuids[1]}"})
    assert (code, only_gpu1(out, gpu_uuids)) == (0, expected(gpu_uuids)), out


def test_cdi_cri_field_is_ignored_by_containerd_16(node, gpu_uuids):
    """cdi-cri needs containerd >= 1.7 (it applies CDI_devices itself, enable_cdi): 1.6
    drops the field, so an image that asks for no GPU gets none, and a CUDA image's
    NVIDIA_VISIBLE_DEVICES=all would get them all. On 1.6, use another strategy."""
    code, out = node.run("cdi-cri", env={"NVIDIA_VISIBLE_DEVICES": "void"}, cdi_devices=[f"{KIND}={gpu_uuids[1]}"])
    assert (code, only_gpu1(out, gpu_uuids)[:2]) == (0, ([], [])), out


# ---------------------------------------------------------------- who may ask

def test_a_pods_own_annotation_gives_no_gpu(node, gpu_uuids):
    # Pod annotations are the pod author's: containerd passes none to the runtime
    # (auto sets container_annotations, never pod_annotations), so a pod cannot name a
    # GPU the device plugin did not allocate it.
    code, out = node.run("pod-annotation", env={"NVIDIA_VISIBLE_DEVICES": "void"},
                         pod_annotations={"cdi.k8s.io/mine": f"{KIND}=all",
                                          "nvidia.cdi.k8s.io/mine": f"{KIND}=all"})
    assert (code, only_gpu1(out, gpu_uuids)[:2]) == (0, ([], [])), out


def test_no_request_no_gpu(node, gpu_uuids):
    code, out = node.run("plain", env={"NVIDIA_VISIBLE_DEVICES": "void"})
    assert (code, only_gpu1(out, gpu_uuids)[:2]) == (0, ([], [])), out
