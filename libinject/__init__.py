"""libinject: discover a GPU host and inject it into containers."""
