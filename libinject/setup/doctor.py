"""`nvhook doctor`: is this node set up to give containers GPUs through this install?

One check per line, each OK, WARN or FAIL with what to do: the driver root and NVML, the
fronts and the Python they run, the hook service, each engine's configuration pointing
at this install (docker, containerd, CRI-O, hooks.d), the CDI specs (valid, current),
the cgroup version and the kernel features nvhook uses. Reads only; writes nothing.
An engine whose file is absent is not set up (no line counts against the node for it);
one whose file names another program is a FAIL (its GPU containers would not be ours).
"""
from __future__ import annotations

import json
import os
import subprocess

from libinject.errors import NvhookError
from libinject.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

OK, WARN, FAIL = "OK", "WARN", "FAIL"


@record(frozen=True)
class Check:
    status: str         # OK, WARN or FAIL
    name: str
    detail: str
    todo: str = ""      # what to do, when not OK


@record(frozen=True)
class Paths:
    """Where the engines' files are (tests point them elsewhere)."""
    docker_config: str = "/etc/docker/daemon.json"
    containerd_config: str = "/etc/containerd/config.toml"
    docker_socket: str = "/run/docker.sock"
    containerd_socket: str = "/run/containerd/containerd.sock"
    crio_drop_in: str = "/etc/crio/crio.conf.d/99-nvhook.toml"
    hooks_dir: str = "/usr/share/containers/oci/hooks.d"
    cdi_specs: tuple[str, ...] = ("/etc/cdi/nvidia.yaml", "/var/run/cdi/nvidia.yaml")


def run(paths: Paths, *, config: str | None = None, root: str | None = None,
        ldcache: str | None = None) -> list[Check]:
    from libinject import config as _config

    cfg = _config.load(config)
    out = [_driver(cfg, root, ldcache)]
    out += _fronts()
    out.append(_service(cfg.nvhook.socket))
    out += [c for c in (_docker(paths.docker_config, paths.docker_socket),
                        _containerd(paths.containerd_config, paths.containerd_socket),
                        _crio(paths.crio_drop_in), _hooksd(paths.hooks_dir)) if c is not None]
    out += [c for p in paths.cdi_specs if (c := _cdi_spec(p, config, root, ldcache)) is not None]
    out.append(_cgroups())
    out.append(_kernel())
    return out


# -- the driver, the fronts, the service ----------------------------------------------------

def _driver(cfg, root: str | None, ldcache: str | None) -> Check:
    try:
        d = cfg.discover_options(root=root, ldcache=ldcache).discover()
    except NvhookError as e:
        return Check(FAIL, "driver", str(e), "check the driver root (--root, [nvidia-container-cli] root) "
                     "and that the NVIDIA driver is loaded")
    return Check(OK, "driver", f"{d.info.driver_version} (CUDA {d.info.cuda_version}), "
                 f"{len(d.info.gpus)} GPU(s) under {d.root}; NVML answered")


def _ours(name: str) -> str:
    from libinject.setup.install import venv_program

    return venv_program(name, check=False)


def _fronts() -> list[Check]:
    """Each front there, and running this install's nvhook (its --version)."""
    from libinject import __version__

    out = []
    for name in ("nvhook-hook", "nvhook-runtime"):
        path = _ours(name)
        if not os.access(path, os.X_OK):
            out.append(Check(FAIL, name, f"no {path}", "reinstall (pip), or `make venv` in a checkout"))
            continue
        try:
            r = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, cwd="/",
                               env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        except (OSError, subprocess.TimeoutExpired) as e:
            out.append(Check(FAIL, name, f"{path} does not run: {e}", "reinstall"))
            continue
        first = (r.stdout.splitlines() or [""])[0]
        if r.returncode != 0 or not first.endswith(f" {__version__}"):
            why = (r.stderr.strip().splitlines() or [first or f"exit status {r.returncode}"])[-1]
            out.append(Check(FAIL, name, f"{path}: {why}", "reinstall, or `make venv` in a checkout"))
        else:
            out.append(Check(OK, name, f"{path} runs nvhook {__version__}"))
    return out


def _service(sock: str) -> Check:
    from libinject.runtime.serve.listen import serving

    if serving(sock):
        return Check(OK, "service", f"nvhook serve answers on {sock}: GPU containers are served")
    return Check(WARN, "service", f"nvhook serve is not running on {sock}: GPU containers take the "
                 "exec'd hook (about twice as slow)", "`nvhook setup service`")


# -- the engines -----------------------------------------------------------------------------

def _read(path: str, what: str = "file", follow: bool = True, limit: int = 4 << 20) -> bytes | None:
    """The file (at most `limit` bytes), None when absent; NvhookError when it cannot be
    read (a FIFO or a device is not opened to wait or act: read_bounded)."""
    from libinject.linux.files import read_bounded

    return read_bounded(path, limit, what, missing_ok=True, follow=follow)


def _points(name: str, path: str, found: Any, want: str, setup: str) -> Check:
    if found == want:
        return Check(OK, name, f"{path} runs {want}")
    if found is None:
        return Check(WARN, name, f"{path} has no nvidia runtime", f"`{setup}`")
    return Check(FAIL, name, f"{path} runs {found}, not this install's {want}", f"`{setup}`")


def _answers(sock: str) -> bool:
    """Whether an engine listens on unix socket sock (it is running)."""
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    s.settimeout(5)
    try:
        s.connect(sock)
        return True
    except OSError:
        return False
    finally:
        s.close()


def _docker(path: str, sock: str) -> Check | None:
    data = _read(path)
    running = _answers(sock)
    if data is None:
        # A running dockerd with no daemon.json has no nvidia runtime: `--gpus` and
        # `--runtime nvidia` fail on it (or run NVIDIA's hook, not ours).
        return (Check(FAIL, "docker", f"dockerd is running ({sock}) and {path} does not exist: "
                      "no nvidia runtime", "`nvhook setup docker`") if running else None)
    try:
        doc = json.loads(data or b"{}")
        found = doc.get("runtimes", {}).get("nvidia", {}).get("path")
        cdi = doc.get("features", {}).get("cdi") is True
    except (ValueError, AttributeError) as e:
        return Check(FAIL, "docker", f"{path}: {e}", "fix the file, then `nvhook setup docker`")
    if found is None and running and not cdi:
        return Check(FAIL, "docker", f"dockerd is running ({sock}) and {path} has no nvidia runtime "
                     "(nor CDI on)", "`nvhook setup docker`")
    return _points("docker", path, found, _ours("nvhook-runtime"), "nvhook setup docker")


def _dig(doc: Any, *keys: Any) -> Any:
    """doc[k1][k2]..., None where a level is missing or not a table."""
    for k in keys:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(k)
    return doc


def _toml_runtime(name: str, path: str, dig, setup: str) -> Check | None:
    """A TOML engine config (absent: None) whose nvidia runtime dig(doc) names."""
    import tomllib

    data = _read(path)
    if data is None:
        return None
    try:
        found = dig(tomllib.loads(data.decode()))
    except ValueError as e:
        return Check(FAIL, name, f"{path}: {e}", f"fix the file, then `{setup}`")
    return _points(name, path, found, _ours("nvhook-runtime"), setup)


def _containerd(path: str, sock: str) -> Check | None:
    from libinject.setup.containerd import PLUGINS

    def dig(doc: dict) -> Any:
        plugin = _dig(doc, "plugins", PLUGINS.get(doc.get("version", 1), ""))
        return _dig(plugin, "containerd", "runtimes", "nvidia", "options", "BinaryName")
    check = _toml_runtime("containerd", path, dig, "nvhook setup containerd")
    if check is None or check.status == FAIL:
        return check
    cri = _cri_status(sock)
    if cri is not None and cri != "ok":
        return Check(FAIL, "containerd", f"containerd ({sock}) runs, but its CRI plugin did not load "
                     f"(status {cri}): the node runs no pods",
                     f"read containerd's log for the CRI plugin's error (`journalctl -u containerd`), "
                     f"fix {path} (`nvhook setup containerd` writes runc out), restart containerd")
    return check


def _cri_status(sock: str) -> str | None:
    """The running containerd's CRI plugin status (`ctr plugins ls`: ok, error, skip), or
    None when no containerd answers on sock or there is no ctr to ask."""
    import shutil

    from libinject.constants import SAFE_PATH

    ctr = shutil.which("ctr", path=SAFE_PATH)
    if ctr is None or not _answers(sock):
        return None
    try:
        r = subprocess.run([ctr, "--address", sock, "plugins", "ls"], capture_output=True, text=True,
                           timeout=30, cwd="/", stdin=subprocess.DEVNULL, env={"PATH": SAFE_PATH})
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    status = None
    for line in r.stdout.splitlines():
        cols = line.split()
        # TYPE ID PLATFORMS STATUS (PLATFORMS is "-" or a list without spaces)
        if len(cols) >= 4 and (cols[0], cols[1]) == ("io.containerd.grpc.v1", "cri"):
            status = cols[-1]
    return status     # not listed: disabled on purpose (a Docker host's containerd)


def _crio(path: str) -> Check | None:
    return _toml_runtime("crio", path, lambda doc: _dig(doc, "crio", "runtime", "runtimes", "nvidia",
                                                        "runtime_path"), "nvhook setup crio")


def _hooksd(directory: str) -> Check | None:
    from libinject.runtime.hooksd import FILES

    for name in FILES.values():
        path = os.path.join(directory, name)
        data = _read(path)
        if data is None:
            continue
        try:
            found = json.loads(data).get("hook", {}).get("path")
        except (ValueError, AttributeError) as e:
            return Check(FAIL, "hooks.d", f"{path}: {e}", "`nvhook hooks install`")
        return _points("hooks.d", path, found, _ours("nvhook-hook"), "nvhook hooks install")
    return None


def _cdi_spec(path: str, config: str | None, root: str | None, ldcache: str | None) -> Check | None:
    from libinject.apply import cdi
    from libinject.apply.cdi_validate import validate
    from libinject.setup.podman import spec_text

    # Read once, by an fd that is not a link's: a spec directory may be one a device
    # plugin's container writes (/var/run/cdi), and what is judged is what was read.
    try:
        data = _read(path, "CDI spec", follow=False, limit=cdi.MAX_SPEC_BYTES)
    except NvhookError as e:
        return Check(FAIL, "cdi", str(e), f"remove it, then `nvhook cdi refresh --output {path}`")
    if data is None:
        return None
    try:
        problems = validate(cdi.loads(data, path))
    except NvhookError as e:
        problems = [str(e)]
    if problems:
        return Check(FAIL, "cdi", f"{path}: {problems[0]}", f"`nvhook cdi refresh --output {path}`")
    try:
        current = spec_text(path, config=config, root=root, ldcache=ldcache) == data
    except NvhookError as e:
        return Check(WARN, "cdi", f"{path}: valid, cannot tell whether current: {e}")
    if not current:
        return Check(WARN, "cdi", f"{path}: valid but stale (the host's GPUs or driver changed "
                     "since it was written)", f"`nvhook cdi refresh --output {path}`")
    return Check(OK, "cdi", f"{path}: valid and current")


# -- the kernel --------------------------------------------------------------------------

def _cgroups() -> Check:
    try:
        v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
    except OSError:
        v2 = False
    return Check(OK, "cgroups", "v2: device rules as eBPF programs" if v2 else "v1: devices.allow")


def _kernel() -> Check:
    from libinject.linux import native
    from libinject.runtime.serve.prefault import populate_write_works

    missing = []
    try:
        fd = os.open("/", os.O_PATH)
        try:
            native.mount_id(fd)
        finally:
            os.close(fd)
    except OSError:
        missing.append("statx mount ids (5.8)")
    if not populate_write_works():
        missing.append("MADV_POPULATE_WRITE (5.14: the service's spares are not pre-faulted)")
    release = os.uname().release
    if missing:
        return Check(WARN, "kernel", f"{release}: no {', '.join(missing)}", "a kernel >= 5.14")
    return Check(OK, "kernel", f"{release}: openat2, statx mount ids, pidfds, MADV_POPULATE_WRITE")


def render(checks: list[Check]) -> str:
    lines = []
    for c in checks:
        lines.append(f"{c.status:<4} {c.name}: {c.detail}" + (f"; do: {c.todo}" if c.todo else ""))
    return "\n".join(lines) + "\n"


def as_json(checks: list[Check]) -> str:
    return json.dumps([{"status": c.status, "name": c.name, "detail": c.detail, "todo": c.todo}
                       for c in checks], indent=2) + "\n"
