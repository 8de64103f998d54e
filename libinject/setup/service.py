"""The `service` target: the systemd unit of `nvhook serve` (the warm hook service).

The unit comes from the template libinject/setup/units/nvhook-serve.service (package data:
an installed wheel has it too) with ExecStart set to
this install's hook front (the nvhook-hook next to this venv's python; a `--config`
is passed on to it), written with the shared mechanics (libinject.setup.install: the
unit there before, or that there was none, is kept in the store the first time;
--undo puts exactly that back). When systemd runs here (and the
directory is one of its unit directories): `systemctl daemon-reload`, then
`systemctl enable --now` (unless no_start), each with a deadline. Errors raise
NvhookError and change nothing -- except a systemctl step failing after the unit was
written, which the message says.
"""
from __future__ import annotations

import os

from libinject.errors import NvhookError
from libinject.record import record
from libinject.setup.install import Entry, Target, diff, nothing_to_undo, open_dir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

UNIT = "nvhook-serve.service"
REFRESH_UNIT = "nvhook-cdi-refresh.service"
# Each unit nvhook installs, and what its ExecStart runs after the front (and --config).
UNITS = {UNIT: ("serve",), REFRESH_UNIT: ("cdi", "refresh", "--watch")}
UNIT_DIR = "/etc/systemd/system"
TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "units")
TEMPLATE = os.path.join(TEMPLATES, UNIT)
# sd_booted(3): systemd is the init system if this exists.
SYSTEMD_RUNNING = "/run/systemd/system"
# Where systemd loads system units from (systemd.unit(5)): elsewhere, systemctl is not run.
SYSTEMD_UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system",
                     "/usr/lib/systemd/system", "/lib/systemd/system")
SYSTEMCTL_TIMEOUT = 60.0
# enable --now and try-restart wait for READY=1 (warm discovery, then the socket): at
# most the unit's TimeoutStartSec (90 s by default); a stop, its TimeoutStopSec (90 s).
SERVICE_TIMEOUT = 150.0
MAX_UNIT = 1 << 20


def systemctl(argv: list[str], timeout: float, exe: str | None = None) -> str:
    """Run `systemctl ARGV` (exe: the systemctl to run, default the one on SAFE_PATH)
    with a deadline: "" if it succeeded, else what went wrong."""
    import shutil

    from libinject.constants import SAFE_PATH
    from libinject.linux import child

    exe = exe or shutil.which("systemctl", path=SAFE_PATH)
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


@record(frozen=True)
class Systemd:
    """Where systemd is and how to talk to it (tests point these elsewhere)."""
    running: str = SYSTEMD_RUNNING              # exists when systemd is PID 1
    unit_dirs: tuple[str, ...] = SYSTEMD_UNIT_DIRS
    systemctl: Callable[[list[str], float], str] = systemctl   # (argv, timeout) -> "" or the error
    reload_timeout: float = SYSTEMCTL_TIMEOUT
    service_timeout: float = SERVICE_TIMEOUT

    def unusable(self, unit_dir: str) -> str:
        """Why systemctl is not run for a unit in unit_dir ("" if it is)."""
        if not os.path.isdir(self.running):
            return f"systemd is not running here (no {self.running})"
        real = os.path.realpath(unit_dir)
        if real not in {os.path.realpath(d) for d in self.unit_dirs}:
            return f"{unit_dir} is not a directory systemd loads units from"
        return ""

    def run_steps(self, steps: list[tuple[str, ...]], done: str) -> None:
        """Run `systemctl STEP` for each step, in order; the first that fails raises,
        saying what was `done` already."""
        for step in steps:
            timeout = self.reload_timeout if step[0] == "daemon-reload" else self.service_timeout
            err = self.systemctl(list(step), timeout)
            if err:
                raise NvhookError(f"`systemctl {' '.join(step)}` {err}; {done}")


def _steps_text(steps: list[tuple[str, ...]]) -> str:
    return "then: " + "; ".join("systemctl " + " ".join(s) for s in steps) + "\n" if steps else ""


def setup(unit_dir: str = UNIT_DIR, *, config: str | None = None, dry_run: bool = False,
          undo: bool = False, no_start: bool = False, systemd: Systemd | None = None,
          backup_dir: str | None = None, unit: str = UNIT) -> str:
    """Install (or undo) `unit` (one of UNITS) in unit_dir; the text to show."""
    systemd = systemd or Systemd()
    unit_dir = os.path.abspath(unit_dir)
    template = os.path.join(TEMPLATES, unit)
    wanted = None if undo else Entry.file(render_unit(read_template(template), front(), serve_config(config),
                                                      UNITS[unit], template))
    os.close(open_dir(unit_dir, "unit directory"))     # a missing one: this message
    target = Target(os.path.join(unit_dir, unit), store=backup_dir, limit=MAX_UNIT)
    if undo:
        return _undo(target, dry_run, no_start, systemd, unit)
    return _install(target, wanted, dry_run, no_start, systemd, unit)


def _install(target: Target, wanted: Entry, dry_run: bool, no_start: bool, systemd: Systemd,
             unit: str = UNIT) -> str:
    path = target.path
    cur = target.read()
    if cur is not None and cur.kind == "link" and cur.data == b"/dev/null":
        raise NvhookError(f"{path} is masked (a link to /dev/null): "
                          f"`systemctl unmask {unit}` first if it should run")
    changed = not wanted.same(cur)
    why_not = systemd.unusable(target.dir)
    steps: list[tuple[str, ...]] = []
    if not why_not:
        if changed:     # a running service gets the new unit; enable --now starts one that is not
            steps.append(("daemon-reload",))
        if not no_start:
            steps += [("try-restart", unit)] if changed else []
            steps.append(("enable", "--now", unit))
    if changed:
        target.saved()      # a backup it must refuse: refused before anything is run or shown
    if dry_run:
        return diff(path, cur, wanted) + _steps_text(steps)
    what = f"unchanged: {path}"
    if changed:
        done = target.install(wanted, cur)
        what = f"wrote {path}" + (f" (the one there before: {done.backup})" if done.backup else "")
    systemd.run_steps(steps, f"{what} (`nvhook setup service --undo` puts back what was there)"
                      if changed else what)
    if why_not:
        tail = f"{why_not}: not enabled or started"
    elif no_start:
        tail = "--no-start: not enabled or started" + ("; reloaded systemd" if steps else "")
    else:
        tail = f"{unit} enabled and running"
    return f"{what}; {tail}\n"


def _undo(target: Target, dry_run: bool, no_start: bool, systemd: Systemd, unit: str = UNIT) -> str:
    path = target.path
    saved = target.saved()
    if saved is None:
        return nothing_to_undo(path)
    backup = saved.entry
    cur = target.read()
    why_not = systemd.unusable(target.dir)
    before: list[tuple[str, ...]] = []
    after: list[tuple[str, ...]] = []
    if not why_not:
        if backup is None and cur is not None and not no_start:
            before.append(("disable", "--now", unit))   # ours alone: stopped before it goes
        after.append(("daemon-reload",))
        if backup is not None and not no_start:
            after.append(("try-restart", unit))         # a running one gets the old unit back
    if dry_run:
        return diff(path, cur, backup) + _steps_text(before + after)
    systemd.run_steps(before, "nothing changed")
    what = target.undo() or f"removed {path}"
    systemd.run_steps(after, what)
    if why_not:
        tail = f"{why_not}: systemd not told"
    else:
        tail = ("stopped and disabled it; " if before else "") + "reloaded systemd"
    return f"{what}; {tail}\n"


# -- the unit ---------------------------------------------------------------------------------

def front() -> str:
    from libinject.runtime.hooksd import default_hook_path

    from libinject.setup.install import trusted_program

    path = default_hook_path()
    if not os.access(path, os.X_OK):
        raise NvhookError(f"no hook front at {path} (`make venv` builds it)")
    trusted_program(path)
    return path


def serve_config(config: str | None) -> str | None:
    if config is not None and not os.path.isabs(config):
        raise NvhookError(f"--config must be absolute for the unit: {config}")
    return config


def read_template(path: str = TEMPLATE) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(MAX_UNIT)
    except (OSError, UnicodeDecodeError) as e:
        raise NvhookError(f"unit template {path}: {getattr(e, 'strerror', None) or e}") from None


def render_unit(template: str, front: str, config: str | None = None, command: tuple[str, ...] = ("serve",),
                name: str = TEMPLATE) -> bytes:
    """The template with its one ExecStart= line running `FRONT [--config C] COMMAND`."""
    argv = [front, *(["--config", config] if config else []), *command]
    lines = template.splitlines(keepends=True)
    at = [i for i, line in enumerate(lines) if line.startswith("ExecStart=")]
    if len(at) != 1:
        raise NvhookError(f"unit template {name}: expected one ExecStart= line, found {len(at)}")
    lines[at[0]] = "ExecStart=" + " ".join(unit_word(a) for a in argv) + "\n"
    return "".join(lines).encode()


_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@+=:,./-")


def unit_word(arg: str) -> str:
    """arg as one word of a unit's command line (systemd.service(5): specifiers are %,
    variables $, words split at spaces unless quoted)."""
    if not arg or not arg.isprintable():
        raise NvhookError(f"cannot put {arg!r} on a unit's command line")
    word = arg.replace("%", "%%").replace("$", "$$")
    if set(arg) <= _PLAIN:
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'
