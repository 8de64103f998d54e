"""TOML engine configs edited in place with tomlkit: comments, key order, formatting and
keys we do not know survive; only the values we set change (and only when they differ,
so a second run renders byte-identical text)."""
from __future__ import annotations

from libinject.errors import NvhookError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Sequence


def parse(data: bytes | None, path: str):
    """The document in data (None or blank: an empty one); unparseable: NvhookError."""
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    try:
        return tomlkit.parse((data or b"").decode("utf-8"))
    except UnicodeDecodeError:
        raise NvhookError(f"{path}: not UTF-8 text, cannot parse it as TOML; nothing changed") from None
    except (TOMLKitError, ValueError) as e:
        raise NvhookError(f"{path}: not valid TOML ({e}); nothing changed") from None


def dumps(doc) -> bytes:
    return doc.as_string().encode("utf-8")


def table(doc, keys: Sequence[str], path: str):
    """The table at keys (made, as implicit super tables, where missing)."""
    import tomlkit

    t = doc
    for i, k in enumerate(keys):
        if k not in t:
            t.append(k, tomlkit.table(is_super_table=True))
        t = t[k]
        if not isinstance(t, dict):
            raise NvhookError(f"{path}: {'.'.join(keys[:i + 1])} is not a table; nothing changed")
    return t


def put(t, key: str, value: Any) -> None:
    """t[key] = value, unless it is that already (keeps the line as written)."""
    cur = t.get(key)
    if cur is None or _plain(cur) != value or type(_plain(cur)) is not type(value):
        t[key] = value


def _plain(v: Any) -> Any:
    return v.unwrap() if hasattr(v, "unwrap") else v


def header(doc, lines: Sequence[str]) -> None:
    """Comment lines at the top of a new document."""
    import tomlkit

    for line in lines:
        doc.add(tomlkit.comment(line))
