"""The `podman` target: podman (>= 4.1) applies CDI devices itself (`podman run
--device nvidia.com/gpu=1`), so nothing of its configuration changes: the CDI spec
for this host's GPUs is written to /etc/cdi/nvidia.yaml (or the file named; .json
for JSON), generated as `nvhook cdi generate` does (libinject.apply.cdi: a device per
GPU and MIG device by index and UUID, plus "all"; hooks run this install's nvhook-hook,
with nvhook's --config when one was given). CRI-O, containerd >= 1.7 (enable_cdi) and
Docker >= 25 (features.cdi) read the same spec. Re-run it when the GPUs or the driver
change; --undo puts back what was there.
"""
from __future__ import annotations

import os

from libinject.setup.install import Target, edit_file, venv_program

SPEC = "/etc/cdi/nvidia.yaml"


def spec_text(path: str, *, config: str | None = None, root: str | None = None,
              ldcache: str | None = None, user: str | None = None, loaded=None) -> bytes:
    """The CDI spec of this host's GPUs, as `nvhook [--config C] cdi generate -o path`
    (loaded: the Config to use instead of reading `config`, which the hooks still name)."""
    from libinject import config as _config
    from libinject.apply import cdi

    cfg = loaded if loaded is not None else _config.load(config)
    options = cfg.discover_options(root=root, ldcache=ldcache, user=user)
    hook = cdi.HookOptions(path=venv_program("nvhook-hook"),
                           ldconfig=cfg.cli.ldconfig or "@/sbin/ldconfig", config=os.path.abspath(config) if config else "",
                           socket=cdi.hook_socket(cfg))
    spec = cdi.generate(options.discover(), hook=hook)
    return cdi.dump(spec, cdi.format_of(path, "yaml")).encode()


def setup(config: str = SPEC, *, nvhook_config: str | None = None, root: str | None = None,
          ldcache: str | None = None, user: str | None = None, dry_run: bool = False,
          undo: bool = False, backup_dir: str | None = None) -> str:
    """Write (or undo) the CDI spec; the text to show."""
    target = Target(config, store=backup_dir, make_dirs=True)
    text = b""
    if not undo:
        text = spec_text(target.path, config=nvhook_config, root=root, ldcache=ldcache, user=user)
    _changed, out = edit_file(target, lambda _data: text, dry_run=dry_run, undo=undo)
    return out
