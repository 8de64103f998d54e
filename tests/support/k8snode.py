"""A Kubernetes node for tests: a fresh Debian root (mmdebstrap) with systemd, containerd
and runc, booted with systemd-nspawn, and the DaemonSet's pod run on it: "install" from
the image with podman, the other containers' commands from
deployments/kubernetes/daemonset.yaml in the node's namespaces; GPU pods through
containerd's CRI (support.cri). tests/test_k8s_node.py (Debian 12, containerd 1.6) and
tests/test_k8s_node_cdi.py (Debian 13, containerd 1.7: native CDI) use it."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from support import nspawn, packaging

REPO = Path(__file__).resolve().parents[2]
V1 = __import__("libinject").__version__
V2 = V1 + ".post1"    # (PEP 440: setuptools >= 84 refuses "-next")
PAUSE = "nvhook.test/pause:1"
IMAGE = "nvhook.test/cuda-like:1"
IMAGE_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
NODE_PACKAGES = "systemd,systemd-sysv,dbus,containerd,runc"
INSTALL = "usr/local/lib/nvhook"
# What the node's administrator configured before nvhook: the files the uninstall must
# give back as they were.
KEPT = ("etc/containerd", "etc/nvidia-container-runtime", "etc/cdi")


def daemonset() -> dict:
    docs = list(yaml.safe_load_all((REPO / "deployments/kubernetes/daemonset.yaml").read_text()))
    [ds] = [d for d in docs if d and d.get("kind") == "DaemonSet"]
    return ds["spec"]["template"]["spec"]


def containers() -> dict[str, dict]:
    spec = daemonset()
    return {c["name"]: c for c in spec["initContainers"] + spec["containers"]}


def files_under(root: Path, tops: tuple[str, ...]) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for top in tops:
        base = root / top
        if not base.exists():
            continue
        for p in sorted(base.rglob("*")):
            rel = str(p.relative_to(root))
            out[rel] = f"-> {p.readlink()}" if p.is_symlink() else (p.read_bytes() if p.is_file() else "dir")
    return out



def image_name() -> str:
    """The name the manifests give the image (kustomization.yaml), the one `make image` tags."""
    sys.path.insert(0, str(REPO / "packaging"))
    try:
        from build_image import image_name as name
    finally:
        sys.path.remove(str(REPO / "packaging"))
    return name()


def build_images(work: Path, env: dict[str, str], versions: tuple[str, ...]) -> None:
    """<the manifests' image name>:<v> for each version, as `make image` builds it."""
    for v in versions:
        out = packaging.build("build_image.py", str(work), "--version", v, env=env, timeout=1800)
        assert out[0] == f"{image_name()}:{v}"


class Node:
    """The booted node, its CRI, and the pod's containers that keep running."""

    def __init__(self, base: Path, sim: Path, suite: str = "bookworm") -> None:
        import tomlkit

        from libinject.sim.rootfs import build_rootfs
        from support.engines_daemons import CONTAINERD

        self.base = base
        self.root = root = nspawn.debootstrap(base / "node", NODE_PACKAGES, suite)
        assert not (root / "usr/bin/python3").exists()      # the node brings no Python
        (root / "sim").mkdir()
        (root / "etc/hosts").write_text("127.0.0.1 localhost\n")     # a node has one; the CRI copies it
        doc = tomlkit.parse(subprocess.run([CONTAINERD, "config", "default"], capture_output=True, text=True,
                                           check=True, timeout=60).stdout)
        doc["plugins"]["io.containerd.grpc.v1.cri"]["sandbox_image"] = PAUSE
        # root on this machine lacks CAP_SYS_RESOURCE (nspawn cannot give it): no
        # oom_score_adj below containerd's own, as tests/test_cri_strategies.py
        doc["plugins"]["io.containerd.grpc.v1.cri"]["restrict_oom_score_adj"] = True
        # The node's cgroup2 has no controllers here (this host binds them all to v1), so
        # the CRI's cpu/memory settings cannot be applied: off, as on a rootless node.
        # runc still makes each container a cgroup and guards its devices (eBPF).
        doc["plugins"]["io.containerd.grpc.v1.cri"]["disable_cgroup"] = True
        (root / "etc/containerd").mkdir(exist_ok=True)
        (root / "etc/containerd/config.toml").write_text(doc.as_string())
        (root / "etc/nvidia-container-runtime").mkdir()
        (root / "etc/nvidia-container-runtime/config.toml").write_text(
            '# the administrator\'s\n[nvidia-container-cli]\nroot = "/sim"\n')
        img = build_rootfs(base / "img")
        for tool in ("mknod", "sed"):
            (img / "bin" / tool).symlink_to("busybox")
        from support import cri

        cri.oci_archive(img, PAUSE, root / "root/pause.tar", ["/bin/sleep", "2147483647"])
        cri.oci_archive(img, IMAGE, root / "root/image.tar", ["/bin/sh"], IMAGE_ENV)
        self.before = files_under(root, KEPT)
        # runc 1.1, started by containerd (under nspawn's seccomp filter), needs keyctl
        self.machine = nspawn.Machine(root, binds=[(sim, "/sim")], syscalls="bpf @keyring")
        self.running: dict[str, subprocess.Popen] = {}
        try:
            for archive in ("pause.tar", "image.tar"):
                r = self.machine.run("ctr", "-n", "k8s.io", "images", "import", f"/root/{archive}", timeout=300)
                assert r.returncode == 0, r.stderr
        except BaseException:
            self.machine.stop()
            raise
        self.cri = cri.CRI(f"/proc/{self.machine.pid1}/root/run/containerd/containerd.sock")

    # -- the pod's containers --

    def install(self, podman, version: str) -> subprocess.CompletedProcess[str]:
        """The init container "install", in the image, its hostPath the node's install dir."""
        c = containers()["install"]
        env = {e["name"]: e["value"] for e in c.get("env", [])}     # NVHOOK_VERSION: the image's
        host = self.root / INSTALL
        host.mkdir(parents=True, exist_ok=True)          # hostPath type DirectoryOrCreate
        [mount] = c["volumeMounts"]
        argv = [shutil.which("podman") or "/usr/bin/podman", "run", "--rm", "--pull=never", "--read-only",
                "--cap-drop=all", "--security-opt=no-new-privileges", "--user=0", "--net=none",
                "-v", f"{host}:{mount['mountPath']}", *[f"--env={k}={v}" for k, v in env.items()],
                f"{image_name()}:{version}", *c["command"]]
        return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=podman.env())

    def node_command(self, name: str) -> list[str]:
        return list(containers()[name]["command"])

    def start(self, name: str) -> None:
        self.running[name] = self.machine.popen(*self.node_command(name), log=self.base / f"{name}.log")

    def stop(self, name: str) -> None:
        proc = self.running.pop(name)
        proc.terminate()
        proc.wait(120)

    def log(self, name: str) -> str:
        return (self.base / f"{name}.log").read_text(errors="replace")

    def served(self) -> int:
        return len(re.findall(r"request from pid \d+: status 0 ", self.log("serve")))

    # -- a kubelet's GPU pod --

    def gpu_pod(self, name: str, env: dict[str, str] | None = None,
                annotations: dict[str, str] | None = None, cdi_devices: list[str] = ()) -> tuple[int, str]:
        import grpc

        from support import cri

        logs = Path("/var/log/pods") / name
        sandbox = self.cri.sandbox_config(name, logs)
        pod = self.cri.run_pod(sandbox)
        try:
            cid = self.cri.create(pod, sandbox, name, IMAGE, ["/bin/sh", "-c", "nvidia-smi -L"], env=env,
                                  annotations=annotations, cdi_devices=list(cdi_devices))
            self.cri.start(cid)
            st = self.cri.wait_exited(cid)
            return st.exit_code, cri.log_text(self.root / str(logs).lstrip("/") / f"{name}.log")
        except grpc.RpcError as e:
            return -1, f"CRI error: {e.details()}"
        finally:
            self.cri.remove_pod(pod)

    def close(self) -> None:
        for name in list(self.running):
            self.stop(name)
        self.cri.close()
        self.machine.stop()


