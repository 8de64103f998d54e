"""config.toml: NVIDIA's nvidia-container-runtime configuration, plus [nvhook].

Where it is read from (first that applies):
  1. an explicit path (`--config`), then $NVHOOK_CONFIG: must exist;
  2. ${XDG_CONFIG_HOME:-/etc}/nvidia-container-runtime/config.toml: defaults if absent.
The hook (every stage, exec'd or served) passes no environment: its environment may be
the container's (runc's createContainer hooks), so only `--config` from the hook entry
or /etc/nvidia-container-runtime/config.toml count, and the file and every directory
above it must be root-owned and writable by nobody else (trusted=True). NVIDIA's
XDG_CONFIG_HOME convention applies to the commands people and engines run
(configure, list, info, cdi, the runtime shim), whose environment is their own.

Relative paths in the file (log files, the snapshot dir, the service socket) are taken
relative to the file's own directory: the hook runs with "/" as its cwd, where a
relative path would otherwise land.

Sections and keys are NVIDIA's (TOML names; Python names replace "-" with "_"), with
NVIDIA's defaults, so an existing NVIDIA config keeps working. Unknown keys and
sections are ignored (NVIDIA configs carry more than we read), but one that is neither
NVIDIA's nor ours (a misspelling, most likely) is named in one `nvhook: warning:` line by
the commands people and engines run (not the hook: its stderr is the runtime's); a key
we know with the wrong type is an error naming the key and the file.
"""
from __future__ import annotations

import math
import os
import sys

from libinject.constants import ALL_CAPABILITIES, SERVE_SOCKET
from libinject.errors import NvhookError
from libinject.record import field, fields, is_record, record, replace

CONFIG_REL = "nvidia-container-runtime/config.toml"
MAX_CONFIG_BYTES = 1 << 20
MAX_SECONDS = 3600.0                # a timeout longer than an hour is a hang by another name
# Keys that are timeouts: a finite number of seconds, > 0 and <= MAX_SECONDS.
SECONDS_KEYS = frozenset({"nvhook.nvml-timeout", "nvhook.serve-timeout"})
# tomllib takes time quadratic in a dotted key's parts (a.a.a...: 50000 parts, 40 s);
# NVIDIA's deepest key has 4. Counted on the text with strings and comments blanked.
MAX_KEY_DOTS = 32
_TOML_TOKEN = r'"(?:[^"\\\n]|\\.)*+"?|\'[^\'\n]*+\'?|#[^\n]*+|[^"\'#]++'
_TOML_KEY_RUN = r'[A-Za-z0-9_\-" \t.]+'
# Parsed tables by the BLAKE2b of the file's bytes, in memory: the hook service parses a
# node's config once (keyed by content, a table is never stale; the file's own checks run
# on every load). Not on disk: a root process that can write the host's /run (a
# container given it as a volume) could then hand every exec'd hook a config of its own.
_TABLES: dict[bytes, dict] = {}
_MAX_TABLES = 16
_CONFIGS: dict[tuple[bytes, str], "Config"] = {}    # (blake2b of the bytes, absolute path) -> parse()


@record(frozen=True)
class ContainerCliConfig:
    """[nvidia-container-cli]: what NVIDIA passes to nvidia-container-cli."""
    root: str = ""                      # driver root ("" = /)
    path: str = ""                      # nvidia-container-cli path (unused by nvhook)
    ldconfig: str = "@/sbin/ldconfig"
    no_cgroups: bool = False
    user: str = ""                      # "UID[:GID]" or "name[:group]" for discovery
    debug: str = ""                     # log file
    ldcache: str = ""
    load_kmods: bool = True
    environment: tuple[str, ...] = ()
    no_pivot: bool = False


@record(frozen=True)
class CdiModeConfig:
    default_kind: str = "nvidia.com/gpu"
    annotation_prefixes: tuple[str, ...] = ("cdi.k8s.io/",)
    spec_dirs: tuple[str, ...] = ("/etc/cdi", "/var/run/cdi")


@record(frozen=True)
class CsvModeConfig:
    mount_spec_path: str = "/etc/nvidia-container-runtime/host-files-for-container.d"


@record(frozen=True)
class LegacyModeConfig:
    cuda_compat_mode: str = "ldconfig"


@record(frozen=True)
class ModesConfig:
    cdi: CdiModeConfig = field(default_factory=CdiModeConfig)
    csv: CsvModeConfig = field(default_factory=CsvModeConfig)
    legacy: LegacyModeConfig = field(default_factory=LegacyModeConfig)


@record(frozen=True)
class RuntimeConfig:
    """[nvidia-container-runtime]: the shim's settings."""
    mode: str = "auto"
    runtimes: tuple[str, ...] = ("docker-runc", "runc", "crun")
    debug: str = "/dev/null"
    log_level: str = "info"
    modes: ModesConfig = field(default_factory=ModesConfig)


@record(frozen=True)
class RuntimeHookConfig:
    """[nvidia-container-runtime-hook]."""
    path: str = "nvidia-container-runtime-hook"
    skip_mode_detection: bool = False


@record(frozen=True)
class NvhookConfig:
    """[nvhook]: what is ours."""
    nvml_timeout: float = 10.0          # seconds; a hung driver fails the container
    snapshot: bool = True               # cache discovery results
    snapshot_dir: str = ""              # "" = discovery's default
    dev_root: str = ""                  # where dev/ and proc/ are read ("" = driver root)
    log_file: str = ""                  # hook log ("" = [nvidia-container-cli] debug)
    log_level: str = ""                 # "" = [nvidia-container-runtime] log-level
    socket: str = SERVE_SOCKET          # `nvhook serve`: where it listens (hooks: --socket)
    serve_timeout: float = 60.0         # `nvhook serve`: seconds one request may take


@record(frozen=True)
class Config:
    disable_require: bool = False
    supported_driver_capabilities: str = ",".join(ALL_CAPABILITIES)
    swarm_resource: str = ""
    accept_nvidia_visible_devices_envvar_when_unprivileged: bool = True
    accept_nvidia_visible_devices_as_volume_mounts: bool = False
    nvidia_container_cli: ContainerCliConfig = field(default_factory=ContainerCliConfig)
    nvidia_container_runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    nvidia_container_runtime_hook: RuntimeHookConfig = field(default_factory=RuntimeHookConfig)
    nvhook: NvhookConfig = field(default_factory=NvhookConfig)
    source: str = ""                    # file it was read from ("" = built-in defaults)
    unknown_keys: tuple[str, ...] = ()  # keys neither NVIDIA's nor ours (ignored; warned of)

    # Short names for what the hook reads most.
    @property
    def cli(self) -> ContainerCliConfig:
        return self.nvidia_container_cli

    @property
    def runtime(self) -> RuntimeConfig:
        return self.nvidia_container_runtime

    def supported_capabilities(self) -> frozenset[str]:
        """supported-driver-capabilities as a set ("all" = every capability)."""
        value = self.supported_driver_capabilities
        caps = {c.strip() for c in value.split(",") if c.strip()}
        if "all" in caps:
            return frozenset(ALL_CAPABILITIES)
        bad = sorted(caps - set(ALL_CAPABILITIES))
        if bad:
            raise NvhookError(
                f"{self.source or 'config'}: supported-driver-capabilities: unknown "
                f"{','.join(bad)} (allowed: {','.join(ALL_CAPABILITIES)})")
        return frozenset(caps)

    def swarm_resource_envvars(self) -> tuple[str, ...]:
        return tuple(v.strip() for v in self.swarm_resource.split(",") if v.strip())

    def log_file(self) -> str:
        return self.nvhook.log_file or self.cli.debug

    def log_level(self) -> str:
        return (self.nvhook.log_level or self.runtime.log_level or "info").lower()

    def discover_options(self, *, root: str | None = None, ldcache: str | None = None,
                         user: str | None = None):
        """Discovery's options: the command line's root/ldcache/user where given, else
        this config's; the one place config keys become discovery settings."""
        from libinject.discover.options import DiscoverOptions
        from libinject.request.user import parse_user

        cli, nv = self.cli, self.nvhook
        if user:
            who = parse_user(user, "--user")
        else:
            who = parse_user(cli.user, f"{self.source or 'config'}: [nvidia-container-cli] user")
        return DiscoverOptions(root=root or cli.root or "/", ldcache=ldcache or cli.ldcache or None,
                               dev_root=nv.dev_root or None, nvml_timeout=nv.nvml_timeout,
                               user=who, snapshot=nv.snapshot, snapshot_dir=nv.snapshot_dir or None)


def config_path(explicit: str | None = None, environ: dict[str, str] | None = None) -> tuple[str, bool]:
    """(path, required): where the config is read from, and whether it must exist."""
    env = os.environ if environ is None else environ
    if explicit:
        return explicit, True
    if env.get("NVHOOK_CONFIG"):
        return env["NVHOOK_CONFIG"], True
    base = env.get("XDG_CONFIG_HOME") or "/etc"
    return os.path.join(base, CONFIG_REL), False


def load(explicit: str | None = None, environ: dict[str, str] | None = None, *,
         trusted: bool = False, userns: bool = False) -> Config:
    """The effective configuration; NvhookError for a missing explicit file or bad content.
    trusted: the file must be one only root could have written (the hook's rule);
    userns: read from a user namespace, where host root shows as the overflow uid."""
    path, required = config_path(explicit, environ)
    return load_at(path, required, trusted=trusted, userns=userns)


def load_at(path: str, required: bool, *, trusted: bool = False, userns: bool = False) -> Config:
    """load() of a path already found by config_path() (the runtime shim's front found
    it in the engine's environment and says which, for `nvhook serve` to read)."""
    memo = _request_loads
    if memo is not None and (path, required, trusted) in memo and not userns:
        return memo[(path, required, trusted)]
    cfg = _load(path, required, trusted, userns)
    if memo is not None and not userns:
        memo[(path, required, trusted)] = cfg
    return cfg


# A hook service worker's loads, for its one request (libinject.runtime.serve.worker sets it
# in the worker: the read-only work it does while the front answers loads the config the
# hook then asks for again, a moment later, for the same request): by what was asked.
# None everywhere else: every load reads and checks the file.
_request_loads: dict[tuple[str, bool, bool], "Config"] | None = None


def _load(path: str, required: bool, trusted: bool, userns: bool = False) -> Config:
    from libinject.linux.files import read_bounded

    check = (lambda fd, st: _check_root_owned(path, fd, st, userns)) if trusted else None
    data = read_bounded(path, MAX_CONFIG_BYTES, "config file", missing_ok=True, check=check)
    if data is None:
        if required:
            raise NvhookError(f"config file {path} not found")
        return Config()
    cfg = parse(data, path)
    if not trusted:
        _warn_unknown(cfg)
    return cfg


def _overflow_uid() -> int:
    """The uid a user namespace shows for an unmapped one (host root among them)."""
    try:
        with open("/proc/sys/kernel/overflowuid", "rb") as f:
            return int(f.read(32))
    except (OSError, ValueError):
        return 65534


def _check_root_owned(path: str, fd: int, st: os.stat_result, userns: bool = False) -> None:
    """The opened file (fd, st), every directory on the way to it, and every symlink on
    the path as given: root-owned and not writable by group or others (a sticky
    directory such as /tmp may be: nobody else can replace root's entries in it).
    userns: in a user namespace (rootless engine) host root shows as the overflow uid."""
    import stat

    roots = {0, _overflow_uid()} if userns else {0}

    def refuse(what: str) -> NvhookError:
        return NvhookError(f"config file {path}: {what} must be owned by root and writable by "
                           "nobody else")

    if st.st_uid not in roots or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise refuse("the file")
    # Symlinks named on the way (their targets' directories are checked below, by where
    # the opened file really is).
    parts = os.path.abspath(path).split("/")
    for i in range(2, len(parts) + 1):
        sub = "/".join(parts[:i])
        try:
            lst = os.lstat(sub)
        except OSError:
            raise refuse(sub) from None
        if stat.S_ISLNK(lst.st_mode) and lst.st_uid not in roots:
            raise refuse(f"symlink {sub}")
    d = os.path.dirname(os.readlink(f"/proc/self/fd/{fd}"))
    while True:
        dst = os.stat(d)
        if dst.st_uid not in roots or (dst.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
                               and not dst.st_mode & stat.S_ISVTX):
            raise refuse(f"directory {d}")
        if d == "/":
            return
        d = os.path.dirname(d)


def parse(data: bytes | str, source: str = "<config>") -> Config:
    """The Config that TOML text data holds (source: where it came from, for errors and
    relative paths)."""
    raw = data if isinstance(data, bytes) else data.encode(errors="surrogatepass")
    try:
        from _blake2 import blake2b     # hashlib would load OpenSSL first (~2.5 ms)
    except ImportError:  # pragma: no cover
        from hashlib import blake2b
    key = blake2b(raw, digest_size=20).digest()
    # The same bytes from the same (absolute) path make the same Config, frozen: kept,
    # like the tables (a service's workers inherit the server's, built from its own read).
    done = _CONFIGS.get((key, source)) if source.startswith("/") else None
    if done is not None:
        return done
    table = _TABLES.get(key)
    if table is None:
        table = _parse_toml(raw, source)
    if len(_TABLES) >= _MAX_TABLES:
        _TABLES.clear()
    _TABLES[key] = table
    cfg = _build(Config, table, source, "")
    cfg = _resolve_paths(replace(cfg, source=source, unknown_keys=tuple(_unknown(Config, table, ""))))
    cfg.supported_capabilities()  # validate now: a bad value is a config error, not a container's
    if source.startswith("/"):
        if len(_CONFIGS) >= _MAX_TABLES:
            _CONFIGS.clear()
        _CONFIGS[(key, source)] = cfg
    return cfg


def _parse_toml(raw: bytes, source: str) -> dict:
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise NvhookError(f"{source}: not UTF-8 text") from None
    # The subset real configs use, without tomllib's import (re, datetime: ~10 ms of an
    # exec'd hook); None for anything else, which tomllib parses or refuses below.
    from libinject import tomlfast

    table = tomlfast.loads(text)
    if table is not None:
        return table
    import tomllib

    try:
        if _deep_key(text):
            raise NvhookError(f"{source}: invalid TOML: a key with more than {MAX_KEY_DOTS} dotted parts")
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise NvhookError(f"{source}: invalid TOML: {e}") from None
    except RecursionError:  # arrays or inline tables nested hundreds deep
        raise NvhookError(f"{source}: invalid TOML: nested too deeply") from None
    except ValueError as e:  # tomllib's int() of a number with thousands of digits
        raise NvhookError(f"{source}: invalid TOML: {_show(str(e))}") from None


def _deep_key(text: str) -> bool:
    """Whether a run of key characters (strings as "", comments dropped) holds
    MAX_KEY_DOTS dots: a dotted key that deep. Linear: each token is consumed once."""
    import re

    clean = "".join('""' if t[0] in "\"'" else "" if t[0] == "#" else t
                    for t in re.findall(_TOML_TOKEN, text))
    return any(m.group().count(".") >= MAX_KEY_DOTS for m in re.finditer(_TOML_KEY_RUN, clean))


def _show(value: object, limit: int = 80) -> str:
    """A value for an error line, cut short (a config value may be a megabyte)."""
    try:
        text = repr(value)
    except ValueError:  # an int too long to print
        text = "a huge number"
    return text if len(text) <= limit else text[:limit] + "..."


def check_seconds(value: object, where: str) -> float:
    """A timeout: a finite number > 0 and <= MAX_SECONDS (inf, nan, 1e308, 0 and negative
    values are refused); NvhookError naming `where` otherwise."""
    ok = (not isinstance(value, bool) and isinstance(value, (int, float))
          and 0 < value <= MAX_SECONDS)        # False for nan
    if not ok:
        raise NvhookError(f"{where}: expected a number of seconds > 0 and <= {MAX_SECONDS:g}, "
                          f"got {_show(value)}")
    return float(value)


def _resolve_paths(cfg: Config) -> Config:
    base = os.path.dirname(os.path.abspath(cfg.source))

    def rel(p: str) -> str:
        return os.path.join(base, p) if p and not os.path.isabs(p) else p

    cli, rt, nv = cfg.cli, cfg.runtime, cfg.nvhook
    return replace(
        cfg,
        nvidia_container_cli=replace(cli, debug=rel(cli.debug)),
        nvidia_container_runtime=replace(rt, debug=rel(rt.debug)),
        nvhook=replace(nv, log_file=rel(nv.log_file), snapshot_dir=rel(nv.snapshot_dir),
                       socket=rel(nv.socket)))


# NVIDIA's tables nvhook does not read (their contents are NVIDIA's business), and the
# fields that are not keys of the file.
_NVIDIA_TABLES = {"": frozenset({"features", "nvidia-ctk"}),
                  "nvidia-container-runtime.": frozenset({"experimental", "discover-mode"}),   # older releases
                  "nvidia-container-runtime.modes.": frozenset({"jit-cdi", "native"})}
_NOT_KEYS = frozenset({"source", "unknown_keys"})


def _unknown(cls: type, table: dict[str, object], prefix: str) -> list[str]:
    """The dotted keys of table that record cls (and NVIDIA) do not know."""
    names = vars(sys.modules[cls.__module__])
    known = {f.name.replace("_", "-"): names.get(f.type, f.type) for f in fields(cls) if f.name not in _NOT_KEYS}
    out: list[str] = []
    for key, value in table.items():
        tp = known.get(key)
        if tp is None:
            if key not in _NVIDIA_TABLES.get(prefix, ()):
                out.append(prefix + key)
        elif isinstance(tp, type) and is_record(tp) and isinstance(value, dict):
            out += _unknown(tp, value, f"{prefix}{key}.")
    return out


_warned: set[tuple[str, tuple[str, ...]]] = set()


def _warn_unknown(cfg: Config) -> None:
    """One `nvhook: warning:` line (once a process) naming the file's unknown keys: NVIDIA
    ignores them, so does nvhook, but a misspelt key is a setting that silently is not."""
    seen = (cfg.source, cfg.unknown_keys)
    if cfg.unknown_keys and seen not in _warned:
        _warned.add(seen)
        sys.stderr.write(f"nvhook: warning: {cfg.source}: unknown key{'s' if len(cfg.unknown_keys) > 1 else ''} "
                         f"{', '.join(cfg.unknown_keys)} ignored (misspelt?)\n")


def _build(cls: type, table: dict[str, object], source: str, prefix: str):
    """Instantiate record cls from a TOML table, checking the types of known keys."""
    # Annotations are strings (postponed evaluation): resolve them here, without typing.
    names = vars(sys.modules[cls.__module__])
    kwargs: dict[str, object] = {}
    for f in fields(cls):
        if f.name in _NOT_KEYS:
            continue
        key = f.name.replace("_", "-")
        if key not in table:
            continue
        value = table[key]
        where = f"{prefix}{key}"
        kwargs[f.name] = _convert(names.get(f.type, f.type), value, source, where)
    return cls(**kwargs)


def _convert(tp: object, value: object, source: str, where: str) -> object:
    def bad(expected: str) -> NvhookError:
        return NvhookError(f"{source}: {where}: expected {expected}, got {type(value).__name__} {_show(value)}")

    if is_record(tp):
        if not isinstance(value, dict):
            raise bad("a table")
        return _build(tp, value, source, where + ".")
    if tp == "bool":
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if tp == "str":
        if not isinstance(value, str):
            raise bad("a string")
        if "\0" in value:      # TOML's \u0000: no path, name or level holds one
            raise bad("a string without NUL characters")
        return value
    if tp == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("a number")
        if where in SECONDS_KEYS:
            return check_seconds(value, f"{source}: {where}")
        try:
            if math.isfinite(float(value)):
                return float(value)
        except OverflowError:   # an int past float's range
            pass
        raise bad("a finite number")
    if tp == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("an integer")
        return value
    if tp == "tuple[str, ...]":
        if not isinstance(value, list) or not all(isinstance(v, str) and "\0" not in v for v in value):
            raise bad("a list of strings (without NUL characters)")
        return tuple(value)
    raise AssertionError(f"config type {tp} not handled")  # a bug in the records above
