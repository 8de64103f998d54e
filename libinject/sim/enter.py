"""Present a simulated GPU host to any program, NVIDIA's tools included:

    nvhook sim enter ROOT -- CMD [ARGS...]

NVIDIA's tools (nvidia-smi, nvidia-container-cli, nvidia-ctk, go-nvml users) take a
driver root for the driver's files but read the kernel's view from the real host's
paths: /proc/driver/nvidia, /proc/devices, /sys/bus/pci/devices, /dev/nvidia*, and load
libnvidia-ml.so.1 as the dynamic loader finds it. CMD runs in a private mount namespace
(nothing propagates back to the host) where the simulated root's versions of those sit
over the host's:

  /proc/driver                    a tmpfs holding ROOT's nvidia/ and nvidia-caps/ (bound)
  /proc/devices                   ROOT/proc/devices (the simulated majors)
  /sys/bus/pci/devices            ROOT/sys/bus/pci/devices (the simulated GPUs only)
  /dev                            a read-only overlay: ROOT/dev over the host's /dev (its
                                  submounts, /dev/pts, /dev/shm, ..., bound back)
  /usr/lib/<arch>-linux-gnu,      read-only overlays: ROOT's driver libraries and tools
  /usr/bin                        over the host's (the host's own stay visible); a dir the
                                  host lacks (i386): ROOT's parent dir over the host's
  /run                            a read-only overlay: ROOT's run (the driver's sockets) over
                                  the host's, its submounts bound back
  /lib/firmware/nvidia            ROOT's GSP firmware, where the host has that dir
  /etc/ld.so.cache                one made in there by the host's ldconfig, listing both

Only ROOT's files are read; nothing is written on the host. Root only (mounts).

CMD runs as root with ROOT's programs on PATH, ROOT's libraries in the loader's cache and
ROOT's dev/ over /dev, so ROOT must be root's alone (check_trusted): a ROOT another user
made, or could still change, would be that user's root. It is refused, with one line,
before anything is mounted or run.
"""
from __future__ import annotations

import os
import subprocess

from libinject.errors import NvhookError

STAGE = "/proc/driver/.nvhook-stage"
LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib/i386-linux-gnu", "usr/bin")
LDCONFIG = ("/sbin/ldconfig", "/usr/sbin/ldconfig")
# Characters overlayfs's option parser takes as separators in lowerdir.
_OVERLAY_SPECIAL = (",", ":", "\\")
# What of ROOT is shown to CMD (_setup), checked entry by entry (check_trusted).
# (usr/lib: shown whole where the host lacks a multiarch dir; run: the driver's sockets)
SHOWN = ("dev", "proc/driver/nvidia", "proc/driver/nvidia-caps", "proc/devices", "sys/bus/pci/devices",
         "usr/lib", "usr/bin", "run", "lib/firmware")
MAX_ENTRIES = 100_000       # a simulated host has a few hundred


def check_root(root: str) -> str:
    """ROOT as an absolute path, or NvhookError naming what is wrong with it."""
    path = os.path.abspath(root)
    if not os.path.isdir(path):
        raise NvhookError(f"sim enter: {path}: not a directory")
    if not os.path.isfile(os.path.join(path, "proc/driver/nvidia/version")):
        raise NvhookError(f"sim enter: {path}: not a driver root (no proc/driver/nvidia/version)")
    if any(c in path for c in _OVERLAY_SPECIAL):
        raise NvhookError(f"sim enter: {path}: ',', ':' and '\\' cannot be in the path (overlayfs options)")
    return path


def check_trusted(root: str) -> None:
    """ROOT is root's alone (module doc), or NvhookError naming what is not: ROOT and
    every directory above it root's and writable by nobody else (a sticky one above may
    be: libinject.linux.safedir), each part of it in SHOWN reached without a symlink,
    every entry there root's, no file or directory there writable by group or others,
    and no symlink under dev/ leading out of it (CMD's opens of /dev/X as root would
    follow it)."""
    from libinject.linux import safedir

    what = f"sim enter: {root}"
    tail = "; ROOT must be root's alone (CMD runs its programs as root): build it as root"
    try:
        fd = safedir.open_dir(root, what, owners=frozenset({0}))
    except OSError as e:
        raise NvhookError(f"{what}: {e.strerror}") from None
    except NvhookError as e:
        raise NvhookError(f"{e}{tail}") from None
    try:
        seen = 0
        for rel in SHOWN:
            seen += _check_shown(fd, rel, what, tail, MAX_ENTRIES - seen)
    except OSError as e:    # (unreadable, or too many open directories: not a simulated host)
        raise NvhookError(f"{what}: {e.strerror}") from None
    finally:
        os.close(fd)


def _check_shown(root_fd: int, rel: str, what: str, tail: str, budget: int) -> int:
    """check_trusted for ROOT/rel (absent: nothing to check); how many entries it has."""
    import stat

    from libinject.linux import safedir

    def refuse(shown: str, why: str) -> NvhookError:
        return NvhookError(f"{what}: {shown} {why}{tail}")

    def check(st: os.stat_result, shown: str, target: str = "") -> None:
        if st.st_uid != 0:
            raise refuse(shown, f"is owned by {safedir.owner(st)}, not root")
        if stat.S_ISLNK(st.st_mode):
            # dev/dri/by-path/* -> ../renderD128 is what a GPU host has; one leading
            # out of dev/ would take root's opens of /dev/X in CMD anywhere on the host.
            if shown.startswith("dev/"):
                inside = os.path.normpath(os.path.join(os.path.dirname(shown), target))
                if target.startswith("/") or not inside.startswith("dev/"):
                    raise refuse(shown, f"is a symlink out of dev/ ({target}): CMD's opens of /dev "
                                        "would follow it")
        elif (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)) and st.st_mode & 0o022:
            raise refuse(shown, "is writable by group or others")

    fd = os.dup(root_fd)
    try:
        parts = rel.split("/")
        for i, name in enumerate(parts):
            shown = "/".join(parts[:i + 1])
            try:
                nfd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                return 0
            os.close(fd)
            fd = nfd
            st = os.fstat(fd)
            check(st, shown)
            if stat.S_ISLNK(st.st_mode):
                raise refuse(shown, "is a symlink (what CMD is shown is not followed out of ROOT)")
            if not stat.S_ISDIR(st.st_mode):
                return 1        # (proc/devices, a file)
        # Depth first, by fd, never through a link (os.fwalk would stat through them).
        n = 1
        stack = [(os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd), rel)]
        try:
            while stack:
                dfd, where = stack.pop()
                try:
                    with os.scandir(dfd) as entries:
                        for entry in entries:
                            n += 1
                            if n > budget:
                                raise NvhookError(f"{what}: more than {MAX_ENTRIES} entries: "
                                                  "not a simulated host")
                            st = entry.stat(follow_symlinks=False)
                            link = os.readlink(entry.name, dir_fd=dfd) if stat.S_ISLNK(st.st_mode) else ""
                            check(st, f"{where}/{entry.name}", link)
                            if stat.S_ISDIR(st.st_mode):
                                stack.append((os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                                                      | os.O_CLOEXEC, dir_fd=dfd), f"{where}/{entry.name}"))
                finally:
                    os.close(dfd)
        finally:
            for dfd, _ in stack:
                os.close(dfd)
        return n
    finally:
        os.close(fd)


def _submounts(under: str) -> list[str]:
    """Mount points strictly below `under` that are not below another of them (binding
    each back recursively brings the nested ones along)."""
    from libinject.linux import mountinfo

    points = sorted({m.mountpoint for m in mountinfo.read() if m.mountpoint.startswith(under + "/")})
    top: list[str] = []
    for p in points:
        if not any(p.startswith(t + "/") for t in top):
            top.append(p)
    return top


def _overlay(native, lower_top: str, target: str) -> None:
    native.mount("overlay", target, "overlay", native.MS_RDONLY, f"lowerdir={lower_top}:{target}")


def _setup(root: str) -> None:
    from libinject.linux import native

    native.unshare(native.CLONE_NEWNS)
    # Nothing done here may reach the host's namespace.
    native.mount(None, "/", None, native.MS_REC | native.MS_PRIVATE)
    dev_subs = _submounts("/dev")
    native.mount("tmpfs", "/proc/driver", "tmpfs", native.MS_NOSUID | native.MS_NODEV | native.MS_NOEXEC,
                 "mode=0755")
    # /dev: the host's /dev (with its submounts) under ROOT's; staged in the tmpfs so
    # that the overlay's lower layer is the host's /dev, not the overlay itself.
    os.mkdir(STAGE)
    native.mount("/dev", STAGE, None, native.MS_BIND | native.MS_REC)
    native.mount("overlay", "/dev", "overlay", native.MS_RDONLY, f"lowerdir={root}/dev:{STAGE}")
    for sub in dev_subs:
        if os.path.isdir(sub) or os.path.exists(sub):
            native.mount(STAGE + sub[len("/dev"):], sub, None, native.MS_BIND | native.MS_REC)
    native.umount2(STAGE, native.MNT_DETACH)
    os.rmdir(STAGE)
    for name in ("nvidia", "nvidia-caps"):
        src = f"{root}/proc/driver/{name}"
        if os.path.isdir(src):
            os.mkdir(f"/proc/driver/{name}")
            native.mount(src, f"/proc/driver/{name}", None, native.MS_BIND | native.MS_REC)
    if os.path.isfile(f"{root}/proc/devices"):
        native.mount(f"{root}/proc/devices", "/proc/devices", None, native.MS_BIND)
    pci = f"{root}/sys/bus/pci/devices"
    if os.path.isdir(pci) and os.path.isdir("/sys/bus/pci/devices"):
        native.mount(pci, "/sys/bus/pci/devices", None, native.MS_BIND | native.MS_REC)
    for rel in LIB_DIRS:
        if os.path.isdir(f"{root}/{rel}") and os.path.isdir(f"/{rel}"):
            _overlay(native, f"{root}/{rel}", f"/{rel}")
        elif os.path.isdir(f"{root}/{rel}"):
            # The host has no such dir (no i386 multiarch): ROOT's parent over the host's.
            parent = os.path.dirname(rel)
            while parent and not os.path.isdir(f"/{parent}"):
                parent = os.path.dirname(parent)
            if parent:
                _overlay_keeping_submounts(native, f"{root}/{parent}", f"/{parent}")
    if os.path.isdir(f"{root}/run"):
        # the driver's sockets (persistenced, fabricmanager) where NVIDIA's tools look
        _overlay_keeping_submounts(native, f"{root}/run", "/run")
    fw = f"{root}/lib/firmware/nvidia"
    if os.path.isdir(fw) and os.path.isdir("/lib/firmware"):
        target = "/lib/firmware/nvidia"
        if os.path.isdir(target):
            _overlay(native, fw, target)
        else:
            _overlay(native, f"{root}/lib/firmware", "/lib/firmware")
    _ldcache(native)


def _overlay_keeping_submounts(native, lower_top: str, target: str) -> None:
    """A read-only overlay of lower_top over target, target's submounts bound back (the
    host's target staged in the private tmpfs, as /dev is)."""
    subs = _submounts(target)
    stage = f"{STAGE}-{os.path.basename(target)}"
    os.mkdir(stage)
    native.mount(target, stage, None, native.MS_BIND | native.MS_REC)
    native.mount("overlay", target, "overlay", native.MS_RDONLY, f"lowerdir={lower_top}:{stage}")
    for sub in subs:
        if os.path.exists(sub):
            native.mount(stage + sub[len(target):], sub, None, native.MS_BIND | native.MS_REC)
    native.umount2(stage, native.MNT_DETACH)
    os.rmdir(stage)


def _ldcache(native) -> None:
    """A cache of what the host's ldconfig finds now (host and simulated libraries),
    made in the private tmpfs and bound over /etc/ld.so.cache (-X: no links written)."""
    ldconfig = next((p for p in LDCONFIG if os.access(p, os.X_OK)), None)
    if ldconfig is None or not os.path.isfile("/etc/ld.so.cache"):
        return
    cache = "/proc/driver/.ld.so.cache"
    # ROOT's library dirs by name too: the host's config may not list them (i386)
    dirs = [f"/{d}" for d in LIB_DIRS if d.startswith("usr/lib/") and os.path.isdir(f"/{d}")]
    r = subprocess.run([ldconfig, "-X", "-C", cache, *dirs], capture_output=True, text=True,
                       env={"PATH": "/usr/sbin:/sbin"})
    if r.returncode != 0 or not os.path.isfile(cache):
        raise NvhookError(f"sim enter: {ldconfig} -C failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    native.mount(cache, "/etc/ld.so.cache", None, native.MS_BIND)
    os.unlink(cache)


def enter(root: str, argv: list[str]) -> int:
    """Run argv with the simulated host at root presented over the host's paths; its
    exit status (128+N for a signal)."""
    if not argv:
        raise NvhookError("sim enter: no command given (nvhook sim enter ROOT -- CMD ...)")
    root = check_root(root)
    if os.geteuid() != 0:
        raise NvhookError("sim enter: needs root (it mounts in a private mount namespace)")
    check_trusted(root)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child sets up its own namespace and becomes CMD
        os.close(r)
        msg = ""
        try:
            _setup(root)
            try:
                os.execvp(argv[0], argv)   # w is close-on-exec: the parent then reads nothing
            except OSError as e:
                msg = f"sim enter: {argv[0]}: {e.strerror}"
        except NvhookError as e:
            msg = str(e)
        except OSError as e:   # a mount or file in the set-up
            msg = f"sim enter: {e.filename or root}: {e.strerror}"
        except BaseException as e:   # reported by the parent: one line, no traceback
            msg = f"sim enter: {type(e).__name__}: {e}"
        os.write(w, msg.encode(errors="replace")[:4000])
        os._exit(127)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        err = f.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if err:
        raise NvhookError(err)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
