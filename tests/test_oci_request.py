"""OCI spec + config -> Request: DESIGN.md §3 row by row, as NVIDIA's hook decides."""
from __future__ import annotations

import pytest

from libinject import config as config_mod
from libinject.errors import NvhookError
from libinject.constants import ALL_CAPABILITIES
from libinject.request.oci_spec import (container_env, devices_from_mounts,
                                   is_privileged, legacy_cuda_version, request_from_spec,
                                   wants_gpu)

ALL = frozenset(ALL_CAPABILITIES)
DEFAULT = frozenset({"utility", "compute"})


def spec(*env: str, privileged: bool = False, mounts=(), annotations=None, caps=None) -> dict:
    s = {"ociVersion": "1.0.2", "root": {"path": "rootfs"},
         "process": {"env": ["PATH=/bin", *env],
                     "capabilities": caps if caps is not None else
                     {"bounding": ["CAP_CHOWN"] + (["CAP_SYS_ADMIN"] if privileged else [])}},
         "mounts": list(mounts)}
    if annotations is not None:
        s["annotations"] = annotations
    return s


def cfg(text: str = "") -> config_mod.Config:
    return config_mod.parse(text, "test.toml")


def req(*env, config=None, **kw):
    return request_from_spec(spec(*env, **kw), config or cfg())


# --- NVIDIA_VISIBLE_DEVICES ----------------------------------------------------------

@pytest.mark.parametrize("env", [(), ("NVIDIA_VISIBLE_DEVICES=",), ("NVIDIA_VISIBLE_DEVICES=void",),
                                 ("NVIDIA_VISIBLE_DEVICES= , ",), ("NVIDIA_VISIBLE_DEVICES=0,void",),
                                 ("NVIDIA_VISIBLE_DEVICES=all,void",), ("NVIDIA_DRIVER_CAPABILITIES=all",),
                                 ("NVIDIA_REQUIRE_CUDA=cuda>=12.0",)])
def test_not_a_gpu_container(env):
    assert req(*env) is None
    assert not wants_gpu(spec(*env), cfg())


@pytest.mark.parametrize("value, devices", [
    ("all", "all"), ("none", "none"), ("0", "0"), ("1,2", "1,2"), (" 1 , 2 ", "1,2"),
    ("GPU-4dd4d4bb-0a84-4fd5-9a8b-3b4a5a1e2a6c", "GPU-4dd4d4bb-0a84-4fd5-9a8b-3b4a5a1e2a6c"),
    ("00000000:07:00.0", "00000000:07:00.0"), ("0:1,MIG-abc", "0:1,MIG-abc"),
    ("0,all", "all"), ("all,none", "none"), ("1,none,all", "none"),
])
def test_visible_devices(value, devices):
    r = req(f"NVIDIA_VISIBLE_DEVICES={value}")
    assert r.devices == devices
    assert wants_gpu(spec(f"NVIDIA_VISIBLE_DEVICES={value}"), cfg())


def test_later_env_entry_wins():
    assert req("NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_VISIBLE_DEVICES=1").devices == "1"
    assert req("NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_VISIBLE_DEVICES=void") is None
    assert container_env(spec("A=1=2", "noequals", "B=")) == {"PATH": "/bin", "A": "1=2", "B": ""}


def test_unprivileged_envvar_policy():
    off = cfg("accept-nvidia-visible-devices-envvar-when-unprivileged = false")
    assert req("NVIDIA_VISIBLE_DEVICES=0", config=off) is None
    assert req("NVIDIA_VISIBLE_DEVICES=0", config=off, privileged=True).devices == "0"
    assert req("NVIDIA_VISIBLE_DEVICES=0").devices == "0"  # default: accepted


# --- device lists as volume mounts ---------------------------------------------------

def _dev_mount(dest, source="/dev/null"):
    return {"destination": dest, "source": source, "type": "bind", "options": ["bind", "ro"]}


MOUNTS = [_dev_mount("/var/run/nvidia-container-devices/0"),
          _dev_mount("/var/run/nvidia-container-devices/GPU-abc/"),
          _dev_mount("/var/run/nvidia-container-devices/3", source="/tmp/x"),  # not /dev/null
          _dev_mount("/var/run/nvidia-container-devices"),                     # no id
          _dev_mount("/var/run/other/4"),
          {"destination": "/proc", "type": "proc", "source": "proc"}]


def test_devices_from_mounts():
    assert devices_from_mounts(MOUNTS) == ["0", "GPU-abc"]


def test_volume_mounts_win_over_env_when_accepted():
    on = cfg("accept-nvidia-visible-devices-as-volume-mounts = true")
    assert req("NVIDIA_VISIBLE_DEVICES=all", config=on, mounts=MOUNTS).devices == "0,GPU-abc"
    # no device mounts: back to the env
    assert req("NVIDIA_VISIBLE_DEVICES=2", config=on, mounts=MOUNTS[2:]).devices == "2"
    # mounts are not subject to the unprivileged envvar policy
    both = cfg("accept-nvidia-visible-devices-as-volume-mounts = true\n"
               "accept-nvidia-visible-devices-envvar-when-unprivileged = false")
    assert req("NVIDIA_VISIBLE_DEVICES=all", config=both, mounts=MOUNTS).devices == "0,GPU-abc"
    assert req("NVIDIA_VISIBLE_DEVICES=all", config=both, mounts=MOUNTS[2:]) is None


def test_volume_mounts_ignored_unless_accepted():
    assert req(mounts=MOUNTS) is None
    assert req("NVIDIA_VISIBLE_DEVICES=1", mounts=MOUNTS).devices == "1"


# --- swarm resource --------------------------------------------------------------------

def test_swarm_resource():
    sw = cfg('swarm-resource = "DOCKER_RESOURCE_GPU, DOCKER_RESOURCE_OTHER"')
    assert req("DOCKER_RESOURCE_GPU=1,2", "NVIDIA_VISIBLE_DEVICES=all", config=sw).devices == "1,2"
    assert req("DOCKER_RESOURCE_GPU=1", "DOCKER_RESOURCE_OTHER=3", config=sw).devices == "1,3"
    # none of the swarm variables set: NVIDIA_VISIBLE_DEVICES
    assert req("NVIDIA_VISIBLE_DEVICES=0", config=sw).devices == "0"
    # a swarm variable set but empty: not a GPU container (NVIDIA_VISIBLE_DEVICES not consulted)
    assert req("DOCKER_RESOURCE_GPU=", "NVIDIA_VISIBLE_DEVICES=0", config=sw) is None
    # without the config key the variable means nothing
    assert req("DOCKER_RESOURCE_GPU=1") is None


# --- CDI annotations ---------------------------------------------------------------------

def test_cdi_annotations():
    a = {"cdi.k8s.io/b": "nvidia.com/gpu=1,nvidia.com/gpu=GPU-x", "cdi.k8s.io/a": "nvidia.com/gpu=0",
         "cdi.k8s.io/c": "other.com/x=1", "other/d": "nvidia.com/gpu=7"}
    assert req(annotations=a).devices == "0,1,GPU-x"
    assert req(annotations={"cdi.k8s.io/x": "nvidia.com/gpu=all"}).devices == "all"
    assert req(annotations={"cdi.k8s.io/x": "other.com/gpu=1"}) is None
    custom = cfg('[nvidia-container-runtime.modes.cdi]\nannotation-prefixes = ["x/"]\ndefault-kind = "k.com/g"')
    assert req(annotations={"x/1": "k.com/g=3"}, config=custom).devices == "3"
    assert req(annotations=a, config=custom) is None


# --- NVIDIA_DRIVER_CAPABILITIES -----------------------------------------------------------

@pytest.mark.parametrize("value, caps", [
    (None, DEFAULT), ("", DEFAULT), ("all", ALL), ("utility", {"utility"}),
    ("compute,video", {"compute", "video"}), (" graphics , display ", {"graphics", "display"}),
    ("compat32,ngx,all", ALL), ("compute,,utility", DEFAULT),
])
def test_capabilities(value, caps):
    env = ["NVIDIA_VISIBLE_DEVICES=0"] + ([f"NVIDIA_DRIVER_CAPABILITIES={value}"] if value is not None else [])
    assert req(*env).capabilities == frozenset(caps)


def test_unknown_capability_names_allowed_set():
    with pytest.raises(NvhookError) as e:
        req("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute,bogus")
    assert "bogus" in str(e.value)
    assert "allowed: compat32,compute,display,graphics,ngx,utility,video" in str(e.value)


def test_supported_driver_capabilities():
    limited = cfg('supported-driver-capabilities = "utility,compute,video"')
    r = req("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=all", config=limited)
    assert r.capabilities == {"utility", "compute", "video"}
    with pytest.raises(NvhookError, match=r"allowed: compute,utility,video"):
        req("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=graphics", config=limited)
    only_utility = cfg('supported-driver-capabilities = "utility"')
    assert req("NVIDIA_VISIBLE_DEVICES=0", config=only_utility).capabilities == {"utility"}


# --- NVIDIA_REQUIRE_* and NVIDIA_DISABLE_REQUIRE -------------------------------------------

def test_requirements_sorted_by_variable():
    r = req("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_Z=brand=tesla", "NVIDIA_REQUIRE_CUDA=cuda>=12.0",
            "NVIDIA_REQUIRE_ARCH=arch>=8.0 arch=7.5", "NVIDIA_REQUIRE_EMPTY=",
            "NVIDIA_REQUIRE_JETPACK=csv-mounts=all")
    assert r.requirements == ("arch>=8.0 arch=7.5", "cuda>=12.0", "brand=tesla")
    assert r.disable_require is False


@pytest.mark.parametrize("value, disabled", [("true", True), ("1", True), ("TRUE", True), ("t", True),
                                             ("false", False), ("0", False), ("yes", False), ("", False)])
def test_disable_require(value, disabled):
    r = req("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=99.0", f"NVIDIA_DISABLE_REQUIRE={value}")
    assert r.disable_require is disabled
    assert r.requirements == (() if disabled else ("cuda>=99.0",))


def test_disable_require_from_config():
    r = req("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=99.0", config=cfg("disable-require = true"))
    assert r.disable_require and r.requirements == ()


# --- legacy CUDA_VERSION images -------------------------------------------------------------

def test_legacy_image_defaults_to_all():
    r = req("CUDA_VERSION=10.0.130")
    assert r.devices == "all" and r.capabilities == ALL
    assert r.requirements == ("cuda>=10.0",)


def test_legacy_image_explicit_values():
    r = req("CUDA_VERSION=11.8.0", "NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=utility")
    assert (r.devices, r.capabilities, r.requirements) == ("1", {"utility"}, ("cuda>=11.8",))
    assert req("CUDA_VERSION=11.8.0", "NVIDIA_VISIBLE_DEVICES=void") is None
    assert req("CUDA_VERSION=11.8.0", "NVIDIA_VISIBLE_DEVICES=") is None
    # empty caps variable: the default, not all
    assert req("CUDA_VERSION=11.8", "NVIDIA_DRIVER_CAPABILITIES=").capabilities == DEFAULT
    # legacy disabled requirements
    assert req("CUDA_VERSION=11.8", "NVIDIA_DISABLE_REQUIRE=1").requirements == ()


def test_not_legacy_with_require_cuda():
    assert req("CUDA_VERSION=11.8", "NVIDIA_REQUIRE_CUDA=cuda>=11.8") is None
    r = req("CUDA_VERSION=11.8", "NVIDIA_REQUIRE_CUDA=cuda>=11.0", "NVIDIA_VISIBLE_DEVICES=0")
    assert r.capabilities == DEFAULT and r.requirements == ("cuda>=11.0",)
    assert req("CUDA_VERSION=") is None


@pytest.mark.parametrize("v, mm", [("10.0.130", "10.0"), ("12", "12.0"), ("v11.2", "11.2"),
                                   ("12.4.1-rc1", "12.4"), ("9.2.148+b1", "9.2")])
def test_legacy_version(v, mm):
    assert legacy_cuda_version(v) == mm


@pytest.mark.parametrize("v", ["abc", "1.2.3.4", "01.2", "12.x"])
def test_legacy_version_invalid(v):
    with pytest.raises(NvhookError, match="invalid CUDA_VERSION"):
        req(f"CUDA_VERSION={v}")


# --- MIG config/monitor and IMEX: privileged only ------------------------------------------

# (IMEX channels follow NVIDIA's envvar-when-unprivileged rule: test_nvidia_reference.py)
@pytest.mark.parametrize("var, field", [("NVIDIA_MIG_CONFIG_DEVICES", "mig_config"),
                                        ("NVIDIA_MIG_MONITOR_DEVICES", "mig_monitor")])
def test_privileged_only(var, field):
    with pytest.raises(NvhookError, match=f"cannot set {var} in non privileged container"):
        req("NVIDIA_VISIBLE_DEVICES=0", f"{var}=all")
    r = req("NVIDIA_VISIBLE_DEVICES=0", f"{var}=all", privileged=True)
    assert getattr(r, field) == "all"
    assert getattr(req("NVIDIA_VISIBLE_DEVICES=0", f"{var}="), field) is None
    assert getattr(req("NVIDIA_VISIBLE_DEVICES=0"), field) is None
    # without devices the container is not a GPU container: nothing is checked
    assert req(f"{var}=all") is None


def test_privileged_detection():
    assert is_privileged(spec(privileged=True))
    assert not is_privileged(spec())
    assert not is_privileged(spec(caps={"effective": ["CAP_SYS_ADMIN"]}))  # bounding set only
    assert is_privileged(spec(caps=["CAP_SYS_ADMIN"]))                        # pre-rc5 list form
    assert not is_privileged({"process": {}})


# --- the rest of the Request ----------------------------------------------------------------

def test_options_from_config():
    c = cfg('[nvidia-container-cli]\nno-cgroups = true\nldconfig = "/sbin/ldconfig"\n'
            '[nvidia-container-runtime.modes.legacy]\ncuda-compat-mode = "mount"\n')
    r = req("NVIDIA_VISIBLE_DEVICES=0", config=c)
    assert r.no_cgroups is True and r.ldconfig == "/sbin/ldconfig" and r.cuda_compat_mode == "mount"
    d = req("NVIDIA_VISIBLE_DEVICES=0")
    assert d.no_cgroups is False and d.ldconfig == "@/sbin/ldconfig" and d.cuda_compat_mode == "ldconfig"


def test_decisions_logged():
    lines: list[str] = []
    request_from_spec(spec("NVIDIA_VISIBLE_DEVICES=1"), cfg(), lines.append)
    assert any("devices=1" in l for l in lines)
    lines.clear()
    request_from_spec(spec("NVIDIA_VISIBLE_DEVICES=1"),
                      cfg("accept-nvidia-visible-devices-envvar-when-unprivileged = false"), lines.append)
    assert any("ignoring NVIDIA_VISIBLE_DEVICES" in l for l in lines)


def test_spec_without_process_or_env():
    assert request_from_spec({"ociVersion": "1", "root": {"path": "r"}}, cfg()) is None
    assert request_from_spec({"process": {"env": None}}, cfg()) is None
