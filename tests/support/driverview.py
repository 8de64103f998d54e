"""What a container sees of the driver, to compare containers made different ways.

SNAPSHOT (a sh script, run inside with `sh -c`) prints the device nodes (DRM nodes
too), driver files (size + checksum; graphics files and X modules too), symlinks,
/proc/driver/nvidia, the ld cache and nvidia-smi's view;
snapshot_lines() makes its output comparable. open_verdicts() reads the lines
`open MINOR <dd's error or OK>` a probe script prints into {minor: "OK", "EPERM", ...}.
"""
from __future__ import annotations

import re

from support.runc import open_result

SNAPSHOT = r'''
cd /
for f in $( (find /dev -maxdepth 2 -name 'nvidia*'; find /usr/lib/x86_64-linux-gnu /usr/lib/i386-linux-gnu /usr/bin /lib/firmware /proc/driver/nvidia /tmp/nvidia-mps /usr/lib64 /dev/dri /etc/vulkan /etc/glvnd /etc/OpenCL /usr/share /usr/local/share /usr/lib/xorg -maxdepth 7; find /run -maxdepth 2 -name 'nvidia*') 2>/dev/null | sort -u); do
  if [ -L "$f" ]; then echo "L $f -> $(readlink "$f")"
  elif [ -c "$f" ]; then echo "C $f $(stat -c '%t:%T' "$f")"
  elif [ -d "$f" ]; then echo "D $f"
  elif [ -S "$f" ]; then echo "S $f"
  elif [ -f "$f" ]; then echo "F $f $(stat -c %s "$f") $(md5sum < "$f" | cut -c1-12)"
  fi
done
echo "LDCACHE $(md5sum < /etc/ld.so.cache | cut -c1-32)"
for p in /etc/ld.so.conf.d/*; do echo "LDCONF $(cat "$p" | tr '\n' ' ')"; done
nvidia-smi -L
'''

_OPEN = re.compile(r"^open (\d+) (.*)$")


def snapshot_lines(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.strip()]


def open_verdicts(out: str) -> dict[int, str]:
    """{minor: "OK" | "EPERM" | "ENXIO" | "ENOENT" | ... | dd's text} from `open M ...` lines."""
    res = {}
    for ln in out.splitlines():
        m = _OPEN.match(ln)
        if m:
            res[int(m[1])] = "OK" if m[2] == "OK" else open_result(m[2], 1).removeprefix("rc=1: ")
    return res


def split_opens(out: str) -> tuple[list[str], dict[int, str]]:
    """(snapshot_lines of everything but the `open M ...` lines, open_verdicts)."""
    return [ln for ln in snapshot_lines(out) if not _OPEN.match(ln)], open_verdicts(out)
