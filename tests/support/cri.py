"""A minimal CRI v1 client for tests: what a kubelet asks containerd's CRI plugin over
its gRPC socket to start a pod with one container (RunPodSandbox, CreateContainer,
StartContainer), to see what the container printed (ContainerStatus and the CRI log
file, ExecSync) and to clean up (StopPodSandbox, RemovePodSandbox).

The messages are the subset in cri_v1.proto (field numbers as the API's), compiled
with grpc_tools' protoc into a per-process directory the first time they are needed;
no stubs are generated: each call is a unary method by its full name. Images come from
a directory tree (oci_archive: a one-layer OCI image archive that `ctr images import`
reads), so nothing needs a registry (RUNTIMES.md)."""
from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROTO = HERE / "cri_v1.proto"
NAMESPACE = "k8s.io"                 # the containerd namespace the CRI plugin uses
SERVICE = "/runtime.v1.RuntimeService/"
_pb: Any = None


def pb() -> Any:
    """The compiled message module (cri_v1_pb2), built once per process."""
    global _pb
    if _pb is None:
        from grpc_tools import protoc

        out = tempfile.mkdtemp(prefix="nvhook-cri-pb-")
        include = str(Path(protoc.__file__).parent / "_proto")
        code = protoc.main(["protoc", f"-I{HERE}", f"-I{include}", f"--python_out={out}", str(PROTO)])
        if code != 0:
            raise RuntimeError(f"protoc failed on {PROTO} ({code})")
        sys.path.insert(0, out)
        try:
            import cri_v1_pb2
        finally:
            sys.path.remove(out)
        _pb = cri_v1_pb2
    return _pb


class CRI:
    """A CRI v1 client on a unix socket; every call has a deadline."""

    def __init__(self, sock: str | os.PathLike[str], timeout: float = 60.0) -> None:
        import grpc

        self.channel = grpc.insecure_channel(f"unix://{sock}")
        self.timeout = timeout

    def call(self, method: str, request: Any, response: str, timeout: float | None = None) -> Any:
        rpc = self.channel.unary_unary(SERVICE + method, request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=getattr(pb(), response).FromString)
        return rpc(request, timeout=timeout or self.timeout)

    def close(self) -> None:
        self.channel.close()

    def version(self) -> Any:
        return self.call("Version", pb().VersionRequest(version="v1"), "VersionResponse")

    # -- pods --

    def sandbox_config(self, name: str, log_dir: Path, annotations: dict[str, str] | None = None) -> Any:
        """A host-network pod (no CNI needed), its containers' logs under log_dir."""
        m = pb()
        ns = m.NamespaceOption(network=m.NODE, pid=m.CONTAINER, ipc=m.POD)
        return m.PodSandboxConfig(
            metadata=m.PodSandboxMetadata(name=name, uid=f"uid-{name}", namespace="default"),
            log_directory=str(log_dir), annotations=annotations or {},
            linux=m.LinuxPodSandboxConfig(security_context=m.LinuxSandboxSecurityContext(namespace_options=ns)))

    def run_pod(self, config: Any, handler: str = "") -> str:
        r = self.call("RunPodSandbox", pb().RunPodSandboxRequest(config=config, runtime_handler=handler),
                      "RunPodSandboxResponse")
        return r.pod_sandbox_id

    def remove_pod(self, pod_id: str) -> None:
        m = pb()
        self.call("StopPodSandbox", m.StopPodSandboxRequest(pod_sandbox_id=pod_id), "StopPodSandboxResponse")
        self.call("RemovePodSandbox", m.RemovePodSandboxRequest(pod_sandbox_id=pod_id), "RemovePodSandboxResponse")

    # -- containers --

    def create(self, pod_id: str, sandbox: Any, name: str, image: str, args: list[str], *,
               env: dict[str, str] | None = None, mounts: list[tuple[str, str]] = (),
               annotations: dict[str, str] | None = None, cdi_devices: list[str] = ()) -> str:
        """A container as a kubelet asks for it: args as its command, env, the device
        plugin's mounts (host path, container path), annotations and CDI devices."""
        m = pb()
        config = m.ContainerConfig(
            metadata=m.ContainerMetadata(name=name), image=m.ImageSpec(image=image), command=args,
            envs=[m.KeyValue(key=k, value=v) for k, v in (env or {}).items()],
            mounts=[m.Mount(host_path=h, container_path=c) for h, c in mounts],
            annotations=annotations or {}, log_path=f"{name}.log",
            CDI_devices=[m.CDIDevice(name=n) for n in cdi_devices],
            linux=m.LinuxContainerConfig(security_context=m.LinuxContainerSecurityContext(
                namespace_options=m.NamespaceOption(network=m.NODE, pid=m.CONTAINER, ipc=m.POD))))
        r = self.call("CreateContainer", m.CreateContainerRequest(pod_sandbox_id=pod_id, config=config,
                                                                  sandbox_config=sandbox),
                      "CreateContainerResponse")
        return r.container_id

    def start(self, container_id: str) -> None:
        self.call("StartContainer", pb().StartContainerRequest(container_id=container_id),
                  "StartContainerResponse")

    def status(self, container_id: str) -> Any:
        return self.call("ContainerStatus", pb().ContainerStatusRequest(container_id=container_id),
                         "ContainerStatusResponse").status

    def wait_exited(self, container_id: str, timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            st = self.status(container_id)
            if st.state == pb().CONTAINER_EXITED:
                return st
            if time.monotonic() > deadline:
                raise TimeoutError(f"container {container_id} still {st.state} after {timeout:g} s")
            time.sleep(0.1)

    def exec_sync(self, container_id: str, cmd: list[str], timeout: int = 30) -> Any:
        return self.call("ExecSync", pb().ExecSyncRequest(container_id=container_id, cmd=cmd, timeout=timeout),
                         "ExecSyncResponse", timeout=timeout + 10)


def log_text(path: str | os.PathLike[str]) -> str:
    """What a container wrote, from its CRI log file (lines `TIME STREAM P|F TEXT`: P
    is a part of a line, F its end)."""
    out = []
    for line in Path(path).read_text(errors="replace").splitlines():
        parts = line.split(" ", 3)
        if len(parts) == 4:
            out.append(parts[3] + ("\n" if parts[2] == "F" else ""))
        elif len(parts) == 3:
            out.append("\n" if parts[2] == "F" else "")
    return "".join(out)


# -- images without a registry ------------------------------------------------------------------

def _blob(tar: tarfile.TarFile, data: bytes) -> tuple[str, int]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo("blobs/sha256/" + digest[7:])
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return digest, len(data)


def oci_archive(rootfs: Path, name: str, dest: Path, cmd: list[str], env: list[str] = ()) -> Path:
    """An OCI image archive of rootfs (one uncompressed layer) named `name`, running
    cmd, with env: what `ctr images import` takes."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as t:
        for entry in sorted(rootfs.iterdir()):
            t.add(entry, arcname=entry.name)
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    with tarfile.open(dest, "w") as tar:
        layer_digest, layer_size = _blob(tar, layer_bytes)
        config = json.dumps({"architecture": "amd64", "os": "linux",
                             "config": {"Cmd": list(cmd), "Env": list(env), "WorkingDir": "/"},
                             "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
        config_digest, config_size = _blob(tar, config)
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest,
                       "size": config_size},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest,
                        "size": layer_size}]}).encode()
        manifest_digest, manifest_size = _blob(tar, manifest)
        for fname, data in (("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
                            ("index.json", json.dumps({"schemaVersion": 2, "manifests": [{
                                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                                "digest": manifest_digest, "size": manifest_size,
                                "annotations": {"io.containerd.image.name": name,
                                                "org.opencontainers.image.ref.name": name}}]}).encode())):
            info = tarfile.TarInfo(fname)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return dest


def import_image(ctr: str, sock: Path, archive: Path) -> None:
    """`ctr -n k8s.io images import`: the image where the CRI plugin looks."""
    r = subprocess.run([ctr, "--address", str(sock), "-n", NAMESPACE, "images", "import", str(archive)],
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise RuntimeError(f"ctr images import {archive}: {r.stderr.strip()}")
