"""`make image`: the image the Kubernetes DaemonSet runs (deployments/kubernetes), with no
registry but Debian's and PyPI:
  - a Debian 12 root from mmdebstrap (variant essential: sh, coreutils, util-linux's
    nsenter: what the pod's own commands use), docs and locales left out;
  - the bundle (packaging/build_bundle.py) at /usr/local/lib/nvhook/<version>: nvhook with
    its own CPython and libraries, so the copy the pod puts on a node runs whatever the
    node's userland is;
imported with podman as localhost/nvhook:<version>, and saved as an OCI archive
OUT_DIR/nvhook_<version>_image.tar (for `ctr -n k8s.io images import`, `skopeo copy` to
a registry, or `podman load`).

Usage: python packaging/build_image.py OUT_DIR [--version V] [--base ROOT_TARBALL]
  --base: a root made before by mmdebstrap (tar), to skip that step (tests build several).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_deb import fail, run  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MMDEBSTRAP = ["mmdebstrap", "--variant=essential", "--dpkgopt=path-exclude=/usr/share/doc/*",
              "--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/locale/*",
              "--dpkgopt=path-exclude=/usr/share/info/*", "bookworm"]


def base_root(dest: Path) -> None:
    """Debian 12, variant essential, as a tarball at dest."""
    run([*MMDEBSTRAP, str(dest)], timeout=1200)


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    from libinject import __version__

    ap = argparse.ArgumentParser(prog="build_image.py")
    ap.add_argument("out")
    ap.add_argument("--version", default=__version__)
    ap.add_argument("--base", help="a root tarball from an earlier mmdebstrap run")
    args = ap.parse_args(argv)
    for tool in ("podman", "mmdebstrap", "tar"):
        if not shutil.which(tool) and not (tool == "mmdebstrap" and args.base):
            fail(f"building the image needs {tool} (apt-get install {tool})")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tag = f"localhost/nvhook:{args.version}"
    with tempfile.TemporaryDirectory(prefix="nvhook-image.") as tmp:
        work = Path(tmp)
        base = Path(args.base) if args.base else work / "base.tar"
        if not args.base:
            base_root(base)
        run([sys.executable, str(REPO / "packaging/build_bundle.py"), str(work), "--version", args.version],
            timeout=1800)
        bundle = work / f"nvhook-{args.version}-bundle.tar.gz"
        # One layer: the base root with the bundle added (tar --concatenate needs both
        # uncompressed; the bundle's members are usr/local/lib/nvhook/<version>/...).
        layer = work / "layer.tar"
        shutil.copy(base, layer)
        run(["sh", "-c", f'gzip -dc "{bundle}" > "{work}/bundle.tar" && tar -Af "{layer}" "{work}/bundle.tar"'],
            timeout=600)
        run(["podman", "import", "--change", f"ENV NVHOOK_VERSION={args.version}",
             "--change", 'CMD ["/bin/sh"]', str(layer), tag], timeout=600)
        archive = out / f"nvhook_{args.version}_image.tar"
        archive.unlink(missing_ok=True)
        run(["podman", "save", "--format", "oci-archive", "-o", str(archive), tag], timeout=600)
    print(tag)
    print(archive)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
