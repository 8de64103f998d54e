"""Files the nvhook package ships so that `systemctl daemon-reload` keeps running
containers' GPUs (`nvhook system create-dev-char-symlinks`; README, Troubleshooting).
For the package builder (packaging/build_deb.py) to pick up: copy FILES into the staged
tree and enable UNIT from the postinst as the other units are (`deb-systemd-helper enable`,
then `systemctl start` it once where systemd runs)."""
from __future__ import annotations

import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
UNIT = "nvhook-dev-char.service"
# (file in this tree, where the package installs it, mode)
FILES = (
    (HERE / "udev/71-nvhook-dev-char.rules", "usr/lib/udev/rules.d/71-nvhook-dev-char.rules", 0o644),
    (HERE / f"systemd/{UNIT}", f"usr/lib/systemd/system/{UNIT}", 0o644),
)


def install(stage: Path) -> list[str]:
    """Copy FILES under stage (the package's root); their paths in the package."""
    out = []
    for src, dest, mode in FILES:
        target = stage / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
        target.chmod(mode)
        out.append("/" + dest)
    return out
