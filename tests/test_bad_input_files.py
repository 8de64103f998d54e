"""Hostile or broken files and values through the real CLI: config.toml (`--config F info`,
`serve`), sim profiles (`sim create --profile-file`). One clear `nvhook: ` line, a
non-zero exit, no hang, nothing created."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import NVHOOK, run
from support.cli import one_error


# --- config.toml ----------------------------------------------------------------------

def _info(cfg: Path, timeout: float = 30) -> subprocess.CompletedProcess:
    return run([NVHOOK, "--config", str(cfg), "info"], timeout=timeout)


@pytest.mark.parametrize("text, expected", [
    ("a = " + "[" * 100000 + "]" * 100000 + "\n", "invalid TOML: nested too deeply"),
    ("a = " + "{b=" * 5000 + "1" + "}" * 5000 + "\n", "invalid TOML: nested too deeply"),
    # tomllib is quadratic in a dotted key's parts: minutes for this one
    ("a" + ".a" * 100000 + " = 1\n", "invalid TOML: a key with more than"),
    ("[" + ".".join(["a"] * 100000) + "]\n", "invalid TOML: a key with more than"),
    ("[nvhook]\nnvml-timeout = " + "1" * 4000 + "\n", "nvhook.nvml-timeout: expected a number of seconds"),
    ('[nvidia-container-cli]\nroot = "/x\\u0000y"\n', "nvidia-container-cli.root: expected a string without NUL"),
    ('[nvidia-container-runtime]\nruntimes = ["runc\\u0000"]\n', "nvidia-container-runtime.runtimes"),
], ids=["deep-array", "deep-inline-table", "dotted-key", "dotted-table", "huge-int", "nul", "nul-in-list"])
def test_config_structure(tmp_path, text, expected):
    cfg = tmp_path / "config.toml"
    cfg.write_text(text)
    t0 = time.monotonic()
    one_error(_info(cfg), str(cfg), expected)
    assert time.monotonic() - t0 < 20


@pytest.mark.parametrize("key", ["nvml-timeout", "serve-timeout"])
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e308", "0", "0.0", "-1", "3601"])
def test_config_timeouts(tmp_path, a100_host, key, value):
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[nvidia-container-cli]\nroot = "{a100_host}"\n'
                   f"[nvhook]\nsnapshot = false\n{key} = {value}\n")
    one_error(_info(cfg), f"nvhook.{key}: expected a number of seconds > 0 and <= 3600")


def _serve(tmp_path: Path, cfg: Path, *args: str) -> subprocess.CompletedProcess:
    """`nvhook serve` that must refuse to start; one that starts is stopped by the timeout."""
    sock = tmp_path / "s" / "hook.sock"
    try:
        return run([NVHOOK, "--config", str(cfg), "serve", "--socket", str(sock), "--no-warm", *args],
                   timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail("nvhook serve started with a bad timeout")


@pytest.mark.parametrize("value", ["inf", "nan", "1e308", "0", "-1", "3601"])
def test_serve_timeout_flag(tmp_path, value):
    cfg = tmp_path / "config.toml"
    cfg.write_text("[nvhook]\nsnapshot = false\n")
    one_error(_serve(tmp_path, cfg, "--timeout", value), "--timeout: expected a number of seconds")
    assert not (tmp_path / "s").exists()


def test_serve_timeout_in_config(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text("[nvhook]\nsnapshot = false\nserve-timeout = inf\n")
    one_error(_serve(tmp_path, cfg), "nvhook.serve-timeout")
    assert not (tmp_path / "s").exists()


def test_config_fifo_or_device(tmp_path):
    """--config naming a FIFO nobody writes, or a device: an error at once, not a hang."""
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    one_error(_info(fifo, timeout=20), "cannot read config file", "a fifo, not a regular file")
    assert time.monotonic() - t0 < 15
    one_error(_info(Path("/dev/null")), "cannot read config file /dev/null: a char device")


# --- sim profiles ---------------------------------------------------------------------

GPU = {"name": "NVIDIA A100-SXM4-80GB", "cc": "8.0", "memory_mib": 81920}


def _profile(**changes) -> dict:
    gpu = dict(GPU)
    top: dict = {"gpus": [gpu]}
    for k, v in changes.items():
        if k.startswith("gpu_"):
            gpu[k[4:]] = v
        else:
            top[k] = v
    return top


def _create(tmp_path: Path, content: bytes | str | dict) -> subprocess.CompletedProcess:
    f = tmp_path / "profile.json"
    if isinstance(content, dict):
        content = json.dumps(content)
    f.write_bytes(content if isinstance(content, bytes) else content.encode())
    dest = tmp_path / "host"
    r = run([NVHOOK, "sim", "create", "--profile-file", str(f), str(dest)], timeout=120)
    if r.returncode != 0:
        assert not dest.exists()
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".host.tmp")]
    return r


@pytest.mark.parametrize("content, expected", [
    (b'{"gpus": [{"name": "caf\xe9", "cc": "8.0", "memory_mib": 1}]}', "not UTF-8"),
    ('{"gpus": ' + "[" * 100000 + "]" * 100000 + "}", "nested too deeply"),
    (_profile(gpu_uuid="GPU-12345678-1234-1234-1234-123456789abc\n"), "gpus[0].uuid: expected 'GPU-' uuid"),
    (_profile(gpu_name="NVIDIA A100\nModel: fake"), "gpus[0].name"),
    (_profile(gpu_bus_id="0000:07:00.0\n"), "gpus[0].bus_id"),
    (_profile(description="two\nlines"), "description: expected one printable line"),
    (_profile(description="x" * 100000), "description: expected one printable line"),
    (_profile(driver_version="550.163.01\n"), "driver_version"),
    (_profile(driver_version="٥٥٠.١٦٣.٠١"), "driver_version"),
    (_profile(driver_version="5" * 5000 + ".1"), "driver_version"),
    (_profile(cuda_version="١٢.4"), "cuda_version"),
    (_profile(gpu_cc="1" * 5000 + ".0"), "gpus[0].cc"),
    (_profile(gpu_cc="٨.٠"), "gpus[0].cc"),
    (_profile(gpu_memory_mib=10 ** 30), "gpus[0].memory_mib"),
    (_profile(gpu_pci_device_id=" 0x20B210DE\n"), "gpus[0].pci_device_id"),
    (_profile(firmware=["gsp.bin\n"]), "firmware[0]: expected a file name"),
    (_profile(firmware=[f"f{i}.bin" for i in range(10000)]), "firmware: at most"),
    (_profile(libraries=["libnvidia-ml", {"name": "libfoo\n"}]), "libraries[1].name"),
    ('{"gpus": [' + ",".join([json.dumps(GPU)] * 10 ** 5) + "]}", "larger than"),
    ('{"gpus": [{"name": "x", "cc": "8.0", "memory_mib": ' + "1" * 5000 + "}]}", "too many digits"),
], ids=["non-utf8", "deep", "uuid-newline", "name-newline", "busid-newline", "description-newline",
        "description-huge", "driver-newline", "driver-unicode-digits", "driver-5000-digits",
        "cuda-unicode-digits", "cc-5000-digits", "cc-unicode-digits", "memory-1e30",
        "pci-id-whitespace", "firmware-newline", "firmware-10^4", "library-newline",
        "gpus-10^5", "int-5000-digits"])
def test_profile(tmp_path, content, expected):
    one_error(_create(tmp_path, content), "profile", expected)


def test_profile_fifo(tmp_path):
    fifo = tmp_path / "p.json"
    os.mkfifo(fifo)
    r = run([NVHOOK, "sim", "create", "--profile-file", str(fifo), str(tmp_path / "host")], timeout=20)
    one_error(r, "cannot read profile", "a fifo, not a regular file")
    assert not (tmp_path / "host").exists()


# --- CDI spec files (cdi validate, cdi list) ---------------------------------------------------

BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
    for p, c in zip("abcdefghi", "bcdefghij")) + "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: [*j]\n"


@pytest.mark.parametrize("name, content, expected", [
    ("bomb.yaml", BOMB, "aliases are not supported"),
    ("deep.json", "[" * 100000 + "]" * 100000, "nested more than"),
    ("deep.yaml", "[" * 100000 + "]" * 100000, "nested too deeply"),
])
def test_cdi_spec_files(tmp_path, name, content, expected):
    d = tmp_path / "cdi"
    d.mkdir()
    (d / name).write_text(content)
    t = time.monotonic()
    r = run([NVHOOK, "cdi", "validate", str(d / name)], timeout=30)   # a report on stdout
    assert (r.returncode, r.stderr) == (1, "") and r.stdout.count("\n") == 1, r.stdout + r.stderr
    assert r.stdout.startswith(f"{d / name}: CDI spec ") and expected in r.stdout, r.stdout
    one_error(run([NVHOOK, "cdi", "list", "--spec-dir", str(d)], timeout=30), expected)
    assert time.monotonic() - t < 20
