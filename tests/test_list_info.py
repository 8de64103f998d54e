"""`nvhook list` and `nvhook info` on every simulated profile, checked line by line."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from libinject.sim.profile import list_profiles
from support.cli import nvhook_caller
from support.simhost import compile_lib, ldconfig, profile_of

PROFILES = list_profiles()
ORDER_BINS = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager",
              "nvidia-cuda-mps-control", "nvidia-cuda-mps-server")


@pytest.fixture
def nvhook(tmp_path):
    return nvhook_caller(tmp_path)


def _gpus(prof: dict) -> list[dict]:
    return sorted(prof["gpus"], key=lambda g: g["bus_id"])


def _minors(root: Path) -> dict[str, int]:
    from libinject.discover.migminors import MIG_MINORS, read_mig_minors
    return read_mig_minors(str(root / MIG_MINORS))


def _cap(minors: dict[str, int], gpu_minor: int, gi: int, ci: int | None = None) -> str:
    key = f"gpu{gpu_minor}/gi{gi}/access" if ci is None else f"gpu{gpu_minor}/gi{gi}/ci{ci}/access"
    return f"/dev/nvidia-caps/nvidia-cap{minors[key]}"


def _libs(root: Path, prof: dict, i386: bool) -> list[str]:
    from libinject.discover.libraries import LIBRARIES

    ver = prof["driver_version"]
    d = "/usr/lib/i386-linux-gnu" if i386 else "/usr/lib/x86_64-linux-gnu"
    have = {lib["name"]: f"{lib['name']}.so.{lib.get('version') or ver}"
            for lib in prof["libraries"] if (lib["i386"] or not i386)
            and lib["name"] != "libnvidia-sandboxutils"}   # host-side only, as nvidia-container-cli
    fixed = [p.split(".so")[0] for p, _ in LIBRARIES]
    out = [f"{d}/{have[n]}" for n in dict.fromkeys(fixed) if n in have]
    out += sorted(f"{d}/{have[n]}" for n in have if n not in fixed)
    return out


def _graphics(root: Path, prof: dict) -> list[str]:
    """The graphics files the host has, in discovery's order (DATA_FILES, then X modules)."""
    from libinject.discover.graphics import DATA_DIRS, DATA_FILES, XORG_DIRS

    ver = prof["driver_version"]
    out = []
    for name, _ in DATA_FILES:
        name = name.format(ver=ver, arch=os.uname().machine)
        out += [f"/{d}/{name}" for d in DATA_DIRS if (root / d / name).is_file()][:1]
    for name in ("drivers/nvidia_drv.so", f"extensions/libglxserver_nvidia.so.{ver}"):
        out += [f"/{XORG_DIRS[0][0]}/{name}"] if (root / XORG_DIRS[0][0] / name).is_file() else []
    return out


def expected_list(root: Path, prof: dict, *, devices=True, migs=True, libs=True, compat32=True,
                  bins=True, ipcs=True, fw=True, graphics=True) -> str:
    minors = _minors(root)
    out = []
    if devices:
        out += ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
        out += ["/dev/nvidia-modeset"] if prof["modeset"] else []
        out += [f"/dev/nvidia{g['minor']}" for g in _gpus(prof)]
        if migs:
            for g in _gpus(prof):
                for m in g["mig"]:
                    gi = f"/proc/driver/nvidia/capabilities/gpu{g['minor']}/mig/gi{m['gi']}"
                    out += [f"{gi}/access", f"{gi}/ci{m['ci']}/access",
                            _cap(minors, g["minor"], m["gi"]), _cap(minors, g["minor"], m["gi"], m["ci"])]
    if bins:
        out += [f"/usr/bin/{b}" for b in ORDER_BINS if b in prof["binaries"]]
    if libs:
        out += _libs(root, prof, False)
        if compat32 and prof["compat32"]:
            out += _libs(root, prof, True)
    if ipcs:
        out += [p for p in ("/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket", "/tmp/nvidia-mps")
                if (root / p.lstrip("/")).exists()]
    if fw:
        out += [f"/lib/firmware/nvidia/{prof['driver_version']}/{n}" for n in sorted(prof["firmware"])]
    if graphics:
        if devices and prof.get("graphics"):
            out += [p for i, _ in enumerate(_gpus(prof)) for p in (f"/dev/dri/card{i}", f"/dev/dri/renderD{128 + i}")]
        out += _graphics(root, prof)
    return "".join(f"{p}\n" for p in out)


def expected_info(prof: dict, mig: bool = False) -> str:
    row = "{:<15} {}\n"
    out = row.format("NVRM version:", prof["driver_version"]) + row.format("CUDA version:", prof["cuda_version"])
    for i, g in enumerate(_gpus(prof)):
        out += "\n" + "".join(row.format(k, v) for k, v in (
            ("Device Index:", i), ("Device Minor:", g["minor"]), ("Model:", g["name"]), ("Brand:", g["brand"]),
            ("GPU UUID:", g["uuid"]), ("Bus Location:", g["bus_id"].lower()),
            ("Architecture:", f"{g['cc'][0]}.{g['cc'][1]}")))
        for j, m in enumerate(g["mig"] if mig else ()):
            out += row.format("MIG Device:", f"{i}:{j} {m['uuid']} {m['name']} (GI {m['gi']}, CI {m['ci']})")
    return out


@pytest.mark.parametrize("profile", PROFILES)
def test_full_list(sim_host, nvhook, profile):
    root = sim_host(profile)
    prof = profile_of(root)
    r = nvhook("--root", str(root), "list")
    assert (r.returncode, r.stderr) == (0, "")
    # as nvidia-container-cli list: no graphics files nor DRM nodes (those: --graphics)
    assert r.stdout == expected_list(root, prof, graphics=False)
    # warm (snapshot) run prints the same
    assert nvhook("--root", str(root), "list").stdout == r.stdout


@pytest.mark.parametrize("profile", PROFILES)
def test_info(sim_host, nvhook, profile):
    root = sim_host(profile)
    prof = profile_of(root)
    r = nvhook("--root", str(root), "info")
    # as nvidia-container-cli info (cli/info.c): GPUs only; --mig adds their MIG devices
    assert (r.returncode, r.stderr, r.stdout) == (0, "", expected_info(prof))
    r = nvhook("--root", str(root), "info", "--mig")
    assert (r.returncode, r.stderr, r.stdout) == (0, "", expected_info(prof, mig=True))
    if profile == "h100x8-mig":
        assert "MIG Device:" in r.stdout
    csv = nvhook("--root", str(root), "info", "--csv").stdout.split("\n\n")
    assert csv[0] == f"NVRM version,CUDA version\n{prof['driver_version']},{prof['cuda_version']}"
    rows = csv[1].splitlines()
    assert rows[0] == "Device Index,Device Minor,Model,Brand,GPU UUID,Bus Location,Architecture"
    assert rows[1:] == [f"{i},{g['minor']},{g['name']},{g['brand']},{g['uuid']},{g['bus_id'].lower()},"
                        f"{g['cc'][0]}.{g['cc'][1]}" for i, g in enumerate(_gpus(prof))]
    doc = json.loads(nvhook("--root", str(root), "info", "--json").stdout)
    assert doc["root"] == str(root) and [g["uuid"] for g in doc["gpus"]] == [g["uuid"] for g in _gpus(prof)]


@pytest.mark.parametrize("profile", PROFILES)
def test_compat32_and_parts(sim_host, nvhook, profile):
    root = sim_host(profile)
    prof = profile_of(root)
    kw = dict(devices=False, bins=False, ipcs=False, fw=False, graphics=False)
    r = nvhook("--root", str(root), "list", "--libraries")
    assert r.stdout == expected_list(root, prof, compat32=False, **kw)
    assert "/i386-linux-gnu/" not in r.stdout
    r = nvhook("--root", str(root), "list", "--libraries", "--compat32")
    assert r.stdout == expected_list(root, prof, **kw)
    assert ("/usr/lib/i386-linux-gnu/" in r.stdout) == prof["compat32"]
    r = nvhook("--root", str(root), "list", "-b", "-i", "-f", "--no-persistenced", "--no-gsp-firmware")
    assert "persistenced/socket" not in r.stdout and "/lib/firmware" not in r.stdout
    assert "/usr/bin/nvidia-smi\n" in r.stdout and "/usr/lib" not in r.stdout


def test_mig_selection(sim_host, nvhook):
    root = sim_host("h100x8-mig")
    prof = profile_of(root)
    g = _gpus(prof)
    minors = _minors(root)
    m = g[1]["mig"][2]
    r = nvhook("--root", str(root), "list", "--device", f"1:2,{g[0]['mig'][0]['uuid'].upper()}")
    gi1 = f"/proc/driver/nvidia/capabilities/gpu1/mig/gi{m['gi']}"
    gi0 = f"/proc/driver/nvidia/capabilities/gpu0/mig/gi{g[0]['mig'][0]['gi']}"
    assert r.stdout.splitlines() == [
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia1", "/dev/nvidia0",
        f"{gi1}/access", f"{gi1}/ci{m['ci']}/access",
        _cap(minors, 1, m["gi"]), _cap(minors, 1, m["gi"], m["ci"]),
        f"{gi0}/access", f"{gi0}/ci0/access",
        _cap(minors, 0, g[0]["mig"][0]["gi"]), _cap(minors, 0, g[0]["mig"][0]["gi"], 0),
    ]
    # --mig-config all lists the config capability and all of each MIG-capable GPU's minors
    r = nvhook("--root", str(root), "list", "--device", "0", "--mig-config", "all")
    lines = r.stdout.splitlines()
    assert lines[:6] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0",
                         "/proc/driver/nvidia/capabilities/mig/config", f"/dev/nvidia-caps/nvidia-cap{minors['config']}"]
    # the GPU's capability dir: NV_GPU_CAPS_PATH, as nvidia-container-cli list prints it
    # (libnvidia-container cli/list.c: mig_config_devices.gpus[i]->mig_caps_path)
    assert lines[6:8] == ["/proc/driver/nvidia/capabilities/gpu0", "/dev/nvidia-caps"]
    assert lines[8:] == [f"/dev/nvidia-caps/nvidia-cap{v}" for k, v in minors.items() if k.startswith("gpu0/")]
    r = nvhook("--root", str(root), "list", "--device", "0:0", "--mig-monitor", "all")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == "nvhook: mig-monitor error: all: cannot enable mig-monitor with specific MIG devices selected\n"


def test_imex_channels(fresh_sim_host, nvhook):
    root = fresh_sim_host("t4x1")
    d = root / "dev/nvidia-caps-imex-channels"
    d.mkdir()
    for n in (0, 3):
        os.mknod(d / f"channel{n}", 0o666 | 0o020000, os.makedev(237, n))
    # --imex-channel alone still lists everything (as nvidia-container-cli), plus the channel
    r = nvhook("--root", str(root), "list", "--imex-channel", "3")
    lines = r.stdout.splitlines()
    assert "/dev/nvidia0" in lines and "/usr/bin/nvidia-smi" in lines
    assert lines[lines.index("/dev/nvidia0") + 1] == "/dev/nvidia-caps-imex-channels/channel3"
    assert "channel0" not in r.stdout
    r = nvhook("--root", str(root), "list", "-d", "none", "--imex-channel", "all")
    assert r.stdout.splitlines()[-2:] == ["/dev/nvidia-caps-imex-channels/channel0",
                                          "/dev/nvidia-caps-imex-channels/channel3"]
    r = nvhook("--root", str(root), "list", "--imex-channel", "x")
    assert (r.returncode, r.stderr) == (1, "nvhook: invalid IMEX channel: x\n")


def test_imex_channel_listed_without_its_node(sim_host, nvhook):
    """nvidia-container-cli list prints NV_CAPS_IMEX_DEVICE_PATH for every channel id it
    parsed, whether or not the node exists (libnvidia-container cli/list.c), and
    `--imex-channel=0` alone lists everything besides (argc 2 with --imex-channel)."""
    root = sim_host("t4x1")
    assert not (root / "dev/nvidia-caps-imex-channels").exists()
    r = nvhook("--root", str(root), "list", "--imex-channel=0")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[lines.index("/dev/nvidia0") + 1] == "/dev/nvidia-caps-imex-channels/channel0"
    assert "/usr/bin/nvidia-smi" in lines
    doc = json.loads(nvhook("--root", str(root), "list", "--imex-channel", "5", "--json").stdout)
    assert {"kind": "imex-channel", "path": "/dev/nvidia-caps-imex-channels/channel5", "host_path": None,
            "channel": 5} in doc["items"]


@pytest.mark.parametrize("flag", ["--compat32", "--no-persistenced", "--no-fabricmanager", "--no-gsp-firmware"])
def test_modifier_flags_alone_list_nothing(sim_host, nvhook, flag):
    """nvidia-container-cli list lists everything only when given no option (cli/list.c,
    ARGP_KEY_END: state->argc == 1, or 2 with --imex-channel); a modifier alone selects
    nothing, so it prints nothing."""
    root = sim_host("a100x8")
    r = nvhook("--root", str(root), "list", flag)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert nvhook("--root", str(root), "list").stdout.count("\n") > 20   # no option at all: everything


def test_extra_library_listed_with_capability(fresh_sim_host, nvhook):
    root = fresh_sim_host("t4x1")
    ver = profile_of(root)["driver_version"]
    lib = root / "usr/lib/x86_64-linux-gnu"
    compile_lib(lib / f"libnvidia-foo.so.{ver}", "libnvidia-foo.so.1")
    compile_lib(lib / "libnvidia-foo2.so.999.1", "libnvidia-foo2.so.1")
    ldconfig(root)
    r = nvhook("--root", str(root), "list", "--libraries")
    assert f"/usr/lib/x86_64-linux-gnu/libnvidia-foo.so.{ver}\n" in r.stdout
    assert "foo2" not in r.stdout
    doc = json.loads(nvhook("--root", str(root), "list", "--libraries", "--json").stdout)
    (foo,) = [i for i in doc["items"] if i["path"].endswith(f"libnvidia-foo.so.{ver}")]
    assert foo == {"kind": "library", "path": f"/usr/lib/x86_64-linux-gnu/libnvidia-foo.so.{ver}",
                   "host_path": f"{root}/usr/lib/x86_64-linux-gnu/libnvidia-foo.so.{ver}",
                   "soname": "libnvidia-foo.so.1", "capability": "utility", "arch": "x86-64", "extra": True}
    assert doc["library_source"] == f"ldcache {root}/etc/ld.so.cache"


def test_list_json_has_host_paths(sim_host, nvhook):
    root = sim_host("a100x8")
    text = nvhook("--root", str(root), "list").stdout.splitlines()
    doc = json.loads(nvhook("--root", str(root), "list", "--json").stdout)
    assert [i["path"] for i in doc["items"]] == text
    for i in doc["items"]:
        if i["kind"] in ("library", "binary", "firmware", "ipc"):
            assert i["host_path"] == f"{root}{i['path']}"


@pytest.mark.parametrize("args,msg", [
    (["list", "--device", "GPU-nope"], "nvhook: unknown device: GPU-nope\n"),
    (["list", "--device", "0,8"], "nvhook: unknown device: 8\n"),
])
def test_errors_one_line_exit_1(sim_host, nvhook, args, msg):
    r = nvhook("--root", str(sim_host("a100x8")), *args)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", msg)


def test_unreadable_root_and_missing_nvml(tmp_path, fresh_sim_host, nvhook):
    r = nvhook("--root", str(tmp_path / "absent"), "info")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == f"nvhook: cannot read driver root {tmp_path}/absent: No such file or directory\n"
    root = fresh_sim_host("t4x1")
    for p in (root / "usr/lib/x86_64-linux-gnu").glob("libnvidia-ml.so*"):
        p.unlink()
    r = nvhook("--root", str(root), "list")
    assert r.returncode == 1 and r.stderr.startswith(f"nvhook: NVML not found under driver root {root}")
    assert r.stderr.count("\n") == 1
    for p in ("etc/ld.so.cache",):
        (root / p).unlink()
    r = nvhook("--root", str(root), "info")
    assert r.returncode == 1 and r.stderr.startswith(f"nvhook: NVML not found under driver root {root}")


def test_nvml_failure_is_one_line(fresh_sim_host, nvhook):
    root = fresh_sim_host("t4x1")
    (root / "etc/nvhook-sim/nvml.conf").write_text("error = DRIVER_NOT_LOADED\n")
    r = nvhook("--root", str(root), "info")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == f"nvhook: NVML on driver root {root} failed: Driver Not Loaded\n"
