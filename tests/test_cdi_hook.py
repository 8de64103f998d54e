"""The one hook entry of nvhook's CDI spec (`cdi-hook createRuntime`, issue 24): every step
(the /proc/driver/nvidia mask, the symlinks, the ld cache) in one call, run by real
runtimes at createRuntime, exec'd and served by `nvhook serve`; and refused, with one
line and nothing done, where it is not what a runtime's createRuntime stage gives.

The containers are runc (and crun) bundles with the generated spec's edits for one
device applied to their config.json as an engine applies them (libinject.apply.spec,
what podman's CDI library does; podman itself: test_cdi_podman.py,
test_rootless_podman.py), on the shared simulated a100x8 host.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import NVHOOK, host_mounts, run
from support import hookenv
from support.runc import RuncContainer, RuncError

ENV = ["PATH=/usr/bin:/bin"]
# what the container sees: nvidia-smi (the ld cache), its GPU procfs, a symlink, its nodes
PROBE = ("nvidia-smi -L; echo procfs $(ls /proc/driver/nvidia/gpus); "
         "echo link $(readlink /usr/lib/x86_64-linux-gnu/libcuda.so); "
         "grep -c ModifyDeviceFiles /proc/driver/nvidia/params; "
         "for d in /dev/nvidia0 /dev/nvidia1; do dd if=$d of=/dev/null bs=1 count=0 2>&1 | "
         "grep -o \"can't open.*\" || echo \"$d: OK\"; done")


def generate(host: Path, out: Path, *extra: str) -> dict:
    r = run([NVHOOK, "cdi", "generate", "--driver-root", str(host), "--hook-path",
             hookenv.ensure_front(), "-o", str(out), *extra])
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def specs(a100_host, tmp_path_factory):
    """{socket: spec dir}: the spec of a100_host whose hook tries no service ("none"),
    and one whose hook tries the service at SOCKET (served tests)."""
    base = tmp_path_factory.mktemp("cdihook")
    out = {}
    for name, sock in (("none", "none"), ("served", str(SOCKET))):
        d = base / name
        d.mkdir()
        generate(a100_host, d / "nvidia.json", "--hook-socket", sock)
        out[name] = d
    return out


SOCKET = Path("/tmp/nvcdi-hook-test/run/hook.sock")      # short: sun_path holds 108 bytes


def cdi_edits(spec_dir: Path, device: str) -> list[dict]:
    from libinject.apply import cdi

    edits, missing = cdi.scan([str(spec_dir)]).resolve([f"nvidia.com/gpu={device}"])
    assert not missing
    return edits


def cdi_container(tmp_path: Path, spec_dir: Path, device: str = "1", *, mode: str = "v1",
                  script: str = PROBE, stage: str | None = None) -> RuncContainer:
    """A runc container given `device` by the spec, as an engine applies it (stage: move
    the spec's hooks to another stage, as a confused engine would run them)."""
    from libinject.apply.spec import apply_cdi

    c = RuncContainer(tmp_path, mode=mode, args=["sh", "-c", script], env=ENV)
    apply_cdi(c.config, cdi_edits(spec_dir, device))
    if stage is not None:
        hooks = c.config["hooks"]
        hooks[stage] = hooks.pop("createRuntime")
    return c


def assert_gpu1(out: str, a100_host: Path, gpu_uuids: list[str]) -> None:
    from libinject.discover.driver import discover

    gpus = discover(str(a100_host), snapshot=False).info.gpus
    assert re.findall(r"UUID: (GPU-[0-9a-f-]+)", out) == [gpu_uuids[1]], out
    assert f"procfs {gpus[1].procfs_name}\n" in out, out
    assert "link libcuda.so.1\n" in out, out
    assert "\n1\n" in out, out                       # params: the host's, ModifyDeviceFiles: 0
    assert "can't open '/dev/nvidia0': No such file or directory" in out, out
    assert "can't open '/dev/nvidia1': No such device or address" in out, out


# -- the spec ----------------------------------------------------------------------------

def test_generated_spec_has_one_hook_entry(a100_host, tmp_path):
    """One createRuntime entry (explicit env, the front) doing all three steps; none per
    device here (a100x8 has no DRM nodes); --hook-stage createContainer moves it; both
    validate against the CDI schema (the shared copy)."""
    from test_cdi import official_validator

    spec = generate(a100_host, tmp_path / "a.json")
    [hook] = spec["containerEdits"]["hooks"]
    assert hook["hookName"] == "createRuntime" and hook["path"] == hookenv.ensure_front()
    assert hook["args"][:3] == ["nvhook-hook", "cdi-hook", "createRuntime"]
    assert hook["env"] == ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    assert {"--procfs-dir", "--link", "--folder"} <= set(hook["args"])
    # the libraries are the spec's mounts, not listed again (the hook finds them among
    # the container's bind mounts): no host path in the hook's arguments
    assert "--library" not in hook["args"]
    assert not [a for a in hook["args"] if str(a_host_lib(a100_host)) in a]
    assert not any(d["containerEdits"].get("hooks") for d in spec["devices"])
    assert list(official_validator().iter_errors(spec)) == []
    other = generate(a100_host, tmp_path / "b.json", "--hook-stage", "createContainer",
                     "--hook-socket", "/run/x.sock")
    [hook2] = other["containerEdits"]["hooks"]
    assert hook2["hookName"] == "createContainer"
    assert hook2["args"][:5] == ["nvhook-hook", "--socket", "/run/x.sock", "cdi-hook", "createContainer"]
    assert hook2["args"][5:] == hook["args"][3:]
    assert list(official_validator().iter_errors(other)) == []


def a_host_lib(host: Path) -> Path:
    return host / "usr/lib/x86_64-linux-gnu"


@pytest.mark.parametrize("bad, why", [
    (["--hook-stage", "prestart"], "invalid choice"),
    (["--hook-socket", "relative.sock"], "must be an absolute path"),
])
def test_generate_refuses_bad_hook_options(a100_host, tmp_path, bad, why):
    r = run([NVHOOK, "cdi", "generate", "--driver-root", str(a100_host), "-o", str(tmp_path / "x.json"), *bad])
    assert r.returncode != 0 and why in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "x.json").exists()


# -- exec'd (no service) -------------------------------------------------------------------

def image_cache(rootfs: Path, cache: bool) -> None:
    """An image whose ld.so.cache (if `cache`: made by ldconfig -r, as real images have
    one) is stale: /opt/extra, listed in its ld.so.conf after the cache was made, holds
    a library the cache does not name. ldconfig (a full rescan) adds it; the in-process
    merge takes the image's cache as it is: ldconfig_ran() tells which ran."""
    if cache:
        subprocess.run(["/sbin/ldconfig", "-r", str(rootfs)], check=True, timeout=60)
    (rootfs / "opt/extra").mkdir(parents=True)
    (rootfs / "opt/extra/libresolv.so.2").write_bytes(
        (rootfs / "lib/x86_64-linux-gnu/libresolv.so.2").read_bytes())
    (rootfs / "etc/ld.so.conf.d/extra.conf").write_text("/opt/extra\n")


def ldconfig_ran(rootfs: Path) -> bool:
    return b"/opt/extra/libresolv.so.2" in (rootfs / "etc/ld.so.cache").read_bytes()


@pytest.mark.parametrize("cache", ["image cache", "no cache"])
@pytest.mark.parametrize("mode", ["v1", "v2"])
def test_runc_runs_the_entry_at_create_runtime(tmp_path, specs, a100_host, gpu_uuids, mode, cache,
                                               no_leaked_mounts):
    """Exec'd; the spec's libraries (--library) merged into the image's ld.so.cache
    in-process where it has one (ldconfig not run: the stale entry stays out), ldconfig
    where not."""
    with cdi_container(tmp_path, specs["none"], mode=mode) as c:
        image_cache(c.rootfs, cache == "image cache")
        r = c.run()
        ran_ldconfig = ldconfig_ran(c.rootfs)
    assert r.returncode == 0, r.stdout + r.stderr
    assert_gpu1(r.stdout + r.stderr, a100_host, gpu_uuids)
    assert ran_ldconfig == (cache == "no cache")


def test_crun_runs_the_entry_at_create_runtime(tmp_path, specs, a100_host, gpu_uuids):
    c = cdi_container(tmp_path, specs["none"])
    c.write_config()
    r = hookenv.crun_run(c.bundle, c.id, tmp_path / "crun")
    assert r.returncode == 0, r.stdout + r.stderr
    assert_gpu1(r.stdout + r.stderr, a100_host, gpu_uuids)


def test_the_createContainer_variant_does_the_same(tmp_path, a100_host, gpu_uuids):
    """`--hook-stage createContainer`: the same steps from inside the container's mount
    namespace (the fallback for engines that run createRuntime hooks elsewhere)."""
    d = tmp_path / "specs"
    d.mkdir()
    generate(a100_host, d / "nvidia.json", "--hook-stage", "createContainer", "--hook-socket", "none")
    with cdi_container(tmp_path, d) as c:
        image_cache(c.rootfs, True)
        r = c.run()
        merged = not ldconfig_ran(c.rootfs)
    assert r.returncode == 0, r.stdout + r.stderr
    assert_gpu1(r.stdout + r.stderr, a100_host, gpu_uuids)
    assert merged       # the spec's libraries found among the mounts there too


def test_the_containers_own_mounts_in_a_library_dir(tmp_path, specs, a100_host, gpu_uuids):
    """The hook takes the libraries to merge from the container's bind mounts (the spec
    no longer lists them), so the container's config chooses what is looked at. Attack:
    a config that also binds a FIFO, a device node and a directory into the library dir
    under library names. None is opened (a FIFO's open would hang the hook, a device's
    could act): the GPU start goes on, merged, without entries for them; a real ELF
    library a user binds there gets its entry, as ldconfig would give it."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    lib = tmp_path / "libzextra.so.1"
    lib.write_bytes(Path("/lib/x86_64-linux-gnu/libz.so.1").read_bytes())   # SONAME libz.so.1
    (tmp_path / "adir").mkdir()
    d = "/usr/lib/x86_64-linux-gnu"
    with cdi_container(tmp_path, specs["none"]) as c:
        # an image whose cache covers the library dir (else, with files there that are
        # not the spec's, ldconfig runs, and on a FIFO it waits out its timeout: that
        # image's own start, as before)
        (c.rootfs / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
        shutil.copy(c.rootfs / "lib/x86_64-linux-gnu/libresolv.so.2", c.rootfs / d.lstrip("/"))
        image_cache(c.rootfs, True)
        c.config["mounts"] += [
            {"destination": f"{d}/libfifo.so.1", "source": str(fifo), "type": "bind", "options": ["bind"]},
            {"destination": f"{d}/libnull.so.1", "source": "/dev/null", "type": "bind", "options": ["bind"]},
            {"destination": f"{d}/libdir.so.1", "source": str(tmp_path / "adir"), "type": "bind",
             "options": ["rbind"]},
            {"destination": "/opt/extra/libresolv.so.2", "source": str(lib), "type": "bind",
             "options": ["bind", "ro"]},        # not in a --folder: not ours to add
            {"destination": f"{d}/libzextra.so.1", "source": str(lib), "type": "bind", "options": ["bind", "ro"]},
        ]
        t0 = time.monotonic()
        r = c.run()
        took = time.monotonic() - t0
        cache = (c.rootfs / "etc/ld.so.cache").read_bytes()
    assert r.returncode == 0, r.stdout + r.stderr
    assert took < 30
    assert_gpu1(r.stdout + r.stderr, a100_host, gpu_uuids)
    assert b"/opt/extra/libresolv.so.2" not in cache                   # merged, not ldconfig
    assert f"{d}/libcuda.so.1".encode() in cache
    assert f"{d}/libz.so.1".encode() in cache                           # libzextra's SONAME
    for name in (b"libfifo.so.1", b"libnull.so.1", b"libdir.so.1"):
        assert name not in cache


def _tree(d: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(d)), p.lstat().st_mode) for p in d.rglob("*"))


def test_entry_run_at_another_stage_is_refused(tmp_path, specs):
    """Attack/misuse: the createRuntime entry run where the state's pid is not the
    container's process as the runtime sees it (runc's createContainer says pid 1:
    from the runtime's /proc that is the host's init). Old
    code took no such entry; without the check the hook would enter pid 1's mount
    namespace (the host's) and mount there. Refused with one line, nothing done."""
    before = host_mounts()
    c = cdi_container(tmp_path, specs["none"], stage="createContainer")
    ours = _ours(c.rootfs)
    with c:
        with pytest.raises(RuncError) as e:
            c.create()
        after = _ours(c.rootfs)
    lines = [ln for ln in str(e.value).split("stderr: ")[-1].splitlines() if ln.strip()]
    assert "nvhook: cdi-hook createRuntime: container process 1 is not a child of the runtime" \
        in str(e.value), e.value
    assert "Traceback" not in str(e.value) and len(lines) == 1, e.value
    assert host_mounts() == before
    assert after == ours        # (runc itself made the spec's mount targets)


def _ours(rootfs: Path) -> tuple:
    """What the hook writes in a rootfs: the symlinks, the ld cache and its conf dir."""
    lib = rootfs / "usr/lib/x86_64-linux-gnu"
    cache = rootfs / "etc/ld.so.cache"
    return ((lib / "libcuda.so").is_symlink(), cache.exists() and cache.read_bytes(),
            sorted(p.name for p in (rootfs / "etc/ld.so.conf.d").iterdir()),
            (rootfs / "proc/driver").exists())


def _forged(tmp_path: Path, rootfs: Path, pid: int) -> subprocess.CompletedProcess[str]:
    """The spec's entry run by hand with a state naming `pid` (the runtime's parent
    check is what stands between it and that process's mount namespace)."""
    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    (bundle / "config.json").write_text(json.dumps(
        {"ociVersion": "1.0.2", "process": {"args": ["true"]}, "root": {"path": str(rootfs)},
         "linux": {"devices": [{"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1}],
                   "resources": {"devices": [{"allow": True, "access": "rwm"}]}}}))
    state = json.dumps({"ociVersion": "1.0.2", "id": "forged", "status": "creating", "pid": pid,
                        "bundle": str(bundle)})
    return subprocess.run([hookenv.ensure_front(), "--socket", "none", "cdi-hook", "createRuntime",
                           "--link", "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so",
                           "--folder", "/usr/lib/x86_64-linux-gnu"],
                          input=state, capture_output=True, text=True, timeout=120, env={})


def _settled_child(victim: subprocess.Popen) -> int:
    """The pid of `unshare --fork`'s child once it runs sleep: it makes its mounts private
    after the fork, so reading them before that races with it."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        kids = Path(f"/proc/{victim.pid}/task/{victim.pid}/children").read_text().split()
        if kids and Path(f"/proc/{kids[0]}/comm").read_text() == "sleep\n":
            return int(kids[0])
        time.sleep(0.005)
    raise TimeoutError("unshare's child did not start sleep")


def test_a_state_naming_another_process_is_refused(tmp_path, rootfs):
    """Attack: a state whose pid is a process in its own mount namespace that is not a
    child of the hook's runtime (here: a grandchild of ours, in `unshare -m`): the
    hook would otherwise enter that namespace and write the rootfs path there. Refused
    with one line; the rootfs and that namespace are untouched."""
    victim = subprocess.Popen(["unshare", "-m", "--fork", "--propagation", "private", "sleep", "60"])
    try:
        pid = _settled_child(victim)
        tree = _tree(rootfs)
        r = _forged(tmp_path, rootfs, pid)
        assert r.returncode == 1, r.stderr
        assert r.stderr == (f"nvhook: cdi-hook createRuntime: container process {pid} is not a child "
                            "of the runtime that ran the hook (not run as a createRuntime hook?)\n")
        assert _tree(rootfs) == tree
        r = _forged(tmp_path, rootfs, 0)
        assert r.returncode == 1 and r.stderr.startswith(
            "nvhook: cdi-hook createRuntime: the container state has no pid"), r.stderr
    finally:
        victim.kill()
        victim.wait(30)


@pytest.mark.parametrize("argv, why", [
    (["--link", "nolink"], "invalid --link 'nolink'"),
    (["--folder", "relative"], "invalid --folder 'relative'"),
    (["--rootfs", "/x"], "takes the container from its state: no --rootfs"),
    (["--library", "lib.so::/usr/lib/lib.so"], "invalid --library 'lib.so::/usr/lib/lib.so'"),
    (["--bogus", "x"], "unrecognized arguments"),
])
def test_bad_entries_say_one_line(argv, why):
    r = subprocess.run([hookenv.ensure_front(), "--socket", "none", "cdi-hook", "createRuntime", *argv],
                       input="{}", capture_output=True, text=True, timeout=60, env={})
    assert r.returncode in (1, 2) and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    # ours: one line; argparse's (exit 2): its usage, then its one error line
    assert why in lines[-1] and (r.returncode == 2 or len(lines) == 1), r.stderr


# -- served (`nvhook serve`) ------------------------------------------------------------------

@pytest.fixture
def cdi_server(hook_config):
    """`nvhook serve` on SOCKET (the served spec's hooks try it)."""
    import shutil

    from support.serve import Serve

    SOCKET.parent.parent.mkdir(mode=0o755, exist_ok=True)
    s = Serve(hook_config, SOCKET)
    try:
        yield s
    finally:
        assert s.stop() == 0, s.log()
        shutil.rmtree(SOCKET.parent.parent, ignore_errors=True)


def test_served_at_create_runtime(tmp_path, specs, a100_host, gpu_uuids, cdi_server, no_leaked_mounts):
    """runc in the service's namespaces: the front hands `cdi-hook createRuntime` to the
    service, whose worker does every step (no Python started for the container), and the
    container sees what the exec'd hook gives it."""
    for cache in (False, True):
        with cdi_container(tmp_path, specs["served"]) as c:
            image_cache(c.rootfs, cache)
            r = c.run()
            ran_ldconfig = ldconfig_ran(c.rootfs)
        assert r.returncode == 0, r.stdout + r.stderr
        assert_gpu1(r.stdout + r.stderr, a100_host, gpu_uuids)
        assert ran_ldconfig != cache        # merged in-process where the image has a cache
    assert cdi_server.statuses(2) == [0, 0], cdi_server.log()
    assert "imported after fork" not in cdi_server.log()
    assert "declined" not in cdi_server.log()


def test_served_failure_is_the_hooks_one_line(tmp_path, specs, cdi_server):
    """A served request the hook refuses (its entry run at createContainer by a confused
    engine is not even sent: a createContainer stage never is; here a bad link) fails
    the create with the worker's one line, as the exec'd hook would."""
    from libinject.apply.spec import apply_cdi

    c = RuncContainer(tmp_path, args=["true"], env=ENV)
    edits = cdi_edits(specs["served"], "1")
    apply_cdi(c.config, edits)
    entry = c.config["hooks"]["createRuntime"][0]
    i = entry["args"].index("--link")
    entry["args"][i + 1] = "libcuda.so.1::relative/libcuda.so"
    with c:
        with pytest.raises(RuncError) as e:
            c.create()
    assert "nvhook: invalid --link 'libcuda.so.1::relative/libcuda.so'" in str(e.value), e.value
    assert cdi_server.statuses(1) == [1], cdi_server.log()


def test_outside_the_service_namespace_the_front_does_it_itself(tmp_path, specs, a100_host,
                                                                gpu_uuids, cdi_server):
    """runc in a private mount namespace (v2 mode): the service refuses the peer, the
    front execs Python, the container is the same."""
    with cdi_container(tmp_path, specs["served"], mode="v2") as c:
        r = c.run()
    assert r.returncode == 0, r.stdout + r.stderr
    assert_gpu1(r.stdout + r.stderr, a100_host, gpu_uuids)
    assert cdi_server.statuses() == [], cdi_server.log()


def test_served_state_naming_another_process_is_refused(tmp_path, rootfs, cdi_server):
    """Attack on the service: a root peer in its namespaces (so one it serves) sends the
    CDI request with a state naming a process that is not a child of the peer's parent
    (a process in a mount namespace of its own). The worker refuses it with one line
    before entering anything; that namespace and the rootfs are untouched."""
    from support import serve_client

    victim = subprocess.Popen(["unshare", "-m", "--fork", "--propagation", "private", "sleep", "60"])
    try:
        pid = _settled_child(victim)
        victim_mounts = Path(f"/proc/{pid}/mountinfo").read_text()
        bundle = tmp_path / "bundle"
        bundle.mkdir()
        (bundle / "config.json").write_text(json.dumps(
            {"ociVersion": "1.0.2", "process": {"args": ["true"]}, "root": {"path": str(rootfs)}}))
        state = json.dumps({"ociVersion": "1.0.2", "id": "forged", "status": "creating", "pid": pid,
                            "bundle": str(bundle)}).encode()
        ours = _ours(rootfs)
        out: list[bytes] = []
        code = serve_client.call(str(SOCKET), ["nvhook-hook", "--socket", str(SOCKET), "cdi-hook",
                                               "createRuntime", "--link",
                                               "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so"],
                                 state, output=out)
        assert code == 1, (code, out, cdi_server.log())
        assert out == [f"nvhook: cdi-hook createRuntime: container process {pid} is not a child of "
                       "the runtime that ran the hook (not run as a createRuntime hook?)\n".encode()]
        assert _ours(rootfs) == ours
        assert Path(f"/proc/{pid}/mountinfo").read_text() == victim_mounts
    finally:
        victim.kill()
        victim.wait(30)


def test_create_container_entries_are_never_sent(tmp_path, a100_host, gpu_uuids, cdi_server):
    """`--hook-stage createContainer` with the service's socket: the front never asks
    (that stage runs in the container's namespaces); the exec'd hook does the work."""
    d = tmp_path / "specs"
    d.mkdir()
    generate(a100_host, d / "nvidia.json", "--hook-stage", "createContainer", "--hook-socket", str(SOCKET))
    with cdi_container(tmp_path, d) as c:
        r = c.run()
    assert r.returncode == 0, r.stdout + r.stderr
    assert_gpu1(r.stdout + r.stderr, a100_host, gpu_uuids)
    assert cdi_server.statuses() == [] and "declined" not in cdi_server.log(), cdi_server.log()


# -- CUDA forward compat (NVIDIA's enable-cuda-compat hook) -------------------------------

@pytest.mark.parametrize("compat_major", [999, 500], ids=["newer", "older"])
def test_cuda_forward_compat_in_cdi_mode(tmp_path, specs, compat_major):
    """NVIDIA: nvidia-ctk's spec runs `enable-cuda-compat --host-driver-version=V` (toolkit
    internal/discover/compat_libs.go): an image's /usr/local/cuda/compat libcuda newer
    than the driver goes first in its loader's search. nvhook's one hook does it with
    --cuda-compat-driver-major (the spec has it from the driver, 550 here): a compat
    libcuda.so.999.x is what the image's ld cache names; a 500.x one is left out."""
    from support.applyenv import HOST_LDCONFIG, elf

    spec = json.loads((specs["none"] / "nvidia.json").read_text())
    [hook] = spec["containerEdits"]["hooks"]
    at = hook["args"].index("--cuda-compat-driver-major")
    assert hook["args"][at + 1] == "550"
    with cdi_container(tmp_path, specs["none"], script="true") as c:
        compat = c.rootfs / "usr/local/cuda/compat"
        compat.mkdir(parents=True)
        elf(compat / f"libcuda.so.{compat_major}.1.1", "libcuda.so.1")
        r = c.run()
        cache = subprocess.run([HOST_LDCONFIG, "-p", "-C", str(c.rootfs / "etc/ld.so.cache")],
                               capture_output=True, text=True).stdout
    assert r.returncode == 0, r.stdout + r.stderr
    first = [ln.split("=> ")[1] for ln in cache.splitlines() if "libcuda.so.1 (libc6,x86-64)" in ln][0]
    assert first == ("/usr/local/cuda/compat/libcuda.so.1" if compat_major == 999
                     else "/usr/lib/x86_64-linux-gnu/libcuda.so.1"), cache
