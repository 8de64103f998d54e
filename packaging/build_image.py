"""`make image`: the image the Kubernetes DaemonSet runs (deployments/kubernetes): only
what its containers run, no package manager, no shell but busybox's, no setuid file:
  - the bundle (packaging/build_bundle.py) at /usr/local/lib/nvhook/<version>: nvhook with
    its own CPython and libraries, so the copy the pod puts on a node runs whatever the
    node's userland is; its standard library as bytecode only (the size); `nvhook` on
    PATH (/usr/local/bin/nvhook, a link into it);
  - /bin/busybox (Debian's busybox-static) and links for the applets the install
    container's script and the preStop use (sh, cp, find, stat, sha256sum, ...);
  - /usr/bin/nsenter (util-linux: busybox's has no --cgroup) and the libraries it needs.
Every member is root's, with no setuid/setgid bit. Imported with podman as IMAGE:<version>,
IMAGE the name deployments/kubernetes/kustomization.yaml gives (its `images:` entry, the
one place the manifests' image name and tag are set), and saved as an OCI archive
OUT_DIR/nvhook_<version>_image.tar (for `ctr -n k8s.io images import`, `skopeo copy` to
a registry, or `podman load`).

Usage: python packaging/build_image.py OUT_DIR [--version V]
"""
from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_bundle import shared_libs  # noqa: E402
from build_deb import fail, run  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
KUSTOMIZATION = REPO / "deployments/kubernetes/kustomization.yaml"
BUSYBOX = "/bin/busybox"                 # busybox-static: no library to carry
NSENTER = "/usr/bin/nsenter"
# What the DaemonSet's install script and preStop run (deployments/kubernetes/daemonset.yaml).
APPLETS = ("sh", "cat", "chmod", "cp", "echo", "env", "find", "ln", "ls", "mkdir", "mktemp", "mv",
           "rm", "sha256sum", "sort", "stat")
PATH = "/usr/local/bin:/usr/bin:/bin"


def image_name() -> str:
    """The `newName` of kustomization.yaml's one `images:` entry (read without a YAML
    library: this runs with the build's Python)."""
    m = re.search(r"^images:\n  - name: \S+\n    newName: (\S+)\n", KUSTOMIZATION.read_text(), re.M)
    if not m:
        fail(f"{KUSTOMIZATION}: no `images:` entry with a newName")
    return m.group(1)


def add(tar: tarfile.TarFile, name: str, *, data: bytes | None = None, link: str | None = None,
        mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mode = mode
    if link is not None:
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, link, 0o777
        tar.addfile(info)
    elif data is None:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def sourceless(members: list[tarfile.TarInfo], stdlib: str) -> dict[str, str]:
    """The standard library as bytecode only (11 MB less): NAME.py dropped ("") and its
    __pycache__/NAME.cpython-311.pyc moved to NAME.pyc, where Python imports it without a
    source. Not site-packages (nvhook's own tracebacks keep their lines)."""
    names = {m.name for m in members}
    moved: dict[str, str] = {}
    for name in names:
        if not name.startswith(stdlib) or not name.endswith(".py") or "/site-packages/" in name:
            continue
        d, _, base = name.rpartition("/")
        pyc = f"{d}/__pycache__/{base[:-3]}.cpython-311.pyc"
        if pyc in names:
            moved[name], moved[pyc] = "", name + "c"
    return moved


def layer(bundle: Path, version: str, dest: Path) -> None:
    """The image's one layer: the bundle's members as they are (refusing any setuid/setgid
    one), then busybox, nsenter and its libraries, and the links."""
    r = subprocess.run(["ldd", BUSYBOX], capture_output=True, text=True)
    if "not a dynamic executable" not in r.stdout + r.stderr:
        fail(f"{BUSYBOX} is not static (apt-get install busybox-static)")
    dirs: set[str] = set()
    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as out:
        def parents(path: str) -> None:
            parts = path.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    add(out, d)
        with tarfile.open(bundle, "r:gz") as src:
            members = src.getmembers()
            moved = sourceless(members, f"usr/local/lib/nvhook/{version}/lib/python3.11/")
            for m in members:
                if m.name in moved:
                    if not moved[m.name]:
                        continue
                    m.name = moved[m.name]
                if m.mode & 0o6000:
                    fail(f"{bundle}: {m.name} is setuid/setgid")
                m.uid = m.gid = 0
                m.uname = m.gname = "root"
                parents(m.name.rstrip("/"))
                if m.isdir():
                    dirs.add(m.name.rstrip("/"))
                out.addfile(m, src.extractfile(m) if m.isfile() else None)
        for d in ("bin", "usr/bin", "usr/local/bin", "etc", "tmp", "proc", "sys", "dev"):
            parents(d + "/x")
        add(out, "bin/busybox", data=Path(BUSYBOX).read_bytes())
        for applet in APPLETS:
            add(out, f"bin/{applet}", link="busybox")
        add(out, "usr/bin/nsenter", data=Path(NSENTER).read_bytes())
        for name, path in sorted(shared_libs([Path(NSENTER)], Path("/nonexistent")).items()):
            # Each library at the path ldd found it (the loader's at the path nsenter names).
            where = path.lstrip("/")
            parents(where)
            add(out, where, data=Path(path).read_bytes())
        add(out, "usr/local/bin/nvhook", link=f"../lib/nvhook/{version}/bin/nvhook")


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    from libinject import __version__

    ap = argparse.ArgumentParser(prog="build_image.py")
    ap.add_argument("out")
    ap.add_argument("--version", default=__version__)
    args = ap.parse_args(argv)
    for tool in ("podman", "ldd", BUSYBOX, NSENTER):
        if not shutil.which(tool):
            fail(f"building the image needs {tool} (apt-get install podman busybox-static util-linux)")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tag = f"{image_name()}:{args.version}"
    old = os.umask(0o022)
    try:
        with tempfile.TemporaryDirectory(prefix="nvhook-image.") as tmp:
            work = Path(tmp)
            run([sys.executable, str(REPO / "packaging/build_bundle.py"), str(work), "--version", args.version],
                timeout=1800)
            tarball = work / "layer.tar"
            layer(work / f"nvhook-{args.version}-bundle.tar.gz", args.version, tarball)
            run(["podman", "import", "--change", f"ENV NVHOOK_VERSION={args.version}",
                 "--change", f"ENV PATH={PATH}", "--change", 'CMD ["/bin/sh"]', str(tarball), tag],
                timeout=600)
            archive = out / f"nvhook_{args.version}_image.tar"
            archive.unlink(missing_ok=True)
            run(["podman", "save", "--format", "oci-archive", "-o", str(archive), tag], timeout=600)
    finally:
        os.umask(old)
    print(tag)
    print(archive)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
