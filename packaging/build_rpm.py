"""`make rpm`: nvhook-<version>-1.x86_64.rpm, for RHEL-family and SUSE nodes
(`make rpm ARCH=arm64`, --arch aarch64: nvhook-<version>-1.aarch64.rpm).

The same payload as the .deb (tree.stage_tree: the bundle under /usr/lib/nvhook/<version>
with its own CPython and libraries), so it requires nothing of the distribution
(AutoReqProv off: the bundle's ELF files need only what the bundle carries; no
distribution Python). Its scriptlets are the .deb's maintainer scripts (packaging/deb/),
given dpkg's arguments: %post "configure"; %preun and %postun "remove" on an erase (an
erase keeps the administrator's config and /var/lib/nvhook, as an rpm keeps a changed
%config file) and "upgrade" on an upgrade. Built with Debian's rpmbuild (package rpm);
nothing of the build machine's is stripped or rewritten (no brp scripts).

Usage: python packaging/build_rpm.py OUT_DIR [--version V | --from-deb DEB] [--arch A]
  --from-deb: the payload of that .deb (its version, its architecture, its files as they
  are), so the two packages of a release carry the same bytes (`make rpm` builds the
  .deb first)
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import arch as archmod  # noqa: E402
from common import HERE, check_version, fail, run, step, version  # noqa: E402
from tree import LIBDIR  # noqa: E402
from tree import stage_tree  # noqa: E402

SPEC = """\
Name: nvhook
Version: {version}
Release: 1
Summary: GPU container toolkit (OCI hook, CDI, runtime shim) in NVIDIA's place
License: unstated
URL: https://localhost/nvhook
AutoReqProv: no
%define debug_package %{{nil}}
%define __os_install_post %{{nil}}
%define _build_id_links none
%define _binary_payload w2.xzdio

%description
nvhook gives containers their NVIDIA GPUs: the OCI prestart hook (also as the
nvidia-container-runtime-hook alternative), CDI spec generation and refresh, a
runtime shim, engine set-up and a warm hook service (nvhook-serve.service). It
carries its own Python and libraries (/usr/lib/nvhook/<version>).

%install
cp -a {stage}/. %{{buildroot}}/

%post
set -- configure
{postinst}

%preun
if [ "$1" -eq 0 ]; then set -- remove; else set -- upgrade; fi
{prerm}

%postun
if [ "$1" -eq 0 ]; then set -- remove; else set -- upgrade; fi
{postrm}

%files
%defattr(-,root,root,-)
{files}
"""


def _script(name: str) -> str:
    text = (HERE / "deb" / name).read_text()
    # %: rpm would expand it (stat -c %u)
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith("#!")).replace("%", "%%")


def _files(stage: Path, ver: str) -> str:
    """The %files list: the version's tree whole, each other file or link by name, the
    directories the package alone owns."""
    out = [f"%dir {LIBDIR}", f"{LIBDIR}/{ver}", "%dir /etc/nvidia-container-runtime", "%dir /usr/share/nvhook",
           "%dir /usr/share/doc/nvhook"]
    skip = stage / LIBDIR.lstrip("/") / ver
    for path in sorted(stage.rglob("*")):
        if path == skip or skip in path.parents or (path.is_dir() and not path.is_symlink()):
            continue
        out.append("/" + str(path.relative_to(stage)))
    return "\n".join(out)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="build_rpm.py")
    ap.add_argument("out")
    ap.add_argument("--version", default=None, help="the package's version (default: libinject.__version__)")
    ap.add_argument("--from-deb", type=Path, help="package this .deb's payload (and version, architecture)")
    ap.add_argument("--arch", help="x86_64 (default) or aarch64 (cross-built; Debian's names do too)")
    args = ap.parse_args(argv)
    if args.from_deb:
        if args.version:
            fail("--from-deb takes the .deb's version: no --version with it")
        r = subprocess.run(["dpkg-deb", "-f", str(args.from_deb), "Version", "Architecture"], capture_output=True,
                           text=True)
        if r.returncode != 0:
            fail(f"{args.from_deb}: not a .deb ({r.stderr.strip()})")
        fields = dict(ln.split(": ", 1) for ln in r.stdout.splitlines() if ": " in ln)
        args.version = fields.get("Version", "")
        deb_arch = archmod.get(fields.get("Architecture", "?")).deb
        if args.arch and archmod.get(args.arch).deb != deb_arch:
            fail(f"--arch {args.arch}: {args.from_deb.name} is for {deb_arch}")
        args.arch = deb_arch
    ver = check_version(args.version or version())
    arch = archmod.get(args.arch or "amd64")
    if not args.from_deb:
        archmod.check_tools(arch)
    if not shutil.which("rpmbuild"):
        fail("building the .rpm needs rpmbuild (apt-get install rpm)")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    old = os.umask(0o022)
    try:
        with tempfile.TemporaryDirectory(prefix="nvhook-rpm.") as tmp:
            work = Path(tmp)
            stage = work / "root"
            stage.mkdir(mode=0o755)
            if args.from_deb:
                step(f"unpacking {args.from_deb.name}")
                run(["dpkg-deb", "-x", str(args.from_deb), str(stage)], timeout=300)
            else:
                stage_tree(stage, work, ver, arch)
            top = work / "rpmbuild"
            spec = work / "nvhook.spec"
            # The arch: rpmbuild's --target (a BuildArch other than the build machine's is refused)
            spec.write_text(SPEC.format(version=ver, stage=stage, files=_files(stage, ver),
                                        postinst=_script("postinst"), prerm=_script("prerm"),
                                        postrm=_script("postrm")))
            step("writing the .rpm (rpmbuild, xz -2)")
            run(["rpmbuild", "-bb", "--target", arch.rpm, "--define", f"_topdir {top}", str(spec)], timeout=900)
            name = f"nvhook-{ver}-1.{arch.rpm}.rpm"
            if not (top / "RPMS" / arch.rpm / name).is_file():
                fail(f"rpmbuild did not write {name}")
            shutil.move(top / "RPMS" / arch.rpm / name, out / name)
            print(out / name)
    finally:
        os.umask(old)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
