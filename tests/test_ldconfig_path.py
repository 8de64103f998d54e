"""Which ldconfig the host-path default runs: on Ubuntu /sbin/ldconfig is a shell wrapper
and the binary is /sbin/ldconfig.real; the default takes that, as NVIDIA's toolkit makes
its default config there (seen on a real GPU node: the hook refused every GPU container
with the wrapper). A script named explicitly stays refused."""
from __future__ import annotations

import os
import shutil

import pytest

from libinject.apply import ldconfig
from libinject.errors import NvhookError


@pytest.fixture
def ubuntu_sbin(tmp_path, monkeypatch):
    wrapper = tmp_path / "ldconfig"
    wrapper.write_text('#!/bin/sh\nexec /sbin/ldconfig.real "$@"\n')
    wrapper.chmod(0o755)
    real = tmp_path / "ldconfig.real"
    shutil.copy("/sbin/ldconfig", real)
    monkeypatch.setattr(ldconfig, "DEFAULT", f"@{wrapper}")
    monkeypatch.setattr(ldconfig, "UBUNTU_REAL", str(real))
    return wrapper, real


@pytest.mark.parametrize("prefix", ["@", "@!"])
def test_the_default_wrapper_script_runs_ldconfig_real(ubuntu_sbin, prefix):
    wrapper, real = ubuntu_sbin
    fd = ldconfig.open_ldconfig(f"{prefix}{wrapper}")
    try:
        assert os.fstat(fd).st_ino == real.stat().st_ino
    finally:
        os.close(fd)


def test_another_script_is_refused(ubuntu_sbin, tmp_path):
    other = tmp_path / "my-ldconfig"
    other.write_text("#!/bin/sh\n")
    with pytest.raises(NvhookError, match="is a script"):
        ldconfig.open_ldconfig(f"@{other}")


def test_without_ldconfig_real_the_wrapper_is_refused(ubuntu_sbin):
    wrapper, real = ubuntu_sbin
    real.unlink()
    with pytest.raises(NvhookError, match=r"is a script \(on Ubuntu use @/sbin/ldconfig.real\)"):
        ldconfig.open_ldconfig(f"@{wrapper}")


@pytest.mark.parametrize("prefix", ["@", "@!"])
def test_a_missing_ldconfig_real_falls_back_to_the_name_without_it(tmp_path, prefix):
    """A config copied from Ubuntu on a host without ldconfig.real: NVIDIA's toolkit
    (config.NormalizeLDConfigPath) runs the host's ldconfig instead; so do we, saying so."""
    plain = tmp_path / "ldconfig"
    shutil.copy("/sbin/ldconfig", plain)
    said: list[str] = []
    fd = ldconfig.open_ldconfig(f"{prefix}{plain}.real", note=said.append)
    try:
        assert os.fstat(fd).st_ino == plain.stat().st_ino
    finally:
        os.close(fd)
    assert said == [f"ldconfig {plain}.real does not exist on this host: using {plain}"]


def test_another_missing_ldconfig_is_refused(tmp_path):
    with pytest.raises(NvhookError, match=r"ldconfig .*/ldconfig.new: No such file"):
        ldconfig.open_ldconfig(f"@{tmp_path}/ldconfig.new")
    with pytest.raises(NvhookError, match=r"ldconfig .*/ldconfig: No such file"):
        ldconfig.open_ldconfig(f"@{tmp_path}/ldconfig.real")
