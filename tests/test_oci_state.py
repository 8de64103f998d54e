"""The hook's state parser: every runtime's variant accepted, malformed input rejected."""
from __future__ import annotations

import io
import json
import os

import pytest
from jsonschema import Draft4Validator
from referencing import Registry
from referencing.jsonschema import DRAFT4

from libinject.request import oci_state
from libinject.errors import NvhookError

from conftest import SPECS as _ALL_SPECS

SPECS = _ALL_SPECS / "oci"

B = "/run/containerd/bundle"
# RUNTIMES.md, "Hook state on stdin, by runtime"
VARIANTS = {
    "runc-prestart": {"ociVersion": "1.0.2-dev", "id": "c1", "status": "creating", "pid": 4242,
                      "bundle": B, "annotations": {"a": "b"}},
    "runc-createContainer": {"ociVersion": "1.0.2-dev", "id": "c1", "status": "creating", "pid": 1, "bundle": B},
    "runc-startContainer": {"ociVersion": "1.0.2-dev", "id": "c1", "status": "created", "pid": 1, "bundle": B},
    "runc-poststart": {"ociVersion": "1.0.2-dev", "id": "c1", "status": "created", "pid": 4242, "bundle": B},
    "runc-poststop": {"ociVersion": "1.0.2-dev", "id": "c1", "status": "stopped", "bundle": B},
    "crun-prestart": {"ociVersion": "1.0", "id": "c2", "status": "created", "pid": 77, "bundle": B,
                      "root": B + "/rootfs", "annotations": {}},
    "crun-createContainer": {"ociVersion": "1.0", "id": "c2", "status": "created", "pid": 0, "bundle": B,
                             "root": B + "/rootfs"},
    "crun-startContainer": {"ociVersion": "1.0", "id": "c2", "status": "starting", "pid": 0, "bundle": "/",
                            "root": "/"},
    "crun-poststart": {"ociVersion": "1.0", "id": "c2", "status": "running", "pid": 77, "bundle": B},
    "crun-poststop": {"ociVersion": "1.0", "id": "c2", "status": "stopped", "pid": 0, "bundle": B},
}


def _validator() -> Draft4Validator:
    schema = json.loads((SPECS / "state-schema.json").read_text())
    defs = DRAFT4.create_resource(json.loads((SPECS / "defs.json").read_text()))
    return Draft4Validator(schema, registry=Registry().with_resource("defs.json", defs))


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variants_accepted(name):
    raw = VARIANTS[name]
    st = oci_state.parse_state(json.dumps(raw).encode())
    assert st.id == raw["id"] and st.bundle == raw["bundle"] and st.status == raw["status"]
    assert st.pid == raw.get("pid", 0)
    assert st.oci_version == raw["ociVersion"]
    assert st.root == raw.get("root")
    errors = list(_validator().iter_errors(raw))
    if raw["status"] == "starting":
        # crun's startContainer status is outside the spec's enum; we take it anyway
        assert [e.validator for e in errors] == ["enum"]
    else:
        assert errors == []


def test_old_runc_bundlepath():
    st = oci_state.parse_state(b'{"ociVersion":"1.0.0","id":"x","status":"running","pid":3,"bundlePath":"/b"}')
    assert st.bundle == "/b"


@pytest.mark.parametrize("data, msg", [
    (b"", "no container state"),
    (b"  \n", "no container state"),
    (b"{", "not valid JSON"),
    (b"\xff\xfe", "not valid JSON"),
    (b"[1,2]", "not a JSON object"),
    (b'"s"', "not a JSON object"),
    (b'{"id":"x","status":"creating","bundle":"/b"}', "ociVersion missing"),
    (b'{"ociVersion":"1.0","status":"creating","bundle":"/b"}', "id missing"),
    (b'{"ociVersion":"1.0","id":"x","bundle":"/b"}', "status missing"),
    (b'{"ociVersion":"1.0","id":"x","status":"creating"}', "bundle missing"),
    (b'{"ociVersion":"1.0","id":"x","status":"creating","bundle":""}', "bundle missing"),
    (b'{"ociVersion":"1.0","id":"x","status":"creating","bundle":7}', "bundle missing"),
    (b'{"ociVersion":1,"id":"x","status":"creating","bundle":"/b"}', "ociVersion not a string"),
    (b'{"ociVersion":"1.0","id":"x","status":"exploded","bundle":"/b"}', "unknown status"),
    (b'{"ociVersion":"1.0","id":"x","status":"creating","bundle":"/b","pid":-1}', "pid is not"),
    (b'{"ociVersion":"1.0","id":"x","status":"creating","bundle":"/b","pid":"12"}', "pid is not"),
    (b'{"ociVersion":"1.0","id":"x","status":"creating","bundle":"/b","pid":true}', "pid is not"),
    (b'{"ociVersion":"1.0","id":"x","status":"creating","bundle":"/b","pid":1.5}', "pid is not"),
    (b'{"ociVersion":"1.0","id":"x","status":"creating","bundle":"/b","annotations":[]}', "annotations"),
    (b'{"ociVersion":"1.0","id":"x","status":"creating","bundle":"/b","annotations":{"a":1}}', "annotations"),
    (b'{"ociVersion":"1.0","id":"x","status":"creating","bundle":"/b","root":3}', "root"),
])
def test_malformed_rejected(data, msg):
    with pytest.raises(NvhookError, match=msg):
        oci_state.parse_state(data)


def test_size_bound():
    ok = json.dumps(VARIANTS["runc-prestart"]).encode()
    assert oci_state.read_state(io.BytesIO(ok)).pid == 4242
    padded = ok[:-1] + b',"annotations":{"x":"' + b"y" * oci_state.MAX_STATE_BYTES + b'"}}'
    with pytest.raises(NvhookError, match="larger than"):
        oci_state.read_state(io.BytesIO(padded))


def test_bundle_dir(tmp_path):
    st = oci_state.parse_state(b'{"ociVersion":"1.0","id":"x","status":"created","bundle":"b/../c"}')
    assert oci_state.bundle_dir(st, "/run/x") == "/run/x/c"
    with pytest.raises(NvhookError, match="relative"):
        oci_state.bundle_dir(st, None)
    st = oci_state.parse_state(b'{"ociVersion":"1.0","id":"x","status":"created","bundle":"/b/./c/"}')
    assert oci_state.bundle_dir(st, None) == "/b/c"


def _bundle(tmp_path, spec) -> str:
    (tmp_path / "config.json").write_text(spec if isinstance(spec, str) else json.dumps(spec))
    return str(tmp_path)


def test_load_config_and_rootfs(tmp_path):
    spec = {"ociVersion": "1.0.2", "process": {"env": []}, "root": {"path": "rootfs"}}
    b = _bundle(tmp_path, spec)
    loaded = oci_state.load_config(b)
    assert loaded == spec
    assert oci_state.rootfs_path(loaded, b) == f"{tmp_path}/rootfs"
    loaded["root"]["path"] = "/abs/rootfs/"
    assert oci_state.rootfs_path(loaded, b) == "/abs/rootfs"


@pytest.mark.parametrize("spec, msg", [
    ("{", "not valid JSON"),
    ("[]", "not a JSON object"),
    ({"process": {}, "root": {"path": "r"}}, "ociVersion missing"),
    ({"ociVersion": "1", "root": {"path": "r"}}, "process missing"),
    ({"ociVersion": "1", "process": {}}, "root.path missing"),
    ({"ociVersion": "1", "process": {}, "root": {"path": ""}}, "root.path missing"),
])
def test_load_config_rejects(tmp_path, spec, msg):
    with pytest.raises(NvhookError, match=msg):
        oci_state.load_config(_bundle(tmp_path, spec))


def test_load_config_missing_or_big(tmp_path):
    with pytest.raises(NvhookError, match="cannot read OCI spec .*config.json: No such file"):
        oci_state.load_config(str(tmp_path / "none"))
    big = '{"ociVersion":"1","process":{},"root":{"path":"r"},"x":"' + "a" * oci_state.MAX_CONFIG_BYTES + '"}'
    with pytest.raises(NvhookError, match="larger than"):
        oci_state.load_config(_bundle(tmp_path, big))


def test_container_pid():
    st = oci_state.parse_state(json.dumps(VARIANTS["runc-prestart"]).encode())
    assert oci_state.container_pid(st, "prestart") == 4242
    st0 = oci_state.parse_state(json.dumps(VARIANTS["crun-createContainer"]).encode())
    with pytest.raises(NvhookError, match="no pid"):
        oci_state.container_pid(st0, "prestart")
    # createContainer runs in the container's namespaces: its own pid as /proc counts it
    assert oci_state.container_pid(st0, "createContainer") == os.getpid()
