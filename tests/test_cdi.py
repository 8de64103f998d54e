"""CDI: generate (per simulated profile), validate, list, the cdi-hook commands and the
OCI-spec applier. Containers under real runtimes are in test_cdi_podman.py,
test_shim.py and test_equivalence.py."""
from __future__ import annotations

import copy
import datetime
import json
import os
import stat
from pathlib import Path

import pytest
import yaml

from conftest import NVHOOK, REPO, SPECS, run

SHARED_CDI = SPECS / "cdi"
PROFILES = ["a100x8", "h100x8-mig", "rtx4090x1", "t4x1"]


def official_validator():
    """The schema straight from ../shared/specs/cdi (not our packaged copy)."""
    from jsonschema import Draft7Validator
    from referencing import Registry
    from referencing.jsonschema import DRAFT7

    schema = json.loads((SHARED_CDI / "schema.json").read_text())
    defs = json.loads((SHARED_CDI / "defs.json").read_text())
    reg = Registry().with_resource("defs.json", DRAFT7.create_resource(defs))
    return Draft7Validator(schema, registry=reg)


def generate(host: Path, *extra: str, out: Path | None = None) -> dict:
    cmd = [NVHOOK, "cdi", "generate", "--driver-root", str(host), *extra]
    if out is not None:
        cmd += ["--output", str(out)]
    r = run(cmd)
    assert r.returncode == 0, r.stderr
    if out is None:
        return json.loads(r.stdout)
    return json.loads(out.read_text()) if out.suffix == ".json" else yaml.safe_load(out.read_text())


def driver_of(host: Path):
    from libinject.discover.driver import discover

    return discover(str(host), snapshot=False)


# --- generate ---------------------------------------------------------------------------

@pytest.mark.parametrize("profile", PROFILES)
def test_generated_spec_validates_for_every_profile(sim_host, tmp_path, profile):
    host = sim_host(profile)
    out = tmp_path / f"{profile}.yaml"
    spec = generate(host, "--device-name-strategy", "index,uuid,type-index", out=out)
    assert list(official_validator().iter_errors(spec)) == []
    r = run([NVHOOK, "cdi", "validate", str(out)])
    assert r.returncode == 0 and r.stdout.strip() == f"{out}: ok", r.stdout + r.stderr
    # Lowest version the content needs: digit device names and hostPath -> 0.5.0, the
    # most podman 4.3.1 reads.
    assert spec["cdiVersion"] == "0.5.0"
    driver = driver_of(host)
    names = [d["name"] for d in spec["devices"]]
    want = []
    for g in driver.info.gpus:     # a GPU in MIG mode is only its MIG devices (nvidia-ctk)
        want += [] if g.mig_enabled else [str(g.index), g.uuid, f"gpu{g.index}"]
    for g in driver.info.gpus:
        for m in g.mig_devices:
            want += [f"{g.index}:{m.index}", m.uuid, f"mig{g.index}:{m.index}"]
    assert names == want + ["all"]


@pytest.mark.parametrize("profile", PROFILES)
def test_none_and_mig_caps_validate_for_every_profile(sim_host, tmp_path, profile):
    """The driver-only device beside every other, and the MIG capability spec where the
    host is MIG capable (IMEX: test_cdi_devices.py, the simulator makes no channels)."""
    from libinject.apply import cdi_validate

    host = sim_host(profile)
    out = tmp_path / "nvidia.yaml"
    spec = generate(host, "--device-id", "all,none", out=out)
    assert [d["name"] for d in spec["devices"]][-2:] == ["all", "none"]
    assert list(official_validator().iter_errors(spec)) == [] and cdi_validate.validate_file(str(out)) == []
    r = run([NVHOOK, "cdi", "generate", "--driver-root", str(host), "--mode", "mig-caps"])
    if any(g.mig_capable for g in driver_of(host).info.gpus):
        assert r.returncode == 0, r.stderr
        caps = json.loads(r.stdout)
        assert [d["name"] for d in caps["devices"]] == ["config", "monitor", "all"]
        assert list(official_validator().iter_errors(caps)) == [] and cdi_validate.validate(caps) == []
    else:
        assert (r.returncode, r.stdout) == (1, "") and "not MIG capable" in r.stderr


def test_capabilities_all_puts_the_32_bit_libraries_in(sim_host):
    """The default spec leaves compat32 out (nvidia-ctk's has no 32-bit libraries);
    --capabilities all mounts them, links them and adds their folder to the ld cache."""
    host = sim_host("a100x8")
    default, full = generate(host), generate(host, "--capabilities", "all")
    i386 = "/usr/lib/i386-linux-gnu/"

    def flags(spec):
        [hook] = spec["containerEdits"]["hooks"]
        return list(zip(hook["args"][3::2], hook["args"][4::2]))

    ours = {m["containerPath"] for m in full["containerEdits"]["mounts"]}
    assert {m["containerPath"] for m in default["containerEdits"]["mounts"]} == {
        p for p in ours if not p.startswith(i386)}
    assert "/usr/lib/i386-linux-gnu/libcuda.so.550.163.01" in ours
    assert ("--folder", "/usr/lib/i386-linux-gnu") in flags(full)
    assert ("--link", "libcuda.so.550.163.01::/usr/lib/i386-linux-gnu/libcuda.so.1") in flags(full)
    assert not [v for _, v in flags(default) if i386 in v]


def test_spec_level_and_device_level_edits_come_from_the_plan(sim_host):
    from libinject.plan import planner as P
    from libinject.request.model import Request

    from libinject.apply.cdi import DEFAULT_CAPABILITIES

    host = sim_host("h100x8-mig")
    spec = generate(host)
    driver = driver_of(host)
    base = P.plan(Request(devices="none", capabilities=frozenset(DEFAULT_CAPABILITIES),
                          cuda_compat_mode="disabled"), driver)
    top = spec["containerEdits"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in top["env"]
    # every library/binary/firmware/ipc mount of the driver-only plan, in plan order
    # (not libnvidia-sandboxutils, which nvidia-ctk's spec has: README)
    assert [m["containerPath"] for m in top["mounts"]] == [
        m.container_path for m in base.mounts if not m.container_path.startswith("/proc/")]
    assert {(n["path"], n["major"], n["minor"]) for n in top["deviceNodes"]} == {
        (d.path, d.major, d.minor) for d in base.device_nodes}
    # one hook entry does every step (issue 24: one exec'd or served call, not three)
    [hook] = top["hooks"]
    assert hook["hookName"] == "createRuntime" and os.path.isabs(hook["path"])
    assert hook["env"] and all(e.startswith("PATH=") for e in hook["env"])
    args = hook["args"]
    assert args[1:3] == ["cdi-hook", "createRuntime"]
    flags = list(zip(args[3::2], args[4::2]))
    assert flags[0] == ("--procfs-dir", driver.procfs_dir)
    assert [v for f, v in flags if f == "--link"] == [f"{s.target}::{s.link}" for s in base.symlinks]
    # no 32-bit libraries by default, as nvidia-ctk's spec
    assert [v for f, v in flags if f == "--folder"] == ["/usr/lib/x86_64-linux-gnu"]
    assert not [m for m in top["mounts"] if "i386" in m["containerPath"]]
    # the image's CUDA forward compat against the driver's major (enable-cuda-compat)
    assert [v for f, v in flags if f == "--cuda-compat-driver-major"] == [driver.info.driver_version.split(".")[0]]
    # (the libraries the spec mounts are not listed again: the hook finds them as mounts)
    assert {f for f, _ in flags} == {"--procfs-dir", "--link", "--folder",
                                     "--cuda-compat-driver-major"}
    by_name = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    # a full GPU: its node only; a MIG device: parent node + gi/ci access caps; a GPU in
    # MIG mode is no device (nvidia-ctk)
    assert [n["path"] for n in by_name["4"]["deviceNodes"]] == ["/dev/nvidia4"]
    assert "1" not in by_name and driver.info.gpus[1].uuid not in by_name
    g0 = driver.info.gpus[0]
    m = g0.mig_devices[1]
    mig = by_name["0:1"]
    assert mig == by_name[m.uuid]
    assert [n["path"] for n in mig["deviceNodes"]] == [
        "/dev/nvidia0", f"/dev/nvidia-caps/nvidia-cap{m.gi_access_minor}",
        f"/dev/nvidia-caps/nvidia-cap{m.ci_access_minor}"]
    assert set(mig) == {"deviceNodes"}     # no /proc mounts: the mask-procfs hook does those
    # "all": every device's nodes, so a GPU in MIG mode with no MIG device (GPU 3) is not
    # in it, as in nvidia-ctk's
    allnodes = {n["path"] for n in by_name["all"]["deviceNodes"]}
    assert {f"/dev/nvidia{g.minor}" for g in driver.info.gpus if g.minor != 3} <= allnodes
    assert "/dev/nvidia3" not in allnodes and not driver.info.gpus[3].mig_devices


def test_strategies_and_kind(sim_host):
    host = sim_host("t4x1")
    spec = generate(host, "--vendor", "example.com", "--class", "acc",
                    "--device-name-strategy", "type-index")
    assert spec["kind"] == "example.com/acc"
    assert [d["name"] for d in spec["devices"]] == ["gpu0", "all"]
    # names starting with a letter and no hostPath would be 0.3.0; hostPath keeps 0.5.0
    assert spec["cdiVersion"] == "0.5.0"


def test_bad_options_fail_cleanly(sim_host, tmp_path):
    host = sim_host("t4x1")
    for extra in (["--device-name-strategy", "bogus"], ["--vendor=-bad"], ["--class", "a/b"],
                  ["--capabilities", "compute,warp"], ["--mode", "nope"], ["--device-id", "void"],
                  ["--mode", "imex"], ["--mode", "mig-caps"]):
        r = run([NVHOOK, "cdi", "generate", "--driver-root", str(host), "-o", str(tmp_path / "x.json"),
                 *extra])
        assert r.returncode == 1 and r.stderr.startswith("nvhook: "), (extra, r.stderr)
        assert r.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_output_is_atomic_and_json_or_yaml(sim_host, tmp_path):
    host = sim_host("t4x1")
    out = tmp_path / "nvidia.json"
    out.write_text("old")
    spec = generate(host, out=out)
    assert [p.name for p in tmp_path.iterdir()] == ["nvidia.json"]   # no temp file left
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    y = tmp_path / "nvidia.yaml"
    spec2 = generate(host, out=y)
    assert spec2 == spec and "&id" not in y.read_text()
    r = run([NVHOOK, "cdi", "generate", "--driver-root", str(host), "-o", str(tmp_path / "no/dir.json")])
    assert r.returncode == 1 and "does not exist" in r.stderr


def test_minimum_version_rules():
    from libinject.apply.cdi import minimum_version

    dev = {"name": "gpu0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}
    spec = {"cdiVersion": "0.3.0", "kind": "nvidia.com/gpu", "devices": [dev]}
    assert minimum_version(spec) == "0.3.0"
    s = copy.deepcopy(spec)
    s["containerEdits"] = {"mounts": [{"hostPath": "/a", "containerPath": "/a", "type": "bind"}]}
    assert minimum_version(s) == "0.4.0"
    s = copy.deepcopy(spec)
    s["devices"][0]["name"] = "0"
    assert minimum_version(s) == "0.5.0"
    s = copy.deepcopy(spec)
    s["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"] = "/x/dev/nvidia0"
    assert minimum_version(s) == "0.5.0"
    s = copy.deepcopy(spec)
    s["kind"] = "nvidia.com/gpu.x"
    assert minimum_version(s) == "0.6.0"
    s = copy.deepcopy(spec)
    s["devices"][0]["annotations"] = {"a": "b"}
    assert minimum_version(s) == "0.6.0"
    s = copy.deepcopy(spec)
    s["containerEdits"] = {"additionalGids": [5]}
    assert minimum_version(s) == "0.7.0"
    s = copy.deepcopy(spec)
    s["containerEdits"] = {"netDevices": [{"hostInterfaceName": "a", "name": "b"}]}
    assert minimum_version(s) == "1.1.0"


# --- validate ---------------------------------------------------------------------------

def test_packaged_schema_equals_shared_copy():
    pkg = REPO / "libinject" / "apply" / "cdi_schema"
    for name in ("schema.json", "defs.json"):
        assert (pkg / name).read_bytes() == (SHARED_CDI / name).read_bytes(), name
    from libinject.apply.cdi_validate import schema_files

    assert schema_files()["schema.json"] == json.loads((SHARED_CDI / "schema.json").read_text())


GOOD = {
    "cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
    "devices": [{"name": "0", "containerEdits": {"deviceNodes": [
        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 438}]}}],
    "containerEdits": {"env": ["A=1"], "hooks": [
        {"hookName": "createContainer", "path": "/bin/true", "env": ["PATH=/bin"]}]},
}


@pytest.mark.parametrize("mutate,expect", [
    (lambda s: s["devices"].append(copy.deepcopy(s["devices"][0])), "duplicate device name"),
    (lambda s: s["devices"][0].update(name="-x"), "should start with a letter or digit"),
    (lambda s: s["devices"][0].update(name="a/b"), "invalid character"),
    (lambda s: s.update(kind="nvidia.com"), "expected vendor/class"),
    (lambda s: s.update(kind="nvidia.com/gp u"), "invalid character"),
    (lambda s: s.update(cdiVersion="0.4.0"), "too low for this content (needs at least 0.5.0)"),
    (lambda s: s.update(cdiVersion="0.9.0"), "unknown version"),
    (lambda s: s["containerEdits"]["hooks"][0].update(hookName="preStart"), "invalid hook name"),
    (lambda s: s["containerEdits"]["hooks"][0].update(path="true"), "not absolute"),
    (lambda s: s["containerEdits"]["hooks"][0].update(env=["NOEQUALS"]), "invalid environment"),
    (lambda s: s["containerEdits"].update(env=["=x"]), "invalid environment"),
    (lambda s: s["containerEdits"].update(env=[3]), "invalid environment"),
    (lambda s: s["containerEdits"].update(bogus=1), "unknown field 'bogus'"),
    (lambda s: s["devices"][0]["containerEdits"]["deviceNodes"][0].update(fileMode="rw"), "fileMode"),
    (lambda s: s["devices"][0]["containerEdits"]["deviceNodes"][0].update(type="x"), "invalid device type"),
    (lambda s: s["devices"][0]["containerEdits"]["deviceNodes"][0].update(permissions="rx"),
     "invalid permissions"),
    (lambda s: s["devices"][0].update(containerEdits={}), "empty device edits"),
    (lambda s: s.update(devices=[]), "at least one device"),
    (lambda s: s.pop("kind"), "'kind' is a required property"),
    (lambda s: s["devices"][0]["containerEdits"]["deviceNodes"][0].update(major="195"),
     "is not of type 'integer'"),
])
def test_validate_rejects(tmp_path, mutate, expect):
    from libinject.apply.cdi_validate import validate

    assert validate(GOOD) == []
    spec = copy.deepcopy(GOOD)
    mutate(spec)
    problems = validate(spec)
    assert any(expect in p for p in problems), problems
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(spec))
    r = run([NVHOOK, "cdi", "validate", str(f)])
    assert r.returncode == 1 and expect in r.stdout


def test_validate_unparsable_and_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cdiVersion: [unclosed\n")
    ok = tmp_path / "ok.yaml"
    ok.write_text(yaml.safe_dump(GOOD))
    r = run([NVHOOK, "cdi", "validate", str(ok), str(bad)])
    assert r.returncode == 1
    assert f"{ok}: ok" in r.stdout and f"{bad}: CDI spec {bad} does not parse" in r.stdout


# Every field the CDI schema knows (and fileMode, which it misses), once each.
_EDITS = {
    "env": ["A=1"],
    "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0", "type": "c", "major": 195,
                     "minor": 0, "fileMode": 438, "permissions": "rw", "uid": 0, "gid": 0}],
    "mounts": [{"hostPath": "/a", "containerPath": "/b", "type": "bind", "options": ["ro"]}],
    "hooks": [{"hookName": "createContainer", "path": "/bin/true", "args": ["true"], "env": ["P=1"],
               "timeout": 5}],
    "intelRdt": {"closID": "c", "l3CacheSchema": "L3:0=f", "memBwSchema": "MB:0=100",
                 "schemata": ["x"], "enableMonitoring": True},
    "additionalGids": [5],
    "netDevices": [{"hostInterfaceName": "eth0", "name": "eth1"}],
}
FULL = {"cdiVersion": "1.1.0", "kind": "nvidia.com/gpu", "annotations": {"a": "b"},
        "devices": [{"name": "0", "annotations": {"c": "d"}, "containerEdits": copy.deepcopy(_EDITS)}],
        "containerEdits": _EDITS}
# A value of each type a JSON or YAML spec can hold (YAML: dates, bytes); not null,
# which the Go loader takes as absent where the schema does not say.
WRONG = [1.5, True, 7, "x", [], [1.5], {"k": "v"}, datetime.date(2020, 1, 1), b"x"]


def _fields(obj, path=()):
    """(path, value) of every field and list item under obj."""
    for k, v in obj.items() if isinstance(obj, dict) else enumerate(obj):
        yield (*path, k), v
        if isinstance(v, (dict, list)):
            yield from _fields(v, (*path, k))


def _schema_fields() -> set[str]:
    from libinject.apply.cdi_validate import schema_files

    names: set[str] = set()
    todo = list(schema_files().values())
    while todo:
        o = todo.pop()
        if isinstance(o, dict):
            names |= set(o.get("properties", {}))
            todo += o.values()
        elif isinstance(o, list):
            todo += o
    return names


def _wrong_type(value, other) -> bool:
    same = {bool: (bool,), int: (int,), float: (float, int), str: (str,), list: (list,), dict: (dict,)}
    return not isinstance(other, same[type(value)]) or isinstance(other, bool) != isinstance(value, bool)


def test_validate_every_wrongly_typed_field_is_one_problem_naming_it():
    """Each field of the schema given each wrong type: one problem, naming the field,
    never an exception (was: TypeError from a check that iterated a non-list)."""
    from libinject.apply.cdi_validate import validate

    assert validate(FULL) == []
    fields = list(_fields(FULL))
    names = {p[-1] for p, _ in fields if isinstance(p[-1], str) and p[-2:-1] != ("annotations",)}
    assert names == _schema_fields() | {"fileMode"}
    tried = 0
    for path, value in fields:
        for w in WRONG:
            if not _wrong_type(value, w):
                continue
            spec = copy.deepcopy(FULL)
            at = spec
            for k in path[:-1]:
                at = at[k]
            at[path[-1]] = w
            problems = validate(spec)
            where = "/".join(map(str, path))
            parent = "/".join(map(str, path[:-1]))
            assert len(problems) == 1 and (where in problems[0] or (
                f"{parent}:" in problems[0] and str(path[-1]) in problems[0])), (where, w, problems)
            tried += 1
    assert tried > 400


def test_validate_annotation_keys_that_are_not_strings():
    """YAML allows them; the schema's patternProperties raised TypeError on them."""
    from libinject.apply.cdi_validate import validate

    spec = copy.deepcopy(FULL)
    spec["devices"][0]["annotations"] = {1: "x"}
    assert validate(spec) == ["devices/0/annotations: key 1 is not a string"]


@pytest.mark.parametrize("edits,where,problem", [
    ("deviceNodes: 1.5", "deviceNodes", "1.5 is not of type 'array'"),
    ("hooks: true", "hooks", "True is not of type 'array'"),
    ("mounts: 7", "mounts", "7 is not of type 'array'"),
    ("netDevices: x", "netDevices", "'x' is not of type 'array'"),
    ("env: 2020-01-01", "env", "datetime.date(2020, 1, 1) is not of type 'array'"),
])
def test_validate_and_list_name_a_wrongly_typed_field(tmp_path, edits, where, problem):
    """`cdi validate`: one problem line naming file and field, exit 1; `cdi list`: one
    `nvhook: ` line naming them, exit 1 (both were `internal error: TypeError`)."""
    d = tmp_path / "cdi"
    d.mkdir()
    f = d / "bad.yaml"
    f.write_text('cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\ndevices:\n- name: "0"\n'
                 f'  containerEdits:\n    {edits}\n')
    line = f"{f}: schema: devices/0/containerEdits/{where}: {problem}"
    r = run([NVHOOK, "cdi", "validate", str(f)])
    assert (r.returncode, r.stdout, r.stderr) == (1, line + "\n", "")
    r = run([NVHOOK, "cdi", "list", "--spec-dir", str(d)])
    assert (r.returncode, r.stdout, r.stderr) == (1, "", f"nvhook: {line}\n")


# --- list -------------------------------------------------------------------------------

def _spec(kind: str, *names: str) -> dict:
    return {"cdiVersion": "0.5.0", "kind": kind,
            "devices": [{"name": n, "containerEdits": {"env": [f"DEV={n}"]}} for n in names]}


def test_list_priorities_and_conflicts(tmp_path):
    d1, d2 = tmp_path / "etc", tmp_path / "run"
    d1.mkdir()
    d2.mkdir()
    (d1 / "a.json").write_text(json.dumps(_spec("nvidia.com/gpu", "0", "1")))
    (d1 / "b.yaml").write_text(yaml.safe_dump(_spec("nvidia.com/gpu", "1", "2")))   # 1: conflict
    (d1 / "c.json").write_text(json.dumps(_spec("vendor.com/net", "eth0")))
    (d1 / "ignored.txt").write_text("not a spec")
    (d2 / "z.json").write_text(json.dumps(_spec("nvidia.com/gpu", "2", "3")))       # 2: d2 wins
    (d2 / "broken.json").write_text("{")
    r = run([NVHOOK, "cdi", "list", "--spec-dir", str(d1), "--spec-dir", str(d2)])
    assert r.stdout.split() == ["nvidia.com/gpu=0", "nvidia.com/gpu=2", "nvidia.com/gpu=3",
                                "vendor.com/net=eth0"]
    assert "conflicting device 'nvidia.com/gpu=1'" in r.stderr and "broken.json" in r.stderr
    assert r.returncode == 1
    from libinject.apply import cdi

    reg = cdi.scan([str(d1), str(d2)])
    edits, missing = reg.resolve(["nvidia.com/gpu=2", "nvidia.com/gpu=1"])
    assert missing == ["nvidia.com/gpu=1"] and edits == [{"env": ["DEV=2"]}]
    r = run([NVHOOK, "cdi", "list", "--spec-dir", str(d2 / "missing")])
    assert r.returncode == 0 and r.stdout == ""


def test_qualify_and_parse():
    from libinject.apply import cdi

    assert cdi.qualify(["0", " all", "GPU-abc", "void", "", "example.com/x=1", "0"]) == [
        "nvidia.com/gpu=0", "nvidia.com/gpu=all", "nvidia.com/gpu=GPU-abc", "example.com/x=1"]
    assert cdi.parse_device("nvidia.com/gpu=0:1") == ("nvidia.com", "gpu", "0:1")
    assert cdi.parse_device("nvidia.com/gpu") is None
    assert cdi.parse_device("/dev/nvidia0") is None
    assert not cdi.is_qualified("0") and cdi.is_qualified("nvidia.com/gpu=all")


# --- apply_spec -------------------------------------------------------------------------

def test_apply_cdi_to_oci_config():
    from libinject.apply.spec import apply_cdi

    cfg = {"process": {"env": ["PATH=/bin", "A=old"], "user": {"uid": 1000, "gid": 1000}},
           "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                      {"destination": "/usr/lib/x/lib.so", "source": "/old"}],
           "linux": {"resources": {"devices": [{"allow": False, "access": "rwm"}]},
                     "devices": [{"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 1}]}}
    apply_cdi(cfg, [
        {"env": ["A=new", "B=1"],
         "mounts": [{"hostPath": "/h/lib.so", "containerPath": "/usr/lib/x/lib.so",
                     "options": ["ro", "bind"]},
                    {"hostPath": "/h/bin", "containerPath": "/usr/bin/smi", "options": ["ro", "bind"]}],
         "hooks": [{"hookName": "createContainer", "path": "/bin/h", "args": ["h"], "env": ["X=1"]}]},
        {"deviceNodes": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0,
                          "permissions": "rw"},
                         {"path": "/dev/nvidia9", "type": "c", "major": 195, "minor": 9,
                          "permissions": "none", "uid": 0}]},
    ])
    assert cfg["process"]["env"] == ["PATH=/bin", "A=new", "B=1"]
    assert cfg["mounts"] == [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/usr/bin/smi", "source": "/h/bin", "options": ["ro", "bind"]},
        {"destination": "/usr/lib/x/lib.so", "source": "/h/lib.so", "options": ["ro", "bind"]}]
    assert cfg["linux"]["devices"] == [
        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "uid": 1000, "gid": 1000},
        {"path": "/dev/nvidia9", "type": "c", "major": 195, "minor": 9, "uid": 0, "gid": 1000}]
    assert cfg["linux"]["resources"]["devices"][1:] == [
        {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rw"},
        {"allow": True, "type": "c", "major": 195, "minor": 9, "access": ""}]
    assert cfg["hooks"] == {"createContainer": [{"path": "/bin/h", "args": ["h"], "env": ["X=1"]}]}


def test_apply_cdi_fills_device_from_host_and_rejects_bad_edits():
    from libinject.apply.spec import apply_cdi
    from libinject.errors import NvhookError

    cfg: dict = {}
    apply_cdi(cfg, [{"deviceNodes": [{"path": "/dev/null"}]}])
    assert cfg["linux"]["devices"] == [{"path": "/dev/null", "type": "c", "major": 1, "minor": 3}]
    assert cfg["linux"]["resources"]["devices"][0]["access"] == "rwm"
    before = copy.deepcopy(cfg)
    with pytest.raises(NvhookError, match="invalid hook name"):
        apply_cdi(cfg, [{"env": ["OK=1"]}, {"hooks": [{"hookName": "bogus", "path": "/x"}]}])
    assert cfg == before      # validated before anything is applied


# --- cdi-hook ---------------------------------------------------------------------------

def _state(bundle: Path) -> str:
    return json.dumps({"ociVersion": "1.0.2", "id": "x", "status": "creating", "pid": 1,
                       "bundle": str(bundle)})


def test_cdi_hook_symlinks_and_ldcache_stay_in_rootfs(rootfs, tmp_path, no_leaked_mounts):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(
        {"ociVersion": "1.0.2", "process": {"args": ["sh"]}, "root": {"path": str(rootfs)}}))
    # hostile image: a lib dir that is a symlink to an absolute path that exists on
    # the host (and inside the rootfs): it must resolve inside the rootfs
    outside = tmp_path / "outside"
    outside.mkdir()
    (rootfs / str(outside).lstrip("/")).mkdir(parents=True)
    (rootfs / "usr/lib/evil").symlink_to(str(outside))
    r = run([NVHOOK, "cdi-hook", "create-symlinks", "--link", "libfoo.so.1::/usr/lib/evil/libfoo.so",
             "--link", "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so"],
            input=_state(bundle))
    assert r.returncode == 0, r.stderr
    assert os.readlink(rootfs / "usr/lib/x86_64-linux-gnu/libcuda.so") == "libcuda.so.1"
    assert list((tmp_path / "outside").iterdir()) == []          # nothing on the host
    assert os.readlink(rootfs / str(outside).lstrip("/") / "libfoo.so") == "libfoo.so.1"
    libdir = rootfs / "usr/lib/x86_64-linux-gnu"
    (libdir / "libm.so.6").write_bytes((rootfs / "lib/x86_64-linux-gnu/libm.so.6").read_bytes())
    r = run([NVHOOK, "cdi-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"],
            input=_state(bundle))
    assert r.returncode == 0, r.stderr
    assert b"/usr/lib/x86_64-linux-gnu/libm.so.6" in (rootfs / "etc/ld.so.cache").read_bytes()
    r = run([NVHOOK, "cdi-hook", "create-symlinks", "--link", "nolink"], input=_state(bundle))
    assert r.returncode == 1 and "invalid --link" in r.stderr
    r = run([NVHOOK, "cdi-hook", "update-ldcache", "--folder", "/x"], input="")
    assert r.returncode == 1 and "no container state" in r.stderr


def test_mask_procfs_edits_follow_container_devices(sim_host):
    from libinject.pipeline import cdi_hook_edits

    host = sim_host("h100x8-mig")
    driver = driver_of(host)
    g0 = driver.info.gpus[0]
    m = g0.mig_devices[0]
    spec = {"linux": {"devices": [
        {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
        {"path": "/dev/nvidia2", "type": "c", "major": 195, "minor": driver.info.gpus[2].minor},
        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": g0.minor},
        {"path": f"/dev/nvidia-caps/nvidia-cap{m.gi_access_minor}", "type": "c", "major": 236,
         "minor": m.gi_access_minor},
        {"path": f"/dev/nvidia-caps/nvidia-cap{m.ci_access_minor}", "type": "c", "major": 236,
         "minor": m.ci_access_minor},
        {"path": "/dev/nvidia5", "type": "c", "major": 195, "minor": driver.info.gpus[5].minor}],
        "resources": {"devices": [   # GPU 5's node exists but the cgroup denies it
            {"allow": False, "access": "rwm"},
            {"allow": True, "type": "c", "major": 195, "access": "rw"},
            {"allow": True, "type": "c", "major": 236, "access": "rw"},
            {"allow": False, "type": "c", "major": 195, "minor": driver.info.gpus[5].minor,
             "access": "rwm"}]}}}
    e = cdi_hook_edits(spec, procfs_dir=driver.procfs_dir)
    assert sorted(n for _, n in e.procfs.gpu_dirs) == sorted(
        [driver.info.gpus[0].procfs_name, driver.info.gpus[2].procfs_name])
    assert "ModifyDeviceFiles: 0" in e.procfs.files["params"]
    # the same procfs the planner gives the hook path for that MIG device and GPU 2
    from libinject.plan import planner as P
    from libinject.request.model import Request

    p = P.plan(Request(devices="0:0,2", capabilities=frozenset({"utility"})), driver)
    assert sorted(e.procfs.gpu_dirs) == sorted(p.procfs.gpu_dirs)
    assert e.procfs.files == p.procfs.files
    # the MIG device's access files bound from the host, as NVIDIA's mount_procfs_mig
    assert e.procfs.bound_files == p.procfs.bound_files
    m0 = driver.info.gpus[0].mig_devices[0]
    gi = f"capabilities/gpu0/mig/gi{m0.gi}"
    assert sorted(rel for _, rel in e.procfs.bound_files) == sorted([f"{gi}/access", f"{gi}/ci{m0.ci}/access"])
    assert all(h == f"{driver.procfs_dir}/{rel}" for h, rel in e.procfs.bound_files)
    assert not any(k.startswith("capabilities/") for k in e.procfs.files)
