"""config.toml: NVIDIA's keys and defaults, [nvhook], lookup order and clear errors."""
from __future__ import annotations

import pytest

from libinject import config
from libinject.errors import NvhookError

# NVIDIA's packaged config (nvidia-container-toolkit config/config.toml.debian) ...
NVIDIA_DEBIAN = """\
disable-require = false
#swarm-resource = "DOCKER_RESOURCE_GPU"
#accept-nvidia-visible-devices-envvar-when-unprivileged = true
#accept-nvidia-visible-devices-as-volume-mounts = false

[nvidia-container-cli]
#root = "/run/nvidia/driver"
#path = "/usr/bin/nvidia-container-cli"
environment = []
#debug = "/var/log/nvidia-container-toolkit.log"
#ldcache = "/etc/ld.so.cache"
load-kmods = true
#no-cgroups = false
#user = "root:video"
ldconfig = "@/sbin/ldconfig"

[nvidia-container-runtime]
#debug = "/var/log/nvidia-container-runtime.log"
#experimental = false
"""

# ... and what `nvidia-ctk config default` writes in recent releases (more sections and
# keys we do not read: they must be tolerated).
NVIDIA_CTK_DEFAULT = """\
#accept-nvidia-visible-devices-as-volume-mounts = false
#accept-nvidia-visible-devices-envvar-when-unprivileged = true
disable-require = false
supported-driver-capabilities = "compat32,compute,display,graphics,ngx,utility,video"
#swarm-resource = "DOCKER_RESOURCE_GPU"

[nvidia-container-cli]
#debug = "/var/log/nvidia-container-toolkit.log"
environment = []
#ldcache = "/etc/ld.so.cache"
ldconfig = "@/sbin/ldconfig.real"
load-kmods = true
#no-cgroups = false
#path = "/usr/bin/nvidia-container-cli"
#root = "/run/nvidia/driver"
#user = "root:video"

[nvidia-container-runtime]
#debug = "/var/log/nvidia-container-runtime.log"
log-level = "info"
mode = "auto"
runtimes = ["docker-runc", "runc", "crun"]

[nvidia-container-runtime.modes]

[nvidia-container-runtime.modes.cdi]
annotation-prefixes = ["cdi.k8s.io/"]
default-kind = "nvidia.com/gpu"
spec-dirs = ["/etc/cdi", "/var/run/cdi"]

[nvidia-container-runtime.modes.csv]
mount-spec-path = "/etc/nvidia-container-runtime/host-files-for-container.d"

[nvidia-container-runtime.modes.legacy]
cuda-compat-mode = "ldconfig"

[nvidia-container-runtime-hook]
path = "nvidia-container-runtime-hook"
skip-mode-detection = false

[nvidia-ctk]
path = "nvidia-ctk"

[features]
allow-cuda-compat-libs-from-container = false
"""


def test_defaults_are_nvidias():
    c = config.Config()
    assert c.disable_require is False
    assert c.supported_capabilities() == frozenset(config.ALL_CAPABILITIES)
    assert c.swarm_resource == ""
    assert c.accept_nvidia_visible_devices_envvar_when_unprivileged is True
    assert c.accept_nvidia_visible_devices_as_volume_mounts is False
    assert c.cli.ldconfig == "@/sbin/ldconfig"
    assert c.cli.load_kmods is True and c.cli.no_cgroups is False and c.cli.root == ""
    assert c.runtime.mode == "auto" and c.runtime.log_level == "info"
    assert c.runtime.runtimes == ("docker-runc", "runc", "crun")
    assert c.runtime.modes.cdi.default_kind == "nvidia.com/gpu"
    assert c.runtime.modes.cdi.annotation_prefixes == ("cdi.k8s.io/",)
    assert c.runtime.modes.cdi.spec_dirs == ("/etc/cdi", "/var/run/cdi")
    assert c.runtime.modes.csv.mount_spec_path.endswith("host-files-for-container.d")
    assert c.nvidia_container_runtime_hook.skip_mode_detection is False
    assert c.nvhook.nvml_timeout == 10.0


@pytest.mark.parametrize("text, ldconfig", [(NVIDIA_DEBIAN, "@/sbin/ldconfig"),
                                            (NVIDIA_CTK_DEFAULT, "@/sbin/ldconfig.real")],
                         ids=["debian", "ctk-default"])
def test_nvidia_configs_keep_working(text, ldconfig):
    c = config.parse(text, "config.toml")
    assert c.source == "config.toml"
    assert c.cli.ldconfig == ldconfig             # as each file says
    assert c.cli.environment == ()
    assert c.supported_capabilities() == frozenset(config.ALL_CAPABILITIES)
    assert c.runtime.modes.legacy.cuda_compat_mode == "ldconfig"


def test_every_key_read():
    c = config.parse("""
disable-require = true
supported-driver-capabilities = "utility,compute"
swarm-resource = "DOCKER_RESOURCE_GPU, OTHER"
accept-nvidia-visible-devices-envvar-when-unprivileged = false
accept-nvidia-visible-devices-as-volume-mounts = true
[nvidia-container-cli]
root = "/run/nvidia/driver"
path = "/usr/bin/nvidia-container-cli"
ldconfig = "/sbin/ldconfig"
no-cgroups = true
user = "root:video"
debug = "/var/log/x.log"
ldcache = "/etc/ld.so.cache"
load-kmods = false
environment = ["A=1"]
[nvidia-container-runtime]
mode = "legacy"
runtimes = ["runc"]
debug = "/var/log/r.log"
log-level = "debug"
[nvidia-container-runtime.modes.cdi]
default-kind = "example.com/gpu"
annotation-prefixes = ["a/", "b/"]
spec-dirs = ["/x"]
[nvidia-container-runtime.modes.csv]
mount-spec-path = "/csv"
[nvidia-container-runtime-hook]
path = "/hook"
skip-mode-detection = true
[nvhook]
nvml-timeout = 3
snapshot = false
snapshot-dir = "/var/cache/nvhook"
dev-root = "/devroot"
log-file = "/var/log/nvhook.log"
log-level = "warning"
""", "f.toml")
    assert c.disable_require is True
    assert c.supported_capabilities() == {"utility", "compute"}
    assert c.swarm_resource_envvars() == ("DOCKER_RESOURCE_GPU", "OTHER")
    assert c.accept_nvidia_visible_devices_envvar_when_unprivileged is False
    assert c.accept_nvidia_visible_devices_as_volume_mounts is True
    cli = c.cli
    assert (cli.root, cli.path, cli.ldconfig, cli.no_cgroups, cli.user, cli.debug, cli.ldcache,
            cli.load_kmods, cli.environment) == (
        "/run/nvidia/driver", "/usr/bin/nvidia-container-cli", "/sbin/ldconfig", True,
        "root:video", "/var/log/x.log", "/etc/ld.so.cache", False, ("A=1",))
    rt = c.runtime
    assert (rt.mode, rt.runtimes, rt.debug, rt.log_level) == ("legacy", ("runc",), "/var/log/r.log", "debug")
    assert rt.modes.cdi.default_kind == "example.com/gpu"
    assert rt.modes.cdi.annotation_prefixes == ("a/", "b/")
    assert rt.modes.cdi.spec_dirs == ("/x",)
    assert rt.modes.csv.mount_spec_path == "/csv"
    assert c.nvidia_container_runtime_hook.path == "/hook"
    assert c.nvidia_container_runtime_hook.skip_mode_detection is True
    nv = c.nvhook
    assert (nv.nvml_timeout, nv.snapshot, nv.snapshot_dir, nv.dev_root) == (3.0, False, "/var/cache/nvhook", "/devroot")
    assert c.log_file() == "/var/log/nvhook.log" and c.log_level() == "warning"


def test_log_settings_fall_back_to_nvidias():
    c = config.parse('[nvidia-container-cli]\ndebug = "/l"\n[nvidia-container-runtime]\nlog-level = "DEBUG"\n')
    assert c.log_file() == "/l" and c.log_level() == "debug"


@pytest.mark.parametrize("text, key", [
    ("disable-require = 1", "disable-require"),
    ('accept-nvidia-visible-devices-as-volume-mounts = "yes"', "accept-nvidia-visible-devices-as-volume-mounts"),
    ("[nvidia-container-cli]\nroot = 5", "nvidia-container-cli.root"),
    ("[nvidia-container-cli]\nenvironment = \"A=1\"", "nvidia-container-cli.environment"),
    ("[nvidia-container-cli]\nenvironment = [1]", "nvidia-container-cli.environment"),
    ("nvidia-container-cli = 3", "nvidia-container-cli"),
    ("[nvidia-container-runtime.modes.cdi]\nspec-dirs = \"/etc/cdi\"", "nvidia-container-runtime.modes.cdi.spec-dirs"),
    ('[nvhook]\nnvml-timeout = "10"', "nvhook.nvml-timeout"),
    ("[nvhook]\nnvml-timeout = true", "nvhook.nvml-timeout"),
])
def test_wrong_type_names_key_and_file(text, key):
    with pytest.raises(NvhookError) as e:
        config.parse(text, "/x/config.toml")
    assert str(e.value).startswith(f"/x/config.toml: {key}: expected")


def test_unknown_keys_tolerated():
    c = config.parse('future-key = 1\n[nvidia-container-cli]\nnew = "x"\n[other]\na = 1\n')
    assert c == config.Config(source="<config>", unknown_keys=("future-key", "nvidia-container-cli.new", "other"))


def test_bad_toml_is_clear():
    with pytest.raises(NvhookError, match=r"^/c.toml: invalid TOML: .*line 1"):
        config.parse("disable-require = = false", "/c.toml")
    with pytest.raises(NvhookError, match="not UTF-8"):
        config.parse(b"\xff\xfe = 1", "/c.toml")


def test_bad_supported_capabilities():
    with pytest.raises(NvhookError, match="supported-driver-capabilities: unknown bogus"):
        config.parse('supported-driver-capabilities = "compute,bogus"', "/c.toml")
    assert config.parse('supported-driver-capabilities = "all"').supported_capabilities() == frozenset(config.ALL_CAPABILITIES)


def test_lookup_order(tmp_path):
    xdg = tmp_path / "xdg"
    (xdg / "nvidia-container-runtime").mkdir(parents=True)
    (xdg / "nvidia-container-runtime/config.toml").write_text("disable-require = true\n")
    explicit = tmp_path / "explicit.toml"
    explicit.write_text('swarm-resource = "X"\n')
    env_file = tmp_path / "env.toml"
    env_file.write_text('swarm-resource = "E"\n')

    assert config.config_path(None, {}) == ("/etc/nvidia-container-runtime/config.toml", False)
    c = config.load(None, {"XDG_CONFIG_HOME": str(xdg)})
    assert c.disable_require and c.source == str(xdg / "nvidia-container-runtime/config.toml")
    assert config.load(None, {"XDG_CONFIG_HOME": str(xdg), "NVHOOK_CONFIG": str(env_file)}).swarm_resource == "E"
    assert config.load(str(explicit), {"NVHOOK_CONFIG": str(env_file)}).swarm_resource == "X"
    # default location absent: NVIDIA's defaults
    assert config.load(None, {"XDG_CONFIG_HOME": str(tmp_path / "none")}) == config.Config()


def test_explicit_missing_or_too_big(tmp_path):
    with pytest.raises(NvhookError, match="config file .*/nope.toml not found"):
        config.load(str(tmp_path / "nope.toml"), {})
    with pytest.raises(NvhookError, match="not found"):
        config.load(None, {"NVHOOK_CONFIG": str(tmp_path / "nope.toml")})
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * config.MAX_CONFIG_BYTES + "\n")
    with pytest.raises(NvhookError, match="larger than"):
        config.load(str(big), {})
    with pytest.raises(NvhookError, match="cannot read config file"):
        config.load(str(tmp_path), {})


MISSPELT = 'disable-requir = true\n[nvidia-container-cli]\nlaod-kmods = false\n[features]\nanything = true\n' \
           '[nvidia-container-runtime.modes.cdi]\ndefault-kindd = "x"\n'


def test_a_misspelt_key_is_one_warning_line_and_the_rest_still_applies(tmp_path, capsys):
    """Keys neither NVIDIA's nor ours: named, with the file, in one `nvhook: warning:`
    line; nothing fails (NVIDIA ignores them); NVIDIA's tables we do not read
    ([features]) are not named."""
    p = tmp_path / "config.toml"
    p.write_text(MISSPELT)
    cfg = config.load_at(str(p), True)
    assert (cfg.disable_require, cfg.cli.load_kmods) == (False, True)
    assert capsys.readouterr().err == (
        f"nvhook: warning: {p}: unknown keys disable-requir, nvidia-container-cli.laod-kmods, "
        "nvidia-container-runtime.modes.cdi.default-kindd ignored (misspelt?)\n")


@pytest.mark.parametrize("text", [NVIDIA_DEBIAN, NVIDIA_CTK_DEFAULT, NVIDIA_DEBIAN.replace("#experimental", "experimental")],
                         ids=["debian", "ctk-default", "experimental"])
def test_nvidias_own_configs_warn_of_nothing(tmp_path, capsys, text):
    p = tmp_path / "config.toml"
    p.write_text(text)
    assert config.load_at(str(p), True).unknown_keys == ()
    assert capsys.readouterr().err == ""
