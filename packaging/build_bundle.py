"""`make bundle`: nvhook as a self-contained tree for a node whatever its userland is, the
tree the Kubernetes image carries and its pod copies to the node.

Built for one install path, PREFIX (default /usr/local/lib/nvhook/<version>: versioned,
so an upgrade is a new directory and a `current` link renamed over the old one):
  PREFIX/bin/python3.11       Debian 12's CPython, its ELF interpreter set to
                              PREFIX/lib/ld-linux-x86-64.so.2 and its DT_RPATH to PREFIX/lib,
                              so it runs on this tree's glibc and libraries alone
  PREFIX/lib/                 glibc and every shared library the interpreter, the standard
                              library's extension modules and the packages' need
  PREFIX/lib/python3.11/      the standard library, and site-packages with nvhook (and its
                              [refresh] extra) and its dependencies
  PREFIX/bin/nvhook-hook, nvhook-runtime   the static fronts (they run the Python beside
                              them and that site-packages: csrc/pyexec.h)
  PREFIX/bin/nvhook           the CLI
Nothing of the node's /usr is used (tests/test_bundle.py runs it in a root holding only
the tree). Bytecode is compiled here (unchecked-hash: never rewritten on the node).
--arch arm64: the same tree for arm64 nodes, cross-built from Debian 12's arm64 packages
(packaging/arch.py; the loader is then ld-linux-aarch64.so.1).

Usage: python packaging/build_bundle.py OUT_DIR [--prefix PREFIX] [--arch amd64|arm64]
  -> OUT_DIR/nvhook-<version>-bundle.tar.gz, whose members are PREFIX's path without the
     leading "/" (untar with -C / on a node, or into an image's root).
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
from common import fail, run, step, wheel_of_tree  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PYTHON = "/usr/bin/python3.11"
STDLIB = "/usr/lib/python3.11"
# Not for a hook's node: tests, GUI, the package installers, 2to3.
# Nor for building C extensions (config-3.11-*: 33 MB of libpython .a), distutils.
STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data",
               "__pycache__", "dist-packages", "site-packages", "EXTERNALLY-MANAGED", "distutils"}
# Extension modules nothing in nvhook imports, with the libraries only they need
# (nis: Kerberos and libtirpc; _dbm: Berkeley DB; _curses, readline: terminals).
DYNLOAD_SKIP = ("_test", "_ctypes_test", "xxlimited", "_xxsubinterpreters", "_xxtestfuzz", "nis.",
                "_dbm.", "_curses", "readline.", "ossaudiodev.")
# Dependencies PyPI has no wheels of (built from source for another arch).
SOURCE_ONLY = ("python-prctl",)
SCRIPT = """#!{prefix}/bin/python3.11 -I
# nvhook's CLI in this bundle: its own site-packages, whatever the node has.
import os, sys
sys.path[:0] = [os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))),
                             "lib", "python3.11", "site-packages")]
from nvhook.cli import main
sys.exit(main())
"""


def shared_libs(objects: list[Path], inside: Path, loader: str = archmod.ARCHES["amd64"].loader) -> dict[str, str]:
    """SONAME -> host path of every library the objects need (ldd), but those in `inside`."""
    libs: dict[str, str] = {}
    for obj in objects:
        r = subprocess.run(["ldd", str(obj)], capture_output=True, text=True)
        for line in r.stdout.splitlines():
            parts = line.split()
            if "=>" in parts:
                name, path = parts[0], parts[2]
                if path == "not":
                    fail(f"{obj} needs {name}, which is not on this machine")
                if not path.startswith(str(inside)):
                    libs[name] = path
            elif parts and parts[0].endswith(loader):
                libs[loader] = parts[0]
    return libs


def sysroot_libs(objects: list[Path], inside: Path, root: Path, arch: archmod.Arch) -> dict[str, str]:
    """shared_libs for another machine's objects (no ldd to run them): SONAME -> path in
    the sysroot of every library they need, by DT_NEEDED, found as the loader would in
    its multiarch dirs. Those a wheel carries (auditwheel's <pkg>.libs, found through
    its $ORIGIN RPATH) are left where they are."""
    dirs = [root / "lib" / arch.triplet, root / "usr/lib" / arch.triplet, root / "lib", root / "usr/lib"]
    carried = {p.name for p in inside.rglob("*.so*")}
    libs = {arch.loader: str(root / "lib" / arch.triplet / arch.loader)}
    todo = list(objects)
    while todo:
        obj = todo.pop()
        for name in archmod.needed(obj):
            if name in libs or name in carried:
                continue
            found = next((d / name for d in dirs if (d / name).exists()), None)
            if found is None:
                fail(f"{obj.name} needs {name}, which none of Debian's {arch.deb} packages extracted has "
                     f"(packaging/arch.py: SYSROOT_PACKAGES)")
            libs[name] = str(found.resolve())
            todo.append(found)
    return libs


def prebuilt_sim(site: Path, arch: archmod.Arch) -> None:
    """The built-in simulated GPU profiles' objects (libinject/sim/prebuilt), so `nvhook sim
    create` builds them on a node without a compiler (for another arch: cross-compiled,
    named as that machine's gcc would name them)."""
    step(f"compiling the simulated GPU's libraries (built-in profiles, {arch.deb})")
    dest = site / "libinject/sim/prebuilt"
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from libinject.sim import build, profile\n"
            "cross = sys.argv[3:] or None\n"
            "for n in profile.list_profiles():\n"
            "    build.build_artifacts(profile.load_profile(n), sys.argv[2] if cross else None, cross)")
    run([sys.executable, "-I", "-c", code, str(site), arch.machine, *arch.cross],
        env=dict(os.environ, NVHOOK_SIM_CACHE=str(dest)), timeout=900)
    for marker in dest.glob("*.ok"):
        marker.unlink()


def _cross_wheels(arch: archmod.Arch, root: Path, work: Path) -> Path:
    """A wheelhouse with arch's wheels of the dependencies PyPI has only as source
    (python-prctl), built by the cross compiler against the sysroot."""
    house = work / "wheels"
    step(f"building {', '.join(SOURCE_ONLY)} for {arch.deb} (PyPI source, cross-compiled)")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-binary", ":all:", "-w", str(house),
         *SOURCE_ONLY], env=archmod.cross_env(arch, root), timeout=900)
    return house


def _install(arch: archmod.Arch, root: Path | None, work: Path, site: Path, wheel: Path) -> None:
    """nvhook's wheel and its dependencies into site (for another arch: PyPI's manylinux
    wheels of that machine, and those _cross_wheels built)."""
    argv = [sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--no-warn-script-location",
            "--target", str(site)]
    if root is not None:
        argv += [*arch.pip_platforms(), "--python-version", "3.11",
                 "--implementation", "cp", "--abi", "cp311", "--only-binary", ":all:",
                 "--find-links", str(_cross_wheels(arch, root, work))]
    run([*argv, f"{wheel}[refresh]"], timeout=900)


def build(prefix: str, stage: Path, work: Path, version: str | None = None,
          arch: archmod.Arch = archmod.ARCHES["amd64"]) -> None:
    """The bundle at stage/prefix; version: stamped into its nvhook (default: this tree's);
    arch: the machine it is for."""
    dest = stage / prefix.lstrip("/")
    root = None if arch.native else archmod.sysroot(arch, work / "sysroot")
    python, stdlib = (PYTHON, STDLIB) if root is None else (root / PYTHON.lstrip("/"), root / STDLIB.lstrip("/"))
    step(f"copying the standard library into {prefix}")
    (dest / "bin").mkdir(parents=True)
    site = dest / "lib/python3.11/site-packages"
    # The standard library.
    shutil.copytree(stdlib, dest / "lib/python3.11", symlinks=False,
                    ignore=lambda d, names: [n for n in names if n in STDLIB_SKIP or n.endswith(".pyc")
                                             or n.startswith("config-3.11-")
                                             or (d.endswith("lib-dynload") and n.startswith(DYNLOAD_SKIP))])
    site.mkdir()
    # nvhook, its fronts and its dependencies.
    wheel = wheel_of_tree(work, version, env=None if root is None else archmod.cross_env(arch, root))
    step("installing nvhook and its dependencies (PyPI)")
    _install(arch, root, work, site, wheel)
    for front in ("nvhook-hook", "nvhook-runtime"):
        shutil.move(site / "bin" / front, dest / "bin" / front)
    shutil.rmtree(site / "bin")
    prebuilt_sim(site, arch)
    shutil.copy2(python, dest / "bin/python3.11")
    for link in ("python", "python3"):
        os.symlink("python3.11", dest / "bin" / link)
    (dest / "bin/nvhook").write_text(SCRIPT.format(prefix=prefix))
    os.chmod(dest / "bin/nvhook", 0o755)
    # The wheels' extension modules carry their debug symbols (PyYAML's: 2.7 MB of 3).
    run([archmod.strip_tool(arch), "--strip-unneeded", *map(str, site.rglob("*.so"))])
    # The libraries, then the interpreter pointed at them.
    step("copying the shared libraries, compiling bytecode")
    objects = [dest / "bin/python3.11", *dest.glob("lib/python3.11/lib-dynload/*.so"), *site.rglob("*.so")]
    libs = shared_libs(objects, dest, arch.loader) if root is None else sysroot_libs(objects, dest, root, arch)
    for name, path in sorted(libs.items()):
        shutil.copy2(path, dest / "lib" / name, follow_symlinks=True)
    run(["patchelf", "--set-interpreter", f"{prefix}/lib/{arch.loader}", "--force-rpath", "--set-rpath",
         f"{prefix}/lib", str(dest / "bin/python3.11")])
    run([PYTHON, "-m", "compileall", "-q", "-j", "0", "-s", str(stage), "-p", "/",
         "--invalidation-mode", "unchecked-hash", str(dest / "lib/python3.11")], timeout=900)


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    from libinject import __version__

    ap = argparse.ArgumentParser(prog="build_bundle.py")
    ap.add_argument("out")
    ap.add_argument("--version", default=__version__,
                    help="the install's version (its directory and the tarball's name)")
    ap.add_argument("--prefix", help="default /usr/local/lib/nvhook/VERSION")
    ap.add_argument("--arch", default="amd64", help="amd64 (default) or arm64 (cross-built)")
    args = ap.parse_args(argv)
    arch = archmod.get(args.arch)
    archmod.check_tools(arch)
    if not args.version or "/" in args.version or args.version.startswith("."):
        fail(f"--version must be a plain name: {args.version!r}")
    args.prefix = args.prefix or f"/usr/local/lib/nvhook/{args.version}"
    if not args.prefix.startswith("/") or args.prefix.rstrip("/") != args.prefix or "//" in args.prefix:
        fail(f"--prefix must be an absolute path without a trailing /: {args.prefix}")
    for tool in ("patchelf", "ldd", "strip"):
        if not shutil.which(tool):
            fail(f"building the bundle needs {tool} (apt-get install patchelf libc-bin binutils)")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    old = os.umask(0o022)
    try:
        with tempfile.TemporaryDirectory(prefix="nvhook-bundle.") as tmp:
            work = Path(tmp)
            stage = work / "root"
            stage.mkdir(mode=0o755)
            build(args.prefix, stage, work, args.version, arch)
            step("writing the tarball")
            tarball = out / f"nvhook-{args.version}-bundle{'' if arch.deb == 'amd64' else '-' + arch.deb}.tar.gz"
            run(["tar", "-C", str(stage), "--owner=0", "--group=0", "--numeric-owner", "-czf", str(tarball),
                 args.prefix.lstrip("/")], timeout=900)
            print(tarball)
    finally:
        os.umask(old)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
