"""The hooks CDI specs call (`nvhook cdi-hook create-symlinks | update-ldcache |
mask-procfs`), as library functions: nvhook/cmd_cdi_hook.py only parses their flags.

`nvhook cdi generate` (and the runtime shim's csv mode) write these as createContainer
hooks with an explicit env. The runtime runs them with the container's state on stdin,
in the container's mount namespace before pivot_root, so the rootfs (root.path of
<bundle>/config.json) is reachable by path. Every change goes through
libinject.apply.live with pid=None (the rootfs is in our mount namespace): container
paths resolved inside the rootfs by libinject.apply.rootfs, ldconfig in
libinject.apply.ldconfig's sandbox, all or nothing; the same code the hook and
`configure` use.

- create-symlinks --link TARGET::LINK ...: symlinks in the container (LINK -> TARGET).
- update-ldcache --folder DIR ... [--ldconfig @/sbin/ldconfig]: the container's ld cache.
- mask-procfs --procfs-dir DIR: a read-only tmpfs over /proc/driver/nvidia with the
  host's params (ModifyDeviceFiles: 0), version and registry, and the gpus/<busid>
  directories and MIG capability files of exactly the devices the container was given
  (/dev/nvidiaN and /dev/nvidia-caps/nvidia-capN in its linux.devices that its
  linux.resources.devices rules allow). A CDI spec cannot express this as mounts: runc
  refuses OCI mounts under /proc.

Rootless engines (podman run by a user) run these hooks in a user namespace, as the
user's mapped root. live.apply writes its journal ahead to /run/nvhook/journal, a
directory of the host's root that is out of reach there; so in a user namespace the
hook first moves to a private copy of the container's mount namespace with a tmpfs of
its own on /run (the journal lives as long as the hook), and live.apply enters the
container's namespace through the runtime process that started the hook, which it
checks is in the namespace the hook left (_rootless_target). /run there is the
runtime's path (the rootfs is not pivoted into yet), nothing the container chose.
"""
from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from libinject.plan.edits import ContainerEdits


def _rootfs(given: str, cwd: str | None) -> tuple[str, dict]:
    from libinject.request import oci_state

    if given:
        return os.path.abspath(given), {}
    state = oci_state.read_state(sys.stdin.buffer)
    bundle = oci_state.bundle_dir(state, cwd)
    spec = oci_state.load_config(bundle)
    return oci_state.rootfs_path(spec, bundle), spec


def parse_links(values: list[str]):
    from libinject.plan.edits import SymlinkEdit
    from libinject.errors import NvhookError

    out = []
    for v in values:
        target, sep, link = v.partition("::")
        if not sep or not target or not link or not link.startswith("/"):
            raise NvhookError(f"invalid --link {v!r}: expected TARGET::/container/path")
        out.append(SymlinkEdit(target=target, link=link))
    return tuple(out)


def run(args) -> int:
    """Run the hook args.hook with its parsed flags (link, folder, ldconfig, procfs_dir,
    mig_minors, rootfs)."""
    from libinject.runtime.hook import start_cwd

    cwd = start_cwd()   # where the runtime started us (the front has moved to "/")
    os.chdir("/")   # never work relative to a directory the container controls
    from libinject.plan.edits import ContainerEdits
    from libinject.errors import NvhookError

    if args.hook == "create-symlinks":
        edits = ContainerEdits(symlinks=parse_links(args.link))
        rootfs, _ = _rootfs(args.rootfs, cwd)
        if edits.symlinks:
            _apply(edits, rootfs)
        return 0
    if args.hook == "update-ldcache":
        bad = [f for f in args.folder if not f.startswith("/")]
        if bad:
            raise NvhookError(f"invalid --folder {bad[0]!r}: not an absolute container path")
        rootfs, _ = _rootfs(args.rootfs, cwd)
        edits = ContainerEdits(ldconfig_folders=tuple(dict.fromkeys(args.folder)))
        _apply(edits, rootfs, ldconfig=args.ldconfig)
        return 0
    if args.hook == "mask-procfs":
        rootfs, spec = _rootfs(args.rootfs, cwd)
        if not spec:
            raise NvhookError("mask-procfs needs the container state on stdin (its devices)")
        edits = procfs_edits(spec, args.procfs_dir, args.mig_minors)
        if edits is not None:
            _apply(edits, rootfs)
        return 0
    raise NvhookError(f"unknown cdi-hook {args.hook}")


def _apply(edits: ContainerEdits, rootfs: str, **kw: str) -> None:
    """live.apply in the container's mount namespace, no cgroup step: the one we are in,
    or (rootless) the one _rootless_target names."""
    from libinject.apply.live import apply

    apply(edits, rootfs, pid=_rootless_target(), no_cgroups=True, **kw)


def _parent_pid() -> int:
    """Our parent's pid as /proc counts pids (getppid() counts in our own pid namespace,
    the container's, while /proc here is the runtime's)."""
    with open("/proc/self/stat", "rb") as f:
        stat = f.read(4096)
    return int(stat[stat.rindex(b")") + 2:].split()[1])   # after "(comm)": state, ppid


def _rootless_target() -> int | None:
    """None outside a user namespace: apply where we are. In one (module docstring):
    leave for a private copy of this mount namespace with our own tmpfs on /run, and
    return the pid of our parent, the runtime's process that runs createContainer hooks,
    once it is checked to be in the namespace we left: live.apply enters that."""
    from libinject.errors import NvhookError
    from libinject.linux import native
    from libinject.runtime.hook import in_user_namespace

    if not in_user_namespace():
        return None
    here = os.stat("/proc/self/ns/mnt")
    try:
        ppid = _parent_pid()
        there = os.stat(f"/proc/{ppid}/ns/mnt")
    except (OSError, ValueError, IndexError):
        there = None
    if there is None or (there.st_dev, there.st_ino) != (here.st_dev, here.st_ino):
        raise NvhookError("cdi-hook in a user namespace: the process that started it is not "
                          "in the container's mount namespace (not run as a createContainer hook?)")
    try:
        native.unshare(native.CLONE_NEWNS)
        # nothing mounted in our copy may propagate back to the container's namespace
        native.mount(None, "/", None, native.MS_REC | native.MS_PRIVATE)
        native.mount("tmpfs", "/run", "tmpfs",
                     native.MS_NOSUID | native.MS_NODEV | native.MS_NOEXEC, "mode=0755")
    except OSError as e:
        raise NvhookError(f"cdi-hook in a user namespace: cannot make a private /run for "
                          f"its journal: {e.strerror}") from None
    return ppid


def procfs_edits(spec: dict, procfs_dir: str, mig_minors: str = ""):
    """ContainerEdits masking /proc/driver/nvidia for the devices in spec's
    linux.devices; None when the host has no such procfs dir. The host is read by
    discovery's procfs reader (libinject.discover.procfs), the one the planner's texts
    come from, and the edit is made as the planner makes it."""
    from libinject.constants import NVIDIA_MAJOR
    from libinject.discover import procfs as host_procfs
    from libinject.discover.driver import read_mig_minors
    from libinject.plan import planner as _plan
    from libinject.plan import procfs
    from libinject.plan.edits import ContainerEdits, ProcfsEdit

    if not os.path.isdir(procfs_dir):
        return None
    linux = spec.get("linux") or {}
    rules = [r for r in (linux.get("resources") or {}).get("devices") or () if isinstance(r, dict)]
    # the container's devices: nodes it has *and* its cgroup lets it open
    devs = [d for d in linux.get("devices") or ()
            if isinstance(d, dict) and _allowed(rules, d.get("type", "c"), d.get("major"), d.get("minor"))]
    minors = {d.get("minor") for d in devs
              if d.get("major") == NVIDIA_MAJOR and isinstance(d.get("path"), str)
              and d["path"].removeprefix("/dev/nvidia").isdigit()}
    # MIG capability nodes -> their files under capabilities/, copied into the tmpfs as
    # the planner does (upstream's mount_procfs_mig; the text is static)
    caps = {d.get("minor") for d in devs if isinstance(d.get("path"), str)
            and d["path"].startswith(_plan.CAPS_DIR + "/nvidia-cap")}
    keys: list[str] = []
    if caps:
        table = mig_minors or os.path.join(os.path.dirname(procfs_dir.rstrip("/")),
                                           "nvidia-caps", "mig-minors")
        keys = [key for key, minor in read_mig_minors(table).items() if minor in caps]
    host = host_procfs.read(procfs_dir, keys)
    gpu_dirs = [(os.path.join(procfs_dir, "gpus", name), name)
                for name, minor in host.gpus.items() if minor is not None and minor in minors]
    files = procfs.masked_files(host.files)
    files.update((rel, host.files[rel]) for rel in map(host_procfs.cap_rel, keys) if rel in host.files)
    return ContainerEdits(procfs=ProcfsEdit(path=procfs.PROC_DRIVER, files=files,
                                            gpu_dirs=tuple(gpu_dirs)))


def _allowed(rules: list, typ: str, major, minor) -> bool:
    """The OCI device cgroup verdict for a node: the last matching rule wins."""
    verdict = False
    for r in rules:
        if r.get("type", "a") not in ("a", typ):
            continue
        if r.get("major") is not None and r.get("major") != major:
            continue
        if r.get("minor") is not None and r.get("minor") != minor:
            continue
        access = r.get("access", "rwm") or ""
        if "r" in access or "w" in access:
            verdict = bool(r.get("allow"))
    return verdict
