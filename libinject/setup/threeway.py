"""--undo that keeps what others changed after nvhook's set-up: a three-way undo of an
engine's structured config (TOML or JSON).

Each time nvhook changes such a file it records the settings it set (key path -> the
value it wrote: `changes`, kept sealed in the store beside the backup of what was there
first). --undo then edits the file as it is NOW: a setting nvhook set that still holds
nvhook's value goes back to what the first run found (or goes away, if it was not
there); a setting someone changed since keeps their value (and is named); everything
else in the file, an administrator's later additions included, stays as it is. Tables
nvhook made that end up empty go too. When the result is what the first run found,
that file comes back byte for byte (comments and layout included).
"""
from __future__ import annotations

import json

from libinject.errors import NvhookError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

FORMATS = ("toml", "json")
MISSING: Any = object()
Path_ = tuple[str, ...]


def parse(fmt: str, data: bytes | None, path: str):
    """The editable document (tomlkit's, or a dict); NvhookError if it does not parse."""
    if fmt == "toml":
        from libinject.setup import tomldoc

        return tomldoc.parse(data, path)
    from libinject.setup import jsondoc

    return jsondoc.parse(data, path)


def plain(fmt: str, doc) -> dict:
    """doc as plain dicts, lists and scalars (JSON-comparable)."""
    if fmt == "toml":
        from libinject.setup import tomldoc

        doc = tomldoc._plain(doc)
    return json.loads(json.dumps(doc, default=str))


def dumps(fmt: str, doc, like: bytes) -> bytes:
    if fmt == "toml":
        from libinject.setup import tomldoc

        return tomldoc.dumps(doc)
    from libinject.setup.jsondoc import indent

    text = like.decode("utf-8", errors="replace")
    out = json.dumps(doc, indent=indent(text), ensure_ascii=False)
    return (out + ("\n" if text.endswith("\n") else "")).encode("utf-8")


def get(tree: Any, path: Path_) -> Any:
    for k in path:
        if not isinstance(tree, dict) or k not in tree:
            return MISSING
        tree = tree[k]
    return tree


def changed(old: dict, new: dict, at: Path_ = ()) -> dict[Path_, Any]:
    """Every leaf of new that differs from old (a table is not a leaf: its keys are)."""
    out: dict[Path_, Any] = {}
    for k, v in new.items():
        o = old.get(k, MISSING) if isinstance(old, dict) else MISSING
        if isinstance(v, dict):
            out.update(changed(o if isinstance(o, dict) else {}, v, (*at, k)))
        elif o is MISSING or o != v or type(o) is not type(v):
            out[(*at, k)] = v
    return out


def encode(changes: dict[Path_, Any]) -> bytes:
    return json.dumps([[list(p), v] for p, v in sorted(changes.items())]).encode()


def decode(data: bytes) -> dict[Path_, Any] | None:
    """The recorded changes (None: not a record this module wrote)."""
    try:
        items = json.loads(data)
    except ValueError:
        return None
    if not isinstance(items, list):
        return None
    out: dict[Path_, Any] = {}
    for item in items:
        if (not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], list) or not item[0]
                or not all(isinstance(k, str) for k in item[0])):
            return None
        out[tuple(item[0])] = item[1]
    return out


def _parent(doc, path: Path_):
    t = doc
    for k in path[:-1]:
        if not isinstance(t, dict) or k not in t:
            return None
        t = t[k]
    return t if isinstance(t, dict) else None


def undo(fmt: str, original: bytes | None, current: bytes, changes: dict[Path_, Any],
         path: str) -> tuple[bytes | None, list[str]]:
    """(the file's bytes after undoing nvhook's changes in `current` -- None: no file,
    as the first run found -- and the settings kept because they changed since)."""
    doc = parse(fmt, current, path)
    now = plain(fmt, doc)
    first = plain(fmt, parse(fmt, original, path)) if original is not None else {}
    kept: list[str] = []
    for key, ours in sorted(changes.items()):
        if get(now, key) != ours:
            kept.append(".".join(key))          # someone else's value now: theirs stays
            continue
        parent = _parent(doc, key)
        if parent is None:
            continue
        was = get(first, key)
        if was is MISSING:
            del parent[key[-1]]
        elif fmt == "toml":
            from libinject.setup import tomldoc

            tomldoc.put(parent, key[-1], was)
        else:
            parent[key[-1]] = was
    # Tables nvhook made, now empty: gone as well (deepest first).
    prefixes = sorted({k[:i] for k in changes for i in range(1, len(k))}, key=len, reverse=True)
    for pre in prefixes:
        if isinstance(get(first, pre), dict):
            continue
        parent = _parent(doc, pre)
        if parent is not None and isinstance(parent.get(pre[-1]), dict) and not len(parent[pre[-1]]):
            _drop_table(fmt, parent, pre[-1])
    if plain(fmt, doc) == first:
        return original, kept                   # nothing of others' left over: the file as it was
    return dumps(fmt, doc, current), kept


def _comments(container) -> str:
    """The comment lines in a tomlkit table's body and its sub-tables' (in order)."""
    from tomlkit.items import Table

    out = ""
    for key, item in container.body:
        if isinstance(item, Table):
            out += _comments(item.value)
        elif key is None:
            out += "".join(line + "\n" for line in item.as_string().splitlines()
                           if line.lstrip().startswith("#"))
    return out


def _drop_table(fmt: str, parent, key: str) -> None:
    """Delete the (empty) table parent[key]. In TOML, a comment written above the next
    table sits at the end of this one's body (tomlkit's view): such comments are not
    nvhook's (it writes none inside tables), so they stay where they were."""
    if fmt != "toml":
        del parent[key]
        return
    from tomlkit.container import Container
    from tomlkit.items import Whitespace

    container = parent if isinstance(parent, Container) else getattr(parent, "value", None)
    if not isinstance(container, Container) or not isinstance(getattr(parent[key], "value", None), Container):
        # a table tomlkit holds as a proxy (its parts spread over the file): no index to
        # keep comments at; the keys are what matters
        del parent[key]
        return
    comments = _comments(parent[key].value)
    idx = container._map.get(key)
    del parent[key]
    # tomlkit leaves a placeholder at the table's index: the comments take its place.
    if comments and isinstance(idx, int) and container.body[idx][0] is None:
        container.body[idx] = (None, Whitespace(comments))
