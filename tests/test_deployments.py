"""deployments/: the Kubernetes manifests validate against the API schemas (offline, with
kubernetes-validate's bundled schemas), and the DaemonSet is what its comments say:
privileged only where the comments give a reason, hostPID, the node selector, no API
access, the commands it documents."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

kv = pytest.importorskip("kubernetes_validate")

DEPLOY = Path(__file__).resolve().parent.parent / "deployments/kubernetes"
MANIFESTS = sorted(p for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")
NVHOOK = "/usr/local/lib/nvhook/current/bin/nvhook"
NSENTER = ["nsenter", "--target=1", "--mount"]


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def all_docs() -> list[dict]:
    return [d for p in MANIFESTS for d in docs(p)]


def daemonset() -> dict:
    return next(d for d in all_docs() if d["kind"] == "DaemonSet")


def pod() -> dict:
    return daemonset()["spec"]["template"]["spec"]


def containers() -> dict[str, dict]:
    p = pod()
    return {c["name"]: c for c in [*p.get("initContainers", []), *p["containers"]]}


def privileged(c: dict) -> bool:
    return bool(c.get("securityContext", {}).get("privileged", False))


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates_strictly(path):
    for d in docs(path):
        kv.validate(d, kv.latest_version(), strict=True)


def test_the_schemas_are_bundled():
    # Offline: the schemas come with the package, nothing is fetched.
    root = Path(kv.__file__).parent / "kubernetes-json-schema"
    assert any(root.glob(f"v{kv.latest_version()}*/daemonset-apps-v1.json"))


def test_validation_catches_a_bad_field():
    bad = daemonset()
    bad["spec"]["template"]["spec"]["containers"][0]["privilegd"] = True
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, kv.latest_version(), strict=True)


def test_kinds_and_namespace():
    assert sorted((d["kind"], d["metadata"].get("namespace")) for d in all_docs()) == \
        [("DaemonSet", "nvhook-system"), ("Namespace", None), ("ServiceAccount", "nvhook-system")]


def test_kustomization_lists_every_manifest():
    k = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert sorted(k["resources"]) == [p.name for p in MANIFESTS]


def test_namespace_admits_privileged_pods():
    ns = next(d for d in all_docs() if d["kind"] == "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_privileged_exactly_where_the_comments_say():
    assert {n for n, c in containers().items() if privileged(c)} == {"setup", "cdi-refresh", "serve"}


def test_install_container_has_no_privilege():
    sc = containers()["install"]["securityContext"]
    assert (sc["privileged"], sc["allowPrivilegeEscalation"], sc["capabilities"], sc["readOnlyRootFilesystem"]) == \
        (False, False, {"drop": ["ALL"]}, True)


def test_host_pid_only():
    p = pod()
    assert (p.get("hostPID"), p.get("hostNetwork", False), p.get("hostIPC", False)) == (True, False, False)


def test_node_selector():
    assert pod()["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


def test_no_api_access():
    sa = next(d for d in all_docs() if d["kind"] == "ServiceAccount")
    assert (sa["automountServiceAccountToken"], pod()["automountServiceAccountToken"], pod()["serviceAccountName"]) \
        == (False, False, sa["metadata"]["name"])


def test_no_rbac():
    assert not {d["kind"] for d in all_docs()} & {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}


def test_only_hostpath_is_the_install_dir():
    vols = pod()["volumes"]
    assert [(v["name"], v["hostPath"]["path"]) for v in vols] == [("install-dir", "/usr/local/lib/nvhook")]


def test_only_install_mounts_the_host_dir():
    assert {n: [m["mountPath"] for m in c.get("volumeMounts", [])] for n, c in containers().items()} == \
        {"install": ["/host/usr/local/lib/nvhook"], "setup": [], "cdi-refresh": [], "serve": []}


def test_init_order_install_then_setup():
    assert [c["name"] for c in pod()["initContainers"]] == ["install", "setup"]


@pytest.mark.parametrize("name,argv", [
    ("setup", [*NSENTER, "--", NVHOOK, "setup", "auto"]),
    ("cdi-refresh", [*NSENTER, "--cgroup", "--", NVHOOK, "cdi", "refresh", "--watch"]),
    ("serve", [*NSENTER, "--cgroup", "--", NVHOOK + "-hook", "serve"]),
])
def test_commands_run_in_the_hosts_mount_namespace(name, argv):
    assert containers()[name]["command"] == argv


def test_prestop_undoes_the_setup():
    assert containers()["serve"]["lifecycle"]["preStop"]["exec"]["command"] == \
        [*NSENTER, "--", NVHOOK, "setup", "auto", "--undo"]


def test_install_version_matches_the_env():
    c = containers()["install"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert all(x["image"].endswith(":" + env["NVHOOK_VERSION"]) for x in containers().values())


def test_install_script_runs(tmp_path):
    # The install script itself, against a fake image tree and host dir: copies once,
    # swaps `current` by rename, and a second run changes nothing but the link.
    c = containers()["install"]
    script = c["command"][2].replace("/host/usr/local/lib/nvhook", str(tmp_path / "host")) \
                            .replace("/usr/local/lib/nvhook/$v", str(tmp_path / "image") + "/$v")
    (tmp_path / "image/0.1.0/bin").mkdir(parents=True)
    (tmp_path / "image/0.1.0/bin/nvhook").write_text("#!/bin/sh\n")
    (tmp_path / "host").mkdir()
    for _ in range(2):
        subprocess.run(["/bin/sh", "-ec", script], check=True, env={"NVHOOK_VERSION": "0.1.0", "PATH": "/usr/bin:/bin"})
    host = tmp_path / "host"
    assert (sorted(p.name for p in host.iterdir()), (host / "current").readlink().as_posix(),
            (host / "current/bin/nvhook").is_file()) == (["0.1.0", "current"], "0.1.0", True)


def test_grace_period_covers_serve_timeout():
    assert pod()["terminationGracePeriodSeconds"] >= 60 + 10


def test_the_service_runs_under_a_memory_limit():
    """The service runs system-node-critical (oom_score_adj -997): a limit keeps one
    hostile image from taking the node's memory; the systemd unit likewise."""
    assert daemonset()["spec"]["template"]["spec"]["priorityClassName"] == "system-node-critical"
    assert containers()["serve"]["resources"]["limits"]["memory"] == "2Gi"
    unit = (DEPLOY.parent.parent / "libinject/setup/units/nvhook-serve.service").read_text().splitlines()
    assert "MemoryMax=2G" in unit and "OOMScoreAdjust=-500" in unit
