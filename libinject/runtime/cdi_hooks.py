"""The hooks CDI specs call, as library functions: nvhook/cmd_cdi_hook.py only describes
their flags for argparse (parse_argv below parses what `cdi generate` writes without it).

`nvhook cdi generate` (and the runtime shim's csv mode) write ONE hook entry per set of
edits, with an explicit env, that does every step those edits need in one call (one
process, one namespace entry, one journal, one ldconfig):

  cdi-hook createRuntime [--procfs-dir DIR [--mig-minors F]] [--link TARGET::LINK ...]
                         [--folder DIR ...] [--ldconfig @PATH]

- --procfs-dir: a read-only tmpfs over /proc/driver/nvidia with the host's params
  (ModifyDeviceFiles: 0), version and registry, and the gpus/<busid> directories and MIG
  capability files of exactly the devices the container was given (/dev/nvidiaN and
  /dev/nvidia-caps/nvidia-capN in its linux.devices that its linux.resources.devices
  rules allow). A CDI spec cannot express this as mounts: runc refuses OCI mounts under
  /proc.
- --link TARGET::LINK: symlinks in the container (LINK -> TARGET).
- --folder DIR [--ldconfig @/sbin/ldconfig]: the container's ld cache. The libraries
  the runtime bind-mounted into those folders (the spec's mounts: spec_libraries; an
  older spec names them, --library HOST::CONTAINER) have their ELF headers merged into
  the image's cache in-process (libinject.apply.ldcache_merge, as the prestart hook does
  for the libraries it mounts) instead of running the sandboxed ldconfig, which stays
  the fallback wherever the merge does not cover the image.

The stage is in the argv because it decides where the work is done, and the hook entry
(the spec's hookName) is what says it:
- createRuntime (the default spec): the runtime runs it in ITS namespaces (runc 1.1.5,
  crun 1.8.1, podman 4.3.1 checked: the host's pid in the state, whose process is a
  child of the hook's own parent, the runtime). That is where `nvhook serve` lives: the
  compiled front hands it over as it hands over the prestart hook (same proofs, same
  worker, libinject.runtime.serve.worker), and the work enters the container's mount
  namespace through that pid exactly as the prestart hook does (libinject.apply.live
  with a pid: every container path resolved inside the rootfs, host sources opened in
  our namespace first). No service (rootless, none running, a busy one): the front
  execs Python, which does the same itself.
- createContainer (`cdi generate --hook-stage createContainer`, for engines that run
  createRuntime hooks elsewhere): the container's mount namespace before pivot_root, so
  the rootfs is reachable by path; never served (the service never enters a
  container's namespaces to talk to it).

The hooks of older specs (one step each, createContainer) are still accepted:
create-symlinks --link ..., update-ldcache --folder ..., mask-procfs --procfs-dir DIR.

Rootless engines (podman run by a user) run hooks in a user namespace, as the user's
mapped root. live.apply writes its journal ahead to /run/nvhook/journal, a directory of
the host's root that is out of reach there; so in a user namespace the hook first moves
to a private copy of its mount namespace with a tmpfs of its own on /run (the journal
lives as long as the hook), and live.apply enters the container's namespace through the
container's process (createRuntime: the state's pid) or the runtime process that
started the hook (createContainer), each checked first (container_target,
rootless_target). /run there is the runtime's path, nothing the container chose.

The hook's argv comes from the hook entry, which the engine took from a CDI spec in its
spec dirs: whoever writes those already chooses the program the runtime runs as root,
so the argv is the admin's, as the prestart hook's --config is. The container's state,
bundle and spec are data.
"""
from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from libinject.plan.edits import ContainerEdits

# `cdi-hook STAGE ...`: every step in one call, at the stage its hook entry names.
STAGES = ("createRuntime", "createContainer")
SERVED = "createRuntime"        # the stage `nvhook serve` takes (the runtime's namespaces)
# Older specs' hooks, one step each (createContainer).
SINGLE = ("create-symlinks", "update-ldcache", "mask-procfs")
DEFAULT_LDCONFIG = "@/sbin/ldconfig"
# STAGE's flags (each takes a value; --link and --folder repeat)
_FLAGS = {"--procfs-dir": "procfs_dir", "--mig-minors": "mig_minors", "--link": "link",
          "--folder": "folder", "--ldconfig": "ldconfig", "--library": "library",
          "--cuda-compat-driver-major": "cuda_compat_driver_major"}
_REPEATED = ("link", "folder", "library")


def parse_argv(argv: list[str], ns):
    """`STAGE [--flag VALUE]...` (what follows `cdi-hook`, as `cdi generate` writes it)
    onto ns (libinject.runtime.hook.HookArgs), without argparse (~15 ms of an exec'd
    hook's start-up; the service's parser must not differ from it). Anything else
    (--flag=value, an unknown flag, a value that looks like a flag): None, and argparse
    parses and reports it (the service declines it, the front then execs Python)."""
    if not argv or argv[0] not in STAGES:
        return None
    ns.hook = argv[0]
    ns.link, ns.folder, ns.library = [], [], []
    ns.procfs_dir = ns.mig_minors = ns.rootfs = ns.cuda_compat_driver_major = ""
    ns.ldconfig = DEFAULT_LDCONFIG
    i = 1
    while i < len(argv):
        name = _FLAGS.get(argv[i])
        if name is None or i + 1 >= len(argv) or argv[i + 1].startswith("-"):
            return None
        if name in _REPEATED:
            getattr(ns, name).append(argv[i + 1])
        else:
            setattr(ns, name, argv[i + 1])     # (argparse too: the last one wins)
        i += 2
    return ns


def _rootfs(given: str, cwd: str | None) -> tuple[str, dict]:
    from libinject.request import oci_state

    if given:
        return os.path.abspath(given), {}
    state = oci_state.read_state(sys.stdin.buffer)
    bundle = oci_state.bundle_dir(state, cwd)
    spec = oci_state.load_config(bundle)
    return oci_state.rootfs_path(spec, bundle), spec


def _cuda_compat(major: str):
    """--cuda-compat-driver-major N: the image's forward-compat libcuda first in its ld
    cache where newer than driver N (the hook's "ldconfig" cuda-compat mode)."""
    from libinject.errors import NvhookError
    from libinject.plan.edits import CudaCompatEdit

    if not major:
        return None
    if not major.isdigit() or len(major) > 6:
        raise NvhookError(f"invalid --cuda-compat-driver-major {major!r}: expected the driver's major version")
    return CudaCompatEdit(mode="ldconfig", driver_major=int(major))


def parse_libraries(values: list[str]):
    """--library HOST::CONTAINER values as MountEdits of the runtime's (never mounted by
    us: their host sources are read for the ld cache merge)."""
    from libinject.errors import NvhookError
    from libinject.plan.edits import RUNTIME_LIBRARY, MountEdit

    out = []
    for v in values:
        host, sep, path = v.partition("::")
        if not sep or not host.startswith("/") or not path.startswith("/"):
            raise NvhookError(f"invalid --library {v!r}: expected /host/path::/container/path")
        out.append(MountEdit(host_path=host, container_path=path, kind=RUNTIME_LIBRARY))
    return tuple(out)


MAX_SPEC_MOUNTS = 4096      # of a container's config.json mounts looked at (a real one: ~60)


def spec_libraries(spec: dict, folders: tuple[str, ...]):
    """The libraries the runtime mounted into `folders` (the CDI spec's mounts, as the
    engine put them in the container's config): its bind mounts there, by container
    path alone. The hook reads them where the runtime mounted them (at createRuntime
    and createContainer the mounts are made), so the spec need not list them again
    (`--library`, ~30 arguments of host::container paths that podman parses on every
    start). The config is the container's, so it chooses only which files *of the
    container* get ld cache entries, as a user's own volume into a library dir gets
    one from ldconfig; their ELF headers are read bounded, by fd, regular files only."""
    from libinject.plan.edits import RUNTIME_LIBRARY, MountEdit

    inside = {f.rstrip("/") for f in folders}
    out: dict[str, MountEdit] = {}
    mounts = spec.get("mounts")
    for m in mounts[:MAX_SPEC_MOUNTS] if isinstance(mounts, list) else ():
        if not isinstance(m, dict):
            continue
        dest, opts = m.get("destination"), m.get("options")
        bind = m.get("type") == "bind" or (isinstance(opts, list) and ("bind" in opts or "rbind" in opts))
        if not bind or not isinstance(dest, str) or not dest.startswith("/") or "\0" in dest:
            continue
        dest = os.path.normpath(dest)
        if os.path.dirname(dest) in inside and dest not in out:
            out[dest] = MountEdit(host_path="", container_path=dest, kind=RUNTIME_LIBRARY)
    return tuple(out.values())


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
    mig_minors, rootfs): the exec'd path (the state on stdin)."""
    from libinject.runtime.front import start_cwd

    cwd = start_cwd()   # where the runtime started us (the front has moved to "/")
    os.chdir("/")   # never work relative to a directory the container controls
    from libinject.plan.edits import ContainerEdits
    from libinject.errors import NvhookError

    if args.hook in STAGES:
        from libinject.request.oci_state import read_state_bytes

        _check_flags(args)          # the entry's own mistakes first, the state after
        return _stage(args, read_state_bytes(sys.stdin.buffer), cwd, "self")

    if args.hook == "create-symlinks":
        edits = ContainerEdits(symlinks=parse_links(args.link))
        rootfs, _ = _rootfs(args.rootfs, cwd)
        if edits.symlinks:
            _apply(edits, rootfs)
        return 0
    if args.hook == "update-ldcache":
        _check_flags(args)
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


def _check_flags(args) -> None:
    from libinject.errors import NvhookError

    bad = [f for f in getattr(args, "folder", ()) if not f.startswith("/")]
    if bad:
        raise NvhookError(f"invalid --folder {bad[0]!r}: not an absolute container path")
    parse_links(getattr(args, "link", ()))
    parse_libraries(getattr(args, "library", ()))
    if args.hook in STAGES and getattr(args, "rootfs", ""):
        raise NvhookError(f"cdi-hook {args.hook} takes the container from its state: no --rootfs")


def handle(args, state: bytes, cwd: str | None, hook_pid: int | str) -> int:
    """`cdi-hook STAGE` for one container, for both paths: the exec'd Python (run) and a
    `nvhook serve` worker (libinject.runtime.serve.worker), whose caller is the front with pid
    hook_pid (the process the runtime started). Errors: one line on stderr, status 1."""
    from libinject.errors import NvhookError, report

    try:
        _check_flags(args)
        return _stage(args, state, cwd, hook_pid)
    except NvhookError as e:
        report(e)
        return 1


def _stage(args, data: bytes, cwd: str | None, hook_pid: int | str) -> int:
    """Every step the entry asks for, in one live.apply: the /proc/driver/nvidia mask,
    the symlinks, then the ld cache (the live applier's order)."""
    from libinject.errors import NvhookError
    from libinject.plan.edits import ContainerEdits
    from libinject.request import oci_state

    if len(data) > oci_state.MAX_STATE_BYTES:
        raise NvhookError(f"container state on stdin is larger than {oci_state.MAX_STATE_BYTES} bytes")
    state = oci_state.parse_state(data)
    bundle = oci_state.bundle_dir(state, cwd)
    spec = oci_state.load_config(bundle)
    rootfs = oci_state.rootfs_path(spec, bundle)
    procfs = procfs_edits(spec, args.procfs_dir, args.mig_minors) if args.procfs_dir else None
    folders = tuple(dict.fromkeys(args.folder))
    libraries = ((parse_libraries(args.library) if args.library else spec_libraries(spec, folders))
                 if folders else ())
    compat = _cuda_compat(args.cuda_compat_driver_major) if folders else None
    if compat is not None and args.procfs_dir and _consumer_models(spec, args.procfs_dir):
        compat = None       # CUDA would fail with 804 (libinject.plan.compat)
    edits = ContainerEdits(procfs=procfs.procfs if procfs is not None else None,
                           symlinks=parse_links(args.link), ldconfig_folders=folders,
                           mounts=libraries, cuda_compat=compat)
    if edits.procfs is None and not edits.symlinks and not edits.ldconfig_folders:
        return 0
    # The image's data comes next (its ld cache, its tree): bounded, as the hook's start.
    from libinject.runtime.ceiling import contain

    contain()
    if args.hook == "createContainer":
        _apply(edits, rootfs, ldconfig=args.ldconfig, owner=state.id)
        return 0
    from libinject.apply.live import apply

    pid, rootless = container_target(state, hook_pid)
    # One-shot (the exec'd hook, or a served worker): no fork of a worker of its own,
    # but where we sit in the container's pid namespace only for our children (rootless).
    apply(edits, rootfs, pid=pid, no_cgroups=True, ldconfig=args.ldconfig, worker=rootless,
          owner=state.id)
    return 0


def _ppid(pid: int | str) -> int:
    """The parent of pid as /proc counts pids."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read(4096)
    return int(stat[stat.rindex(b")") + 2:].split()[1])   # after "(comm)": state, ppid


def container_target(state, hook_pid: int | str,
                      where: str = "cdi-hook createRuntime") -> tuple[int, bool]:
    """(the container's process at createRuntime, whether we are rootless): the state's
    pid, once it is seen to be what a runtime running this stage gives (runc, crun): a
    live process, child of the runtime that started the hook (hook_pid's parent), in
    another mount namespace than ours. Anything else is a hook entry run at another
    stage (createContainer: pid 1 or 0, which would name the host's init here), refused
    before anything is done.

    In a user namespace (rootless) we first move to a private copy of our mount
    namespace with our own /run (module docstring), and have our children born in the
    container's pid namespace: the ldconfig sandbox makes a pid namespace of its own and
    comes back from it with setns, which a user namespace's root may do only into one
    its user namespace owns (the container's, not the host's we run in here)."""
    from libinject.errors import NvhookError

    pid = state.pid
    if pid <= 0:
        raise NvhookError(f"{where}: the container state has no pid (status {state.status}): "
                          "not run as a createRuntime hook?")
    try:
        if _ppid(pid) != _ppid(hook_pid):
            raise NvhookError(f"{where}: container process {pid} is not a child of the runtime "
                              "that ran the hook (not run as a createRuntime hook?)")
        there = os.stat(f"/proc/{pid}/ns/mnt")
        here = os.stat("/proc/self/ns/mnt")
    except (OSError, ValueError, IndexError) as e:
        why = e.strerror if isinstance(e, OSError) else "unreadable"
        raise NvhookError(f"{where}: container process {pid}: {why}") from None
    if (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino):
        raise NvhookError(f"{where}: the hook runs in the container's mount namespace "
                          "(generate the spec with --hook-stage createContainer for this engine)")
    from libinject.linux.proc import in_user_namespace

    if not in_user_namespace():
        return pid, False
    _private_run()
    from libinject.linux import native

    try:
        fd = os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        try:
            native.setns(fd, native.CLONE_NEWPID)
        finally:
            os.close(fd)
    except OSError as e:
        raise NvhookError(f"{where} in a user namespace: cannot enter the container's pid "
                          f"namespace: {e.strerror}") from None
    return pid, True


def _apply(edits: ContainerEdits, rootfs: str, **kw: str) -> None:
    """live.apply in the container's mount namespace, no cgroup step: the one we are in,
    or (rootless) the one rootless_target names."""
    from libinject.apply.live import apply

    apply(edits, rootfs, pid=rootless_target(), no_cgroups=True, **kw)


def rootless_target() -> int | None:
    """None outside a user namespace: apply where we are. In one (module docstring):
    leave for a private copy of this mount namespace with our own tmpfs on /run, and
    return the pid of our parent, the runtime's process that runs createContainer hooks,
    once it is checked to be in the namespace we left: live.apply enters that."""
    from libinject.errors import NvhookError
    from libinject.linux.proc import in_user_namespace

    if not in_user_namespace():
        return None
    here = os.stat("/proc/self/ns/mnt")
    try:
        ppid = _ppid("self")
        there = os.stat(f"/proc/{ppid}/ns/mnt")
    except (OSError, ValueError, IndexError):
        there = None
    if there is None or (there.st_dev, there.st_ino) != (here.st_dev, here.st_ino):
        raise NvhookError("cdi-hook in a user namespace: the process that started it is not "
                          "in the container's mount namespace (not run as a createContainer hook?)")
    _private_run()
    return ppid


def _private_run() -> None:
    """In a user namespace: leave for a private copy of our mount namespace with a tmpfs
    of our own on /run, where live.apply's journal can be written."""
    from libinject.errors import NvhookError
    from libinject.linux import native

    try:
        native.unshare(native.CLONE_NEWNS)
        # nothing mounted in our copy may propagate back to the namespace we left
        native.mount(None, "/", None, native.MS_REC | native.MS_PRIVATE)
        native.mount("tmpfs", "/run", "tmpfs",
                     native.MS_NOSUID | native.MS_NODEV | native.MS_NOEXEC, "mode=0755")
    except OSError as e:
        raise NvhookError(f"cdi-hook in a user namespace: cannot make a private /run for "
                          f"its journal: {e.strerror}") from None


def _consumer_models(spec: dict, procfs_dir: str) -> list[str]:
    """The models of the container's GPUs (its /dev/nvidia<N> in linux.devices) that
    CUDA forward compat does not support, from the host's gpus/*/information (the spec
    is the container's own: it can only turn compat off for itself)."""
    from libinject.constants import NVIDIA_MAJOR
    from libinject.discover import procfs as host_procfs
    from libinject.plan.compat import consumer_model

    minors = {d.get("minor") for d in (spec.get("linux") or {}).get("devices") or ()
              if isinstance(d, dict) and d.get("major") == NVIDIA_MAJOR
              and isinstance(d.get("path"), str) and d["path"].removeprefix("/dev/nvidia").isdigit()}
    gpus = os.path.join(procfs_dir, "gpus")
    try:
        names = sorted(os.listdir(gpus))
    except OSError:
        return []
    out = []
    for name in names:
        text = host_procfs.read_text(os.path.join(gpus, name, "information")) or ""
        if host_procfs.device_minor(text) not in minors:
            continue
        model = next((v.strip() for k, _, v in (ln.partition(":") for ln in text.splitlines())
                      if k.strip() == "Model"), "")
        if consumer_model(model):
            out.append(model)
    return out


def procfs_edits(spec: dict, procfs_dir: str, mig_minors: str = ""):
    """ContainerEdits masking /proc/driver/nvidia for the devices in spec's
    linux.devices; None when the host has no such procfs dir. The host is read by
    discovery's procfs reader (libinject.discover.procfs), the one the planner's texts
    come from, and the edit is made as the planner makes it."""
    from libinject.constants import NVIDIA_MAJOR
    from libinject.discover import procfs as host_procfs
    from libinject.discover.migminors import read_mig_minors
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
    # MIG capability nodes -> their files under capabilities/, bound into the tmpfs as
    # the planner does (upstream's mount_procfs_mig)
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
    if any(k in ("config", "monitor") for k in keys):
        # a MIG manager (nvidia.com/mig-caps): the live capabilities dir, as the planner
        # gives NVIDIA_MIG_CONFIG_DEVICES, so instances made after the start show
        live = ((os.path.join(procfs_dir, "capabilities"), "capabilities"),)
        return ContainerEdits(procfs=ProcfsEdit(path=procfs.PROC_DRIVER, files=files,
                                                gpu_dirs=tuple(gpu_dirs), live_dirs=live))
    bound = tuple((os.path.join(procfs_dir, rel), rel) for rel in map(host_procfs.cap_rel, keys)
                  if rel in host.files)
    return ContainerEdits(procfs=ProcfsEdit(path=procfs.PROC_DRIVER, files=files,
                                            gpu_dirs=tuple(gpu_dirs), bound_files=bound))


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
