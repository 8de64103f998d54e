"""nvhook setup TARGET: put nvhook in place on this node, one target at a time.

    nvhook [--config FILE] setup service [--unit-dir DIR] [--dry-run] [--undo] [--no-start]

service: the systemd unit of `nvhook serve` (the warm hook service), from the template
contrib/nvhook-serve.service with ExecStart set to this install's hook front (the
nvhook-hook next to this venv's python; `--config FILE` is passed on to it). Written
atomically; what was there before is kept beside it (UNIT.nvhook-backup, or an empty
UNIT.nvhook-none when there was nothing) the first time, and --undo puts exactly that
back. A second run finds the unit unchanged. When systemd runs here (and DIR is one of
its unit directories): `systemctl daemon-reload`, then `systemctl enable --now` (unless
--no-start), each with a deadline. --dry-run shows the change as a unified diff and
changes nothing. Errors: one `nvhook:` line, non-zero, and nothing changed -- except
when a systemctl step fails after the unit was written, which the line says.

Every target is a subcommand with its own options (TARGETS); runtime configuration
(docker, containerd, crio, podman, auto) is to come as more of them.
"""
from __future__ import annotations

import argparse
import os
import stat
import sys

from libinject.errors import NvhookError

UNIT = "nvhook-serve.service"
UNIT_DIR = "/etc/systemd/system"
BACKUP = ".nvhook-backup"       # UNIT + this: the unit that was there before the first run
NONE = ".nvhook-none"           # UNIT + this (empty): there was none, --undo removes it
TEMPLATE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "contrib", UNIT)
# sd_booted(3): systemd is the init system if this exists.
SYSTEMD_RUNNING = "/run/systemd/system"
# Where systemd loads system units from (systemd.unit(5)): elsewhere, systemctl is not run.
SYSTEMD_UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system",
                     "/usr/lib/systemd/system", "/lib/systemd/system")
SYSTEMCTL: str | None = None    # None: `systemctl` on SAFE_PATH
SYSTEMCTL_TIMEOUT = 60.0
# enable --now and try-restart wait for READY=1 (warm discovery, then the socket): at
# most the unit's TimeoutStartSec (90 s by default); a stop, its TimeoutStopSec (90 s).
SERVICE_TIMEOUT = 150.0
MAX_UNIT = 1 << 20


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.description = "Put nvhook in place on this node: one subcommand per target."
    sub = p.add_subparsers(dest="target", metavar="TARGET", required=True)
    for target, (helptext, add, _) in TARGETS.items():
        add(sub.add_parser(target, help=helptext, description=helptext))


def run(args: argparse.Namespace) -> int:
    return TARGETS[args.target][2](args)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true",
                   help="show the change as a unified diff and change nothing")
    p.add_argument("--undo", action="store_true",
                   help="put back what was there before the first run")


# -- service: the systemd unit of `nvhook serve` -------------------------------------------

def _service_arguments(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--unit-dir", metavar="DIR", default=UNIT_DIR,
                   help=f"where the unit goes (default {UNIT_DIR})")
    p.add_argument("--no-start", action="store_true",
                   help="write (or undo) the unit and reload systemd, but do not enable, "
                        "start, stop or restart the service")


def _service(args: argparse.Namespace) -> int:
    unit_dir = os.path.abspath(args.unit_dir)
    path = os.path.join(unit_dir, UNIT)
    wanted = None if args.undo else _Entry.file(
        render_unit(_read_template(), _front(), _serve_config(args.config)))
    from libinject.linux.atomic import open_dir

    try:
        dfd = open_dir(unit_dir)
    except OSError as e:
        raise NvhookError(f"unit directory {unit_dir}: {e.strerror}") from None
    try:
        if args.undo:
            return _undo(dfd, unit_dir, path, args)
        return _install(dfd, unit_dir, path, wanted, args)
    finally:
        os.close(dfd)


def _install(dfd: int, unit_dir: str, path: str, wanted: _Entry, args) -> int:
    cur = _Entry.read(dfd, UNIT, path)
    if cur is not None and cur.kind == "link" and cur.data == b"/dev/null":
        raise NvhookError(f"{path} is masked (a link to /dev/null): "
                          f"`systemctl unmask {UNIT}` first if it should run")
    changed = not wanted.same(cur)
    why_not = _systemd_unusable(unit_dir)
    steps: list[tuple[str, ...]] = []
    if not why_not:
        if changed:     # a running service gets the new unit; enable --now starts one that is not
            steps.append(("daemon-reload",))
        if not args.no_start:
            steps += [("try-restart", UNIT)] if changed else []
            steps.append(("enable", "--now", UNIT))
    if args.dry_run:
        _show_diff(path, cur, wanted)
        _show_steps(steps)
        return 0
    what = f"unchanged: {path}"
    if changed:
        made = None
        if not _exists(dfd, UNIT + BACKUP) and not _exists(dfd, UNIT + NONE):
            made = UNIT + (NONE if cur is None else BACKUP)
            (_Entry.file(b"") if cur is None else cur).put(dfd, made)
        try:
            wanted.put(dfd, UNIT)
        except BaseException:
            if made:
                _unlink(dfd, made)
            raise
        what = f"wrote {path}" + (f" (the one there before: {UNIT + BACKUP})" if made and cur else "")
    _run_steps(steps, f"{what} (`nvhook setup service --undo` puts back what was there)"
               if changed else what)
    if why_not:
        tail = f"{why_not}: not enabled or started"
    elif args.no_start:
        tail = "--no-start: not enabled or started" + ("; reloaded systemd" if steps else "")
    else:
        tail = f"{UNIT} enabled and running"
    print(f"{what}; {tail}")
    return 0


def _undo(dfd: int, unit_dir: str, path: str, args) -> int:
    backup = _Entry.read(dfd, UNIT + BACKUP, os.path.join(unit_dir, UNIT + BACKUP))
    had_none = _exists(dfd, UNIT + NONE)
    if backup is None and not had_none:
        print(f"nothing to undo: neither {UNIT + BACKUP} nor {UNIT + NONE} is beside {path}")
        return 0
    cur = _Entry.read(dfd, UNIT, path)
    why_not = _systemd_unusable(unit_dir)
    before: list[tuple[str, ...]] = []
    after: list[tuple[str, ...]] = []
    if not why_not:
        if backup is None and cur is not None and not args.no_start:
            before.append(("disable", "--now", UNIT))   # ours alone: stopped before it goes
        after.append(("daemon-reload",))
        if backup is not None and not args.no_start:
            after.append(("try-restart", UNIT))         # a running one gets the old unit back
    if args.dry_run:
        _show_diff(path, cur, backup)
        _show_steps(before + after)
        return 0
    _run_steps(before, "nothing changed")
    if backup is not None:
        backup.put(dfd, UNIT)
        what = f"restored {path} from {UNIT + BACKUP}"
    else:
        _unlink(dfd, UNIT)
        what = f"removed {path}"
    for name in (UNIT + BACKUP, UNIT + NONE):
        _unlink(dfd, name)
    _run_steps(after, what)
    if why_not:
        tail = f"{why_not}: systemd not told"
    else:
        tail = ("stopped and disabled it; " if before else "") + "reloaded systemd"
    print(f"{what}; {tail}")
    return 0


def _show_steps(steps: list[tuple[str, ...]]) -> None:
    if steps:
        print("then: " + "; ".join("systemctl " + " ".join(s) for s in steps))


def _run_steps(steps: list[tuple[str, ...]], done: str) -> None:
    """Run `systemctl STEP` for each step, in order; the first that fails raises, saying
    what was `done` already."""
    for step in steps:
        timeout = SYSTEMCTL_TIMEOUT if step[0] == "daemon-reload" else SERVICE_TIMEOUT
        err = _systemctl(list(step), timeout)
        if err:
            raise NvhookError(f"`systemctl {' '.join(step)}` {err}; {done}")


def _systemctl(argv: list[str], timeout: float) -> str:
    """Run `systemctl ARGV` with a deadline: "" if it succeeded, else what went wrong."""
    import shutil

    from libinject.constants import SAFE_PATH
    from libinject.linux import child

    exe = SYSTEMCTL or shutil.which("systemctl", path=SAFE_PATH)
    if not exe:
        return "cannot run: systemctl not found"
    try:
        code, _out, err = child.run([exe, *argv], timeout=timeout, env={"PATH": SAFE_PATH})
    except TimeoutError:
        return f"did not finish within {timeout:g} s (killed)"
    except OSError as e:
        return f"cannot run: {e.strerror}"
    if code == 0:
        return ""
    lines = err.decode(errors="replace").strip().splitlines()
    return f"failed (exit {code})" + (f": {lines[-1]}" if lines else "")


def _systemd_unusable(unit_dir: str) -> str:
    """Why systemctl is not run for a unit in unit_dir ("" if it is)."""
    if not os.path.isdir(SYSTEMD_RUNNING):
        return f"systemd is not running here (no {SYSTEMD_RUNNING})"
    real = os.path.realpath(unit_dir)
    if real not in {os.path.realpath(d) for d in SYSTEMD_UNIT_DIRS}:
        return f"{unit_dir} is not a directory systemd loads units from"
    return ""


# -- the unit ---------------------------------------------------------------------------------

def _front() -> str:
    from libinject.runtime.hooksd import default_hook_path

    front = default_hook_path()
    if not os.access(front, os.X_OK):
        raise NvhookError(f"no hook front at {front} (`make venv` builds it)")
    return front


def _serve_config(config: str | None) -> str | None:
    if config is not None and not os.path.isabs(config):
        raise NvhookError(f"--config must be absolute for the unit: {config}")
    return config


def _read_template() -> str:
    try:
        with open(TEMPLATE, encoding="utf-8") as f:
            return f.read(MAX_UNIT)
    except (OSError, UnicodeDecodeError) as e:
        raise NvhookError(f"unit template {TEMPLATE}: {getattr(e, 'strerror', None) or e}") from None


def render_unit(template: str, front: str, config: str | None = None) -> bytes:
    """The template with its one ExecStart= line running `FRONT [--config C] serve`."""
    argv = [front, *(["--config", config] if config else []), "serve"]
    lines = template.splitlines(keepends=True)
    at = [i for i, line in enumerate(lines) if line.startswith("ExecStart=")]
    if len(at) != 1:
        raise NvhookError(f"unit template {TEMPLATE}: expected one ExecStart= line, found {len(at)}")
    lines[at[0]] = "ExecStart=" + " ".join(_unit_word(a) for a in argv) + "\n"
    return "".join(lines).encode()


_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@+=:,./-")


def _unit_word(arg: str) -> str:
    """arg as one word of a unit's command line (systemd.service(5): specifiers are %,
    variables $, words split at spaces unless quoted)."""
    if not arg or not arg.isprintable():
        raise NvhookError(f"cannot put {arg!r} on a unit's command line")
    word = arg.replace("%", "%%").replace("$", "$$")
    if set(arg) <= _PLAIN:
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _Entry:
    """What a directory entry is: kind "file" (data: its bytes) or "link" (data: its
    target), with its stat (None for one not written yet)."""

    __slots__ = ("kind", "data", "st")

    def __init__(self, kind: str, data: bytes, st: os.stat_result | None = None) -> None:
        self.kind, self.data, self.st = kind, data, st

    @classmethod
    def file(cls, data: bytes) -> _Entry:
        return cls("file", data)

    @classmethod
    def read(cls, dfd: int, name: str, shown: str) -> _Entry | None:
        """Entry `name` of dfd (None if there is none); shown: its path, for messages."""
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                return cls("link", os.fsencode(os.readlink(name, dir_fd=dfd)), st)
            if not stat.S_ISREG(st.st_mode):
                raise NvhookError(f"{shown} is neither a file nor a symlink")
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
            try:
                data = b""
                while len(data) <= MAX_UNIT:
                    chunk = os.read(fd, 1 << 16)
                    if not chunk:
                        break
                    data += chunk
            finally:
                os.close(fd)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise NvhookError(f"{shown}: {e.strerror}") from None
        if len(data) > MAX_UNIT:
            raise NvhookError(f"{shown} is larger than {MAX_UNIT} bytes")
        return cls("file", data, st)

    def same(self, other: _Entry | None) -> bool:
        """Would writing self change nothing where other is?"""
        return (other is not None and other.kind == self.kind and other.data == self.data
                and (other.st is None or self.kind == "link"
                     or stat.S_IMODE(other.st.st_mode) == self.mode))

    @property
    def mode(self) -> int:
        return stat.S_IMODE(self.st.st_mode) if self.st is not None else 0o644

    def put(self, dfd: int, name: str) -> None:
        """Make entry `name` of dfd this, atomically (a file: its bytes, mode and owner;
        a link: its target)."""
        from libinject.linux.atomic import discarded_on_error, write_at

        try:
            if self.kind == "link":
                tmp = f".{name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
                os.symlink(self.data, tmp, dir_fd=dfd)
                with discarded_on_error(dfd, tmp):
                    self._chown(dfd, tmp)
                    os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            else:
                write_at(dfd, name, self.data, self.mode)
                self._chown(dfd, name)
        except OSError as e:
            raise NvhookError(f"cannot write {name}: {e.strerror}") from None

    def _chown(self, dfd: int, name: str) -> None:
        if self.st is not None and (self.st.st_uid, self.st.st_gid) != (os.geteuid(), os.getegid()):
            os.chown(name, self.st.st_uid, self.st.st_gid, dir_fd=dfd, follow_symlinks=False)

    def lines(self) -> list[str]:
        if self.kind == "link":
            return [f"(a symlink to {os.fsdecode(self.data)})\n"]
        return self.data.decode(errors="replace").splitlines(keepends=True)


def _exists(dfd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dfd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def _unlink(dfd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise NvhookError(f"cannot remove {name}: {e.strerror}") from None


def _show_diff(path: str, old: _Entry | None, new: _Entry | None) -> None:
    import difflib

    if (new is None and old is None) or (new is not None and new.same(old)):
        print(f"unchanged: {path}")
        return
    a = old.lines() if old is not None else []
    b = new.lines() if new is not None else []
    diff = difflib.unified_diff(a, b, fromfile=path if old is not None else "/dev/null",
                                tofile=path if new is not None else "/dev/null")
    for line in diff:
        sys.stdout.write(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    if a == b and old is not None and new is not None:
        print(f"mode {oct(old.mode)} -> {oct(new.mode)}")


# target -> (help, add its arguments, run it)
TARGETS = {
    "service": ("install the systemd unit that runs `nvhook serve` (the warm hook service) "
                "and start it", _service_arguments, _service),
}
