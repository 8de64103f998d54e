"""libinject: discover a GPU host and inject it into containers."""

# The one home of the version: pyproject.toml reads it (tool.setuptools.dynamic).
__version__ = "0.2.0"
