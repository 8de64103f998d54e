"""hooks.d/*.json and `nvhook hooks print|install`: valid OCI hooks 1.0.0 configs."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from jsonschema import Draft7Validator

from libinject.runtime import hooksd as hookinstall
from libinject.errors import NvhookError
from conftest import NVHOOK, REPO, SPECS
from support import hookenv

SCHEMA = SPECS / "oci-hooks/hooks-1.0.0.schema.json"


def validate(doc) -> None:
    Draft7Validator(json.loads(SCHEMA.read_text())).validate(doc)


@pytest.mark.parametrize("variant", sorted(hookinstall.FILES))
def test_repo_files_valid_and_in_sync(variant):
    path = REPO / "hooks.d" / hookinstall.FILES[variant]
    doc = json.loads(path.read_text())
    validate(doc)
    assert path.read_text() == hookinstall.dumps(hookinstall.render(variant))
    assert doc["stages"] == ["prestart"] and doc["hook"]["args"][-1] == "prestart"


def test_variants():
    assert hookinstall.render("always")["when"] == {"always": True}
    ann = hookinstall.render("annotation")["when"]["annotations"]
    import re
    (k, v), = ann.items()
    assert re.search(k, "cdi.k8s.io/gpus") and re.search(v, "nvidia.com/gpu=1")
    assert not re.search(k, "io.kubernetes.cri-o.Devices")
    doc = hookinstall.render("always", "/opt/h", "/etc/x.toml")
    assert doc["hook"]["path"] == "/opt/h"
    assert doc["hook"]["args"] == ["nvhook-hook", "--config", "/etc/x.toml", "prestart"]
    validate(doc)
    with pytest.raises(NvhookError, match="unknown hooks.d variant"):
        hookinstall.render("sometimes")
    with pytest.raises(NvhookError, match="absolute"):
        hookinstall.render("always", "relative/hook")


def test_install(tmp_path):
    front = hookenv.ensure_front()
    d = tmp_path / "hooks.d"
    a = hookinstall.install(str(d), "always", front)
    assert json.loads(a.read_text())["hook"]["path"] == front
    b = hookinstall.install(str(d), "annotation", front, "/c.toml")
    assert sorted(p.name for p in d.iterdir()) == [hookinstall.FILES["annotation"]]  # one at a time
    validate(json.loads(b.read_text()))
    with pytest.raises(NvhookError, match="not an executable"):
        hookinstall.install(str(d), "always", str(tmp_path / "missing"))
    assert sorted(p.name for p in d.iterdir()) == [hookinstall.FILES["annotation"]]


def test_cli(tmp_path):
    hookenv.ensure_front()
    r = subprocess.run([NVHOOK, "hooks", "print"], capture_output=True, text=True, check=True, timeout=60)
    doc = json.loads(r.stdout)
    validate(doc)
    assert doc["hook"]["path"] == str(hookenv.FRONT)
    r = subprocess.run([NVHOOK, "--config", "/x.toml", "hooks", "install", "--annotation", "--dir",
                        str(tmp_path)], capture_output=True, text=True, check=True, timeout=60)
    written = Path(r.stdout.strip())
    assert written.parent == tmp_path
    assert json.loads(written.read_text())["hook"]["args"] == ["nvhook-hook", "--config", "/x.toml", "prestart"]
    r = subprocess.run([NVHOOK, "hooks", "install", "--dir", str(tmp_path), "--hook-path", "/nope"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.startswith("nvhook: hook /nope is not an executable")
