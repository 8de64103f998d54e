"""deployments/: the Kubernetes manifests validate against the API schemas (offline, with
kubernetes-validate's bundled schemas), and the DaemonSet is what its comments say:
privileged only where the comments give a reason, hostPID, the node selector, API access
only for serve's preStop (read-only RBAC), the commands it documents; the preStop
script run for real (fake nvhook and nsenter) undoes only when told the DaemonSet left."""
from __future__ import annotations

import os
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
        [("ClusterRole", None), ("ClusterRoleBinding", None), ("DaemonSet", "nvhook-system"), ("Namespace", None),
         ("Role", "nvhook-system"), ("RoleBinding", "nvhook-system"), ("ServiceAccount", "nvhook-system")]


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


SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def test_api_token_only_in_serve():
    # No automount anywhere; serve alone mounts a projected, short-lived token.
    sa = next(d for d in all_docs() if d["kind"] == "ServiceAccount")
    assert (sa["automountServiceAccountToken"], pod()["automountServiceAccountToken"], pod()["serviceAccountName"]) \
        == (False, False, sa["metadata"]["name"])
    [vol] = [v for v in pod()["volumes"] if v["name"] == "api-token"]
    assert [next(iter(src)) for src in vol["projected"]["sources"]] == ["serviceAccountToken", "configMap"]
    assert {n for n, c in containers().items() for m in c.get("volumeMounts", []) if m["name"] == "api-token"} == {"serve"}


def test_rbac_reads_only_its_daemonset_and_nodes():
    rules = {d["kind"]: d["rules"] for d in all_docs() if d["kind"] in ("Role", "ClusterRole")}
    assert rules == {"Role": [{"apiGroups": ["apps"], "resources": ["daemonsets"],
                               "resourceNames": [daemonset()["metadata"]["name"]], "verbs": ["get"]}],
                     "ClusterRole": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]}
    sa = next(d for d in all_docs() if d["kind"] == "ServiceAccount")["metadata"]
    for b in (d for d in all_docs() if d["kind"].endswith("Binding")):
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}]
        assert b["roleRef"]["kind"] == b["kind"].replace("Binding", "")


def test_only_hostpath_is_the_install_dir():
    vols = [v for v in pod()["volumes"] if "hostPath" in v]
    assert [(v["name"], v["hostPath"]["path"]) for v in vols] == [("install-dir", "/usr/local/lib/nvhook")]


def test_only_install_mounts_the_host_dir():
    assert {n: [m["mountPath"] for m in c.get("volumeMounts", [])] for n, c in containers().items()} == \
        {"install": ["/host/usr/local/lib/nvhook"], "setup": [], "cdi-refresh": [], "serve": [SA_DIR]}


def test_init_order_install_then_setup():
    assert [c["name"] for c in pod()["initContainers"]] == ["install", "setup"]


@pytest.mark.parametrize("name,argv", [
    ("setup", [*NSENTER, "--", NVHOOK, "setup", "auto", "--restart-engines"]),
    ("cdi-refresh", [*NSENTER, "--cgroup", "--", NVHOOK, "cdi", "refresh", "--watch"]),
    ("serve", [*NSENTER, "--cgroup", "--", NVHOOK + "-hook", "serve"]),
])
def test_commands_run_in_the_hosts_mount_namespace(name, argv):
    assert containers()[name]["command"] == argv


def _prestop(tmp_path: Path, answer: int) -> tuple[int, list[str]]:
    """serve's preStop script, run for real with the image's nvhook a fake answering
    k8s-removed with `answer`, and nsenter a fake on PATH: (its exit status, the
    commands the fakes saw)."""
    c = containers()["serve"]
    argv = c["lifecycle"]["preStop"]["exec"]["command"]
    assert argv[:2] == ["/bin/sh", "-c"]
    # NVHOOK_VERSION: the image's ENV (packaging/build_image.py)
    env = {e["name"]: e.get("value", "") for e in c["env"]} | {"NVHOOK_VERSION": "0.1.0"}
    image = tmp_path / "image"
    script = argv[2].replace("/usr/local/lib/nvhook/$NVHOOK_VERSION", f"{image}/$NVHOOK_VERSION")
    log = tmp_path / "log"
    bindir = tmp_path / "bin"
    for d in (bindir, image / env["NVHOOK_VERSION"] / "bin"):
        d.mkdir(parents=True)
    fake = f'#!/bin/sh\necho "$(basename $0) $*" >> {log}\n'
    (image / env["NVHOOK_VERSION"] / "bin/nvhook").write_text(fake + f"exit {answer}\n")
    (bindir / "nsenter").write_text(fake + "exit 0\n")
    for f in ((image / env["NVHOOK_VERSION"] / "bin/nvhook"), bindir / "nsenter"):
        f.chmod(0o755)
    r = subprocess.run(["/bin/sh", "-c", script], env={"PATH": f"{bindir}:/usr/bin:/bin", "NVHOOK_VERSION": env["NVHOOK_VERSION"],
                                                       "NODE_NAME": "gpu-1", "POD_NAMESPACE": "nvhook-system"},
                       capture_output=True, text=True, timeout=60)
    return r.returncode, log.read_text().splitlines() if log.exists() else []


ASK = "nvhook setup k8s-removed --daemonset nvhook-system/nvhook --node gpu-1"
UNDO = f"nsenter --target=1 --mount -- {NVHOOK} setup auto --undo --restart-engines"


def test_prestop_undoes_when_the_daemonset_left_the_node(tmp_path):
    assert _prestop(tmp_path, 0) == (0, [ASK, UNDO])


@pytest.mark.parametrize("answer", [3, 1], ids=["a new pod follows", "no answer"])
def test_prestop_keeps_the_setup_on_update_or_no_answer(tmp_path, answer):
    assert _prestop(tmp_path, answer) == (0, [ASK])


def test_prestop_asks_about_this_daemonset_on_this_node():
    c = containers()["serve"]
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c["env"]}
    assert (env["NODE_NAME"], env["POD_NAMESPACE"]) == ("spec.nodeName", "metadata.namespace")
    script = c["lifecycle"]["preStop"]["exec"]["command"][2]
    assert f'"$POD_NAMESPACE/{daemonset()["metadata"]["name"]}"' in script


def rendered_images() -> set[str]:
    """Every container's image as `kubectl apply -k` applies it (kubectl kustomize, offline)."""
    out = subprocess.run(["kubectl", "kustomize", str(DEPLOY)], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    ds = next(d for d in yaml.safe_load_all(out) if d and d["kind"] == "DaemonSet")
    p = ds["spec"]["template"]["spec"]
    return {c["image"] for c in [*p["initContainers"], *p["containers"]]}


def test_the_image_is_named_once_as_make_image_tags_it():
    """One name and version (kustomization's `images:`), the one `make image` tags: the
    manifests name the image without a tag, and no container sets NVHOOK_VERSION (the
    image's ENV carries its own)."""
    import sys
    sys.path.insert(0, str(DEPLOY.parent.parent / "packaging"))
    try:
        from build_image import image_name
    finally:
        sys.path.pop(0)
    from libinject import __version__
    assert (rendered_images(), {c["image"] for c in containers().values()},
            [e["name"] for c in containers().values() for e in c.get("env", []) if e["name"] == "NVHOOK_VERSION"]) == (
        {f"{image_name()}:{__version__}"}, {"nvhook"}, [])
    assert image_name() == "localhost/nvhook"


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


def install_script(image: Path, host: Path) -> str:
    return containers()["install"]["command"][2].replace("/host/usr/local/lib/nvhook", str(host)) \
                                                .replace("/usr/local/lib/nvhook/$v", str(image) + "/$v")


def run_install_as_the_pod(script: str) -> subprocess.CompletedProcess:
    # uid 0 with every capability dropped and no new privileges, as the pod's
    # securityContext runs it.
    return subprocess.run(["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs",
                           "/bin/sh", "-ec", script], capture_output=True, text=True,
                          env={"NVHOOK_VERSION": "0.1.0", "PATH": "/usr/bin:/bin"})


@pytest.fixture
def world(tmp_path):
    # A place the unprivileged user can reach (pytest's tmp is root's 0700).
    import shutil
    import tempfile
    top = Path(tempfile.mkdtemp(prefix="nvhook-install-"))
    top.chmod(0o755)
    image = top / "image"
    (image / "0.1.0/bin").mkdir(parents=True)
    (image / "0.1.0/bin/nvhook").write_text("#!/bin/sh\necho image\n")
    (image / "0.1.0/bin/nvhook").chmod(0o755)
    yield top, image
    shutil.rmtree(top)


def as_nobody(*argv: str) -> None:
    subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv], check=True)


def test_install_refuses_a_version_dir_another_user_planted(world):
    """Issue 32 item 3: the host dir is sticky and world-writable (/tmp-like); an
    unprivileged user plants 0.1.0 before the pod runs. The install must not point
    `current` (what the engines' hooks run as root) at it: one line, non-zero exit."""
    top, image = world
    host = top / "host"
    host.mkdir()
    host.chmod(0o1777)
    as_nobody("mkdir", "-p", f"{host}/0.1.0/bin")
    as_nobody("sh", "-c", f"printf '#!/bin/sh\\nid > /tmp/pwned\\n' > {host}/0.1.0/bin/nvhook; chmod 755 {host}/0.1.0/bin/nvhook")
    r = run_install_as_the_pod(install_script(image, host))
    assert (r.returncode, r.stderr.startswith(f"nvhook: {host}: "), len(r.stderr.splitlines()),
            os.path.lexists(host / "current")) == (1, True, 1, False)


def test_install_refuses_a_version_dir_it_did_not_write(world):
    """A root-only host dir holding a 0.1.0 that is not the image's (a file another user
    owns inside it, then a changed file): refused, `current` left as it was."""
    top, image = world
    host = top / "host"
    host.mkdir()
    r = run_install_as_the_pod(install_script(image, host))
    assert (r.returncode, (host / "current").readlink().as_posix()) == (0, "0.1.0")
    (host / "current").unlink()
    os.chown(host / "0.1.0/bin/nvhook", 65534, 65534)
    r = run_install_as_the_pod(install_script(image, host))
    assert (r.returncode, r.stderr, os.path.lexists(host / "current")) == (
        1, f"nvhook: {host}/0.1.0/bin/nvhook: not root's or writable by group/other; refusing to link current to {host}/0.1.0\n", False)
    os.chown(host / "0.1.0/bin/nvhook", 0, 0)
    (host / "0.1.0/bin/nvhook").write_text("#!/bin/sh\necho other\n")
    r = run_install_as_the_pod(install_script(image, host))
    assert (r.returncode, r.stderr.startswith(f"nvhook: {host}/0.1.0: differs from this image's 0.1.0"),
            os.path.lexists(host / "current")) == (1, True, False)
    (host / "0.1.0/bin/nvhook").write_text("#!/bin/sh\necho image\n")
    r = run_install_as_the_pod(install_script(image, host))
    assert (r.returncode, r.stderr, (host / "current").readlink().as_posix(), sorted(p.name for p in host.iterdir())) == (
        0, "", "0.1.0", ["0.1.0", "current"])
