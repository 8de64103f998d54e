"""`nvhook configure` end to end, for real: simulated hosts, busybox+glibc rootfs,
private mount namespaces, runc on cgroup v1 and v2."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import NVHOOK, run
from libinject.linux import mountinfo
from support import hookenv

VER = "550.163.01"
LIB = "/usr/lib/x86_64-linux-gnu"
FLAG_OF = {"ro": "ro", "nosuid": "nosuid", "nodev": "nodev", "noexec": "noexec"}


def nvhook(*args: str) -> list[str]:
    return [NVHOOK, *args]


def in_private_ns(script: str, timeout: float = 120):
    """Run a sh script in a fresh private mount namespace (nothing leaks to the host)."""
    return run(["unshare", "-m", "--propagation", "private", "sh", "-euc", script], timeout=timeout)


def q(*args: object) -> str:
    return " ".join(shlex.quote(str(a)) for a in args)


def dry_plan(host: Path, rootfs: Path, *flags: str) -> dict:
    r = run(nvhook("--root", str(host), "configure", "--dry-run", "--json", *flags, str(rootfs)))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def parse_mountinfo(text: str, under: Path) -> dict[str, frozenset[str]]:
    """mount point -> per-mount options, for mounts at or below `under`."""
    prefix = str(under)
    return {m.mountpoint: m.options for m in mountinfo.parse(text)
            if m.mountpoint == prefix or m.mountpoint.startswith(prefix + "/")}


def expected_mounts(edits: dict, rootfs: Path) -> dict[str, set[str]]:
    """mount point -> options the plan asks for (mountinfo's per-mount flags)."""
    exp: dict[str, set[str]] = {}
    r = str(rootfs)
    if edits["procfs"]:
        base = r + edits["procfs"]["path"]
        exp[base] = {"ro", "nosuid", "nodev", "noexec"}   # read-only: stricter than upstream
        for _host, name in edits["procfs"]["gpu_dirs"]:
            exp[f"{base}/gpus/{name}"] = {"ro", "nosuid", "nodev", "noexec"}
    for m in edits["mounts"]:
        exp[r + m["container_path"]] = {FLAG_OF[o] for o in m["options"] if o in FLAG_OF}
    for d in edits["device_nodes"]:
        exp[r + d["path"]] = {"ro", "nosuid", "noexec"}   # read-only, as NVIDIA's mount_device
    return exp


@pytest.fixture
def no_mounts_left(tmp_path):
    """Nothing mounted under this test's dirs in the host's namespace afterwards (the
    suite-wide no_leaked_mounts compares the whole table, which other tests running on
    the same machine change)."""
    yield
    left = [m.mountpoint for m in mountinfo.read() if m.mountpoint.startswith(str(tmp_path))]
    assert left == []


@pytest.fixture
def smi_rootfs(rootfs) -> Path:
    """The fixture rootfs plus the host's static ldconfig, to run `ldconfig -p` inside."""
    shutil.copy2("/sbin/ldconfig", rootfs / "sbin/ldconfig")
    return rootfs


def configure_and_look(host: Path, rootfs: Path, tmp: Path, *flags: str) -> dict[str, str]:
    """configure in a private namespace, then collect mountinfo, nvidia-smi -L and
    ldconfig -p from inside that namespace."""
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    script = f"""
{q(NVHOOK, "--root", host, "configure", *flags, rootfs)}
cat /proc/self/mountinfo > {q(out / "mountinfo")}
chroot {q(rootfs)} /usr/bin/nvidia-smi -L > {q(out / "smi")} 2>&1 || echo "rc=$?" >> {q(out / "smi")}
chroot {q(rootfs)} /sbin/ldconfig -p > {q(out / "ldconfig")}
ls -ln {q(rootfs)}/dev/nvidia-caps > {q(out / "caps")} 2>&1 || true
"""
    r = in_private_ns(script)
    assert r.returncode == 0, r.stderr
    return {p.name: p.read_text() for p in out.iterdir()}


def test_standalone_utility_compute(sim_host, smi_rootfs, tmp_path, no_mounts_left):
    host = sim_host("a100x8")
    flags = ("--device=1", "--utility", "--compute")
    edits = dry_plan(host, smi_rootfs, *flags)
    seen = configure_and_look(host, smi_rootfs, tmp_path, *flags)
    # Exactly the planned mounts, with the planned options.
    got = parse_mountinfo(seen["mountinfo"], smi_rootfs)
    exp = expected_mounts(edits, smi_rootfs)
    assert set(got) == set(exp)
    for mp, opts in exp.items():
        assert opts <= got[mp], (mp, opts, got[mp])
        if "ro" not in opts:
            assert "rw" in got[mp], mp
    # nvidia-smi inside sees GPU 1 only.
    uuids = hookenv.gpu_uuids(host)
    smi = seen["smi"]
    assert uuids[1] in smi, smi
    assert sum(u in smi for u in uuids) == 1, smi
    assert smi.count("GPU ") == 1
    # The injected libraries are in the container's ld.so.cache.
    for so in ("libnvidia-ml.so.1", "libcuda.so.1", "libcuda.so"):
        assert f"\t{so} " in seen["ldconfig"], seen["ldconfig"]
    assert "libGLX_nvidia" not in seen["ldconfig"]
    # Nothing of it visible outside the namespace, and the rootfs keeps only mount
    # targets (empty files/dirs), no host content.
    assert not (smi_rootfs / "proc/driver/nvidia/version").exists()


def test_graphics_adds_graphics_libraries(sim_host, smi_rootfs, tmp_path, no_mounts_left):
    host = sim_host("a100x8")
    base = dry_plan(host, smi_rootfs, "--device=0", "--utility", "--compute")
    gfx = dry_plan(host, smi_rootfs, "--device=0", "--utility", "--compute", "--graphics")
    libs = lambda e: {m["container_path"].rsplit("/", 1)[1] for m in e["mounts"] if m["kind"] == "library"}  # noqa: E731
    added = libs(gfx) - libs(base)
    assert libs(base) <= libs(gfx)
    for stem in ("libGLX_nvidia", "libEGL_nvidia", "libnvidia-glcore", "libnvidia-eglcore"):
        assert f"{stem}.so.{VER}" in added, added
    seen = configure_and_look(host, smi_rootfs, tmp_path, "--device=0", "--utility", "--compute", "--graphics")
    assert "libGLX_nvidia.so.0" in seen["ldconfig"] and "libEGL_nvidia.so.0" in seen["ldconfig"]
    # ldconfig lists names equal to a SONAME only; the GLVND link is a plain symlink,
    # left in the rootfs (as upstream's).
    assert os.readlink(smi_rootfs / "usr/lib/x86_64-linux-gnu/libGLX_indirect.so.0") == "libGLX_nvidia.so.0"


def test_mig_selection_gives_cap_nodes(sim_host, smi_rootfs, tmp_path, no_mounts_left):
    host = sim_host("h100x8-mig")
    from libinject.discover.driver import discover

    drv = discover(str(host))
    gpu = next(g for g in drv.info.gpus if g.mig_devices)
    mig = gpu.mig_devices[0]
    edits = dry_plan(host, smi_rootfs, f"--device={mig.uuid}", "--utility", "--compute")
    caps = {d["path"]: (d["major"], d["minor"]) for d in edits["device_nodes"] if d["kind"] == "mig"}
    assert set(caps) == {f"/dev/nvidia-caps/nvidia-cap{mig.gi_access_minor}",
                         f"/dev/nvidia-caps/nvidia-cap{mig.ci_access_minor}"}
    seen = configure_and_look(host, smi_rootfs, tmp_path, f"--device={mig.uuid}", "--utility", "--compute")
    # `ls -ln` of the container's /dev/nvidia-caps: exactly the planned nodes, each a
    # character device with the planned numbers ("crw... 1 0 0 236, 12 DATE nvidia-cap12")
    total, *lines = seen["caps"].splitlines()
    assert total.startswith("total "), seen["caps"]
    made = {}
    for line in lines:
        f = line.split()
        assert f[0].startswith("c") and f[4].endswith(","), line
        made[f[-1]] = (int(f[4].rstrip(",")), int(f[5]))
    assert made == {path.rsplit("/", 1)[1]: numbers for path, numbers in caps.items()}, seen["caps"]
    assert mig.uuid in seen["smi"], seen["smi"]
    assert str(smi_rootfs / f"dev/nvidia{gpu.minor}") in seen["mountinfo"]


@pytest.mark.parametrize("expr,msg", [
    ("cuda>=99.0", "nvhook: requirement error: unsatisfied condition: cuda>=99.0, please update your driver "
                   "to a newer version, or use an earlier cuda container"),
    ("brand=geforce", "nvhook: requirement error: unsatisfied condition: brand=geforce"),
    ("driver>=999 cuda>=99", "nvhook: requirement error: unsatisfied condition: driver>=999"),
    ("cuda>>12", "nvhook: requirement error: invalid expression"),
    ("gpu=1", "nvhook: requirement error: invalid expression"),
])
def test_requirement_failures(sim_host, rootfs, expr, msg, no_mounts_left):
    host = sim_host("a100x8")
    before = sorted(str(p) for p in rootfs.rglob("*"))
    r = run(nvhook("--root", str(host), "configure", "--device=0", "--utility", f"--require={expr}", str(rootfs)))
    assert r.returncode == 1
    assert r.stderr.strip() == msg
    assert sorted(str(p) for p in rootfs.rglob("*")) == before


def test_requirements_pass(sim_host, rootfs):
    host = sim_host("a100x8")
    r = run(nvhook("--root", str(host), "configure", "--dry-run", "--device=0", "--utility",
                   "--require=cuda>=12.0 brand=geforce", "--require=arch>=8.0,driver>=550",
                   "--require", "cuda>=99 cuda>=12.4", str(rootfs)))
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("args,msg", [
    (["--device=42"], "unknown device"),
    (["--cuda-compat-mode=bogus"], "invalid choice"),
])
def test_input_errors(sim_host, rootfs, args, msg):
    r = run(nvhook("--root", str(sim_host("a100x8")), "configure", *args, str(rootfs)))
    assert r.returncode != 0 and msg in r.stderr


@pytest.mark.parametrize("rootfs_arg", ["relative/rootfs", "/"])
def test_invalid_rootfs(sim_host, rootfs_arg):
    r = run(nvhook("--root", str(sim_host("a100x8")), "configure", "--utility", rootfs_arg))
    assert r.returncode == 1
    assert r.stderr.strip() == "nvhook: input error: invalid rootfs directory"


def test_dry_run_readable(sim_host, rootfs):
    r = run(nvhook("--root", str(sim_host("a100x8")), "configure", "--dry-run", "--device=all",
                   "--utility", "--compute", str(rootfs)))
    assert r.returncode == 0, r.stderr
    assert "/dev/nvidia7" in r.stdout and "libcuda.so" in r.stdout and "ldconfig" in r.stdout


def test_rpm_layout(sim_host, tmp_path):
    from libinject.sim.rootfs import build_rootfs

    rpm = build_rootfs(tmp_path / "rpm", lib_layout="rpm")
    e = dry_plan(sim_host("a100x8"), rpm, "--device=0", "--utility", "--compat32")
    assert {m["container_path"].rsplit("/", 1)[0] for m in e["mounts"] if m["kind"] == "library"} <= {"/usr/lib64", "/usr/lib"}
    assert e["ldconfig_folders"] == ["/usr/lib64", "/usr/lib"]


def test_failure_half_way_leaves_no_mount(sim_host, rootfs, tmp_path, no_mounts_left):
    """/run is a file in this image: the IPC mounts fail after procfs, binaries, libraries
    and firmware went in. Every one of them must be gone afterwards."""
    host = sim_host("a100x8")
    assert (host / "run/nvidia-persistenced/socket").exists()
    shutil.rmtree(rootfs / "run")
    (rootfs / "run").write_text("not a directory\n")
    edits = dry_plan(host, rootfs, "--device=0", "--utility", "--compute")
    assert any(m["kind"] == "ipc" and m["container_path"].startswith("/run/") for m in edits["mounts"])
    out = tmp_path / "mi"
    script = f"""
rc=0; {q(NVHOOK, "--root", host, "configure", "--device=0", "--utility", "--compute", rootfs)} 2> {q(tmp_path / "err")} || rc=$?
echo $rc > {q(tmp_path / "rc")}
cat /proc/self/mountinfo > {q(out)}
"""
    r = in_private_ns(script)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "rc").read_text().strip() == "1"
    err = (tmp_path / "err").read_text().strip()
    assert err.startswith("nvhook: ") and "\n" not in err, err
    assert parse_mountinfo(out.read_text(), rootfs) == {}
    assert (rootfs / "run").read_text() == "not a directory\n"


# --- runc: cgroup v1 and v2 -------------------------------------------------------------

HOOK = """import json, subprocess, sys
state = json.load(sys.stdin)
r = subprocess.run(sys.argv[1:-1] + ["--pid", str(state["pid"]), sys.argv[-1]])
sys.exit(r.returncode)
"""


def _runc_configure(tmp_path, host: Path, mode: str, extra: list[str]) -> dict[str, str]:
    from support.runc import RuncContainer

    hook = tmp_path / "hook.py"
    hook.write_text(HOOK)
    with RuncContainer(tmp_path, mode=mode,
                       devices=[("/dev/nvidia0", 195, 0), ("/dev/nvidia1", 195, 1)]) as c:
        argv = [sys.executable, "-I", str(hook), NVHOOK, "--root", str(host), "configure",
                "--device=1", "--utility", "--compute", *extra, str(c.rootfs)]
        c.config["hooks"] = {"prestart": [{"path": sys.executable, "args": argv,
                                           "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"], "timeout": 60}]}
        c.create()
        c.start()
        res = {p: c.open_result(p) for p in ("/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl")}
        smi = c.exec("nvidia-smi", "-L")
        res["smi"] = smi.stdout + smi.stderr
        return res


@pytest.mark.parametrize("mode", ["v1", "v2"])
def test_runc_selected_gpu_only(sim_host, tmp_path, mode, no_mounts_left):
    host = sim_host("a100x8")
    res = _runc_configure(tmp_path, host, mode, [])
    assert res["/dev/nvidia1"] == "ENXIO", res
    assert res["/dev/nvidia0"] == "EPERM", res
    assert res["/dev/nvidiactl"] == "ENXIO", res
    uuids = hookenv.gpu_uuids(host)
    assert uuids[1] in res["smi"] and uuids[0] not in res["smi"], res["smi"]


@pytest.mark.parametrize("mode", ["v1", "v2"])
def test_runc_no_cgroups(sim_host, tmp_path, mode, no_mounts_left):
    res = _runc_configure(tmp_path, sim_host("a100x8"), mode, ["--no-cgroups"])
    assert res["/dev/nvidia1"] == "EPERM", res
    assert res["/dev/nvidia0"] == "EPERM", res


# --- flags -> Request (pure) -----------------------------------------------------------

def _parse(*argv: str):
    import argparse

    from nvhook import cmd_configure

    p = argparse.ArgumentParser()
    p.add_argument("--user")
    cmd_configure.add_arguments(p, "configure")
    return p.parse_args(list(argv))


def test_cli_request_mapping():
    from libinject.request.cli_flags import build

    r = build(_parse("--device", "0,1", "-d", "GPU-abc", "--utility", "-c", "--require", "cuda>=12",
                     "-r", "brand=tesla", "--mig-config", "all", "--imex-channel", "1", "--imex-channel", "2",
                     "--no-cgroups", "--no-persistenced", "--ldconfig", "@/sbin/ldconfig.real",
                     "--cuda-compat-mode", "mount", "--user", "1000:1001", "/r"))
    assert r.devices == "0,1,GPU-abc"
    assert r.capabilities == frozenset({"utility", "compute"})
    assert r.requirements == ("cuda>=12", "brand=tesla")
    assert (r.mig_config, r.mig_monitor, r.imex_channels) == ("all", None, "1,2")
    assert r.no_cgroups and r.no_persistenced and not r.no_devbind
    assert r.ldconfig == "@/sbin/ldconfig.real" and r.cuda_compat_mode == "mount"
    # --user is discovery's (DiscoverOptions), not part of what the container asks for
    assert not hasattr(r, "user")


def test_cli_request_defaults():
    from libinject.request.cli_flags import build

    r = build(_parse("/r"))
    assert r.devices == "none"            # no --device: driver only, as nvidia-container-cli
    assert r.capabilities == frozenset()  # no capability flag: no libraries or binaries
    assert r.ldconfig == "@/sbin/ldconfig" and r.cuda_compat_mode == "ldconfig"
    assert r.requirements == ()


def test_driver_root_given_through_a_symlink(sim_host, rootfs, tmp_path):
    """/run/nvidia/driver is often a symlink: it is resolved once at discovery, so the
    applier (which follows no symlink in host source paths) still works."""
    link = tmp_path / "driver-link"
    link.symlink_to(sim_host("t4x1"))
    r = subprocess.run(["unshare", "-m", "--propagation", "private", NVHOOK, "--root", str(link),
                        "configure", "--device", "0", "--utility", "--no-cgroups", str(rootfs)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
