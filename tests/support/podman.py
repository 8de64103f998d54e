"""podman (4.3.1, RUNTIMES.md) for tests: its own containers.conf, storage.conf,
registries.conf and state under one dir; nothing of the host's podman setup is used.

That dir must be short (state_dir() makes one): conmon's attach socket lives under it
and sun_path holds 108 bytes; under pytest's long tmp paths every `podman run --rm`
waits out conmon's 20 s timeout instead.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

from support.applyenv import umount_under

PODMAN = shutil.which("podman") or "/usr/bin/podman"

# podman reads CDI specs only from /etc/cdi and /var/run/cdi: it runs in a private mount
# namespace with an overlay on /etc and the spec dir bound on /etc/cdi.
CDI_SH = r'''
set -e
S=$1; SPECS=$2; shift 2
mount -t overlay overlay -o lowerdir=/etc,upperdir=$S/etc-upper,workdir=$S/etc-work /etc
mkdir -p /etc/cdi
mount --bind "$SPECS" /etc/cdi
if [ -d /var/run/cdi ]; then mount -t tmpfs tmpfs /var/run/cdi; fi
exec "$@"
'''


@contextlib.contextmanager
def state_dir(prefix: str = "pm") -> Iterator[Path]:
    """A new short dir under /tmp for Podman's state, removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


class Podman:
    """podman with its config and state under `state`."""

    def __init__(self, state: Path) -> None:
        self.state = state
        for d in ("networks", "tmp", "root", "runroot", "xdg", "hooks", "etc-upper", "etc-work"):
            (state / d).mkdir(parents=True, exist_ok=True)
        (state / "containers.conf").write_text(f"""\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
netns = "none"
[network]
network_config_dir = "{state}/networks"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "{state}/events.log"
tmp_dir = "{state}/tmp"
static_dir = "{state}/root/libpod"
volume_path = "{state}/root/volumes"
""")
        (state / "storage.conf").write_text(f"""\
[storage]
driver = "vfs"
graphroot = "{state}/root"
runroot = "{state}/runroot"
""")
        (state / "registries.conf").write_text("")
        os.chmod(state / "xdg", 0o700)

    def env(self) -> dict[str, str]:
        return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME": str(self.state),
                "CONTAINERS_CONF": str(self.state / "containers.conf"),
                "CONTAINERS_STORAGE_CONF": str(self.state / "storage.conf"),
                "CONTAINERS_REGISTRIES_CONF": str(self.state / "registries.conf"),
                "XDG_RUNTIME_DIR": str(self.state / "xdg")}

    def run(self, rootfs: Path, cmd: Sequence[str], *, hooks_dir: Path | None = None,
            cdi_specs: Path | None = None, env: Sequence[str] = (),
            annotations: dict[str, str] | None = None, devices: Sequence[str] = (),
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`podman run --rm --rootfs ROOTFS:O CMD...` (a throw-away overlay on rootfs).
        hooks_dir: its OCI hooks dir (default: an empty one); cdi_specs: the CDI spec dir
        it sees as /etc/cdi; devices: --device values (CDI names with cdi_specs)."""
        argv = [PODMAN, "--hooks-dir", str(hooks_dir or self.state / "hooks"), "run", "--rm",
                "--pull=never"]
        for e in env:
            argv += ["--env", e]
        for k, v in (annotations or {}).items():
            argv += ["--annotation", f"{k}={v}"]
        for d in devices:
            argv += ["--device", d]
        argv += ["--rootfs", f"{rootfs}:O", *cmd]
        if cdi_specs is not None:
            argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", CDI_SH, "sh",
                    str(self.state), str(cdi_specs), *argv]
        return subprocess.run(argv, env=self.env(), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def cleanup(self) -> None:
        """Remove its containers and storage, and unmount what it left under `state`."""
        subprocess.run([PODMAN, "rm", "-af"], env=self.env(), capture_output=True, timeout=120)
        subprocess.run([PODMAN, "system", "reset", "-f"], env=self.env(), capture_output=True,
                       timeout=120)
        umount_under(self.state)        # vfs/overlay leftovers
