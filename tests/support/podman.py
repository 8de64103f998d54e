"""podman (4.3.1, RUNTIMES.md) for tests: its own containers.conf, storage.conf,
registries.conf and state under one dir; nothing of the host's podman setup is used.

That dir must be short (state_dir() makes one): conmon's attach socket lives under it
and sun_path holds 108 bytes; under pytest's long tmp paths every `podman run --rm`
waits out conmon's 20 s timeout instead.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import shutil
import signal
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


def run_argv(hooks_dir: Path, rootfs: Path, cmd: Sequence[str], env: Sequence[str] = (),
             annotations: dict[str, str] | None = None, devices: Sequence[str] = (),
             extra: Sequence[str] = ()) -> list[str]:
    """`podman --hooks-dir D run --rm --rootfs ROOTFS:O CMD...` with --env, --annotation
    and --device options (and `extra` run options, e.g. --read-only)."""
    argv = [PODMAN, "--hooks-dir", str(hooks_dir), "run", "--rm", "--pull=never", *extra]
    for e in env:
        argv += ["--env", e]
    for k, v in (annotations or {}).items():
        argv += ["--annotation", f"{k}={v}"]
    for d in devices:
        argv += ["--device", d]
    return argv + ["--rootfs", f"{rootfs}:O", *cmd]


class CdiNamespace:
    """A private mount namespace set up as CDI_SH sets one up (an overlay on /etc, `specs`
    bound on /etc/cdi), kept by a holder process until close(): podman and `nvhook serve`
    can then run in the same one (wrap()), as on a node where the service runs beside
    the engine (the service serves only peers in its own mount namespace)."""

    def __init__(self, state: Path, specs: Path) -> None:
        for d in ("etc-upper", "etc-work"):
            (state / d).mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", CDI_SH, "sh", str(state),
             str(specs), "sh", "-c", "echo ready; exec sleep 100000"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"ready":
            self.proc.kill()
            raise RuntimeError(f"CDI namespace: {self.proc.communicate(timeout=30)[1]!r}")

    def wrap(self, argv: Sequence[str]) -> list[str]:
        return ["nsenter", "-t", str(self.proc.pid), "-m", "--", *argv]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)

    def __enter__(self) -> "CdiNamespace":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
            timeout: float = 120, extra: Sequence[str] = (),
            ns: CdiNamespace | None = None) -> subprocess.CompletedProcess[str]:
        """`podman run --rm --rootfs ROOTFS:O CMD...` (a throw-away overlay on rootfs).
        hooks_dir: its OCI hooks dir (default: an empty one); cdi_specs: the CDI spec dir
        it sees as /etc/cdi; devices: --device values (CDI names with cdi_specs); extra:
        more run options; ns: run in that CdiNamespace (its specs) instead."""
        argv = self.argv(rootfs, cmd, hooks_dir=hooks_dir, cdi_specs=cdi_specs, env=env,
                         annotations=annotations, devices=devices, extra=extra, ns=ns)
        return subprocess.run(argv, env=self.env(), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def argv(self, rootfs: Path, cmd: Sequence[str], *, hooks_dir: Path | None = None,
             cdi_specs: Path | None = None, env: Sequence[str] = (),
             annotations: dict[str, str] | None = None, devices: Sequence[str] = (),
             extra: Sequence[str] = (), ns: CdiNamespace | None = None) -> list[str]:
        """run()'s command line (run it with env())."""
        argv = run_argv(hooks_dir or self.state / "hooks", rootfs, cmd, env, annotations, devices, extra)
        if ns is not None:
            return ns.wrap(argv)
        if cdi_specs is not None:
            argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", CDI_SH, "sh",
                    str(self.state), str(cdi_specs), *argv]
        return argv

    def cleanup(self) -> None:
        """Remove its containers and storage, and unmount what it left under `state`."""
        subprocess.run([PODMAN, "rm", "-af"], env=self.env(), capture_output=True, timeout=120)
        subprocess.run([PODMAN, "system", "reset", "-f"], env=self.env(), capture_output=True,
                       timeout=120)
        umount_under(self.state)        # vfs/overlay leftovers


# -- rootless podman --------------------------------------------------------------------
# An unprivileged user runs podman; podman then runs runc, conmon and the OCI hooks in a
# user namespace where the user is root (newuidmap/newgidmap from Debian's `uidmap` map
# its subordinate ids). The user, with subuid/subgid ranges, is made once for the test
# machine (a system account without a login shell) and kept: CI runs on a fresh machine.
ROOTLESS_USER = "nvhook-rootless"
SUBID_FIRST = 3_000_000       # subordinate ids start here or after the highest in use
SUBID_COUNT = 65_536


@dataclasses.dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int


def _next_subid_start(path: Path) -> int:
    ends = [int(start) + int(count) for line in path.read_text().splitlines()
            if line.count(":") == 2 for _, start, count in [line.split(":")]]
    return max([SUBID_FIRST, *ends])


def rootless_user(name: str = ROOTLESS_USER) -> User:
    """The unprivileged user rootless podman runs as, made (with subordinate uid and gid
    ranges) if it is missing. Needs newuidmap (scripts/install-deps installs uidmap)."""
    import pwd

    for tool in ("newuidmap", "newgidmap"):
        if not shutil.which(tool):
            raise RuntimeError(f"{tool} missing: install Debian's uidmap (scripts/install-deps)")
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--user-group", "--no-create-home",
                        "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name],
                       check=True, capture_output=True, timeout=60)
        pw = pwd.getpwnam(name)
    for flag, path in (("--add-subuids", Path("/etc/subuid")), ("--add-subgids", Path("/etc/subgid"))):
        path.touch(exist_ok=True)
        if not any(line.startswith(f"{name}:") for line in path.read_text().splitlines()):
            start = _next_subid_start(path)
            subprocess.run(["usermod", flag, f"{start}-{start + SUBID_COUNT - 1}", name],
                           check=True, capture_output=True, timeout=60)
    return User(name, pw.pw_uid, pw.pw_gid)


def _searchable(d: str) -> bool:
    return bool(os.stat(d).st_mode & 0o001)


def unreachable_dirs(paths: Sequence[str | os.PathLike[str]]) -> dict[str, set[str]]:
    """{dir others cannot search: its entries on the way to `paths`}, for the dirs that
    keep another user from `paths` (e.g. /root, 0700, above a pyenv Python). Below such a
    dir the way must be open: that is what rootless_sh() can mend."""
    out: dict[str, set[str]] = {}
    for p in paths:
        parts = Path(os.path.realpath(p)).parts       # ("/", "root", ".pyenv", ...)
        closed = None
        for i in range(1, len(parts)):
            d = os.path.join(*parts[:i])               # the dir holding parts[i]
            if _searchable(d):
                continue
            if closed is not None:
                raise RuntimeError(f"{p}: {closed} and {d} both keep other users out")
            closed = d
            out.setdefault(d, set()).add(parts[i])
    return out


def rootless_sh(state: Path, user: User, *, cdi_specs: Path | None = None,
                dev_nodes: Path | None = None, reach: dict[str, set[str]] | None = None) -> str:
    """A shell script (run as root, in a private mount namespace: `unshare -m
    --propagation private sh -c SCRIPT sh CMD...`) that prepares that namespace and then
    runs CMD as `user`. Nothing it mounts is seen outside the namespace.
    cdi_specs: seen as /etc/cdi (an overlay on /etc; podman reads specs only there).
    dev_nodes: a dir whose nvidia* device nodes appear in /dev (an overlay on /dev). A
      rootless runc cannot mknod: it bind-mounts each linux.devices node from the host
      path equal to the container path, where a real driver has its nodes; a simulated
      host keeps them in its own dev/.
    reach: unreachable_dirs(); each such dir gets a tmpfs (0755) holding binds of only
      the entries named, so the user reaches the hook's Python (e.g. under /root)."""
    q = shlex.quote
    lines = ["set -e"]
    if cdi_specs is not None:
        lines += [f"mkdir -p {q(str(state))}/etc-upper {q(str(state))}/etc-work",
                  f"mount -t overlay overlay -o lowerdir=/etc,upperdir={q(str(state))}/etc-upper,"
                  f"workdir={q(str(state))}/etc-work /etc",
                  "mkdir -p /etc/cdi", f"mount --bind {q(str(cdi_specs))} /etc/cdi",
                  "if [ -d /var/run/cdi ]; then mount -t tmpfs tmpfs /var/run/cdi; fi"]
    if dev_nodes is not None:
        d = q(str(state / "dev"))
        lines += [f"mkdir -p {d}/lower {d}/upper {d}/work",
                  f"mount --rbind /dev {d}/lower",
                  f"cp -a {q(str(dev_nodes))}/nvidia* {d}/upper/",
                  f"mount -t overlay overlay -o lowerdir={d}/lower,upperdir={d}/upper,workdir={d}/work /dev",
                  f"for m in shm pts mqueue; do if [ -d {d}/lower/$m ]; then "
                  f"mount --rbind {d}/lower/$m /dev/$m; fi; done"]
    for i, (closed, entries) in enumerate(sorted((reach or {}).items())):
        keep = q(str(state / f"keep{i}"))
        lines += [f"mkdir -p {keep}", f"mount --bind {q(closed)} {keep}",
                  f"mount -t tmpfs -o mode=0755 tmpfs {q(closed)}"]
        for e in sorted(entries):
            src, dst = f"{keep}/{q(e)}", f"{q(closed)}/{q(e)}"
            lines.append(f"if [ -d {src} ]; then mkdir {dst}; else touch {dst}; fi; "
                         f"mount --rbind {src} {dst}")
        lines.append(f"umount -l {keep}")
    lines.append(f'exec setpriv --reuid={user.uid} --regid={user.gid} --init-groups -- "$@"')
    return "\n".join(lines) + "\n"


class RootlessPodman(Podman):
    """podman run by `user`, its state (config, storage, runtime dir) under `state`,
    which it owns. Every call runs in a private mount namespace set up by rootless_sh()
    (reach: unreachable_dirs() of what the hooks run)."""

    def __init__(self, state: Path, user: User, reach: dict[str, set[str]] | None = None) -> None:
        super().__init__(state)
        self.user = user
        self.reach = reach or {}
        # Rootless podman keeps its images and containers under rootless_storage_path (it
        # ignores graphroot), and conmon runs `podman container cleanup` without our
        # CONTAINERS_CONF, so with that cleanup's default database beside the storage:
        # the same place as static_dir, or `run --rm` waits out conmon's 20 s for it.
        with open(state / "storage.conf", "a") as f:
            f.write(f'rootless_storage_path = "{state}/root"\n')
        subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(state)], check=True,
                       timeout=60)
        os.chmod(state, 0o755)     # the rootfs and the simulated host live under it

    def _argv(self, cmd: Sequence[str], cdi_specs: Path | None = None,
              dev_nodes: Path | None = None) -> list[str]:
        work = self.state / "ns"
        work.mkdir(exist_ok=True)
        script = rootless_sh(work, self.user, cdi_specs=cdi_specs, dev_nodes=dev_nodes,
                             reach=self.reach)
        return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *cmd]

    def run(self, rootfs: Path, cmd: Sequence[str], *, hooks_dir: Path | None = None,
            cdi_specs: Path | None = None, env: Sequence[str] = (),
            annotations: dict[str, str] | None = None, devices: Sequence[str] = (),
            timeout: float = 120, dev_nodes: Path | None = None) -> subprocess.CompletedProcess[str]:
        """As Podman.run, as the user; dev_nodes: see rootless_sh()."""
        argv = run_argv(hooks_dir or self.state / "hooks", rootfs, cmd, env, annotations, devices)
        return self.as_user(argv, cdi_specs=cdi_specs, dev_nodes=dev_nodes, timeout=timeout)

    def as_user(self, argv: Sequence[str], *, input: str | None = None, timeout: float = 120,
                **kw: Path | None) -> subprocess.CompletedProcess[str]:
        """argv as the user, in the prepared namespace, with podman's environment."""
        return subprocess.run(self._argv(argv, **kw), env=self.env(), capture_output=True,
                              text=True, timeout=timeout, cwd="/",
                              **({"input": input} if input is not None else
                                 {"stdin": subprocess.DEVNULL}))

    def cleanup(self) -> None:
        """Remove the user's containers, stop podman's rootless pause process (it holds
        the user namespace; ours by its pid file) and unmount what is left under state."""
        self.as_user([PODMAN, "rm", "-af"], timeout=120)
        pidfile = self.state / "tmp/pause.pid"
        try:
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
        umount_under(self.state)
