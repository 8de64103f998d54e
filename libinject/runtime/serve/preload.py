"""What the server imports before it forks any child: the hook's modules and those of
every request kind, so no worker ever imports after the fork (a worker that did logs
"imported after fork")."""
from __future__ import annotations

# What the hook (and the children it forks without exec) may import: all of it before
# any worker runs, so no worker ever reads Python from the front's mount namespace.
PRELOAD = (
    "argparse", "ctypes", "errno", "fcntl", "glob", "grp", "json", "posixpath", "pwd",
    "re", "resource", "select", "signal", "stat", "struct", "subprocess", "time", "tomllib",
    "traceback", "pathlib", "prctl",
    "libinject.linux.native", "libinject.errors", "libinject.linux.files", "libinject.discover.model", "libinject.request.model",
    "libinject.plan.edits", "libinject.config", "libinject.request.oci_state", "libinject.request.oci_spec",
    "libinject.pipeline", "libinject.discover.snapshot", "libinject.discover.driver", "libinject.discover.nvml",
    "libinject.discover.ldcache", "libinject.discover.libraries", "libinject.plan.select", "libinject.plan.require",
    "libinject.plan.procfs", "libinject.plan.planner", "libinject.apply.rootfs", "libinject.apply.ldconfig",
    "libinject.apply.live", "libinject.apply.cgroups", "libinject.apply.bpf",
    "libinject.apply.sdunit", "libinject.linux.sdbus", "socket",   # (a systemd scope's DeviceAllow=)
    "libinject.log", "libinject.linux.safedir", "libinject.request.user", "libinject.discover.options",
    "libinject.runtime.hook", "libinject.constants", "libinject.linux.child",
    "libinject.discover.decode", "libinject.discover.procfs", "libinject.discover.graphics",
    "libinject.linux.privileges", "libinject.linux.proc", "libinject.linux.mountinfo",
    "libinject.linux.atomic", "libinject.tomlfast", "libinject.jsonc", "libinject.record",
    "libinject.apply.ldcache_merge", "_prctl", "libinject.runtime.ceiling",
    "libinject.runtime.cdi_hooks", "libinject.linux.devnodes", "libinject.apply.journal",
    "libinject.linux.resolve", "libinject.hostkey", "libinject.discover.hostfiles",
    "libinject.discover.migminors", "libinject.runtime.front", "libinject.apply.elf",
    "libinject.apply.ldcache_file", "libinject.request.cdi_hook", "libinject.plan.cdi_hook",
    "libinject.plan.compat",
    # the runtime shim's create (libinject.runtime.serve.shim), every mode's
    "libinject.runtime.shim", "libinject.runtime.serve.shim", "libinject.apply.cdi",
    "libinject.apply.cdi_validate", "libinject.apply.spec", "libinject.plan.csv",
    "libinject.installpath",     # (the hook path a legacy create writes: apply.cdi.default_hook_path)
    "yaml", "base64",           # a cdi-mode create reading YAML specs (apply.cdi._load_yaml)
    "libinject.runtime.serve.fallback",     # (the hook's _handle: the exec'd path's log line)
)


def preload() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    try:
        import _blake2  # noqa: F401  (snapshot's hash, without OpenSSL)
    except ImportError:  # pragma: no cover
        import hashlib  # noqa: F401
