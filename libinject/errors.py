"""The one exception type that reaches users: its message is the one line they see."""


class NvhookError(Exception):
    """A failure with a clear, single-line message for stderr."""

    def __str__(self) -> str:
        return " ".join(str(a) for a in self.args).replace("\n", " ")
