"""The bundle (`make bundle`: packaging/build_bundle.py) runs in a root that holds nothing
else: no /usr, no libc, no Python of the node's. Its interpreter's ELF loader and library
path point inside the bundle, so what the Kubernetes pod copies to a node runs whatever
the node's userland is."""
from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pytest

from support import packaging

REPO = Path(__file__).resolve().parent.parent
VERSION = __import__("libinject").__version__
PREFIX = f"/usr/local/lib/nvhook/{VERSION}"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundle")
    tarball = out / f"nvhook-{VERSION}-bundle.tar.gz"
    assert packaging.build("build_bundle.py", str(out)) == [str(tarball)]
    return tarball


def test_its_members_are_the_install_path_only_and_roots(bundle):
    with tarfile.open(bundle) as t:
        members = t.getmembers()
    top = PREFIX.lstrip("/")
    assert all(m.name.rstrip("/") == top or m.name.startswith(top + "/") for m in members)
    assert all(m.uid == 0 and m.gid == 0 and not (m.mode & 0o022) for m in members if not m.issym())
    names = {m.name for m in members}
    for prog in ("nvhook", "nvhook-hook", "nvhook-runtime", "python3.11"):
        assert f"{PREFIX.lstrip('/')}/bin/{prog}" in names


def test_it_runs_in_a_root_with_nothing_else(bundle, tmp_path, a100_host):
    root = tmp_path / "root"
    root.mkdir()
    subprocess.run(["tar", "-C", str(root), "-xzf", str(bundle)], check=True, timeout=300)
    for d in ("proc", "dev", "sim", "tmp"):
        (root / d).mkdir()
    assert sorted(p.name for p in root.iterdir()) == ["dev", "proc", "sim", "tmp", "usr"]
    assert [str(p.relative_to(root)) for p in (root / "usr").rglob("*") if p.is_dir() and p.parent == root / "usr"] \
        == ["usr/local"]
    script = (f'mount --bind "{root}" "{root}" && mount -t proc proc "{root}/proc" && '
              f'mount --bind /dev "{root}/dev" && mount --bind "{a100_host}" "{root}/sim" && '
              f'for p in nvhook nvhook-hook; do chroot "{root}" {PREFIX}/bin/$p --version; done && '
              f'chroot "{root}" {PREFIX}/bin/nvhook --root /sim info && '
              f'chroot "{root}" {PREFIX}/bin/nvhook-hook --root /sim list --binaries')
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:2] == [f"nvhook {VERSION}"] * 2
    assert "NVRM version:   550.163.01" in lines and lines[-1].startswith("/usr/bin/nvidia-")
