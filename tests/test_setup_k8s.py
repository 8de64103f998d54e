"""`nvhook setup k8s-removed`: the DaemonSet pod's preStop undoes the node's set-up only
when the DaemonSet is gone (or being deleted) or no longer selects the node; a rolling
update, an eviction or a pod deletion keep it (exit 3). Against a local HTTP server
answering as the API server does (the objects, 404 for a missing one, the bearer token
checked); the decision itself over a table."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from libinject.setup.k8s import decide
from support.cli import nvhook_in_process as nvhook

DS_PATH = "/apis/apps/v1/namespaces/nvhook-system/daemonsets/nvhook"
NODE_PATH = "/api/v1/nodes/gpu-1"
SELECTOR = {"nvidia.com/gpu.present": "true"}


def ds(deleting: bool = False, selector: dict | None = None) -> dict:
    meta = {"name": "nvhook", "namespace": "nvhook-system"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"kind": "DaemonSet", "metadata": meta,
            "spec": {"template": {"spec": {"nodeSelector": SELECTOR if selector is None else selector}}}}


def node(labels: dict) -> dict:
    return {"kind": "Node", "metadata": {"name": "gpu-1", "labels": labels}}


LABELLED = node({"kubernetes.io/hostname": "gpu-1", **SELECTOR})

TABLE = {
    "rolling update / eviction": (ds(), LABELLED, False, "still selects node gpu-1"),
    "daemonset deleted": (None, LABELLED, True, "is gone"),
    "daemonset being deleted (foreground)": (ds(deleting=True), LABELLED, True, "is being deleted"),
    "node unlabelled": (ds(), node({"kubernetes.io/hostname": "gpu-1"}), True,
                        "no longer selects node gpu-1 (it lacks nvidia.com/gpu.present=true)"),
    "label changed value": (ds(), node({"nvidia.com/gpu.present": "false"}), True, "no longer selects"),
    "selector changed": (ds(selector={"pool": "a100"}), LABELLED, True, "it lacks pool=a100"),
    "node gone": (ds(), None, False, "node gpu-1 is gone"),
}


@pytest.mark.parametrize("case", list(TABLE))
def test_decision(case):
    d, n, undo, why = TABLE[case]
    got = decide(d, n, "nvhook-system/nvhook", "gpu-1")
    assert got[0] is undo and why in got[1], got


class Api:
    """objects: path -> JSON object (absent: 404; an int: that HTTP status)."""

    def __init__(self, objects: dict, token: str = "tok") -> None:
        api = self
        self.objects, self.token, self.seen = objects, token, []

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                api.seen.append((self.path, self.headers.get("Authorization")))
                if self.headers.get("Authorization") != f"Bearer {api.token}":
                    return self._send(401, {"kind": "Status", "code": 401})
                obj = api.objects.get(self.path)
                if obj is None:
                    return self._send(404, {"kind": "Status", "code": 404})
                if isinstance(obj, int):
                    return self._send(obj, {"kind": "Status", "code": obj})
                return self._send(200, obj)

            def _send(self, code, obj):
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def api_server():
    made = []

    def make(objects: dict, token: str = "tok") -> Api:
        made.append(Api(objects, token))
        return made[-1]
    yield make
    for a in made:
        a.close()


def _run(capsys, tmp_path, api: Api, token: str = "tok"):
    tf = tmp_path / "token"
    tf.write_text(token + "\n")
    return nvhook(capsys, "setup", "k8s-removed", "--daemonset", "nvhook-system/nvhook", "--node", "gpu-1",
                  "--api-server", api.url, "--token-file", str(tf))


def test_an_update_keeps_the_setup(tmp_path, capsys, api_server):
    api = api_server({DS_PATH: ds(), NODE_PATH: LABELLED})
    code, out, err = _run(capsys, tmp_path, api)
    assert (code, out.startswith("keep the set-up: DaemonSet nvhook-system/nvhook still selects node gpu-1")) == (3, True), out + err
    assert api.seen == [(DS_PATH, "Bearer tok"), (NODE_PATH, "Bearer tok")]


def test_a_deleted_daemonset_undoes(tmp_path, capsys, api_server):
    code, out, err = _run(capsys, tmp_path, api_server({NODE_PATH: LABELLED}))
    assert (code, out) == (0, "undo the set-up: DaemonSet nvhook-system/nvhook is gone\n"), err


def test_an_unlabelled_node_undoes(tmp_path, capsys, api_server):
    code, out, err = _run(capsys, tmp_path, api_server({DS_PATH: ds(), NODE_PATH: node({})}))
    assert (code, "no longer selects node gpu-1" in out) == (0, True), out + err


@pytest.mark.parametrize("objects,token,says", [
    ({DS_PATH: 403, NODE_PATH: LABELLED}, "tok", "HTTP 403"),
    ({DS_PATH: ds(), NODE_PATH: LABELLED}, "wrong", "HTTP 401"),
])
def test_no_answer_keeps_the_setup_with_one_line(tmp_path, capsys, api_server, objects, token, says):
    code, out, err = _run(capsys, tmp_path, api_server(objects), token)
    assert (code, out, err.count("\n"), err.startswith("nvhook: GET "), says in err) == (1, "", 1, True, True), err


def test_unreachable_api_server_is_one_line(tmp_path, capsys):
    tf = tmp_path / "token"
    tf.write_text("tok")
    code, out, err = nvhook(capsys, "setup", "k8s-removed", "--daemonset", "nvhook-system/nvhook", "--node", "gpu-1",
                            "--api-server", "http://127.0.0.1:9", "--token-file", str(tf))
    assert (code, out, err.count("\n"), err.startswith("nvhook: GET http://127.0.0.1:9/apis/apps/v1/")) == (1, "", 1, True), err


@pytest.mark.parametrize("args,says", [
    (["--daemonset", "nvhook", "--node", "gpu-1"], "give it as NAMESPACE/NAME"),
    (["--daemonset", "a/b", "--node", "gpu-1", "--token-file", "/nonexistent/token"], "/nonexistent/token: No such file"),
])
def test_bad_arguments_are_one_line(capsys, args, says):
    code, out, err = nvhook(capsys, "setup", "k8s-removed", "--api-server", "http://127.0.0.1:9", *args)
    assert (code, err.count("\n"), says in err, err.startswith("nvhook: ")) == (1, 1, True, True), err
