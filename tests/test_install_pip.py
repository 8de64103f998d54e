"""README's pip path, as README writes it, in a fresh Debian 12 root (mmdebstrap: no
compiler, no Python headers): its `apt-get install` line is all the system packages the
install needs, `pip install .` in a copy of this checkout builds the static fronts and
python-prctl, and the installed `nvhook`, `nvhook-hook` and `nvhook-runtime` run. (Debian's
archive and PyPI are reached as a node reaches them.)"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VERSION = __import__("libinject").__version__


def _readme_pip_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"^### pip\n.*?```sh\n(.*?)```", text, re.S | re.M).group(1)
    cmds = [ln.split("#", 1)[0].strip() for ln in block.splitlines()]
    # the install itself; `setup service` / `setup docker` need a booted node and an engine
    return [c for c in cmds if c and " setup " not in c]


HOST_CA = "/etc/ssl/certs/nvhook-test-host-ca.crt"   # in the root: the CA bundle this machine's pip trusts


def _in_root(root: Path, cmd: str, cwd: str = "/", timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive", "HOME": "/root"}
    if (root / HOST_CA.lstrip("/")).is_file():
        env["PIP_CERT"] = HOST_CA
    return subprocess.run(["unshare", "-m", "-p", "-f", "--propagation", "private", "sh", "-c",
                           'mount -t proc proc "$0/proc" && exec chroot "$0" sh -c "cd $1 && $2"', str(root), cwd,
                           cmd], capture_output=True, text=True, timeout=timeout, env=env)


def test_readmes_pip_install_works_in_a_fresh_root(tmp_path, debian_root):
    cmds = _readme_pip_commands()
    assert cmds[0].startswith("apt-get install ") and cmds[-1].endswith("pip install .")
    root = debian_root("bookworm", tmp_path / "root")
    shutil.copy("/etc/resolv.conf", root / "etc/resolv.conf")
    # PyPI as this machine reaches it (behind a proxy with its own CA, where there is one)
    ca = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
    if ca and os.path.isfile(ca):
        (root / HOST_CA.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ca, root / HOST_CA.lstrip("/"))
    src = root / "src/nvhook"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for rel in files.decode().split("\0"):
        if rel and (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    r = _in_root(root, "apt-get update -q")
    assert r.returncode == 0, r.stderr[-2000:]
    for cmd in cmds:
        if cmd.startswith("apt-get install "):
            cmd = cmd.replace("apt-get install ", "apt-get install -y -q ", 1)
        r = _in_root(root, cmd, cwd="/src/nvhook")
        assert r.returncode == 0, f"{cmd}: {r.stdout[-2000:]}{r.stderr[-2000:]}"
    for prog, first in (("nvhook", f"nvhook {VERSION}"), ("nvhook-hook", f"nvhook {VERSION}"),
                        ("nvhook-runtime", f"nvhook-runtime version {VERSION}")):   # then the runtime's
        r = _in_root(root, f"/opt/nvhook/bin/{prog} --version")
        assert r.returncode == 0 and r.stdout.splitlines()[0] == first, r.stdout + r.stderr
