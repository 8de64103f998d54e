"""/proc/PID/mountinfo, parsed (proc(5)):

  36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
  (1)(2) (3)   (4)   (5)      (6)      (7)   (8) (9)    (10)         (11)

Paths and sources are unescaped (the kernel writes space, tab, newline and backslash
as \\ooo). Lines that do not parse are skipped.
"""
from __future__ import annotations

import os

from libinject.record import record

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


def parse(text: str) -> list[Mount]:
    """Every mount in `text`, in the kernel's order (parents before children)."""
    return [m for m in map(parse_line, text.splitlines()) if m is not None]


def read(pid: int | str = "self", *, proc_fd: int | None = None,
         proc_root: str = "/proc") -> list[Mount]:
    """The mounts process `pid` sees. proc_fd: an fd of the /proc to read from
    (libinject.linux.proc.proc_fd(), from inside another mount namespace); else
    the one at `proc_root`. Raises OSError (FileNotFoundError: no such process)."""
    path = f"{pid}/mountinfo"
    fd = (os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc_fd) if proc_fd is not None
          else os.open(f"{proc_root}/{path}", os.O_RDONLY | os.O_CLOEXEC))
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return parse(b"".join(chunks).decode(errors="surrogateescape"))
