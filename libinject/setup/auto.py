"""The `auto` target: find the container engines on this node and their CDI support,
then set each up the way that support calls for (the GPU Operator's native-CDI choice):

- native CDI (containerd >= 1.7 with the CRI plugin's enable_cdi, CRI-O >= 1.23,
  Docker >= 25 with features.cdi): the engine applies the CDI spec itself; the spec is
  generated, the `nvidia` runtime (nvhook's shim in cdi mode) is added for the
  operands that name it, and the engine's default runtime is left alone. CDI that the
  engine has but that is off (enable_cdi = false, no features.cdi) is turned on.
- an engine without CDI that runs OCI runtimes (containerd < 1.7, Docker < 25):
  nvhook's shim in cdi mode as the engine's default runtime, reading the devices from
  `nvidia.cdi.k8s.io/` annotations (the device plugin's cdi-annotations strategy),
  which no engine acts on itself, and for containerd < 1.7 alone on the node from
  `cdi.k8s.io/` ones too (the plugin's default prefix; nothing else applies them there).
  containerd hands a container's annotations to the runtime only when the runtime's
  `container_annotations` match them: auto lists the prefixes there (`PREFIX*`);
- CRI-O without CDI: the hooks.d hook (`nvhook hooks install`'s "always" file).

Support is read from what the engine says of itself, not from its version alone (forks
renumber): containerd's effective config (`containerd config dump`: enable_cdi under
the CRI plugin is there from 1.7 on, absent in 1.6), `docker info` (CDISpecDirs, from
25 on; empty when CDI is off), `crio config` (cdi_spec_dirs, from 1.23 on); the
version decides only when those cannot be had, and every decision says why.

decide() is a pure function of the gathered facts (is the binary there, its version
text, its effective config text); gather() runs the engines' binaries with deadlines.
setup() writes through each engine's target (libinject.setup.containerd, crio,
docker), nvhook's config.toml ([nvidia-container-runtime] mode = "cdi", and
modes.cdi.annotation-prefixes when the decision says so) and the CDI spec (by default
/var/run/cdi/nvidia.yaml, the file `nvhook cdi refresh` keeps current: one spec, never
a stale copy in /etc/cdi beside it), each with the shared backup / --undo / --dry-run
mechanics. A spec outside the engines' spec dirs (--cdi-spec elsewhere) is added to
each reader's list: the shim's modes.cdi.spec-dirs, containerd's and CRI-O's
cdi_spec_dirs (native CDI). Every file's new text is computed
(and every file parsed) before the first is written, so an error changes nothing.
It never installs the systemd unit of `nvhook serve` (`nvhook setup service` does).
"""
from __future__ import annotations

import json
import os
import re

from libinject.errors import NvhookError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# The engines' binaries (None: looked up on SAFE_PATH) and how long each may run.
CONTAINERD_BIN: str | None = None
CRIO_BIN: str | None = None
DOCKERD_BIN: str | None = None
DOCKER_BIN: str | None = None
GATHER_TIMEOUT = 20.0
MAX_OUTPUT = 1 << 20

ENGINES = ("containerd", "crio", "docker")
ANNOTATION_PREFIX = "nvidia.cdi.k8s.io/"   # the GPU Operator's device-plugin prefix
CDI_PREFIX = "cdi.k8s.io/"                 # the device plugin's default one
DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
HOOKS_DIR = "/usr/share/containers/oci/hooks.d"
HEADER = ("written by `nvhook setup auto`; `nvhook setup auto --undo` removes it",)
CRI_PLUGINS = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}

NATIVE, RUNTIME, HOOK = "native-cdi", "runtime-cdi", "hooks.d"


class Facts:
    """What gather() learnt of one engine: binary (its path, None: not installed),
    version_text (`X --version`), config_text (its effective config: `containerd config
    dump`, `crio config`; None: could not be had, config_error says why), and for
    Docker daemon_json (the text of daemon.json, None: none) and info_text (`docker
    info --format '{{json .}}'`, None: no answer)."""

    __slots__ = ("engine", "binary", "version_text", "config_text", "config_error",
                 "daemon_json", "info_text")

    def __init__(self, engine: str, binary: str | None = None, version_text: str = "",
                 config_text: str | None = None, config_error: str = "",
                 daemon_json: str | None = None, info_text: str | None = None) -> None:
        self.engine, self.binary, self.version_text = engine, binary, version_text
        self.config_text, self.config_error = config_text, config_error
        self.daemon_json, self.info_text = daemon_json, info_text


class Decision:
    """What to do with one engine. method: NATIVE (the engine applies CDI), RUNTIME
    (nvhook's shim in cdi mode as its default runtime) or HOOK (the hooks.d hook);
    enable_cdi: turn the engine's CDI on (it has it, off)."""

    __slots__ = ("engine", "version", "method", "enable_cdi", "reasons", "prefixes", "spec_dirs")

    def __init__(self, engine: str, version: str, method: str, reasons: list[str],
                 enable_cdi: bool = False, spec_dirs: list[str] | None = None) -> None:
        self.engine, self.version, self.method = engine, version, method
        self.enable_cdi, self.reasons = enable_cdi, reasons
        # decide() may widen it (containerd < 1.7 alone: the device plugin's default too)
        self.prefixes = [ANNOTATION_PREFIX] if method == RUNTIME else []
        # the engine's own CDI spec dirs (native CDI: where it looks for the spec)
        self.spec_dirs = spec_dirs

    @property
    def native_cdi(self) -> bool:
        return self.method == NATIVE

    @property
    def runtime_mode(self) -> str | None:
        """The mode of nvhook's shim for this engine (None: the shim is not used)."""
        return "cdi" if self.method in (NATIVE, RUNTIME) else None

    @property
    def set_as_default(self) -> bool:
        return self.method == RUNTIME

    @property
    def annotation_prefixes(self) -> list[str]:
        """The annotation prefixes nvhook's runtime must read for this engine ([]: none
        of its own; the config's stay)."""
        return list(self.prefixes)

    @property
    def container_annotations(self) -> list[str]:
        """containerd < 1.7 hands a container's annotations to the runtime only when its
        runtime's container_annotations match them: the prefixes the shim reads.
        (Not pod_annotations: a pod's annotations are its author's to choose, the
        container's come from the kubelet and the device plugin.)"""
        return [p + "*" for p in self.prefixes] if self.engine == "containerd" and self.method == RUNTIME else []

    def as_json(self) -> dict[str, Any]:
        return {"engine": self.engine, "version": self.version, "native_cdi": self.native_cdi,
                "runtime_mode": self.runtime_mode, "set_as_default": self.set_as_default,
                "annotation_prefixes": self.annotation_prefixes,
                "container_annotations": self.container_annotations, "method": self.method,
                "enable_cdi": self.enable_cdi, "reasons": list(self.reasons)}

    def summary(self) -> str:
        if self.method == NATIVE:
            what = ("native CDI: the engine applies the CDI spec; nvhook's runtime (cdi mode) "
                    "added for the operands, the default runtime left alone")
            if self.enable_cdi:
                what += "; turning the engine's CDI on"
        elif self.method == RUNTIME:
            what = (f"no native CDI: nvhook's runtime in cdi mode as the default runtime, "
                    f"annotation prefix{'es' if len(self.prefixes) > 1 else ''} {', '.join(self.prefixes)}")
        else:
            what = "no native CDI: the hooks.d hook"
        return f"{self.engine} {self.version or '(version unknown)'}: {what}"


# -- the decision: pure ------------------------------------------------------------------------

def version_of(engine: str, text: str) -> str:
    """The version as the engine prints it ("" when none can be found)."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    if engine == "containerd":
        parts = first.split()               # containerd REPO VERSION REVISION
        if len(parts) >= 3:
            return parts[2]
    m = re.search(r"(?i)\bversion\b[:\s]*v?([0-9][^\s,]*)", text)
    if m:
        return m.group(1)
    return first[:80]


def number(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version string, None when it starts with neither."""
    m = re.match(r"v?(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _since(version: str, first: tuple[int, int]) -> bool | None:
    n = number(version)
    return None if n is None else n >= first


def _otherwise(version: str, since: bool | None, by: str) -> str:
    if since is None:
        return f"its version {version!r} is not one to go by; {by} decides"
    return f"its version {version} would say otherwise; {by} decides"


def _toml(text: str) -> dict | None:
    import tomllib

    try:
        return tomllib.loads(text)
    except (tomllib.TOMLDecodeError, ValueError):
        return None


def _containerd(f: Facts) -> Decision:
    version = version_of("containerd", f.version_text)
    since = _since(version, (1, 7))
    reasons: list[str] = []
    doc = _toml(f.config_text) if f.config_text is not None else None
    section = None
    if doc is not None:
        v = doc.get("version", 1)
        plugin = CRI_PLUGINS.get(v if isinstance(v, int) else 0, CRI_PLUGINS[2])
        section = (doc.get("plugins") or {}).get(plugin)
    if isinstance(section, dict):
        where = f'[plugins."{plugin}"] of its effective config (`containerd config dump`)'
        if "enable_cdi" in section:
            on = section["enable_cdi"] is True
            reasons.append(f"{where} has enable_cdi = {str(on).lower()}: this containerd has CDI")
            if not since:
                reasons.append(_otherwise(version, since, "the config"))
            reasons.append("CDI is on: containerd applies the CDI spec itself" if on else
                           "CDI is off: turning it on (enable_cdi = true)")
            return Decision("containerd", version, NATIVE, reasons, enable_cdi=not on,
                            spec_dirs=_dirs(section.get("cdi_spec_dirs")))
        reasons.append(f"{where} has no enable_cdi: no CDI in this containerd (it came in 1.7)")
        if since is not False:
            reasons.append(_otherwise(version, since, "the config"))
        return Decision("containerd", version, RUNTIME, reasons)
    if doc is None:
        reasons.append("no effective config to read (`containerd config dump`"
                       + (f": {f.config_error})" if f.config_error else ")"))
    else:
        reasons.append("its effective config has no CRI plugin section")
    if since:
        reasons.append(f"decided by its version {version}: CDI since 1.7; turning it on (enable_cdi = true)")
        return Decision("containerd", version, NATIVE, reasons, enable_cdi=True, spec_dirs=list(DEFAULT_SPEC_DIRS))
    reasons.append(f"decided by its version {version}: no CDI before 1.7" if since is False else
                   f"cannot read its version {version!r}: taken as without CDI")
    return Decision("containerd", version, RUNTIME, reasons)


def _crio(f: Facts) -> Decision:
    version = version_of("crio", f.version_text)
    since = _since(version, (1, 23))
    reasons: list[str] = []
    if f.config_text is not None:
        has = re.search(r"(?m)^[ \t]*#?[ \t]*cdi_spec_dirs[ \t]*=", f.config_text) is not None
        if has:
            reasons.append("its effective config (`crio config`) has cdi_spec_dirs: CRI-O "
                           "applies CDI devices itself (always on)")
        else:
            reasons.append("its effective config (`crio config`) has no cdi_spec_dirs: no CDI "
                           "in this CRI-O (it came in 1.23)")
        if since is not has:
            reasons.append(_otherwise(version, since, "the config"))
    else:
        reasons.append("no effective config to read (`crio config`"
                       + (f": {f.config_error})" if f.config_error else ")"))
        has = bool(since)
        reasons.append(f"decided by its version {version}: " + ("CDI since 1.23" if has else "no CDI before 1.23")
                       if since is not None else f"cannot read its version {version!r}: taken as without CDI")
    if has:
        crio = _toml(f.config_text) if f.config_text is not None else None
        runtime = ((crio or {}).get("crio") or {}).get("runtime") if isinstance(crio, dict) else None
        return Decision("crio", version, NATIVE, reasons,
                        spec_dirs=_dirs(runtime.get("cdi_spec_dirs") if isinstance(runtime, dict) else None))
    reasons.append("CRI-O runs OCI hooks from hooks.d: nvhook's hook goes there")
    return Decision("crio", version, HOOK, reasons)


def _docker(f: Facts) -> Decision:
    version = version_of("docker", f.version_text)
    since = _since(version, (25, 0))
    reasons: list[str] = []
    try:
        daemon = json.loads(f.daemon_json) if f.daemon_json and f.daemon_json.strip() else {}
    except ValueError:
        daemon = {}
    features = daemon.get("features") if isinstance(daemon, dict) else None
    cdi_flag = features.get("cdi") if isinstance(features, dict) else None
    try:
        info = json.loads(f.info_text) if f.info_text else None
    except ValueError:
        info = None
    if isinstance(info, dict) and "CDISpecDirs" in info:
        dirs = info.get("CDISpecDirs") or []
        on = bool(dirs)
        reasons.append("`docker info` has CDISpecDirs: this dockerd has CDI ("
                       + (f"on: {', '.join(map(str, dirs))})" if on else "empty: off)"))
        if not since:
            reasons.append(_otherwise(version, since, "`docker info`"))
    elif since:
        on = cdi_flag is True or (_since(version, (28, 0)) is True and cdi_flag is not False)
        reasons.append(f"no `docker info` to read; decided by its version {version}: CDI since 25, "
                       + ("on" if on else "off") + f" (daemon.json features.cdi: {json.dumps(cdi_flag)})")
    else:
        reasons.append(("no CDISpecDirs in `docker info`" if isinstance(info, dict) else "no `docker info` to read")
                       + (f"; its version {version}: no CDI before 25" if since is False else
                          f"; cannot read its version {version!r}: taken as without CDI"))
        return Decision("docker", version, RUNTIME, reasons)
    reasons.append("CDI is on: dockerd applies the CDI spec itself" if on else
                   "CDI is off: turning it on (daemon.json features.cdi = true)")
    return Decision("docker", version, NATIVE, reasons, enable_cdi=not on)


def _dirs(value: Any) -> list[str]:
    """An engine's cdi_spec_dirs as its config gives them (absent: the CDI default)."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    return list(DEFAULT_SPEC_DIRS)


def decide(facts: list[Facts]) -> list[Decision]:
    """One Decision per engine whose binary is there, in the order of facts."""
    rules = {"containerd": _containerd, "crio": _crio, "docker": _docker}
    out = [rules[f.engine](f) for f in facts if f.binary]
    # containerd < 1.7 applies no CDI annotation itself, so nvhook's runtime (its default)
    # reads the device plugin's default prefix as well as the GPU Operator's. Not when an
    # engine here applies cdi.k8s.io/ itself (CRI-O, containerd >= 1.7): nvhook's config is
    # one for the node, and that engine's nvidia handler would apply those devices twice.
    native = [d.engine for d in out if d.method == NATIVE and d.engine in ("containerd", "crio")]
    for d in out:
        if d.engine == "containerd" and d.method == RUNTIME:
            if native:
                d.reasons.append(f"{', '.join(native)} here applies {CDI_PREFIX} annotations itself: "
                                 f"nvhook's runtime reads {ANNOTATION_PREFIX} only")
            else:
                d.prefixes = [CDI_PREFIX, ANNOTATION_PREFIX]
                d.reasons.append(f"nothing here applies CDI annotations: nvhook's runtime reads {CDI_PREFIX} "
                                 f"(the device plugin's default) and {ANNOTATION_PREFIX} (the GPU Operator's), "
                                 "and containerd passes them on (container_annotations)")
    return out


# -- gathering: the engines' binaries, with deadlines -------------------------------------------

class Paths:
    """Where auto looks and writes (the defaults are the engines' own)."""

    def __init__(self, *, containerd_config: str | None = None, containerd_bin: str | None = None,
                 crio_drop_in: str | None = None, crio_config: str | None = None,
                 crio_bin: str | None = None, docker_config: str | None = None,
                 docker_hook_dir: str | None = None, dockerd_bin: str | None = None,
                 docker_bin: str | None = None, hooks_dir: str | None = None,
                 cdi_spec: str | None = None, backup_dir: str | None = None) -> None:
        from libinject.apply.cdi_refresh import DEFAULT_OUTPUT
        from libinject.setup import containerd, crio, docker

        self.containerd_config = containerd_config or containerd.CONFIG
        self.containerd_bin = containerd_bin or CONTAINERD_BIN
        self.crio_drop_in = crio_drop_in or crio.DROP_IN
        self.crio_config = crio_config          # None: crio's own
        self.crio_bin = crio_bin or CRIO_BIN
        self.docker_config = docker_config or docker.DAEMON_JSON
        self.docker_hook_dir = docker_hook_dir or docker.HOOK_DIR
        self.dockerd_bin = dockerd_bin or DOCKERD_BIN
        self.docker_bin = docker_bin or DOCKER_BIN
        self.hooks_dir = hooks_dir or HOOKS_DIR
        self.cdi_spec = cdi_spec or DEFAULT_OUTPUT
        self.backup_dir = backup_dir            # None: libinject.setup.store.STORE_DIR


def _which(given: str | None, name: str) -> str | None:
    import shutil

    from libinject.constants import SAFE_PATH

    if given:
        return given if os.path.isfile(given) and os.access(given, os.X_OK) else None
    return shutil.which(name, path=SAFE_PATH)


def _run(argv: list[str]) -> tuple[str | None, str]:
    """(stdout, "") of a run that exited 0, else (None, why)."""
    from libinject.constants import SAFE_PATH
    from libinject.linux.child import run

    try:
        code, out, err = run(argv, timeout=GATHER_TIMEOUT, env={"PATH": SAFE_PATH}, limit=MAX_OUTPUT)
    except TimeoutError as e:
        return None, f"{os.path.basename(argv[0])}: {e}"
    except OSError as e:
        return None, f"{argv[0]}: {e.strerror}"
    if code != 0:
        last = err.decode(errors="replace").strip().splitlines()
        return None, f"exit {code}" + (f": {last[-1][:200]}" if last else "")
    return out.decode(errors="replace"), ""


def _read_text(path: str) -> str | None:
    from libinject.setup.install import MAX_FILE

    try:
        with open(path, "rb") as f:
            return f.read(MAX_FILE).decode(errors="replace")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise NvhookError(f"{path}: {e.strerror}") from None


def gather(paths: Paths) -> list[Facts]:
    """The facts of each engine, from its binaries and files."""
    out = []
    b = _which(paths.containerd_bin, "containerd")
    f = Facts("containerd", b)
    if b:
        f.version_text = _run([b, "--version"])[0] or ""
        cfg = paths.containerd_config if os.path.exists(paths.containerd_config) else "/dev/null"
        f.config_text, f.config_error = _run([b, "--config", cfg, "config", "dump"])
    out.append(f)
    b = _which(paths.crio_bin, "crio")
    f = Facts("crio", b)
    if b:
        f.version_text = _run([b, "--version"])[0] or ""
        f.config_text, f.config_error = _run(
            [b, *(["--config", paths.crio_config] if paths.crio_config else []), "config"])
    out.append(f)
    b = _which(paths.dockerd_bin, "dockerd")
    f = Facts("docker", b)
    if b:
        f.version_text = _run([b, "--version"])[0] or ""
        f.daemon_json = _read_text(paths.docker_config)
        client = _which(paths.docker_bin, "docker")
        if client:
            f.info_text = _run([client, "info", "--format", "{{json .}}"])[0]
    out.append(f)
    return out


# -- applying ---------------------------------------------------------------------------------

def config_edit(data: bytes | None, path: str, prefixes: list[str], spec_dir: str | None = None) -> bytes:
    """nvhook's config.toml with [nvidia-container-runtime] mode = "cdi" (and
    modes.cdi.annotation-prefixes = prefixes, unless empty; and spec_dir added to
    modes.cdi.spec-dirs when they do not have it: the shim finds the spec auto wrote)."""
    from libinject.setup import tomldoc

    doc = tomldoc.parse(data, path)
    if not doc.keys() and not (data or b"").strip():
        tomldoc.header(doc, HEADER)
    tomldoc.put(tomldoc.table(doc, ["nvidia-container-runtime"], path), "mode", "cdi")
    if prefixes:
        t = tomldoc.table(doc, ["nvidia-container-runtime", "modes", "cdi"], path)
        tomldoc.put(t, "annotation-prefixes", list(prefixes))
    if spec_dir:
        cur = tomldoc._plain(doc).get("nvidia-container-runtime", {}).get("modes", {}).get("cdi", {})
        dirs = _dirs(cur.get("spec-dirs") if isinstance(cur, dict) else None)
        if spec_dir not in dirs:
            t = tomldoc.table(doc, ["nvidia-container-runtime", "modes", "cdi"], path)
            tomldoc.put(t, "spec-dirs", dirs + [spec_dir])
    return tomldoc.dumps(doc)


def spec_dir(paths: Paths) -> str:
    """The directory of the CDI spec auto writes: every reader of it must look there."""
    return os.path.dirname(os.path.abspath(paths.cdi_spec))


def _wanted_dirs(d: Decision, paths: Paths) -> list[str] | None:
    """The engine's cdi_spec_dirs with the spec's directory added (None: it has it, or
    the engine does not apply CDI itself)."""
    if d.method != NATIVE or d.spec_dirs is None or d.engine not in ("containerd", "crio"):
        return None
    where = spec_dir(paths)
    return None if where in d.spec_dirs else [*d.spec_dirs, where]


def _engine_call(d: Decision, paths: Paths, config: str | None, *, dry_run: bool) -> str:
    from libinject.setup import containerd, crio, docker

    if d.engine == "containerd":
        return containerd.setup(paths.containerd_config, set_as_default=d.set_as_default,
                                cdi=d.enable_cdi, dry_run=dry_run, backup_dir=paths.backup_dir,
                                container_annotations=d.container_annotations,
                                cdi_spec_dirs=_wanted_dirs(d, paths))
    if d.engine == "docker":
        return docker.setup(paths.docker_config, hook_dir=paths.docker_hook_dir,
                            set_as_default=d.set_as_default, cdi=d.enable_cdi, dry_run=dry_run,
                            backup_dir=paths.backup_dir)
    if d.method == NATIVE:
        return crio.setup(paths.crio_drop_in, set_as_default=False, dry_run=dry_run,
                          backup_dir=paths.backup_dir, cdi_spec_dirs=_wanted_dirs(d, paths),
                          nvhook_config=_nvhook_config(config) if d.runtime_mode == "cdi" else config)
    return ""       # CRI-O with the hooks.d hook: its file is one of the shared ones


# -- making the engines take the new configuration --------------------------------------------

# How each engine takes a changed config through the host's systemd (--restart-engines),
# as NVIDIA's toolkit container does it: containerd and CRI-O read theirs only at start
# (a restart; running containers keep running: their shims are separate processes);
# dockerd reloads runtimes and default-runtime on SIGHUP (its unit's ExecReload), which
# spares its containers (features.cdi needs a restart: one when auto turned it on).
RESTART = {"containerd": ("restart", "containerd.service"), "crio": ("restart", "crio.service"),
           "docker": ("reload", "docker.service")}
RESTART_TIMEOUT = 120.0


def _pending(engine: str) -> str:
    # A sealed record in the store: a restart that failed is tried again by the next run
    # even though the files are then unchanged (the engine still runs the old config).
    return f"restart-pending:{engine}"


def restart_engines(engines: list[str], paths: Paths, systemctl, *, running: bool,
                    full: frozenset[str] = frozenset()) -> tuple[str, list[str]]:
    """Restart (or reload) `engines` and any whose earlier restart failed: (what was
    done, one line per failure). systemctl(argv, timeout) -> "" or what went wrong;
    full: engines to restart even where a reload would do."""
    from libinject.setup import store

    where = paths.backup_dir or store.STORE_DIR
    todo = [e for e in ENGINES if e in engines or _has_pending(where, e)]
    done, failed = "", []
    for e in todo:
        verb, unit = RESTART[e]
        verb = "restart" if e in full else verb
        store.write(where, store.Record(_pending(e), "none"))
        why = systemctl([verb, unit], RESTART_TIMEOUT) if running else "systemd is not running here"
        if why:
            failed.append(f"could not {verb} {e} (`systemctl {verb} {unit}`): {why}; it still runs its "
                          "old configuration (the next `nvhook setup auto --restart-engines` tries again)")
            continue
        store.remove(where, _pending(e))
        done += f"{verb}ed {e} (`systemctl {verb} {unit}`): it takes its new configuration\n"
    return done, failed


def _has_pending(where: str, engine: str) -> bool:
    from libinject.setup import store

    try:
        return store.read(where, _pending(engine), 0) is not None
    except NvhookError:
        return False


def _hook_target(paths: Paths):
    from libinject.runtime.hooksd import FILES
    from libinject.setup.install import Target

    return Target(os.path.join(paths.hooks_dir, FILES["always"]), store=paths.backup_dir, make_dirs=True)


def _nvhook_config(config: str | None) -> str:
    from libinject.config import config_path

    return os.path.abspath(config_path(config)[0])


def plan_files(decisions: list[Decision], paths: Paths, config: str | None, *, root: str | None,
               ldcache: str | None, user: str | None) -> list[tuple[Any, bytes]]:
    """(Target, wanted bytes) of the files auto shares among the engines: nvhook's
    config.toml, the CDI spec, the hooks.d file. Reads and parses them; writes nothing."""
    from libinject import config as _config
    from libinject.runtime import hooksd
    from libinject.setup import podman
    from libinject.setup.install import Target, venv_program

    files: list[tuple[Any, bytes]] = []
    if any(d.runtime_mode == "cdi" for d in decisions):
        cfg_path = _nvhook_config(config)
        target = Target(cfg_path, store=paths.backup_dir, make_dirs=True, fmt="toml")
        cur = target.read()
        if cur is not None and cur.kind == "link":
            raise NvhookError(f"{target.path} is a symlink: name the file it points to with --config")
        prefixes = sorted({p for d in decisions for p in d.annotation_prefixes})
        wanted = config_edit(cur.data if cur is not None else None, target.path, prefixes, spec_dir(paths))
        loaded = _config.parse(wanted, target.path)         # what the shim will read: valid
        files.append((target, wanted))
        spec = Target(paths.cdi_spec, store=paths.backup_dir, make_dirs=True)
        files.append((spec, podman.spec_text(spec.path, config=cfg_path, root=root, ldcache=ldcache,
                                             user=user, loaded=loaded)))
    if any(d.method == HOOK for d in decisions):
        doc = hooksd.render("always", venv_program("nvhook-hook"), config)
        files.append((_hook_target(paths), hooksd.dumps(doc).encode()))
    return files


def _put_files(files: list[tuple[Any, bytes]], *, dry_run: bool) -> str:
    from libinject.setup.install import edit_file

    return "".join(edit_file(t, lambda _data, b=b: b, dry_run=dry_run)[1] for t, b in files)


def _restart_line(engine: str) -> str:
    from libinject.setup import containerd, crio, docker

    return {"containerd": containerd.RESTART, "crio": crio.RESTART, "docker": docker.RESTART}[engine]


def apply(decisions: list[Decision], paths: Paths, config: str | None, *, root: str | None = None,
          ldcache: str | None = None, user: str | None = None, dry_run: bool = False,
          changed: list[str] | None = None) -> str:
    """Set the engines up as decided; the text to show (dry_run: the diffs). changed:
    gets the engines whose own config changed (they must restart to see it)."""
    files = plan_files(decisions, paths, config, root=root, ldcache=ldcache, user=user)
    # Every engine's file parsed and its change computed (and every backup that would be
    # refused, refused) before anything is written.
    shown = [_engine_call(d, paths, config, dry_run=True) for d in decisions]
    put = _put_files(files, dry_run=True)
    if dry_run:
        return put + "".join(shown)
    text = _put_files(files, dry_run=False)
    for d in decisions:
        t = _engine_call(d, paths, config, dry_run=False)
        if changed is not None and _restart_line(d.engine) in t:
            changed.append(d.engine)
        text += t
    return text


def _ours_link(paths: Paths) -> bool:
    from libinject.setup.docker import HOOK_NAME
    from libinject.setup.install import venv_program

    try:
        return os.readlink(os.path.join(paths.docker_hook_dir, HOOK_NAME)) == venv_program(
            "nvhook-hook", check=False)
    except OSError:
        return False


def _has_backup(target) -> bool:
    from libinject.setup.store import BackupRefused

    try:
        return target.has_backup()
    except BackupRefused:       # one it must not put back: said, not skipped
        raise
    except NvhookError:         # its directory is not there
        return False


def undo(paths: Paths, config: str | None, *, dry_run: bool = False) -> tuple[str, list[str]]:
    """Put back every file auto changed (whatever the engines are now): (the text to
    show, the engines undone)."""
    from libinject.setup import containerd, crio, docker
    from libinject.setup.install import Target, edit_file

    work = []   # (engine or "", run(dry_run) -> text)
    main = Target(paths.containerd_config)
    if os.path.isdir(main.dir):
        def run_containerd(dry: bool) -> str:
            text = containerd.setup(paths.containerd_config, dry_run=dry, undo=True, backup_dir=paths.backup_dir)
            return "" if text.startswith("nothing to undo") else text
        work.append(("containerd", run_containerd))
    drop = Target(paths.crio_drop_in, os.path.dirname(os.path.dirname(os.path.abspath(paths.crio_drop_in))),
                  store=paths.backup_dir, make_dirs=True)
    if _has_backup(drop):
        work.append(("crio", lambda dry: crio.setup(paths.crio_drop_in, dry_run=dry, undo=True,
                                                    backup_dir=paths.backup_dir)))
    if _has_backup(Target(paths.docker_config, store=paths.backup_dir, make_dirs=True)) or _ours_link(paths):
        work.append(("docker", lambda dry: docker.setup(paths.docker_config, hook_dir=paths.docker_hook_dir,
                                                        dry_run=dry, undo=True, backup_dir=paths.backup_dir)))
    for t in (_hook_target(paths), Target(paths.cdi_spec, store=paths.backup_dir, make_dirs=True),
              Target(_nvhook_config(config), store=paths.backup_dir, make_dirs=True, fmt="toml")):
        if _has_backup(t):
            work.append(("", lambda dry, t=t: edit_file(t, None, dry_run=dry, undo=True)[1]))
    # Every file read and parsed (a dry run) before anything is put back.
    shown = [(e, run(True)) for e, run in work]
    texts = shown if dry_run else [(e, run(False)) for e, run in work]
    done = [e for e, text in texts if e and text]
    text = "".join(t for _, t in texts)
    return text or "nothing to undo: `nvhook setup auto` has changed nothing here\n", done


class Restarter:
    """--restart-engines: systemctl(argv, timeout) -> "" or what went wrong; running:
    whether systemd is PID 1 here. failed collects one line per engine it could not
    restart (the CLI prints them and exits non-zero, after the rest is done)."""

    def __init__(self, systemctl, running: bool) -> None:
        self.systemctl, self.running = systemctl, running
        self.failed: list[str] = []

    def __call__(self, engines: list[str], paths: Paths, full: frozenset[str] = frozenset()) -> str:
        text, failed = restart_engines(engines, paths, self.systemctl, running=self.running, full=full)
        self.failed += failed
        return text


def setup(paths: Paths, *, config: str | None = None, root: str | None = None,
          ldcache: str | None = None, user: str | None = None, dry_run: bool = False,
          undo_: bool = False, as_json: bool = False, facts: list[Facts] | None = None,
          restart: Restarter | None = None) -> str:
    """Detect, decide, apply (or undo); the text to show (as_json: a JSON object with
    "engines", one object per engine detected, and "changes", the text). restart: make
    the engines whose config changed take it (and any whose restart failed before)."""
    if undo_:
        text, done = undo(paths, config, dry_run=dry_run)
        if restart is not None and not dry_run:
            text += restart([e for e in done if e in RESTART], paths)
        if as_json:
            return json.dumps({"undo": True, "dry_run": dry_run, "engines": [], "undone": done,
                               "changes": text}, indent=2) + "\n"
        return text
    decisions = decide(gather(paths) if facts is None else facts)
    changed: list[str] = []
    if not decisions:
        text = "no container engine found (containerd, CRI-O, Docker): nothing to set up\n"
    else:
        changes = apply(decisions, paths, config, root=root, ldcache=ldcache, user=user, dry_run=dry_run,
                        changed=changed)
        if restart is not None and not dry_run:
            changes += restart(changed, paths, frozenset(d.engine for d in decisions
                                                         if d.engine == "docker" and d.enable_cdi))
    if as_json:
        return json.dumps({"undo": False, "dry_run": dry_run,
                           "engines": [d.as_json() for d in decisions],
                           "changes": changes if decisions else ""}, indent=2) + "\n"
    if not decisions:
        return text
    lines = []
    for d in decisions:
        lines.append(d.summary() + "\n")
        lines += [f"  why: {r}\n" for r in d.reasons]
    return "".join(lines) + changes
