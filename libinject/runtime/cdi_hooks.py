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
  the runtime bind-mounted into those folders (the spec's mounts:
  libinject.request.cdi_hook.runtime_libraries; an older spec names them, --library
  HOST::CONTAINER) have their ELF headers merged into
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


def run(args) -> int:
    """Run the hook args.hook with its parsed flags (link, folder, ldconfig, procfs_dir,
    mig_minors, rootfs): the exec'd path (the state on stdin)."""
    from libinject.runtime.front import start_cwd

    cwd = start_cwd()   # where the runtime started us (the front has moved to "/")
    os.chdir("/")   # never work relative to a directory the container controls
    from libinject import pipeline
    from libinject.errors import NvhookError
    from libinject.plan import cdi_hook as plan_hook
    from libinject.plan.edits import ContainerEdits

    if args.hook in STAGES:
        from libinject.request.oci_state import read_state_bytes

        _check_flags(args)          # the entry's own mistakes first, the state after
        return _stage(args, read_state_bytes(sys.stdin.buffer), cwd, "self")

    if args.hook == "create-symlinks":
        edits = ContainerEdits(symlinks=plan_hook.links(args.link))
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
        edits = pipeline.cdi_hook_edits(spec, procfs_dir=args.procfs_dir, mig_minors=args.mig_minors)
        if edits.procfs is not None:
            _apply(edits, rootfs)
        return 0
    raise NvhookError(f"unknown cdi-hook {args.hook}")


def _check_flags(args) -> None:
    from libinject.errors import NvhookError

    bad = [f for f in getattr(args, "folder", ()) if not f.startswith("/")]
    if bad:
        raise NvhookError(f"invalid --folder {bad[0]!r}: not an absolute container path")
    from libinject.plan import cdi_hook as plan_hook

    plan_hook.links(getattr(args, "link", ()))
    plan_hook.libraries(getattr(args, "library", ()))
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
    """Every step the entry asks for, in one apply: the /proc/driver/nvidia mask, the
    symlinks, then the ld cache (the live applier's order). The pipeline's stages, as
    the prestart hook walks them: the request (the state, the container's config), its
    discovery and plan (pipeline.cdi_hook_edits), the apply (pipeline.apply)."""
    from libinject import pipeline
    from libinject.errors import NvhookError
    from libinject.request import oci_state

    if len(data) > oci_state.MAX_STATE_BYTES:
        raise NvhookError(f"container state on stdin is larger than {oci_state.MAX_STATE_BYTES} bytes")
    state = oci_state.parse_state(data)
    bundle = oci_state.bundle_dir(state, cwd)
    spec = oci_state.load_config(bundle)
    rootfs = oci_state.rootfs_path(spec, bundle)
    edits = pipeline.cdi_hook_edits(spec, procfs_dir=args.procfs_dir, mig_minors=args.mig_minors,
                                    links=args.link, folders=args.folder, libraries=args.library,
                                    cuda_compat_major=args.cuda_compat_driver_major)
    if edits.procfs is None and not edits.symlinks and not edits.ldconfig_folders:
        return 0
    # The image's data comes next (its ld cache, its tree): bounded, as the hook's start.
    from libinject.runtime.ceiling import contain

    contain()
    if args.hook == "createContainer":
        _apply(edits, rootfs, ldconfig=args.ldconfig, owner=state.id)
        return 0
    pid, rootless = container_target(state, hook_pid)
    # One-shot (the exec'd hook, or a served worker): no fork of a worker of its own,
    # but where we sit in the container's pid namespace only for our children (rootless).
    pipeline.apply(edits, rootfs, pid=pid, no_cgroups=True, ldconfig=args.ldconfig, worker=rootless,
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
    """The apply stage in the container's mount namespace, no cgroup step: the one we
    are in, or (rootless) the one rootless_target names."""
    from libinject import pipeline

    pipeline.apply(edits, rootfs, pid=rootless_target(), no_cgroups=True, **kw)


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
