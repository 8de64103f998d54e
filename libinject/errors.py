"""The one exception type that reaches users, and the one way it is shown.

Users see exactly one line on stderr, `nvhook: <message>`, and a non-zero exit.
"""
from __future__ import annotations

import sys

PREFIX = "nvhook: "


class NvhookError(Exception):
    """A failure with a clear, single-line message for stderr."""

    def __str__(self) -> str:
        return " ".join(str(a) for a in self.args).replace("\n", " ")


def error_line(e: BaseException | str) -> str:
    """The line users see for e (an NvhookError, or a message). Control characters (a
    container's values can be in the message) are escaped: no terminal or log forging."""
    text = str(e).replace("\n", " ")
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return f"{PREFIX}{text}\n"


def report(e: BaseException | str, stream=None) -> None:
    """Write e's line to stream (default stderr); never raises."""
    out = sys.stderr if stream is None else stream
    try:
        out.write(error_line(e))
        out.flush()
    except (OSError, ValueError):
        pass
