"""The kernel's MIG minors table (proc/driver/nvidia-caps/mig-minors): parsed whole, or
the part a plan can use, by hand (`re` costs the hook ~8 ms to import). Discovery and
the snapshot check (libinject.discover.snapshot.verify) both read it."""
from __future__ import annotations

MIG_MINORS = "proc/driver/nvidia-caps/mig-minors"   # under the dev root


def parse_mig_minors(text: str) -> dict[str, int]:
    """The whole mig-minors table: "config 1", "gpu0/gi1/access 12" ... -> {name: minor}
    (the CDI mask-procfs hook, tests; discovery keeps a part: mig_minors_for);
    malformed lines are skipped."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isascii() and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def read_mig_minors(path: str) -> dict[str, int]:
    """proc/driver/nvidia-caps/mig-minors as a table; a missing or unreadable file is
    an empty table."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse_mig_minors(f.read())
    except OSError:
        return {}


_MIG_MEMO: tuple = ()           # (text, minors, table): the warm service checks the same text often


# The ASCII whitespace (str.isspace(), \s) other than " ", "\t" and "\n".
_OTHER_ASCII_SPACE = ("\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f")


def _mig_lines(block: str, needle: str) -> list[tuple[str, str]]:
    """re.findall(rf"(?m)^({needle}\\S*)[ \\t]+([0-9]+)[ \\t]*$", block), by hand (`re` costs
    the hook ~8 ms to import), `needle` taken literally (it is "gpu<int>/": no metacharacter).
    No part of that pattern matches a newline, so a match is one whole line ("\\n"-split,
    "$" is before a "\\n" or at the end): the needle; the rest of its non-whitespace run
    (\\S: not str.isspace(), as str.split() has it); one or more spaces or tabs; ASCII
    digits; spaces or tabs. Any other whitespace ("\\r", "\\v", U+00A0...) fails the line."""
    lines = block.split("\n")
    if block.isascii() and not any(c in block for c in _OTHER_ASCII_SPACE):
        # The kernel's table: " " and "\t" are the only whitespace in a line, so a line
        # matches iff it starts with the needle and splits into a name and ASCII digits.
        split = [line.split() for line in lines if line.startswith(needle)]
        return [(p[0], p[1]) for p in split if len(p) == 2 and p[1].isdigit()]
    pairs = []
    for line in lines:
        if not line.startswith(needle):
            continue
        name = line.split(None, 1)[0]       # starts with the needle: not whitespace
        rest = line[len(name):]
        digits = rest.lstrip(" \t")
        if len(digits) == len(rest):        # no space or tab after the name
            continue
        digits = digits.rstrip(" \t")
        if digits and not digits.strip("0123456789"):
            pairs.append((name, digits))
    return pairs


def mig_minors_for(text: str, gpus) -> dict[str, int]:
    """The part of the mig-minors table (it covers every possible GPU: 32 x 135 lines)
    a plan can use: "config", "monitor" and the `gpus`' own entries. Discovery and the
    snapshot check (every warm start) both use this, so it works at C speed: a GPU's
    lines are one block of the table, found with find/rfind and parsed line by line.
    As in the kernel's table, a line is "name minor" from its first column; malformed
    lines are skipped, a repeated name keeps its last minor."""
    global _MIG_MEMO
    minors = tuple(g.minor for g in gpus)
    if _MIG_MEMO and _MIG_MEMO[1] == minors and _MIG_MEMO[0] == text:
        return dict(_MIG_MEMO[2])
    out: dict[str, int] = {}
    t = "\n" + text
    for name in ("config", "monitor"):      # the last good line, as a full parse has it
        i = len(t)
        while (i := t.rfind("\n" + name, 0, i)) >= 0:
            j = t.find("\n", i + 1)
            parts = t[i + 1:len(t) if j < 0 else j].split()
            if len(parts) == 2 and parts[0] == name and parts[1].isascii() and parts[1].isdigit():
                out[name] = int(parts[1])
                break
    for minor in minors:
        needle = f"gpu{minor}/"
        first = text.find(needle)
        if first < 0:
            continue
        end = text.find("\n", text.rfind(needle))
        block = text[max(first - 1, 0):len(text) if end < 0 else end]
        out.update({name: int(minor) for name, minor in _mig_lines(block, needle)})
    _MIG_MEMO = (text, minors, out)
    return dict(out)
