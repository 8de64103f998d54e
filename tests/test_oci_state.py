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


def _outcome(fn, *args) -> str:
    try:
        fn(*args)
    except NvhookError as e:
        return str(e)
    return "ok"


def _spec_variants() -> list[dict]:
    """A runc spec, and copies with one field of SPEC_FIELDS of another JSON type each."""
    import copy
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        subprocess.run(["runc", "spec", "--bundle", d], check=True)
        base = json.loads(open(os.path.join(d, "config.json")).read())
    base["hooks"] = {"prestart": [{"path": "/x", "args": ["a"]}]}
    base["annotations"] = {"k": "v"}
    out = [base]
    others = [None, 1, "s", [], ["s"], [1], {}, {"a": 1}, [{}], True]
    for path, _ in oci_state.SPEC_FIELDS:
        head, sep, tail = path.partition("[].")
        for v in others:
            spec = copy.deepcopy(base)
            items = [spec]
            if sep:
                items = [x for x in (oci_state._walk(spec, tuple(head.split(".")))[1] or []) if isinstance(x, dict)]
                path = tail
            for item in items[:1]:
                *parents, last = path.split(".")
                cur = item
                for k in parents:
                    cur = cur.setdefault(k, {}) if isinstance(cur, dict) else None
                    if not isinstance(cur, dict):
                        break
                else:
                    cur[last] = v
                    out.append(spec)
    return out


def test_fast_spec_check_agrees_with_the_full_one(monkeypatch):
    """check_spec's fast path (_spec_ok) passes exactly the specs the field-by-field walk
    passes; a spec it does not pass gets the walk's own message."""
    variants = _spec_variants()
    assert len(variants) > 200
    fast = [_outcome(oci_state.check_spec, s) for s in variants]
    monkeypatch.setattr(oci_state, "_spec_ok", lambda spec: False)
    slow = [_outcome(oci_state.check_spec, s) for s in variants]
    assert fast == slow
    assert fast.count("ok") < len(fast) and fast[0] == "ok"


@pytest.mark.parametrize("data", [
    b'{"a": "x\\u0000y"}', b'{"a\\u0000": 1}', b'{"a": ["\\ud800"]}', b'{"k": "\\u00e9"}',
    b'{"a": ' + b"[" * 70 + b"]" * 70 + b"}", b'{"a": ' + b"[" * 60 + b"]" * 60 + b"}",
    b'{"a": "' + b"[" * 100 + b'"}', "{\"a\": \"\udc80\"}", "{\"a\": \"x\\u0000\"}",
    b'["' + "é".encode() + b'"]', b'"top"', b"1",
])
def test_fast_json_checks_agree_with_the_tree_walk(data):
    """loads_json skips the string checks for UTF-8 bytes without a \\u escape (they
    cannot hold a NUL or a lone surrogate there) and the depth walk when there are not
    enough brackets to nest that deep: same outcome as walking the whole tree."""
    fast = _outcome(oci_state.loads_json, data, "x")
    obj = json.loads(data)
    assert fast == _outcome(oci_state._check_tree, obj, "x")
