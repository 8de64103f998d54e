"""Let a running container open device nodes: cgroup v1 `devices.allow` and cgroup v2
eBPF device programs.

Finding the cgroup (as nvidia-container-cli does): the caller runs in the host's (or the
runtime's) mount namespace. /proc/PID/cgroup and /proc/self/mountinfo both show cgroup
paths relative to the *reader's* cgroup namespace root, so the container's directory is
`mountpoint + (cgroup path - mount root)` for a mount of that hierarchy whose root
contains the path. A path outside our cgroup namespace ("/../...") cannot be reached.

On a hybrid host both can apply: the kernel checks the v1 `devices` controller *and*
the eBPF programs attached on the unified hierarchy, so we handle each one that
restricts the container:
- v1: append "c MAJ:MIN rw" to devices.allow (one write per rule), only for rules
  devices.list does not already cover; undo writes to devices.deny the access bits
  that were added (so access the container had before is kept).
- v2: for each BPF_CGROUP_DEVICE program attached to the container's cgroup, read its
  translated instructions, prepend an allow block for our rules (libinject.apply.bpf),
  load it and swap it in atomically with BPF_F_ALLOW_MULTI|BPF_F_REPLACE (non-multi
  attachments are simply replaced by attaching again). Undo swaps the old programs back;
  until then the Undo keeps them alive through their fds. If a runtime's program cannot
  be reused (helper calls, maps), pass `oci_devices` (the bundle's
  linux.resources.devices) to generate a complete program instead; without it that is an
  error. Which was used: read-and-prepend whenever the program allows it (runc's,
  crun's and systemd's device programs do: plain ctx loads, compares and jumps).

`pid` is a pid in the caller's pid namespace (runc's createContainer hook state has the
container-namespace pid 1: use the prestart/poststart pid, or /proc of the runtime).

Our own cgroup (pid is this process: a createContainer hook, which runs in the
container's cgroup and mount namespace before pivot_root, stands in its own pid): the
mounts we see are then the container's (runc's read-only cgroup binds, and whatever the
spec mounts over them, down to a single devices.allow file), so v1 is reached without
them: a private, detached mount of the devices hierarchy (fsopen/fsconfig/fsmount,
attached nowhere) and openat2 beneath it, RESOLVE_BENEATH|NO_SYMLINKS|NO_XDEV, to the
path /proc/self/cgroup names. That mount's root is our cgroup namespace's root, and so
are the paths /proc/self/cgroup shows: the two agree in a cgroup namespace too. Before
the first write the kernel confirms the directory holds this process (cgroup.procs),
so a /proc the container chose cannot point the write at another cgroup. v2 keeps the
mountinfo walk: nothing is written through a path there (the BPF program is attached
to a directory fd the kernel checks is a cgroup), and a fresh cgroup2 mount is not
harmless: in the initial cgroup namespace each cgroup2 mount re-applies its options
(nsdelegate, memory_recursiveprot, ...) to the one global hierarchy.
"""
from __future__ import annotations

import errno
import os

from libinject.linux import mountinfo, native
from libinject.linux.files import read_bounded
from libinject.plan.edits import CgroupRule
from libinject.errors import NvhookError
from libinject.record import field, record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any, Callable, Iterable, Mapping, Sequence


@record(frozen=True)
class CgroupMount:
    mount_id: int
    mountpoint: str
    root: str            # the mount's root inside the hierarchy
    fstype: str          # "cgroup" | "cgroup2"
    controllers: frozenset[str]


@record
class Undo:
    """Restores the container's previous device access; call it at most once.
    `release()` keeps the change and frees what the Undo holds (fds of old programs)."""
    steps: list[Callable[[], None]] = field(default_factory=list)
    cleanups: list[Callable[[], None]] = field(default_factory=list)
    v1_dir: str | None = None      # what was changed, for callers and tests
    v2_dir: str | None = None
    v2_programs: int = 0

    def __call__(self) -> None:
        errors = []
        for step in reversed(self.steps):
            try:
                step()
            except (OSError, NvhookError) as e:   # keep undoing the rest
                errors.append(e)
        self.steps.clear()
        self.release()
        if errors:
            raise NvhookError(f"cgroup undo failed: {errors[0]}")

    undo = __call__   # apply_live calls undo.undo()

    def release(self) -> None:
        self.steps.clear()
        for c in reversed(self.cleanups):
            try:
                c()
            except OSError:
                pass
        self.cleanups.clear()

    def __enter__(self) -> "Undo":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# -- finding the cgroup ----------------------------------------------------------------
def cgroup_mounts(mounts: str | list[mountinfo.Mount]) -> list[CgroupMount]:
    """The cgroup hierarchies among `mounts` (parsed, or mountinfo text)."""
    if isinstance(mounts, str):
        mounts = mountinfo.parse(mounts)
    return [CgroupMount(m.id, m.mountpoint, m.root, m.fstype,
                        m.super_options if m.fstype == "cgroup" else frozenset())
            for m in mounts if m.fstype in ("cgroup", "cgroup2")]


def proc_cgroups(text: str) -> dict[str, str]:
    """/proc/PID/cgroup -> {controller or name=X or "" (unified): path}."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, ctrls, path = parts
        if ctrls == "":
            out[""] = path
        for c in ctrls.split(","):
            if c:
                out[c] = path
    return out


if TYPE_CHECKING:
    Visible = Callable[[str, CgroupMount], bool]


def _mount_visible(proc_root: str) -> Visible:
    """Whether `path` really is reached through mount m: mountinfo also lists mounts
    that are covered (e.g. the v1 hierarchies under a cgroup2 mounted on /sys/fs/cgroup
    in a runtime's private namespace), so compare the mount id of what the path opens."""
    def visible(path: str, m: CgroupMount) -> bool:
        try:
            fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            return native.mount_id(fd)[0] == m.mount_id   # statx: what fdinfo's mnt_id says
        except OSError:
            return False
        finally:
            os.close(fd)
    return visible


def _resolve(path: str, mounts: Iterable[CgroupMount], visible: Visible) -> str | None:
    """The directory of cgroup `path`: mountpoint + (path - mount root), through a
    visible mount whose root holds the path (the deepest root first)."""
    if path == "/.." or path.startswith("/../"):
        raise NvhookError("the container's cgroup is outside this cgroup namespace")
    cands = []
    for m in mounts:
        root = m.root.rstrip("/")
        if root == "" or path == root or path.startswith(root + "/"):
            cands.append((len(root), m))
    for rootlen, m in sorted(cands, key=lambda c: -c[0]):
        rel = path[rootlen:].lstrip("/")
        d = os.path.join(m.mountpoint, rel) if rel else m.mountpoint
        if visible(d, m):
            return d
    return None


def _read_cgroups(pid: int, proc_root: str) -> str:
    """/proc/PID/cgroup's text; NvhookError when there is no such process."""
    data = read_bounded(f"{proc_root}/{pid}/cgroup", 1 << 20, "cgroup list", missing_ok=True)
    if data is None:
        raise NvhookError(f"no such process: {pid}")
    return data.decode(errors="replace")


_CGROUP_FSTYPES = frozenset({"cgroup", "cgroup2"})


def find_cgroup_dirs(pid: int, *, proc_root: str = "/proc", visible: Visible | None = None,
                     v1_too: bool = True) -> tuple[str | None, str | None]:
    """(v1 devices dir, cgroup2 dir) of process pid as seen from our mount namespace;
    None where there is none to change (v1 always None without v1_too)."""
    cg = proc_cgroups(_read_cgroups(pid, proc_root))
    try:
        # only the cgroup lines are parsed: a node's table can have thousands of others
        mounts = cgroup_mounts(mountinfo.read(proc_root=proc_root, fstypes=_CGROUP_FSTYPES))
    except FileNotFoundError:
        raise NvhookError(f"no such process: {pid}") from None
    visible = visible or _mount_visible(proc_root)
    v1 = v2 = None
    if v1_too and "devices" in cg:
        v1 = _resolve(cg["devices"], [m for m in mounts if "devices" in m.controllers],
                      visible)
        # The root devices cgroup cannot be restricted, so a container left there (a
        # v2 runtime on a hybrid host) needs nothing even where v1 is not mounted.
        if v1 is None and cg["devices"] != "/":
            raise NvhookError("the devices cgroup hierarchy is not mounted")
    if "" in cg:
        v2 = _resolve(cg[""], [m for m in mounts if m.fstype == "cgroup2"], visible)
    return v1, v2


# -- cgroup v1 -------------------------------------------------------------------------
def _rule_line(r: CgroupRule) -> str:
    return f"{r.type} {r.major}:{r.minor} {r.access}"


def _v1_entries(listing: str) -> list[tuple[str, str, str, str]]:
    out = []
    for line in listing.splitlines():
        try:
            t, majmin, acc = line.split()
            maj, mnr = majmin.split(":")
        except ValueError:
            continue
        out.append((t, maj, mnr, acc))
    return out


def _covered(r: CgroupRule, entries: list[tuple[str, str, str, str]]) -> bool:
    """Whether one devices.list entry already grants rule r (the kernel matches a
    request against single entries). A default-allow cgroup lists only "a *:* rwm"
    whatever its exceptions; we take it at its word."""
    for t, maj, mnr, acc in entries:
        if (t in ("a", r.type) and maj in ("*", str(r.major)) and mnr in ("*", str(r.minor))
                and set(r.access) <= set(acc)):
            return True
    return False


def _added_access(r: CgroupRule, entries: list[tuple[str, str, str, str]]) -> str:
    """The access bits our write adds to the exact entry for r's device: undo denies
    only these (a deny removes bits from the entry with exactly this type and number)."""
    had = set()
    for t, maj, mnr, acc in entries:
        if (t, maj, mnr) == (r.type, str(r.major), str(r.minor)):
            had |= set(acc)
    return "".join(c for c in "rwm" if c in r.access and c not in had)


if TYPE_CHECKING:
    Opener = Callable[[int, str, int], int]    # (dir fd, name, flags) -> fd


def _open_plain(dfd: int, name: str, flags: int) -> int:
    return os.open(name, flags | os.O_CLOEXEC, dir_fd=dfd)


# Nothing but the named file in the named directory: no symlink, no "..", no mount.
_BENEATH = (native.RESOLVE_BENEATH | native.RESOLVE_NO_SYMLINKS | native.RESOLVE_NO_XDEV
            | native.RESOLVE_NO_MAGICLINKS)


def _open_beneath(dfd: int, name: str, flags: int) -> int:
    return native.openat2(dfd, name, flags | os.O_CLOEXEC, resolve=_BENEATH)


def _write_v1(dfd: int, name: str, line: str, opener: Opener = _open_plain) -> None:
    fd = opener(dfd, name, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _allow_v1(cgdir: str, rules: Sequence[CgroupRule], undo: Undo) -> None:
    dfd = os.open(cgdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    undo.cleanups.append(lambda: os.close(dfd))
    _allow_v1_at(dfd, cgdir, rules, undo, _open_plain)


def _allow_v1_at(dfd: int, where: str, rules: Sequence[CgroupRule], undo: Undo,
                 opener: Opener, before_write: Callable[[], None] | None = None) -> None:
    """The v1 step on the open cgroup directory dfd (`where` names it in messages);
    before_write() runs once, before the first write, if there is one."""
    fd = opener(dfd, "devices.list", os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):    # (no io wrapper: fstat, ioctl, lseek calls)
            chunks.append(chunk)
    finally:
        os.close(fd)
    entries = _v1_entries(b"".join(chunks).decode(errors="replace"))
    allow = -1      # devices.allow, opened once for all our rules (one rule a write)
    try:
        for r in rules:
            if _covered(r, entries):
                continue
            if before_write is not None:
                before_write()
                before_write = None
            added = _added_access(r, entries)
            try:
                if allow < 0:
                    allow = opener(dfd, "devices.allow", os.O_WRONLY | os.O_NOFOLLOW)
                os.write(allow, _rule_line(r).encode())
            except OSError as e:
                raise NvhookError(f"cannot allow device {r.major}:{r.minor} in {where}: "
                                  f"{e.strerror}") from None
            entries.append((r.type, str(r.major), str(r.minor), r.access))
            deny = f"{r.type} {r.major}:{r.minor} {added}"
            undo.steps.append(lambda deny=deny: _write_v1(dfd, "devices.deny", deny, opener))
            undo.v1_dir = where
    finally:
        if allow >= 0:
            os.close(allow)


# -- cgroup v1, our own cgroup: through a private mount ---------------------------------
def is_self(pid: int, proc_root: str) -> bool:
    """Whether pid is this process, as proc_root counts pids (oci_state.container_pid
    gives a createContainer hook its own pid so)."""
    try:
        return pid == int(os.readlink(f"{proc_root}/self"))
    except (OSError, ValueError):
        return False


def v1_hierarchy(text: str, controller: str) -> tuple[tuple[str, ...], str] | None:
    """From /proc/PID/cgroup text: (what the v1 hierarchy holding `controller` is mounted
    with: its controllers and any "name=X", as listed; the cgroup path in it), or None
    when no v1 hierarchy has it. More than one line naming it is an error: a cgroup
    name with a newline in it can forge lines."""
    found = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[1]:
            names = tuple(n for n in parts[1].split(",") if n)
            if controller in names:
                found.append((names, parts[2]))
    if len(found) > 1:
        raise NvhookError(f"the cgroup list names the {controller} hierarchy more than once")
    return found[0] if found else None


def _mount_hierarchy(names: Sequence[str]) -> int:
    """An fd of a new, detached mount of the existing v1 hierarchy mounted with exactly
    `names`: attached nowhere, so no other process (nor the container) sees it, and
    gone with its last fd. Naming exactly the hierarchy's controllers makes the kernel
    reuse that hierarchy (a set matching none would ask for a new one, which fails with
    EBUSY while its controllers are bound elsewhere; and in a cgroup namespace, with
    EPERM). The mount's root is our cgroup namespace's root."""
    fs = native.fsopen("cgroup")
    try:
        for n in names:
            if n.startswith("name="):
                native.fsconfig(fs, native.FSCONFIG_SET_STRING, "name", n[5:])
            else:
                native.fsconfig(fs, native.FSCONFIG_SET_FLAG, n)
        native.fsconfig(fs, native.FSCONFIG_CMD_CREATE)
        return native.fsmount(fs, native.FSMOUNT_CLOEXEC, native.MOUNT_ATTR_NOSUID
                              | native.MOUNT_ATTR_NODEV | native.MOUNT_ATTR_NOEXEC)
    finally:
        os.close(fs)


def _holds_this_process(dfd: int, where: str) -> None:
    """NvhookError unless cgroup directory dfd lists this process: the kernel's word
    that the path we were given (from a /proc in a namespace the container set up) is
    our cgroup. cgroup.procs counts pids in the reader's pid namespace, as getpid()."""
    fd = _open_beneath(dfd, "cgroup.procs", os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        pids = f.read(1 << 20).split()
    if str(os.getpid()).encode() not in pids:
        raise NvhookError(f"{where} does not hold this process; not changing it")


def _allow_own_v1(text: str, rules: Sequence[CgroupRule], undo: Undo) -> None:
    """The v1 step for our own cgroup (text: /proc/self/cgroup), through a private mount
    of the devices hierarchy: no path any mount namespace's mounts chose is used."""
    found = v1_hierarchy(text, "devices")
    if found is None:
        return      # no v1 devices hierarchy: nothing restricts us there
    names, path = found
    if path == "/.." or path.startswith("/../") or not path.startswith("/"):
        raise NvhookError("the container's cgroup is outside this cgroup namespace")
    where = f"devices cgroup {path}"
    try:
        mnt = _mount_hierarchy(names)
    except OSError as e:
        raise NvhookError(f"cannot mount the devices cgroup hierarchy ({','.join(names)}) "
                          f"privately: {e.strerror}") from None
    undo.cleanups.append(lambda: os.close(mnt))
    try:
        dfd = _open_beneath(mnt, path.strip("/") or ".", os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise NvhookError(f"cannot open {where}: {e.strerror}") from None
    undo.cleanups.append(lambda: os.close(dfd))
    _allow_v1_at(dfd, where, rules, undo, _open_beneath,
                 before_write=lambda: _holds_this_process(dfd, where))


# -- cgroup v2 -------------------------------------------------------------------------
def _dev_rules(rules: Sequence[CgroupRule]):
    from libinject.apply.bpf import DevRule
    return [DevRule(r.type, r.major, r.minor, r.access) for r in rules]


def _allow_v2(cgdir: str, rules: Sequence[CgroupRule], undo: Undo,
              oci_devices: Sequence[Mapping[str, Any]] | None) -> None:
    from libinject.apply import bpf as bd
    from libinject.linux import native as n

    cgfd = os.open(cgdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    undo.cleanups.append(lambda: os.close(cgfd))
    try:
        ids, flags = n.bpf_prog_query(cgfd, n.BPF_CGROUP_DEVICE)
    except OSError as e:
        raise NvhookError(f"cannot query device programs of {cgdir}: {e.strerror}") from None
    if not ids:
        return   # nothing attached here: no v2 restriction to lift at this level
    multi = bool(flags & n.BPF_F_ALLOW_MULTI)
    if not multi and len(ids) > 1:
        raise NvhookError(f"unexpected device programs in {cgdir}")
    ours = _dev_rules(rules)

    def keep(fd: int) -> int:
        undo.cleanups.append(lambda: os.close(fd))
        return fd

    # Load every replacement first, so a verifier error changes nothing.
    pairs: list[tuple[int, int]] = []
    for pid_ in ids:
        try:
            old = keep(n.bpf_prog_get_fd_by_id(pid_))
            insns = n.bpf_prog_get_insns(old)
        except OSError as e:
            if e.errno == errno.ENOENT:   # detached meanwhile
                continue
            raise NvhookError(f"cannot read device program {pid_}: {e.strerror}") from None
        why = bd.reusable(insns)
        if why is None:
            prog = bd.prepend_allow(ours, insns)
        elif oci_devices is not None:
            # runc's order: the config's rules, then its default devices; ours last
            prog = bd.program_from_rules(bd.rules_from_oci(oci_devices) +
                                         list(bd.DEFAULT_ALLOWED) + ours)
        else:
            raise NvhookError(f"cannot extend the container's device program {pid_}: {why}")
        try:
            new = keep(n.bpf_prog_load(n.BPF_PROG_TYPE_CGROUP_DEVICE, prog))
        except OSError as e:
            raise NvhookError(f"cannot load device program: {e.strerror}") from None
        pairs.append((old, new))

    for old, new in pairs:
        _swap(cgfd, old, new, flags, multi)
        undo.steps.append(lambda old=old, new=new: _swap(cgfd, new, old, flags, multi))
        undo.v2_programs += 1
    undo.v2_dir = cgdir


def _swap(cgfd: int, old: int, new: int, flags: int, multi: bool) -> None:
    from libinject.linux import native as n
    try:
        if multi:
            n.bpf_prog_attach(cgfd, new, n.BPF_CGROUP_DEVICE,
                              n.BPF_F_ALLOW_MULTI | n.BPF_F_REPLACE, old)
        else:   # a single (non-multi) attachment is replaced by attaching again
            n.bpf_prog_attach(cgfd, new, n.BPF_CGROUP_DEVICE, flags)
    except OSError as e:
        if not multi or e.errno != errno.EINVAL:
            raise NvhookError(f"cannot attach device program: {e.strerror}") from None
        # kernels without BPF_F_REPLACE: attach next to it, then detach the old one
        try:
            n.bpf_prog_attach(cgfd, new, n.BPF_CGROUP_DEVICE, n.BPF_F_ALLOW_MULTI)
            n.bpf_prog_detach(cgfd, old, n.BPF_CGROUP_DEVICE)
        except OSError as e2:
            raise NvhookError(f"cannot attach device program: {e2.strerror}") from None


# -- entry point -----------------------------------------------------------------------
def allow_devices(pid: int, rules: Sequence[CgroupRule], *, proc_root: str = "/proc",
                  oci_devices: Sequence[Mapping[str, Any]] | None = None) -> Undo:
    """Let process pid's cgroup open the devices in `rules` (v1 and/or v2, whichever
    restricts it). All or nothing: on failure what was changed is undone and
    NvhookError raised. Returns an Undo; call it to restore the previous access, or
    `.release()` it to keep the change."""
    for r in rules:
        if r.type not in ("c", "b") or not set(r.access) <= set("rwm") or not r.access:
            raise NvhookError(f"bad cgroup rule: {r.type} {r.major}:{r.minor} {r.access}")
    undo = Undo()
    if not rules:
        return undo
    own = is_self(pid, proc_root)
    own_text = _read_cgroups(pid, proc_root) if own else ""
    # our own cgroup: v1 below, never through the mounts we see (module docstring)
    v1, v2 = find_cgroup_dirs(pid, proc_root=proc_root, v1_too=not own)
    try:
        if own:
            _allow_own_v1(own_text, rules, undo)
        if v1 is not None:
            _allow_v1(v1, rules, undo)
        if v2 is not None:
            _allow_v2(v2, rules, undo, oci_devices)
    except BaseException:
        try:
            undo()
        except NvhookError:
            pass   # report the first failure, not the rollback's
        raise
    return undo
