"""Is nvhook's DaemonSet leaving this node for good? The question its pod's preStop asks
before undoing the node's set-up (`nvhook setup k8s-removed`).

Kubernetes runs preStop on every termination: a rolling update, an eviction, a drain,
`kubectl delete pod`, as well as the DaemonSet's removal. Only two of those mean "no
nvhook here any more": the DaemonSet is gone (or being deleted), or it no longer selects
this node (the node lost the label, or the DaemonSet's nodeSelector changed). Anything
else is followed by a new pod of the same DaemonSet, and undoing in between would leave
the node without GPU containers during an upgrade. So the pod reads two objects from
the API server -- its DaemonSet, and its node -- and undoes only when one of those two
holds. When the answer cannot be had (API server unreachable, no permission), the
set-up stays: a node that keeps working is the safe side (NVIDIA's toolkit container
undoes on every exit instead).

decide() is pure; fetch() is the only I/O (HTTPS with the pod's service-account token
and the cluster's CA, every read bounded).
"""
from __future__ import annotations

import json
import os

from libinject.errors import NvhookError

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TIMEOUT = 10.0
MAX_BODY = 4 << 20


def decide(daemonset: dict | None, node: dict | None, where: str, node_name: str) -> tuple[bool, str]:
    """(undo the set-up?, why). daemonset/node: the API objects, None when the API
    server says they do not exist; where: NAMESPACE/NAME of the DaemonSet."""
    if daemonset is None:
        return True, f"DaemonSet {where} is gone"
    meta = daemonset.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return True, f"DaemonSet {where} is being deleted"
    if node is None:
        return False, f"node {node_name} is gone: nothing of it to restore"
    spec = ((daemonset.get("spec") or {}).get("template") or {}).get("spec") or {}
    selector = spec.get("nodeSelector") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    if not isinstance(selector, dict) or not isinstance(labels, dict):
        raise NvhookError(f"DaemonSet {where} or node {node_name}: not the objects the API server sends")
    missing = [f"{k}={v}" for k, v in sorted(selector.items()) if labels.get(k) != v]
    if missing:
        return True, f"DaemonSet {where} no longer selects node {node_name} (it lacks {', '.join(missing)})"
    return False, (f"DaemonSet {where} still selects node {node_name}: an update, eviction or pod "
                   "deletion, a new pod follows; the set-up stays")


class Api:
    """GET requests to the API server with a bearer token."""

    def __init__(self, server: str, token_file: str, ca_file: str | None) -> None:
        self.server = server.rstrip("/")
        try:
            with open(token_file, encoding="utf-8") as f:
                self.token = f.read(MAX_BODY).strip()
        except OSError as e:
            raise NvhookError(f"{token_file}: {e.strerror} (the pod's service-account token)") from None
        if not self.token:
            raise NvhookError(f"{token_file}: empty (the pod's service-account token)")
        self.ca_file = ca_file

    def get(self, path: str) -> dict | None:
        """The object at path, None for 404."""
        import ssl
        import urllib.error
        import urllib.request

        url = self.server + path
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.token}",
                                                   "Accept": "application/json"})
        ctx = None
        if url.startswith("https:"):
            try:
                ctx = ssl.create_default_context(cafile=self.ca_file)
            except (OSError, ssl.SSLError) as e:
                raise NvhookError(f"{self.ca_file}: {getattr(e, 'strerror', None) or e} (the cluster's CA)") from None
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT, context=ctx) as r:
                body = r.read(MAX_BODY + 1)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise NvhookError(f"GET {url}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise NvhookError(f"GET {url}: {getattr(e, 'reason', None) or e}") from None
        if len(body) > MAX_BODY:
            raise NvhookError(f"GET {url}: answer larger than {MAX_BODY} bytes")
        try:
            obj = json.loads(body)
        except ValueError:
            raise NvhookError(f"GET {url}: not JSON") from None
        if not isinstance(obj, dict):
            raise NvhookError(f"GET {url}: not a JSON object")
        return obj


def default_server() -> str:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST", ""), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise NvhookError("no API server: KUBERNETES_SERVICE_HOST is not set (name one with --api-server)")
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def removed(daemonset: str, node_name: str, *, server: str | None = None, token_file: str | None = None,
            ca_file: str | None = None) -> tuple[bool, str]:
    """Ask the API server about DaemonSet NAMESPACE/NAME and node node_name: decide()'s answer."""
    ns, slash, name = daemonset.partition("/")
    if not slash or not ns or not name or "/" in name:
        raise NvhookError(f"--daemonset {daemonset!r}: give it as NAMESPACE/NAME")
    if not node_name or "/" in node_name:
        raise NvhookError(f"--node {node_name!r}: not a node name")
    api = Api(server or default_server(), token_file or os.path.join(SA_DIR, "token"),
              ca_file or os.path.join(SA_DIR, "ca.crt"))
    ds = api.get(f"/apis/apps/v1/namespaces/{ns}/daemonsets/{name}")
    node = api.get(f"/api/v1/nodes/{node_name}")
    return decide(ds, node, daemonset, node_name)


