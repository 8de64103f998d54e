"""libinject.jsonc gives what json gives, for what the hook reads and writes, without
importing json (or re and enum, which json.decoder drags in)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from libinject import jsonc

REPO = Path(__file__).resolve().parent.parent

GOOD = [
    '{"ociVersion": "1.0.2-dev", "id": "c1", "status": "creating", "pid": 4242, "bundle": "/b"}',
    '  {"a": [1, 2.5, -3e10, true, false, null, "x\\u00e9\\ud83d\\ude00\\n\\t\\"\\\\"], "b": {}} \n',
    '"just a string"', "0", "-0.0", "1e400", "[NaN, Infinity, -Infinity]", '{"a": 1, "a": 2}',
    "123456789012345678901234567890", '"\\ud800"', "[]", "[[[[[[[[]]]]]]]]", '{"é": "ü"}',
]
BAD = ["", " ", "[1,]", '{"a"}', "[1] x", "\ufeff[1]", "[", '{"a": 1', "tru", '"\x01"',
       "{'a': 1}", "[01]", '{"a": 1,}', "// x\n1", "1 2"]


@pytest.mark.parametrize("text", GOOD)
def test_loads_and_dumps_match_json(text):
    want = json.loads(text)
    got = jsonc.loads(text)
    assert repr(got) == repr(want)
    assert repr(jsonc.loads(text.encode())) == repr(want)
    assert jsonc.dumps(want) == json.dumps(want)
    assert jsonc.dumps(want, compact=True) == json.dumps(want, separators=(",", ":"))


@pytest.mark.parametrize("text", BAD)
def test_what_json_refuses_is_a_value_error(text):
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        jsonc.loads(text)


def test_bytes_must_be_utf8():
    with pytest.raises(ValueError):
        jsonc.loads(b'"\xff"')


def test_dumps_refuses_what_json_refuses():
    with pytest.raises(TypeError, match="not JSON serializable"):
        jsonc.dumps({"a": object()})
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular"):
        jsonc.dumps(loop)


def test_imports_neither_json_nor_re():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from libinject import jsonc; "
            "jsonc.dumps(jsonc.loads('{\"a\": [1]}')); "
            "print(sorted(m for m in ('json', 're', 'enum', 'typing') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(REPO)], capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"
