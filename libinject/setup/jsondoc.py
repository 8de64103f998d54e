"""JSON engine configs (dockerd's daemon.json): the document as a dict, or one line saying
why not; the indent its text has. (tomldoc.py is its TOML sibling; threeway.py undoes either.)"""
from __future__ import annotations

import json

from libinject.errors import NvhookError


def parse(data: bytes | None, path: str) -> dict:
    """daemon.json's object (empty or absent: {}); anything else is one line."""
    try:
        text = (data or b"").decode("utf-8")
        doc = json.loads(text) if text.strip() else {}
    except (UnicodeDecodeError, ValueError) as e:
        raise NvhookError(f"{path}: not valid JSON ({e}); nothing changed") from None
    if not isinstance(doc, dict):
        raise NvhookError(f"{path}: not a JSON object; nothing changed")
    return doc


def indent(text: str) -> str | None:
    """The indent of the file's first indented key ("    " for a new or empty object;
    None for a one-line file)."""
    body = text.strip()
    if body in ("", "{}"):
        return "    "
    if "\n" not in body:
        return None
    for line in body.splitlines()[1:]:
        rest = line.lstrip(" \t")
        if rest.startswith('"'):
            return line[:len(line) - len(rest)] or None
    return "    "
