"""NVIDIA_REQUIRE_* grammar and messages, as nvidia-container-cli's dsl.c."""
from __future__ import annotations

import pytest

from libinject.plan import require
from libinject.errors import NvhookError
from libinject.discover.model import DriverInfo, Gpu

INFO = DriverInfo(driver_version="550.163.01", cuda_version="12.4")


def gpu(index=0, cc=(8, 0), brand="Tesla") -> Gpu:
    return Gpu(index=index, minor=index, uuid=f"GPU-{index}", name="NVIDIA A100", brand=brand,
               bus_id=f"00000000:0{index}:00.0", cc=cc, architecture="Ampere", memory_total=1)


def facts(g: Gpu | None = None):
    return require.facts_for(INFO, g or gpu())


@pytest.mark.parametrize("v1,op,v2,want", [
    ("12.4", ">=", "12.4", True), ("12.4", ">=", "12.5", False), ("12.4", ">", "12.3", True),
    ("12.4", "<", "12.10", True), ("12.4", "=", "12.4.0", True), ("12.4", "=", "12", False),
    ("12.0", "=", "12", True), ("12.4", ">", "12", True), ("12", "<", "12.1", True),
    ("12.4", "!=", "12.4.0.0", False), ("12.4", "!=", "12.5", True), ("12.4", "<=", "12.4", True),
    ("550.163.01", ">=", "550.163.1", True), ("550.163.01", "<", "550.163.1", False),
    ("12.04", ">", "12", True), ("12.10", ">", "12.9", True), ("8.0", ">=", "8", True),
])
def test_compare_version(v1, op, v2, want):
    assert require.compare_version(v1, op, v2) is want


@pytest.mark.parametrize("bad", ["12a", "v12", "-1", "18446744073709551615", "1.x"])
def test_compare_version_invalid(bad):
    with pytest.raises(require.InvalidExpression):
        require.compare_version("12.4", ">=", bad)


@pytest.mark.parametrize("pred,want", [
    ("cuda>=12.4", True), ("cuda>=12.5", False), ("CUDA>=12.0", True),
    ("cuda>=12.5 cuda>=12.0", True),                      # space = OR
    ("cuda>=12.0,driver>=560", False),                    # comma = AND
    ("cuda>=12.0,driver>=550", True),
    ("cuda>=13 brand=tesla,driver>=550,driver<551", True),  # the CUDA images' style
    ("cuda>=13 brand=geforce,driver>=550", False),
    ("brand=TESLA", True), ("brand!=tesla", False), ("brand=geforce", False),
    ("arch>=8.0", True), ("arch=8.0", True), ("arch>8.0", False), ("arch<9", True),
    ("driver=550.163.01", True), ("driver!=550.163.01", False),
    ("", True), ("  ", True), (",,", True), ("cuda>=12.4 ", True),
    ("cuda!12.5", True),      # strncmp quirk: a lone "!" reads as "!="
])
def test_evaluate(pred, want):
    assert require.evaluate(pred, facts()) is want


@pytest.mark.parametrize("pred", [
    "cuda", "cuda12", ">=12", "cuda>=", "foo>=1", "cuda=>12", "cuda==12", "cuda>=12a",
    "brand<tesla", "brand>=geforce", "cuda<>12", "arch>=sm_80",
])
def test_invalid(pred):
    with pytest.raises(require.InvalidExpression):
        require.evaluate(pred, facts())
    assert require.check_one(pred, facts()) == "invalid expression"


def test_short_circuit_like_dsl():
    # dsl.c never parses atoms after the first satisfied OR group or a false AND atom.
    assert require.evaluate("cuda>=12 garbage", facts()) is True
    assert require.check_one("cuda>=99,garbage", facts()).startswith("unsatisfied")
    assert require.check_one("cuda>=99 garbage", facts()) == "invalid expression"


def test_no_device_arch_brand_true():
    f = require.facts_for(INFO, None)
    assert require.evaluate("brand=geforce", f) is True
    assert require.evaluate("arch>=9.0", f) is True
    assert require.evaluate("brand<x", f) is True    # never compared without a device
    assert require.evaluate("cuda>=12.5", f) is False


def test_messages():
    assert require.check_one("cuda>=12.5", facts()) == (
        "unsatisfied condition: cuda>=12.5, please update your driver to a newer version, "
        "or use an earlier cuda container")
    assert require.check_one("brand=geforce", facts()) == "unsatisfied condition: brand=geforce"
    # The message names the predicate's first OR term, whichever term failed last.
    msg = require.check_one("cuda>=12.5 brand=geforce,driver>=550", facts())
    assert msg.startswith("unsatisfied condition: cuda>=12.5, please update")
    assert require.check_one("driver>=560 cuda>=13", facts()) == "unsatisfied condition: driver>=560"


def test_check_per_gpu_in_order():
    gs = [gpu(0, (8, 0), "Tesla"), gpu(1, (7, 5), "GeForce")]
    require.check(["arch>=7.5"], INFO, gs)
    with pytest.raises(NvhookError, match=r"^requirement error: unsatisfied condition: arch>=8.0$"):
        require.check(["arch>=8.0"], INFO, gs)
    with pytest.raises(NvhookError) as e:
        require.check(["brand=tesla", "cuda>=13"], INFO, gs)
    # GPU 0 fails cuda>=13 before GPU 1 is looked at: requirements in order per GPU.
    assert "cuda>=13" in str(e.value)
    with pytest.raises(NvhookError, match="invalid expression"):
        require.check(["cuda>>12"], INFO, gs)


def test_check_without_gpu():
    require.check(["brand=geforce", "arch>=9"], INFO, [])
    with pytest.raises(NvhookError, match="unsatisfied condition: driver>=999"):
        require.check(["driver>=999"], INFO, [])
    require.check([], INFO, [])


def test_missing_versions_are_true():
    f = require.facts_for(DriverInfo(driver_version="", cuda_version=""), gpu())
    assert require.evaluate("cuda>=99,driver>=999", f) is True
