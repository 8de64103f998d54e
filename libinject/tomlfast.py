"""A small TOML parser for the subset nvidia-container-runtime's config.toml uses.

`import tomllib` costs an exec'd `python -I -S` hook 10-15 ms (re, its compiled
regexes, datetime); this module imports nothing. loads(text) gives exactly what
tomllib.loads(text) gives, or None: "not in my subset, ask tomllib" (which then parses
it or raises, so every error message and every other construct is tomllib's).

The subset, one statement per line ("\\r\\n" is taken as "\\n", as tomllib does):
  - blank lines and comments;
  - table headers [a.b.c] of bare keys (A-Za-z0-9_-), spaces and tabs around the
    brackets and dots, each table defined once;
  - key = value, the key bare or dotted bare, the value one of: a one-line "basic"
    string with no backslash, a 'literal' string, true, false, a decimal integer of at
    most 18 digits ([+-]?(0|[1-9](_?[0-9])*)), or a one-line array of such strings;
  - a trailing comment after a header or a value.
Anything else (quoted keys, escapes, multi-line strings or arrays, inline tables,
floats, dates, hex/octal/binary, inf/nan, [[arrays of tables]], a control character
anywhere, a key or header of more than MAX_PARTS parts) gives None, and so does every
redefinition tomllib refuses, plus one it sometimes allows (dotted keys through a table
made by a [header] or by another section's dotted keys), which no real config has.
What follows a value is checked by the caller: only whitespace and a comment may
("truex", "1.5", "0x1" and "1979-05-27" all stop being a scalar there).
"""

MAX_PARTS = 32          # config.py's MAX_KEY_DOTS: a deeper key goes to tomllib's path
MAX_DIGITS = 18

_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
_DIGITS = frozenset("0123456789_")
# Raw control characters: tomllib refuses them everywhere (in comments and strings
# too), tab and newline aside. "\r" is one once "\r\n" has become "\n".
_CTRL = frozenset([chr(i) for i in range(32) if i not in (9, 10)] + ["\x7f"])
_IMPLICIT = -1                  # a table a header only passed through ([a] of [a.b])
_EXPLICIT = -2                  # a table a header defined
# (a table made by dotted keys is marked with the number of the section it was made in)


def loads(text: str) -> dict | None:
    """tomllib.loads(text), or None where text is outside the subset (or invalid)."""
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    if not _CTRL.isdisjoint(text):
        return None
    root: dict = {}
    kinds: dict[int, int] = {}     # id(table) -> _IMPLICIT, _EXPLICIT or a section number
    table = root
    section = 0
    for line in text.split("\n"):
        n = len(line)
        i = _ws(line, 0, n)
        if i == n:
            continue
        c = line[i]
        if c == "#":
            continue
        if c == "[":
            parts, i = _key(line, _ws(line, i + 1, n), n)
            if parts is None or i == n or line[i] != "]" or not _tail(line, i + 1, n):
                return None
            table = _open(root, kinds, parts)
            if table is None:
                return None
            section += 1
        elif c in _BARE:
            parts, i = _key(line, i, n)
            if parts is None or i == n or line[i] != "=":
                return None
            value, i = _value(line, _ws(line, i + 1, n), n)
            if value is None or not _tail(line, i, n):
                return None
            node = table
            for k in parts[:-1]:
                sub = node.get(k)
                if sub is None:
                    sub = node[k] = {}
                    kinds[id(sub)] = section
                elif type(sub) is not dict or kinds[id(sub)] != section:
                    return None
                node = sub
            if parts[-1] in node:
                return None
            node[parts[-1]] = value
        else:
            return None
    return root


def _ws(line: str, i: int, n: int) -> int:
    while i < n and (line[i] == " " or line[i] == "\t"):
        i += 1
    return i


def _tail(line: str, i: int, n: int) -> bool:
    """Only whitespace and a comment from i on."""
    i = _ws(line, i, n)
    return i == n or line[i] == "#"


def _key(line: str, i: int, n: int) -> tuple[list | None, int]:
    """Bare key parts joined by dots (whitespace around them) at i, and the position
    after the key and the whitespace that follows it."""
    parts = []
    while True:
        j = i
        while j < n and line[j] in _BARE:
            j += 1
        if j == i or len(parts) == MAX_PARTS:
            return None, i
        parts.append(line[i:j])
        i = _ws(line, j, n)
        if i == n or line[i] != ".":
            return parts, i
        i = _ws(line, i + 1, n)


def _open(root: dict, kinds: dict, parts: list) -> dict | None:
    """The table a [header] defines, made (with its parents) where missing. As in tomllib,
    a header may pass through any table, and may name a table only passed through before
    (not one a header or dotted keys defined)."""
    node = root
    for k in parts[:-1]:
        sub = node.get(k)
        if sub is None:
            sub = node[k] = {}
            kinds[id(sub)] = _IMPLICIT
        elif type(sub) is not dict:
            return None
        node = sub
    sub = node.get(parts[-1])
    if sub is None:
        sub = node[parts[-1]] = {}
    elif type(sub) is not dict or kinds[id(sub)] != _IMPLICIT:
        return None
    kinds[id(sub)] = _EXPLICIT
    return sub


def _string(line: str, i: int) -> tuple[str | None, int]:
    """The one-line string (no escapes) that starts at line[i] ('"' or "'")."""
    q = line[i]
    j = line.find(q, i + 1)
    if j < 0:
        return None, i
    s = line[i + 1:j]
    if q == '"' and "\\" in s:
        return None, i
    return s, j + 1


def _value(line: str, i: int, n: int) -> tuple[object, int]:
    if i == n:
        return None, i
    c = line[i]
    if c == '"' or c == "'":
        return _string(line, i)
    if c == "t" or c == "f":
        word = "true" if c == "t" else "false"
        if line.startswith(word, i):
            return c == "t", i + len(word)
        return None, i
    if c == "[":
        return _array(line, i + 1, n)
    j = i + 1 if c == "+" or c == "-" else i
    k = j
    while k < n and line[k] in _DIGITS:
        k += 1
    digits = line[j:k]
    if (not digits or len(digits) > 2 * MAX_DIGITS
            or (digits != "0" and (digits[0] not in "123456789" or "__" in digits
                                   or digits[-1] == "_"))
            or len(digits) - digits.count("_") > MAX_DIGITS):
        return None, i
    return int(line[i:k]), k


def _array(line: str, i: int, n: int) -> tuple[list | None, int]:
    """A one-line array of strings, from after its "["."""
    out = []
    i = _ws(line, i, n)
    if i < n and line[i] == "]":
        return out, i + 1
    while True:
        if i == n or line[i] not in "\"'":
            return None, i
        s, i = _string(line, i)
        if s is None:
            return None, i
        out.append(s)
        i = _ws(line, i, n)
        if i == n:
            return None, i
        if line[i] == "]":
            return out, i + 1
        if line[i] != ",":
            return None, i
        i = _ws(line, i + 1, n)
        if i < n and line[i] == "]":
            return out, i + 1
