"""JSON through the C scanner and encoder of CPython's `_json`, without `json`.

`import json` costs the exec'd hook ~7-10 ms on this machine kind: json.decoder compiles
regular expressions, which imports `re` and `enum`. The work itself is done by `_json`
(C) either way; this module drives it directly (~0.3 ms to import). Same results as
json.loads / json.dumps with default arguments for everything the hook reads and writes
(tests/test_jsonc.py compares them); errors are ValueError (a JSON syntax error from the
C scanner is json.decoder.JSONDecodeError, which imports json then: only on bad input),
whatever modules happen to be loaded.
"""
from __future__ import annotations

import _json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_WS = " \t\n\r"
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _Context:
    # What _json.make_scanner reads of json.JSONDecoder: its defaults.
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__
    memo: dict = {}


_scan = _json.make_scanner(_Context())


def loads(data: str | bytes | bytearray) -> Any:
    """json.loads(data) for UTF-8 (bytes) or str input."""
    if not isinstance(data, str):
        data = bytes(data).decode("utf-8")      # UnicodeDecodeError is a ValueError
    if data.startswith("\ufeff"):
        raise ValueError("Unexpected UTF-8 BOM (decode using utf-8-sig)")
    start = len(data) - len(data.lstrip(_WS))
    try:
        obj, end = _scan(data, start)
    except StopIteration as e:
        raise ValueError(f"Expecting value: char {e.value}") from None
    except SystemError:
        # The C scanner raises its syntax errors as json.decoder.JSONDecodeError, looked
        # up only among loaded modules: without it, a NULL with no exception. Load it
        # (only on bad input) and scan again for the same ValueError as json.loads.
        import json.decoder  # noqa: F401
        obj, end = _scan(data, start)
    if data[end:].strip(_WS):
        raise ValueError(f"Extra data: char {end}")
    return obj


def _default(o: object) -> object:
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")



def _encoder(item_separator: str, key_separator: str):
    return _json.make_encoder({}, _default, _json.encode_basestring_ascii, None,
                              key_separator, item_separator, False, False, True)


_SPACED = _encoder(", ", ": ")
_COMPACT = _encoder(",", ":")


def dumps(obj: object, *, compact: bool = False) -> str:
    """json.dumps(obj) (compact: with separators=(",", ":")); str keys only."""
    if isinstance(obj, str):
        return _json.encode_basestring_ascii(obj)
    return "".join((_COMPACT if compact else _SPACED)(obj, 0))
