"""Rootless Docker, as Debian ships it (docker.io's dockerd-rootless.sh under rootlesskit,
run by an unprivileged user), with NVIDIA's documented rootless set-up: `no-cgroups = true`
in /etc/nvidia-container-runtime/config.toml and `docker run --gpus`. dockerd's --gpus
runs the `nvidia-container-runtime-hook` on its PATH (the link `nvhook setup docker`
makes to nvhook's front) as runc's prestart hook, in rootlesskit's user namespace.
NVIDIA's legacy hook starts such a container without a device cgroup; so does nvhook.

The daemon runs as the user (support.podman.rootless_user) in a private mount namespace
where the hook's Python is reachable (support.podman.rootless_sh); rootlesskit's copied-up
/etc holds the config (nothing of the host's /etc is written), host networking
(DOCKERD_ROOTLESS_ROOTLESSKIT_NET=host: no slirp4netns needed, containers run with
--network none).
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest

from support import hookenv
from support.podman import rootless_sh, rootless_user, unreachable_dirs

DOCKER = "/usr/bin/docker"
ROOTLESS_SH = "/usr/share/docker.io/contrib/dockerd-rootless.sh"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PROBE = ("nvidia-smi -L; ls /proc/driver/nvidia/gpus; "
         "for d in /dev/nvidia1 /dev/nvidia0; do dd if=$d of=/dev/null bs=1 count=0 2>&1 | "
         "grep -o \"can't open.*\" || echo \"$d: OK\"; done")
# In rootlesskit's namespaces, before dockerd (what dockerd-rootless.sh's child does,
# plus the config in the copied-up /etc and no hook service socket of the host's).
CHILD = ('rm -rf /run/docker /run/containerd /run/xtables.lock /run/nvhook '
         '/etc/nvidia-container-runtime && mkdir /etc/nvidia-container-runtime && '
         'cp "$NVHOOK_TEST_CONFIG" /etc/nvidia-container-runtime/config.toml && exec dockerd "$@"')


class RootlessDocker:
    def __init__(self, base: Path, user, hook_bin: Path, config: Path) -> None:
        self.d = base / "d"
        self.d.mkdir()
        (self.d / "run").mkdir(mode=0o700)
        subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(self.d)], check=True, timeout=60)
        self.sock = self.d / "docker.sock"
        reach = unreachable_dirs([hookenv.ensure_front(), hookenv.PY, hookenv.REPO,
                                  sysconfig.get_paths()["purelib"], sys.base_prefix])
        ns = base / "ns"
        ns.mkdir()
        script = rootless_sh(ns, user, reach=reach)
        dockerd = ["--data-root", f"{self.d}/data", "--exec-root", f"{self.d}/exec",
                   "-H", f"unix://{self.sock}", "--pidfile", f"{self.d}/pid", "--iptables=false",
                   "--bridge=none", "--storage-driver=vfs", "--userland-proxy=false"]
        env = ["env", "-i", f"PATH={hook_bin}:{PATH}", f"HOME={self.d}", f"XDG_RUNTIME_DIR={self.d}/run",
               f"NVHOOK_TEST_CONFIG={config}"]
        kit = ["rootlesskit", "--net=host", "--copy-up=/etc", "--copy-up=/run", "--propagation=rslave",
               f"--state-dir={self.d}/rk", "sh", "-c", CHILD, "sh", *dockerd]
        self.log = base / "dockerd.log"
        self.proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script,
                                      "sh", *env, *kit], stdout=open(self.log, "wb"),
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.sock.exists() and self.docker("info", timeout=20).returncode == 0:
                return
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"rootless dockerd did not start: {self.log.read_text(errors='replace')[-3000:]}")

    def docker(self, *args: str, input: bytes | None = None, timeout: float = 120):
        return subprocess.run([DOCKER, "-H", f"unix://{self.sock}", *args], capture_output=True,
                              input=input, timeout=timeout, env={"PATH": PATH, "HOME": str(self.d)},
                              stdin=None if input is not None else subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()       # (unshare: it passes it on to rootlesskit)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        pid = self.d / "rk/child_pid"
        if pid.exists():    # rootlesskit's child (dockerd's namespaces), if it outlived it
            try:
                os.kill(int(pid.read_text()), 9)
            except (OSError, ValueError):
                pass


@pytest.fixture(scope="module")
def rootless_docker():
    from libinject.sim.build import create_host
    from libinject.sim.rootfs import build_rootfs

    user = rootless_user()
    base = Path(tempfile.mkdtemp(prefix="nvrd", dir="/tmp"))
    d = None
    try:
        base.chmod(0o755)
        host = create_host(base / "host", profile="a100x8")
        hook_bin = base / "bin"
        hook_bin.mkdir(mode=0o755)
        os.symlink(hookenv.ensure_front(), hook_bin / "nvidia-container-runtime-hook")
        config = base / "config.toml"
        config.write_text(f'[nvidia-container-cli]\nroot = "{host}"\nno-cgroups = true\n'
                          '[nvhook]\nsnapshot = false\n')
        config.chmod(0o644)
        d = RootlessDocker(base, user, hook_bin, config)
        tar = subprocess.run(["tar", "-C", str(build_rootfs(base / "rootfs")), "-c", "."],
                             capture_output=True, check=True, timeout=120).stdout
        r = d.docker("import", "-", "nvhook-rootless:1", input=tar)
        assert r.returncode == 0, r.stderr
        yield d, host
    finally:
        if d is not None:
            d.stop()
        from support.applyenv import umount_under
        umount_under(base)
        shutil.rmtree(base, ignore_errors=True)


def test_rootless_docker_gpus_with_no_cgroups(rootless_docker):
    """`docker run --gpus device=1` on rootless dockerd: GPU 1 only (nvidia-smi, the
    masked /proc/driver/nvidia); /dev/nvidia1 opens as far as the (absent) driver, no
    /dev/nvidia0 at all. (Old code: `nvhook: prestart: cannot give this container GPUs:
    the hook runs in a user namespace ...`.)"""
    d, host = rootless_docker
    info = d.docker("info", "--format", "{{.SecurityOptions}}").stdout.decode()
    assert "rootless" in info, info
    r = d.docker("run", "--rm", "--network", "none", "--gpus", "device=1", "nvhook-rootless:1",
                 "sh", "-c", PROBE)
    out = r.stdout.decode() + r.stderr.decode()
    assert r.returncode == 0, out
    assert re.findall(r"UUID: (GPU-[0-9a-f-]+)", out) == [hookenv.gpu_uuids(host)[1]], out
    assert len(re.findall(r"^0000:\S+$", out, re.M)) == 1, out
    assert "can't open '/dev/nvidia1': No such device or address" in out, out
    assert "can't open '/dev/nvidia0': No such file or directory" in out, out
