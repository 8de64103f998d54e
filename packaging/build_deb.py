"""`make deb`: nvhook_<version>_amd64.deb, for any Debian or Ubuntu node (Debian 11 on);
`make deb ARCH=arm64` (--arch arm64): nvhook_<version>_arm64.deb, cross-built
(packaging/arch.py).

The payload is tree.stage_tree's (the bundle under /usr/lib/nvhook/<version> with its
own CPython and libraries, `current`, the links, units and default config), so the
package depends on nothing a minimal root lacks. Maintainer scripts: packaging/deb/
(the hook alternative, the default config where none is, the log dir, the services
enabled and (under systemd) restarted). DEBIAN/md5sums covers every file.

Usage: python packaging/build_deb.py OUT_DIR [--version V] [--arch amd64|arm64]   (`make deb`)
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# fail, run: build_image.py imports them from here (wheel_of_tree: the old home of it)
import arch as archmod  # noqa: E402
from common import HERE, check_version, fail, run, step, version, wheel_of_tree  # noqa: E402,F401
from tree import stage_tree  # noqa: E402

CONTROL = """\
Package: nvhook
Version: {version}
Architecture: {arch}
Maintainer: nvhook developers <nvhook@localhost>
Installed-Size: {size}
Recommends: runc | crun
Section: utils
Priority: optional
Homepage: https://localhost/nvhook
Description: GPU container toolkit (OCI hook, CDI, runtime shim) in NVIDIA's place
 nvhook gives containers their NVIDIA GPUs: the OCI prestart hook (also as the
 nvidia-container-runtime-hook alternative), CDI spec generation and refresh, a
 runtime shim, engine set-up (nvhook setup docker|containerd|crio|auto) and a warm
 hook service (nvhook-serve.service) that starts GPU containers without Python's
 start-up. It carries its own Python and libraries (/usr/lib/nvhook/<version>).
"""


def control(stage: Path, ver: str, arch: str) -> None:
    meta = stage / "DEBIAN"
    meta.mkdir()
    size = sum(p.lstat().st_size for p in stage.rglob("*") if not p.is_dir()) // 1024 + 1
    (meta / "control").write_text(CONTROL.format(version=ver, arch=arch, size=size))
    sums = []
    for path in sorted(stage.rglob("*")):
        if path.is_file() and not path.is_symlink() and meta not in path.parents:
            sums.append(f"{hashlib.md5(path.read_bytes()).hexdigest()}  {path.relative_to(stage)}\n")
    (meta / "md5sums").write_text("".join(sums))
    for script in ("preinst", "postinst", "prerm", "postrm"):
        shutil.copy(HERE / "deb" / script, meta / script)
        os.chmod(meta / script, 0o755)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="build_deb.py")
    ap.add_argument("out")
    ap.add_argument("--version", default=None, help="the package's version (default: libinject.__version__)")
    ap.add_argument("--arch", default="amd64", help="amd64 (default) or arm64 (cross-built)")
    args = ap.parse_args(argv)
    ver = check_version(args.version or version())
    arch = archmod.get(args.arch)
    archmod.check_tools(arch)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    old = os.umask(0o022)
    try:
        with tempfile.TemporaryDirectory(prefix="nvhook-deb.") as tmp:
            work = Path(tmp)
            stage = work / "root"
            stage.mkdir(mode=0o755)
            stage_tree(stage, work, ver, arch)
            control(stage, ver, arch.deb)
            step("writing the .deb (xz)")
            deb = out / f"nvhook_{ver}_{arch.deb}.deb"
            run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(stage), str(deb)], timeout=900)
            print(deb)
    finally:
        os.umask(old)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
