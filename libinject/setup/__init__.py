"""`nvhook setup TARGET`: put nvhook in place on a node, one target at a time.

install.py holds the mechanics every target shares (a file written atomically, what
was there before kept for --undo, a unified diff for --dry-run); one module per
target: service.py (the systemd unit of `nvhook serve`), docker.py, containerd.py,
crio.py, podman.py (the engines). Each target's functions return the text to show;
the CLI (nvhook/cmd_setup.py) prints it. Nothing here is on the hook's path.
"""
