"""The `crio` target: a drop-in /etc/crio/crio.conf.d/99-nvhook.toml with the runtime
handler `nvidia` ([crio.runtime.runtimes.nvidia]: runtime_path = this install's
nvhook-runtime, runtime_type = "oci"), and with set_as_default
[crio.runtime] default_runtime = "nvidia". CRI-O applies drop-ins in name order after
crio.conf, so 99- comes late; other drop-ins are not touched. CRI-O reads every file
under crio.conf.d (subdirectories too), so an earlier nvhook kept the drop-in's backup
in the directory above it (/etc/crio); now it is in the store like every other. An existing file of that name is edited in place
(comments and other keys survive). CRI-O always applies CDI devices (cdi_spec_dirs
default to /etc/cdi and /var/run/cdi): `nvhook setup podman` writes the spec.
"""
from __future__ import annotations

import os

from libinject.constants import SAFE_PATH
from libinject.setup import tomldoc
from libinject.setup.install import Target, edit_file, venv_program

DROP_IN = "/etc/crio/crio.conf.d/99-nvhook.toml"
RUNTIME = "nvidia"
HEADER = ("written by `nvhook setup crio`; `nvhook setup crio --undo` removes it",)
RESTART = "restart CRI-O for it to take effect (`systemctl restart crio`)"


def configure(doc, path: str, shim: str, *, set_as_default: bool,
              nvhook_config: str | None = None, cdi_spec_dirs: list[str] | None = None) -> None:
    """nvhook_config: the config the shim must read. CRI-O starts conmon, and so the
    handler's binary, with only the handler's monitor_env (and conmon_env) and PATH,
    never CRI-O's own environment: NVHOOK_CONFIG reaches the shim only from here.
    cdi_spec_dirs: [crio.runtime] cdi_spec_dirs to write (a drop-in's list replaces
    crio.conf's, so it is the whole list: the effective one plus the spec's dir)."""
    if cdi_spec_dirs is not None:
        tomldoc.put(tomldoc.table(doc, ["crio", "runtime"], path), "cdi_spec_dirs", list(cdi_spec_dirs))
    if set_as_default:
        tomldoc.put(tomldoc.table(doc, ["crio", "runtime"], path), "default_runtime", RUNTIME)
    nv = tomldoc.table(doc, ["crio", "runtime", "runtimes", RUNTIME], path)
    tomldoc.put(nv, "runtime_path", shim)
    tomldoc.put(nv, "runtime_type", "oci")
    if nvhook_config is not None:
        tomldoc.put(nv, "monitor_env", [f"PATH={SAFE_PATH}",
                                        f"NVHOOK_CONFIG={os.path.abspath(nvhook_config)}"])


def setup(config: str = DROP_IN, *, set_as_default: bool = False, dry_run: bool = False,
          undo: bool = False, backup_dir: str | None = None, nvhook_config: str | None = None,
          cdi_spec_dirs: list[str] | None = None) -> str:
    """Write (or undo) CRI-O's drop-in; the text to show. nvhook_config: the config the
    handler's shim reads (`nvhook --config F setup crio`; configure says how)."""
    path = os.path.abspath(config)
    target = Target(path, os.path.dirname(os.path.dirname(path)), store=backup_dir, make_dirs=True, fmt="toml")
    shim = None if undo else venv_program("nvhook-runtime")

    def edit(data: bytes | None) -> bytes:
        doc = tomldoc.parse(data, target.path)
        if not doc.keys() and not (data or b"").strip():
            tomldoc.header(doc, HEADER)
        configure(doc, target.path, shim, set_as_default=set_as_default, nvhook_config=nvhook_config,
                  cdi_spec_dirs=cdi_spec_dirs)
        return tomldoc.dumps(doc)

    changed, text = edit_file(target, edit, dry_run=dry_run, undo=undo)
    if changed and not dry_run:
        text += RESTART + "\n"
    return text
