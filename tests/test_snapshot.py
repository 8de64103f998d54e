"""Snapshots never decide which devices a container gets.

A snapshot file edited by hand (or by anyone holding the snapshot key: "resigned"),
damaged, or of the wrong shape is discarded on load, rediscovered and rewritten, never
an error for the user; the device facts a start reads anyway (device nodes' rdev, each
GPU's gpus/<busid>/information, the mig-minors table, the procfs texts) are checked
against what the snapshot says. The snapshot dir stays bounded.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from libinject.discover import snapshot as S
from libinject.discover.driver import discover
from libinject.plan.planner import plan
from libinject.request.model import Request
from support.simhost import profile_of


def _only(sdir: Path) -> Path:
    (snap,) = [p for p in sdir.iterdir() if p.name.startswith("driver-")]
    return snap


def _split(snap: Path) -> tuple[str, str, dict]:
    """(header lines, the fingerprint, the JSON body) of a snapshot file."""
    text = snap.read_text()
    i = text.index("\n{")
    return text[:i + 1], text.split("\n", 1)[0], json.loads(text[i + 1:])


def _write(sdir: Path, how: str, doc_or_body) -> None:
    """Put a changed body in the snapshot: "hand" keeps the header as it was (an edit
    by hand), "resigned" seals it again with the snapshot key (a writer that has it)."""
    snap = _only(sdir)
    header, fp, _ = _split(snap)
    body = doc_or_body if isinstance(doc_or_body, (str, bytes)) else json.dumps(doc_or_body)
    if isinstance(body, str):
        body = body.encode()
    if how == "hand":
        snap.write_bytes(header.encode() + body)
    else:
        snap.write_bytes(S.seal(fp, body, S.read_key(str(sdir))))
    assert snap.stat().st_mode & 0o077 == 0


def _reloads(sdir: Path, root: Path) -> object:
    """The snapshot as discover() would load it for root (None: it would be discarded)."""
    snap = _only(sdir)
    fp = snap.read_bytes().split(b"\n", 1)[0].decode()
    r = os.path.realpath(root)
    return S.load(str(snap), fp, S.view(r, r))


def _gpu_node(driver, index: int) -> str:
    e = plan(Request(devices=str(index), capabilities=frozenset({"utility"})), driver)
    return [d.path for d in e.device_nodes if d.kind == "gpu"][0]


def _swap(items: list, a: int, b: int, key: str) -> None:
    items[a][key], items[b][key] = items[b][key], items[a][key]


# ---------------------------------------------------------------- devices: cross-checked

EDITS = {
    # the reported case: NVIDIA_VISIBLE_DEVICES=0 got GPU 5's node
    "gpu-minors": lambda d: _swap(d["info"]["gpus"], 0, 5, "minor"),
    # selection by UUID picks the other GPU
    "gpu-uuids": lambda d: _swap(d["info"]["gpus"], 0, 5, "uuid"),
    # the nodes themselves say other minors
    "node-minors": lambda d: _swap(d["gpu_devices"], 0, 5, "minor"),
    # a GPU's procfs dir is another GPU's
    "gpu-procfs": lambda d: d["gpu_procfs"].update({
        d["info"]["gpus"][0]["bus_id"]: d["gpu_procfs"][d["info"]["gpus"][5]["bus_id"]]}),
    # the masked procfs would let the driver in the container recreate /dev nodes
    "procfs-params": lambda d: d["procfs"].update(
        params=d["procfs"]["params"].replace("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 2")),
    # a host path outside the driver root
    "library-outside-root": lambda d: d["libraries"][0].update(path="/etc/shadow"),
}


@pytest.mark.parametrize("how", ["hand", "resigned"])
@pytest.mark.parametrize("edit", list(EDITS))
def test_edited_snapshot_never_changes_devices(sim_host, tmp_path, edit, how):
    root = sim_host("a100x8")
    sdir = tmp_path / "snaps"
    d0 = discover(str(root), snapshot_dir=str(sdir))
    want = {g["uuid"]: g["minor"] for g in profile_of(root)["gpus"]}
    assert {g.uuid: g.minor for g in d0.info.gpus} == want
    _, _, doc = _split(_only(sdir))
    EDITS[edit](doc)
    _write(sdir, how, doc)
    d = discover(str(root), snapshot_dir=str(sdir))
    assert d == d0
    assert {g.uuid: g.minor for g in d.info.gpus} == want
    for i, g in enumerate(d.info.gpus):
        assert _gpu_node(d, i) == f"/dev/nvidia{g.minor}"
    assert _reloads(sdir, root) == d0          # rewritten: good again


def test_discarded_snapshot_is_logged(sim_host, tmp_path):
    root = sim_host("t4x1")
    sdir = tmp_path / "snaps"
    d0 = discover(str(root), snapshot_dir=str(sdir))
    _, _, doc = _split(_only(sdir))
    doc["info"]["gpus"][0]["minor"] = "0"
    _write(sdir, "hand", doc)
    lines: list[str] = []
    assert discover(str(root), snapshot_dir=str(sdir), log=lines.append) == d0
    assert len(lines) == 1 and "discarded" in lines[0] and str(_only(sdir)) in lines[0]
    # a current one is used without a word; a stale one is simply replaced
    assert discover(str(root), snapshot_dir=str(sdir), log=lines.append) == d0
    assert len(lines) == 1


def test_swapped_minors_found_by_crosscheck_alone(sim_host, tmp_path):
    """Resigned, so the seal holds: the cross-check against the host is what refuses."""
    root = sim_host("a100x8")
    sdir = tmp_path / "snaps"
    d0 = discover(str(root), snapshot_dir=str(sdir))
    _, fp, doc = _split(_only(sdir))
    _swap(doc["info"]["gpus"], 0, 5, "minor")
    doc["gpu_devices"][0], doc["gpu_devices"][5] = doc["gpu_devices"][5], doc["gpu_devices"][0]
    _write(sdir, "resigned", doc)
    lines: list[str] = []
    assert S.load(str(_only(sdir)), fp, log=lines.append) is None
    assert "minor" in lines[0] and "information" in lines[0]
    assert discover(str(root), snapshot_dir=str(sdir)) == d0


MIG_EDITS = {
    "mig-access-minors": lambda d: _swap(d["info"]["gpus"][0]["mig_devices"], 0, 1, "gi_access_minor"),
    "mig-table": lambda d: d["mig_minors"].update(config=d["mig_minors"]["monitor"]),
    "mig-cap-file": lambda d: d["procfs"].update({k: "DeviceFileMinor: 1\n" for k in d["procfs"]
                                                  if k.endswith("/access")}),
    "cap-node-minor": lambda d: d["cap_devices"][0].update(minor=d["cap_devices"][1]["minor"]),
}


@pytest.mark.parametrize("edit", list(MIG_EDITS))
def test_edited_mig_facts_are_not_believed(sim_host, tmp_path, edit):
    root = sim_host("h100x8-mig")
    sdir = tmp_path / "snaps"
    d0 = discover(str(root), snapshot_dir=str(sdir))
    _, _, doc = _split(_only(sdir))
    MIG_EDITS[edit](doc)
    _write(sdir, "resigned", doc)
    assert discover(str(root), snapshot_dir=str(sdir)) == d0
    assert _reloads(sdir, root) == d0


GRAPHICS_EDITS = {
    # the card node is the render node: another minor than the host's
    "drm-minor": lambda d: d["drm_devices"][0]["node"].update(minor=128),
    # a node discovery never found (the host's /dev/null, to be bound in as a DRM node)
    "drm-extra": lambda d: d["drm_devices"].append(dict(d["drm_devices"][0], node=dict(
        d["drm_devices"][0]["node"], path="/dev/null", major=1, minor=3))),
    # the by-path link would point another GPU's way
    "drm-by-path": lambda d: d["drm_devices"][0].update(by_path="/dev/dri/by-path/pci-0000:99:00.0-card"),
    # an ICD file from outside the driver root
    "graphics-outside-root": lambda d: d["graphics_files"][0].update(path="/etc/shadow"),
}


@pytest.mark.parametrize("edit", list(GRAPHICS_EDITS))
def test_edited_graphics_facts_are_not_believed(sim_host, tmp_path, edit):
    root = sim_host("rtx4090x1")
    sdir = tmp_path / "snaps"
    d0 = discover(str(root), snapshot_dir=str(sdir))
    assert d0.drm_devices and d0.graphics_files
    _, _, doc = _split(_only(sdir))
    GRAPHICS_EDITS[edit](doc)
    _write(sdir, "resigned", doc)
    assert _reloads(sdir, root) is None
    assert discover(str(root), snapshot_dir=str(sdir)) == d0
    assert _reloads(sdir, root) == d0


# ---------------------------------------------------------------- host files: re-found
# Resealed with the key: only checking each file the way discovery finds it refuses these
# (they were only checked to be under the root, which is "/" on a normal host). The
# simulated root's etc/shadow stands for the host's; its tmp/volume for a directory others
# write (a volume, /tmp), holding planted files.

def _one(items: list[dict], key: str, end: str) -> dict:
    (found,) = [x for x in items if x[key].endswith(end)]
    return found


def _lib(d: dict, name: str, arch: str = "x86-64") -> dict:
    return next(x for x in d["libraries"] if x["path"].rpartition("/")[2].startswith(name) and x["arch"] == arch)


FILE_FORGERIES = {
    # libraries: a host file, a planted one, relabelled, moved, doubled, another source
    "lib-is-shadow": ("libraries", lambda d, r: _lib(d, "libcuda.so").update(path=f"{r}/etc/shadow")),
    "lib-planted": ("libraries", lambda d, r: _lib(d, "libcuda.so").update(
        path=f"{r}/tmp/volume/" + _lib(d, "libcuda.so")["path"].rpartition("/")[2])),
    "lib-soname": ("libraries", lambda d, r: _lib(d, "libcuda.so").update(soname="libnvidia-ml.so.1")),
    "lib-capability": ("libraries", lambda d, r: _lib(d, "libnvidia-ml.so").update(capability="compute")),
    "lib-extra": ("libraries", lambda d, r: _lib(d, "libcuda.so").update(extra=True)),
    "lib-arch": ("libraries", lambda d, r: _lib(d, "libcuda.so").update(arch="i386")),
    "lib-32-is-64": ("libraries", lambda d, r: _lib(d, "libcuda.so", "i386").update(
        path=_lib(d, "libcuda.so")["path"])),
    "lib-twice": ("libraries", lambda d, r: d["libraries"].append(dict(_lib(d, "libcuda.so")))),
    "lib-no-soname": ("libraries", lambda d, r: _lib(d, "libcuda.so").update(soname=None)),
    "lib-source": ("libraries", lambda d, r: d.update(library_source="search /usr/lib (forged)")),
    # binaries: a host file, a planted one, another name, another container path
    "bin-is-shadow": ("binaries", lambda d, r: _one(d["binaries"], "path", "/nvidia-smi").update(
        path=f"{r}/etc/shadow")),
    "bin-planted": ("binaries", lambda d, r: _one(d["binaries"], "path", "/nvidia-smi").update(
        path=f"{r}/tmp/volume/nvidia-smi")),
    "bin-swapped": ("binaries", lambda d, r: _one(d["binaries"], "path", "/nvidia-smi").update(
        path=_one(d["binaries"], "path", "/nvidia-debugdump")["path"])),
    "bin-params": ("binaries", lambda d, r: _one(d["binaries"], "path", "/nvidia-smi").update(
        container_path="/proc/driver/nvidia/params")),
    "bin-capability": ("binaries", lambda d, r: _one(d["binaries"], "path", "/nvidia-smi").update(
        capability="compute")),
    # firmware: a host file, a planted gsp*.bin, another container path, another name
    "fw-is-shadow": ("firmware", lambda d, r: d["firmware"][0].update(path=f"{r}/etc/shadow")),
    "fw-planted": ("firmware", lambda d, r: d["firmware"][0].update(path=f"{r}/tmp/volume/gsp_evil.bin")),
    "fw-container-path": ("firmware", lambda d, r: d["firmware"][0].update(container_path="/etc/shadow")),
    "fw-not-gsp": ("firmware", lambda d, r: d["firmware"].append(dict(
        d["firmware"][0], path=d["firmware"][0]["path"].rpartition("/")[0] + "/README",
        container_path=d["firmware"][0]["container_path"].rpartition("/")[0] + "/README"))),
    # IPC (bind-mounted read-write): a host file, a dir that is no IPC path, the MPS pipe
    # dir where a user made it, another container path
    "ipc-is-shadow": ("ipcs", lambda d, r: d["ipcs"][0].update(path=f"{r}/etc/shadow")),
    "ipc-planted": ("ipcs", lambda d, r: d["ipcs"].append({
        "path": f"{r}/tmp/volume/mps", "container_path": "/tmp/nvidia-mps", "capability": "compute",
        "kind": "ipc"})),
    "ipc-users-mps-dir": ("ipcs", lambda d, r: d["ipcs"].append({
        "path": f"{r}/tmp/nvidia-mps", "container_path": "/tmp/nvidia-mps", "capability": "compute",
        "kind": "ipc"})),
    "ipc-container-path": ("ipcs", lambda d, r: d["ipcs"][0].update(container_path="/etc/passwd")),
    "ipc-twice": ("ipcs", lambda d, r: d["ipcs"].append(dict(d["ipcs"][0]))),
    "ipc-kind": ("ipcs", lambda d, r: d["ipcs"][0].update(kind="graphics")),
}
WHY = {"libraries": "libraries are not ones discovery finds", "binaries": "binaries are not the driver root's",
       "firmware": "firmware files are not the driver root's", "ipcs": "IPC paths are not the driver's"}


def _plant(root: Path) -> None:
    """Files like the driver's, in a directory others write (and the host's secret)."""
    (root / "etc/shadow").write_text("root:$6$host-secret:19000:0:99999:7:::\n")
    vol = root / "tmp/volume"
    vol.mkdir(parents=True, mode=0o1777)
    for lib in (root / "usr/lib/x86_64-linux-gnu").glob("libcuda.so.*.*"):
        (vol / lib.name).write_bytes(lib.read_bytes())
    (vol / "nvidia-smi").write_text("#!/bin/sh\n")
    os.chmod(vol / "nvidia-smi", 0o755)
    (vol / "gsp_evil.bin").write_bytes(b"evil")
    (vol / "mps").mkdir()
    (root / "tmp/nvidia-mps").mkdir()              # a user's, not the MPS daemon's
    for fw in (root / "lib/firmware/nvidia").iterdir():
        (fw / "README").write_text("not firmware\n")   # beside the gsp*.bin files
    os.chown(root / "tmp/nvidia-mps", 65534, 65534)


@pytest.mark.parametrize("forgery", list(FILE_FORGERIES))
def test_forged_host_files_are_not_believed(fresh_sim_host, tmp_path, forgery):
    root = fresh_sim_host("t4x1")
    _plant(root)
    sdir = tmp_path / "snaps"
    d0 = discover(str(root), snapshot_dir=str(sdir))
    assert d0.libraries and d0.binaries and d0.firmware and d0.ipcs
    _, _, doc = _split(_only(sdir))
    field, edit = FILE_FORGERIES[forgery]
    edit(doc, os.path.realpath(root))
    _write(sdir, "resigned", doc)
    lines: list[str] = []
    assert discover(str(root), snapshot_dir=str(sdir), log=lines.append) == d0
    assert len(lines) == 1 and f"({WHY[field]}" in lines[0], lines
    assert _reloads(sdir, root) == d0          # rewritten: good again


def _search_layout(root: Path) -> None:
    """The driver unpacked without an ld.so.cache (libraries found by searching)."""
    import shutil

    for src, dst in (("usr/lib/x86_64-linux-gnu", "usr/local/nvidia/lib64"), ("usr/lib/i386-linux-gnu", "usr/lib")):
        (root / dst).mkdir(parents=True, exist_ok=True)
        for p in sorted((root / src).iterdir()):
            if not p.name.startswith("libnvidia-ml"):
                shutil.move(str(p), str(root / dst / p.name))
    (root / "etc/ld.so.cache").unlink()


@pytest.mark.parametrize("forgery", ["lib-planted", "lib-soname", "lib-source-ldcache", "none"])
def test_searched_libraries_are_checked_too(fresh_sim_host, tmp_path, forgery):
    """Without an ld.so.cache discovery searches the library dirs: a snapshot's libraries
    are checked against that search (and a true snapshot is kept, not rebuilt)."""
    root = fresh_sim_host("t4x1")
    _search_layout(root)
    _plant(root)
    sdir = tmp_path / "snaps"
    d0 = discover(str(root), snapshot_dir=str(sdir))
    assert d0.library_source.startswith("search ") and any(x.name.startswith("libcuda.so") for x in d0.libraries)
    _, _, doc = _split(_only(sdir))
    r = os.path.realpath(root)
    if forgery == "lib-source-ldcache":
        doc["library_source"] = f"ldcache {r}/etc/ld.so.cache"
    elif forgery != "none":
        FILE_FORGERIES[forgery][1](doc, r)
    _write(sdir, "resigned", doc)
    lines: list[str] = []
    assert discover(str(root), snapshot_dir=str(sdir), log=lines.append) == d0
    if forgery == "none":
        assert lines == []
    else:
        assert len(lines) == 1 and f"({WHY['libraries']}" in lines[0], lines


def test_true_snapshot_with_linked_files_is_kept(fresh_sim_host, tmp_path):
    """Driver files reached through links (an absolute one, a chain of two, a binary
    linked from its bin dir) and an MPS pipe dir: the true snapshot reloads as it is."""
    root = fresh_sim_host("t4x1")
    ver = profile_of(root)["driver_version"]
    lib, opt = root / "usr/lib/x86_64-linux-gnu", root / "opt/nvidia"
    (opt / "bin").mkdir(parents=True)
    os.rename(lib / f"libcuda.so.{ver}", opt / f"libcuda.so.{ver}")
    (lib / "libcuda.so.1").unlink()
    (lib / "libcuda.so.1").symlink_to(f"/opt/nvidia/libcuda.so.{ver}")
    os.rename(lib / f"libnvidia-cfg.so.{ver}", opt / f"libnvidia-cfg.so.{ver}")
    (lib / f"libnvidia-cfg.so.{ver}").symlink_to(f"../../../opt/nvidia/libnvidia-cfg.so.{ver}")
    os.rename(root / "usr/bin/nvidia-smi", opt / "bin/nvidia-smi")
    (root / "usr/bin/nvidia-smi").symlink_to("../../opt/nvidia/bin/nvidia-smi")
    (root / "tmp/nvidia-mps").mkdir(parents=True)
    sdir = tmp_path / "snaps"
    d0 = discover(str(root), snapshot_dir=str(sdir))
    r = os.path.realpath(root)
    assert {f"{r}/opt/nvidia/libcuda.so.{ver}", f"{r}/opt/nvidia/libnvidia-cfg.so.{ver}"} <= {
        x.path for x in d0.libraries}
    assert f"{r}/opt/nvidia/bin/nvidia-smi" in {x.path for x in d0.binaries}
    assert any(x.container_path == "/tmp/nvidia-mps" for x in d0.ipcs)
    lines: list[str] = []
    assert discover(str(root), snapshot_dir=str(sdir), log=lines.append) == d0
    assert lines == []


# ---------------------------------------------------------------- shapes: validated

def _set(path: str, value):
    def edit(doc):
        *where, last = path.split(".")
        node = doc
        for k in where:
            node = node[int(k)] if isinstance(node, list) else node[k]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return edit


def _drop(path: str):
    def edit(doc):
        *where, last = path.split(".")
        node = doc
        for k in where:
            node = node[int(k)] if isinstance(node, list) else node[k]
        del node[last]
    return edit


BAD = {
    "string-minor": _set("info.gpus.0.minor", "0"),
    "list-for-info": _set("info", []),
    "bool-for-int": _set("info.gpus.0.index", True),
    "negative-minor": _set("info.gpus.1.minor", -1),
    "huge-minor": _set("info.gpus.1.minor", 1 << 70),
    "float-memory": _set("info.gpus.0.memory_total", 1.5),
    "cc-three-numbers": _set("info.gpus.0.cc", [8, 0, 1]),
    "null-library-path": _set("libraries.0.path", None),
    "relative-path": _set("binaries.0.path", "usr/bin/nvidia-smi"),
    "string-for-list": _set("libraries", "libcuda.so"),
    "mig-minors-list": _set("mig_minors", [1, 2]),
    "mig-minor-string": _set("mig_minors.config", "1"),
    "procfs-not-text": _set("procfs.version", 5),
    "extra-field": _set("info.gpus.0.evil", 1),
    "missing-field": _drop("info.gpus.0.uuid"),
    "gpus-out-of-order": lambda d: d["info"]["gpus"].reverse(),
    "other-root": _set("root", "/"),
}
RAW = {
    "truncated": lambda body: body[: len(body) // 2],
    "empty": lambda body: b"",
    "not-json": lambda body: b"\xff\xfe garbage",
    "deep-nesting": lambda body: b"[" * 100000 + b"]" * 100000,
    "not-an-object": lambda body: b"[1, 2, 3]",
}


@pytest.mark.parametrize("how", ["hand", "resigned"])
@pytest.mark.parametrize("bad", list(BAD) + list(RAW))
def test_bad_snapshot_is_rebuilt(sim_host, tmp_path, bad, how):
    root = sim_host("a100x8")
    sdir = tmp_path / "snaps"
    d0 = discover(str(root), snapshot_dir=str(sdir))
    _, _, doc = _split(_only(sdir))
    if bad in BAD:
        BAD[bad](doc)
        _write(sdir, how, doc)
    else:
        _write(sdir, how, RAW[bad](json.dumps(doc).encode()))
    assert _reloads(sdir, root) is None
    d = discover(str(root), snapshot_dir=str(sdir))      # no exception, the true answer
    assert d == d0
    assert _gpu_node(d, 0) == f"/dev/nvidia{d0.info.gpus[0].minor}"
    assert _reloads(sdir, root) == d0                          # a fresh snapshot written


def test_snapshot_key_is_ours_alone(sim_host, tmp_path):
    root = sim_host("t4x1")
    sdir = tmp_path / "snaps"
    d0 = discover(str(root), snapshot_dir=str(sdir))
    key = sdir / S.KEY_NAME
    st = key.stat()
    assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o600 and st.st_size == S.KEY_BYTES
    # a key others may have written (or read) is not used, and replaced on the next save
    os.chmod(key, 0o644)
    assert _reloads(sdir, root) is None
    assert discover(str(root), snapshot_dir=str(sdir)) == d0
    assert key.stat().st_mode & 0o777 == 0o600
    assert _reloads(sdir, root) == d0
    # a snapshot sealed with another key is not believed
    _, fp, doc = _split(_only(sdir))
    _only(sdir).write_bytes(S.seal(fp, json.dumps(doc).encode(), os.urandom(S.KEY_BYTES)))
    assert _reloads(sdir, root) is None
    assert discover(str(root), snapshot_dir=str(sdir)) == d0


def test_old_format_is_discarded(sim_host, tmp_path):
    """A format-1 snapshot (fingerprint, then the JSON) is never read as a current one."""
    root = sim_host("t4x1")
    sdir = tmp_path / "snaps"
    d0 = discover(str(root), snapshot_dir=str(sdir))
    _, fp, doc = _split(_only(sdir))
    _only(sdir).write_text(fp + "\n" + json.dumps(doc))
    assert _reloads(sdir, root) is None
    assert discover(str(root), snapshot_dir=str(sdir)) == d0
    assert _reloads(sdir, root) == d0


# ---------------------------------------------------------------- pruning

def _boot_time() -> float:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    raise AssertionError("no btime")


def test_pruning_bounds_the_snapshot_dir(sim_host, tmp_path):
    root = sim_host("t4x1")
    sdir = tmp_path / "snaps"
    sdir.mkdir(mode=0o700)
    now = time.time()
    old = [sdir / f"driver-{i:032x}.json" for i in range(40)]
    for i, p in enumerate(old):
        p.write_text("x\n{}")
        os.chmod(p, 0o600)
        t = now - 60 * (i + 1)                       # recent, one minute apart
        os.utime(p, (t, t))
    before_boot = sdir / f"driver-{'b' * 32}.json"
    before_boot.write_text("x\n{}")
    t = _boot_time() - 3600
    os.utime(before_boot, (t, t))
    stale_tmp = sdir / f".driver-{'c' * 32}.json.tmp-123-0badf00d"
    stale_tmp.write_text("half")
    os.utime(stale_tmp, (now - 3600, now - 3600))
    live_tmp = sdir / f".driver-{'d' * 32}.json.tmp-456-0badf00d"   # a writer right now
    live_tmp.write_text("half")
    other = sdir / "README"                          # not ours to remove
    other.write_text("admin's notes\n")

    d = discover(str(root), snapshot_dir=str(sdir))
    snaps = sorted(p.name for p in sdir.iterdir() if p.name.startswith("driver-"))
    assert len(snaps) <= 8
    mine = _only_current(sdir, root)
    assert mine.name in snaps and S.load(str(mine), _split(mine)[1]) == d
    # the newest of the others are the ones kept
    kept = [p for p in old if p.exists()]
    assert kept == old[:len(kept)]
    assert not before_boot.exists() and not stale_tmp.exists()
    assert live_tmp.exists() and other.exists()
    # and it stays bounded
    for i in range(20):
        p = sdir / f"driver-{0xf00 + i:032x}.json"
        p.write_text("x\n{}")
    os.unlink(mine)
    discover(str(root), snapshot_dir=str(sdir))
    assert len([p for p in sdir.iterdir() if p.name.startswith("driver-")]) <= 8


def _only_current(sdir: Path, root: Path) -> Path:
    from libinject.discover.driver import DEFAULT_LDCACHE

    r = os.path.realpath(root)
    return Path(S.path_for(str(sdir), r, r, os.path.join(r, DEFAULT_LDCACHE.lstrip("/"))))


# ---------------------------------------------------------------- the fingerprint, fast

def _probe_args(root: Path) -> tuple:
    from libinject.discover.driver import DEFAULT_LDCACHE, _watch_dirs

    r = os.path.realpath(root)
    return r, r, os.path.join(r, DEFAULT_LDCACHE.lstrip("/")), _watch_dirs()


def test_remembered_fingerprint_is_the_hashed_one(fresh_sim_host, monkeypatch):
    """probe() hashes only material it has not seen last time; what it returns for
    material seen before is what hashing it again gives, and any change is hashed."""
    root = fresh_sim_host("a100x8")
    args = _probe_args(root)
    k0, _ = S.probe(*args)
    assert S._last is not None and S._last[2] == k0
    monkeypatch.setattr(S, "_last", None)
    assert S.probe(*args)[0] == k0                  # hashed afresh: the same
    assert S.probe(*args)[0] == k0                  # remembered: the same
    gpus = sorted((root / "proc/driver/nvidia/gpus").iterdir())
    info = gpus[3] / "information"
    info.write_text(info.read_text().replace("Device Minor:", "Device Minor: "))
    k1 = S.probe(*args)[0]
    assert k1 != k0
    # a watched directory changes (an entry made): seen through its stat
    (root / args[3][0] / "libnvidia-extra.so.1").write_bytes(b"")
    k2 = S.probe(*args)[0]
    assert k2 not in (k0, k1)
    monkeypatch.setattr(S, "_last", None)
    assert S.probe(*args)[0] == k2


def test_default_dir_key_is_out_of_reach_of_a_run_writer(fresh_sim_host, tmp_path, monkeypatch):
    """The attack: a root process outside the runtime's namespaces that can write the
    host's /run (a container given it as a volume) replaces the snapshot, sealed with a
    key it wrote beside it, naming its own file as libcuda: every GPU container would
    load it. The default dir's key lives in KEY_DIR (/var/lib/nvhook), not under /run:
    the forged snapshot is discarded and the library stays the driver's. (The driver
    root is "/" on a real host, so the peer's file in /run is under it: here the
    simulated root's run/ stands for the host's /run.)"""
    root = fresh_sim_host("a100x8")
    run_dir, key_dir = root / "run/nvhook/snapshots", tmp_path / "var/lib/nvhook"
    monkeypatch.setattr(S, "DEFAULT_DIR", str(run_dir))
    monkeypatch.setattr(S, "KEY_DIR", str(key_dir), raising=False)
    evil = root / "run/libcuda.so.550.163.01"               # the peer's own library, in "/run"
    evil.write_bytes(b"\x7fELF evil")
    run_dir.mkdir(parents=True, mode=0o700)
    d0 = discover(str(root), snapshot_dir=str(run_dir))
    snap = _only(run_dir)
    _, fp, doc = _split(snap)
    for lib in doc["libraries"]:
        if lib["soname"] == "libcuda.so.1":
            lib["path"] = str(evil)
    forged_key = os.urandom(S.KEY_BYTES)
    (run_dir / S.KEY_NAME).write_bytes(forged_key)
    os.chmod(run_dir / S.KEY_NAME, 0o600)
    snap.write_bytes(S.seal(fp, json.dumps(doc).encode(), forged_key))
    lines: list[str] = []
    d = discover(str(root), snapshot_dir=str(run_dir), log=lines.append)
    assert d == d0 and str(evil) not in {lib.path for lib in d.libraries}
    assert lines and "seal does not match" in lines[0]
    (run_dir / S.KEY_NAME).unlink()
    assert (key_dir / S.KEY_NAME).is_file() and not (run_dir / S.KEY_NAME).exists()
    assert _reloads(run_dir, root) == d0                    # rewritten, sealed with KEY_DIR's key
