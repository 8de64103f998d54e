"""/proc/PID/mountinfo, parsed (proc(5)):

  36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
  (1)(2) (3)   (4)   (5)      (6)      (7)   (8) (9)    (10)         (11)

Paths and sources are unescaped (the kernel writes space, tab, newline and backslash
as \\ooo). Lines that do not parse are skipped.
"""
from __future__ import annotations

import os

from libinject.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import AbstractSet

_OCTAL = "01234567"


@record(frozen=True)
class Mount:
    id: int
    parent: int
    dev: str                      # "major:minor" of the file system
    root: str                     # what of the file system is mounted
    mountpoint: str
    options: frozenset[str]       # per-mount options (rw, nosuid, ...)
    optional: tuple[str, ...]     # shared:N, master:N, ...
    fstype: str
    source: str
    super_options: frozenset[str]  # per-superblock options (cgroup v1: its controllers)


def unescape(s: str) -> str:
    if "\\" not in s:
        return s
    # re.sub(r"\\([0-7]{3})", chr(octal), s) by hand (`re` costs the hook ~8 ms to import):
    # each backslash with three octal digits after it is one character; others stay.
    first, *rest = s.split("\\")
    out = [first]
    for part in rest:
        if len(part) >= 3 and not part[:3].strip(_OCTAL):
            out.append(chr(int(part[:3], 8)))
            out.append(part[3:])
        else:
            out.append("\\")
            out.append(part)
    return "".join(out)


def parse_line(line: str) -> Mount | None:
    f = line.split()
    try:
        sep = f.index("-", 6)
        return Mount(int(f[0]), int(f[1]), f[2], unescape(f[3]), unescape(f[4]),
                     frozenset(f[5].split(",")), tuple(f[6:sep]), f[sep + 1],
                     unescape(f[sep + 2]), frozenset(f[sep + 3].split(",")))
    except (ValueError, IndexError):
        return None


def parse(text: str, fstypes: AbstractSet[str] | None = None) -> list[Mount]:
    """Every mount in `text`, in the kernel's order (parents before children).
    fstypes: only mounts of these file system types; the others' lines are passed
    over without being parsed (a node's table can have thousands of lines, ~4 us
    each to parse; the cgroup step wants a dozen of them)."""
    if fstypes is None:
        lines = text.splitlines()
    else:       # the lines holding " - TYPE ", found by str.find over the whole text
        found = []
        for t in fstypes:
            needle = f" - {t} "
            at = text.find(needle)
            while at >= 0:
                start = text.rfind("\n", 0, at) + 1
                end = text.find("\n", at)
                end = len(text) if end < 0 else end
                line = text[start:end]
                if _fstype(line) == t:
                    found.append((start, line))
                at = text.find(needle, end)
        lines = [ln for _, ln in sorted(found)]
    return [m for m in map(parse_line, lines) if m is not None]


def _fstype(line: str) -> str | None:
    """The file system type field of a line, found without parsing the rest: the word
    after the first " - " (paths and options cannot hold one: the kernel writes a
    space in them as \\040, and optional fields are single words)."""
    sep = line.find(" - ")
    if sep < 0:
        return None
    end = line.find(" ", sep + 3)
    return line[sep + 3:end] if end >= 0 else line[sep + 3:]


def read_text(pid: int | str = "self", *, proc_fd: int | None = None,
              proc_root: str = "/proc") -> str:
    """The text of process `pid`'s mountinfo (see read())."""
    path = f"{pid}/mountinfo"
    fd = (os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc_fd) if proc_fd is not None
          else os.open(f"{proc_root}/{path}", os.O_RDONLY | os.O_CLOEXEC))
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="surrogateescape")


def read(pid: int | str = "self", *, proc_fd: int | None = None,
         proc_root: str = "/proc", fstypes: AbstractSet[str] | None = None) -> list[Mount]:
    """The mounts process `pid` sees. proc_fd: an fd of the /proc to read from
    (libinject.linux.proc.proc_fd(), from inside another mount namespace); else
    the one at `proc_root`. fstypes: only those (see parse()). Raises OSError
    (FileNotFoundError: no such process)."""
    return parse(read_text(pid, proc_fd=proc_fd, proc_root=proc_root), fstypes)


class Table:
    """One reading of a mountinfo file, by mount id, each line parsed only when asked
    for (a caller that checks two or three mounts of a namespace with a few hundred
    does not pay for the rest). It is a snapshot: see what its user says about why
    that is enough for what it checks."""

    __slots__ = ("_lines", "_parsed")

    def __init__(self, text: str):
        self._lines: dict[int, str] = {}
        self._parsed: dict[int, Mount | None] = {}
        for line in text.splitlines():
            head = line[:max(line.find(" "), 0)]
            if head.isascii() and head.isdigit():
                self._lines[int(head)] = line

    def get(self, mid: int) -> Mount | None:
        """Mount `mid`, or None if that reading has no (well-formed) line for it."""
        try:
            return self._parsed[mid]
        except KeyError:
            pass
        line = self._lines.get(mid)
        m = parse_line(line) if line is not None else None
        self._parsed[mid] = m
        return m

    def __contains__(self, mid: int) -> bool:
        return self.get(mid) is not None

    def __len__(self) -> int:
        return len(self._lines)


def table(pid: int | str = "self", *, proc_fd: int | None = None,
          proc_root: str = "/proc") -> Table:
    """read(), as a Table (parsed lazily, by mount id)."""
    return Table(read_text(pid, proc_fd=proc_fd, proc_root=proc_root))
