"""The Kubernetes DaemonSet's pod, for real, on a node (issue 22): the image `make image`
builds (packaging/build_image.py: a Debian root with the bundle), and a fresh Debian 12
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
import shutil
import subprocess
import sys
import threading
import time
import uuid as _uuid
from pathlib import Path

import pytest
import yaml

from support import nspawn
from support.hookenv import gpu_uuids as sim_uuids

REPO = Path(__file__).resolve().parent.parent
V1 = __import__("libinject").__version__
V2 = V1 + "-next"
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


@pytest.fixture(scope="module")
def podman():
    from support.podman import Podman, state_dir

    with state_dir("k8") as d:
        yield Podman(d)


@pytest.fixture(scope="module")
def images(tmp_path_factory, podman):
    """Both image versions, from one mmdebstrap base."""
    work = tmp_path_factory.mktemp("images")
    base = work / "base.tar"
    sys.path.insert(0, str(REPO / "packaging"))
    try:
        from build_image import MMDEBSTRAP
    finally:
        sys.path.remove(str(REPO / "packaging"))
    r = subprocess.run([*MMDEBSTRAP, str(base)], capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-2000:]
    for v in (V1, V2):
        r = subprocess.run([sys.executable, str(REPO / "packaging/build_image.py"), str(work), "--version", v,
                            "--base", str(base)], capture_output=True, text=True, timeout=1800, env=podman.env())
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout.splitlines()[0] == f"localhost/nvhook:{v}"
    return work


class Node:
    """The booted node, its CRI, and the pod's containers that keep running."""

    def __init__(self, base: Path, sim: Path) -> None:
        import tomlkit

        from libinject.sim.rootfs import build_rootfs
        from support.engines_daemons import CONTAINERD

        self.base = base
        self.root = root = nspawn.debootstrap(base / "node", NODE_PACKAGES)
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
        env = {e["name"]: e["value"] for e in c.get("env", [])} | {"NVHOOK_VERSION": version}
        host = self.root / INSTALL
        host.mkdir(parents=True, exist_ok=True)          # hostPath type DirectoryOrCreate
        [mount] = c["volumeMounts"]
        argv = [shutil.which("podman") or "/usr/bin/podman", "run", "--rm", "--pull=never", "--read-only",
                "--cap-drop=all", "--security-opt=no-new-privileges", "--user=0", "--net=none",
                "-v", f"{host}:{mount['mountPath']}", *[f"--env={k}={v}" for k, v in env.items()],
                f"localhost/nvhook:{version}", *c["command"]]
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
                annotations: dict[str, str] | None = None) -> tuple[int, str]:
        import grpc

        from support import cri

        logs = Path("/var/log/pods") / name
        sandbox = self.cri.sandbox_config(name, logs)
        pod = self.cri.run_pod(sandbox)
        try:
            cid = self.cri.create(pod, sandbox, name, IMAGE, ["/bin/sh", "-c", "nvidia-smi -L"], env=env,
                                  annotations=annotations)
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
