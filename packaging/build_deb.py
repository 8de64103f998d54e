"""`make deb`: nvhook_<version>_amd64.deb, a self-contained install for Debian 12.

Layout (what a node gets):
  /usr/lib/nvhook/            a venv on Debian's python3.11, built here from wheels (this
                              tree's, with its static fronts, and its dependencies from PyPI)
  /usr/lib/nvhook/bin/        nvhook (the CLI), nvhook-hook and nvhook-runtime (the fronts,
                              which find the Python beside them: csrc/pyexec.h)
  /usr/bin/nvhook, nvhook-hook, nvhook-runtime   links to those
  /usr/lib/systemd/system/    nvhook-serve.service and nvhook-cdi-refresh.service, rendered
                              from libinject/setup/units with ExecStart at the package's front
  /usr/share/nvhook/config.toml   the default config, copied by postinst to
                              /etc/nvidia-container-runtime/config.toml only where none is
  nvidia-container-runtime-hook   an alternative (postinst), beside NVIDIA's package
The venv is built in a staging dir and then made to name /usr/lib/nvhook only: scripts'
interpreter lines and pyvenv.cfg rewritten, activate scripts and pip's direct_url.json
dropped; the build fails if the staging path is left in any file. Bytecode is compiled
here (unchecked-hash: never rewritten at run time), so dpkg owns every file it leaves.

Usage: python packaging/build_deb.py OUT_DIR   (run with the checkout's venv: `make deb`)
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent / "deb"
PREFIX = "/usr/lib/nvhook"
PYTHON = "/usr/bin/python3.11"          # Debian 12's; the venv's ABI (cp311) is tied to it
UNITS = ("nvhook-serve.service", "nvhook-cdi-refresh.service")
CONTROL = """\
Package: nvhook
Version: {version}
Architecture: amd64
Maintainer: nvhook developers <nvhook@localhost>
Installed-Size: {size}
Depends: python3.11, libc6 (>= 2.36), libcap2
Recommends: runc | crun
Section: utils
Priority: optional
Description: GPU container toolkit (OCI hook, CDI, runtime shim) in NVIDIA's place
 nvhook gives containers their NVIDIA GPUs: the OCI prestart hook (also as the
 nvidia-container-runtime-hook alternative), CDI spec generation and refresh, a
 runtime shim, engine set-up (nvhook setup docker|containerd|crio|auto) and a warm
 hook service (nvhook-serve.service) that starts GPU containers without Python's
 start-up.
"""


def fail(msg: str) -> None:
    print(f"nvhook: {msg}", file=sys.stderr)
    sys.exit(1)


def run(argv: list[str], **kw) -> None:
    r = subprocess.run(argv, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        lines = [ln for ln in (r.stderr or r.stdout).splitlines() if ln.strip()]
        fail(f"`{' '.join(map(str, argv[:4]))} ...` failed: {lines[-1] if lines else r.returncode}")


def wheel_of_tree(work: Path) -> Path:
    """This tree's wheel (with its static fronts), built in work/ from a copy of the tracked
    files: no build dirs left in the checkout."""
    dist, src = work / "dist", work / "src"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for rel in tracked.decode().split("\0"):
        if rel and (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist),
         str(src)], timeout=900)
    [wheel] = dist.glob("nvhook-*.whl")
    return wheel


def build_venv(work: Path, stage: Path) -> Path:
    """The venv at stage/PREFIX with this tree's wheel (and its [refresh] extra) installed."""
    wheel = wheel_of_tree(work)
    venv = stage / PREFIX.lstrip("/")
    if not os.access(PYTHON, os.X_OK):
        fail(f"{PYTHON} is needed to build the package's venv (Debian 12's python3.11)")
    run([PYTHON, "-m", "venv", "--without-pip", str(venv)], timeout=300)
    run([sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "install", "-q", "--no-compile",
         "--no-warn-script-location", f"{wheel}[refresh]"], timeout=900)
    return venv


def relocate(venv: Path, stage: Path) -> None:
    """Make the venv name PREFIX where it names the staging dir."""
    staged = str(venv).encode()
    for name in os.listdir(venv / "bin"):
        path = venv / "bin" / name
        # Only the interpreter links and nvhook's own (not its dependencies' tools, nor
        # activate scripts, which name the staging dir).
        if not name.startswith(("python", "nvhook")):
            path.unlink()
            continue
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if data.startswith(b"#!" + staged + b"/"):
            path.write_bytes(data.replace(b"#!" + staged, b"#!" + PREFIX.encode(), 1))
    cfg = venv / "pyvenv.cfg"
    cfg.write_text("".join(ln for ln in cfg.read_text().splitlines(keepends=True) if not ln.startswith("command")))
    for rec in venv.glob("lib/python3*/site-packages/*.dist-info/direct_url.json"):
        rec.unlink()
    run([PYTHON, "-m", "compileall", "-q", "-j", "0", "-s", str(stage), "-p", "/",
         "--invalidation-mode", "unchecked-hash", str(venv / "lib")], timeout=900)
    left = subprocess.run(["grep", "-rlF", str(stage), str(stage)], capture_output=True, text=True).stdout.split()
    if left:
        fail(f"the staging path is still named in {left[0]} ({len(left)} files)")


def units(stage: Path) -> None:
    sys.path.insert(0, str(REPO))
    from libinject.setup.service import TEMPLATES, UNITS as COMMANDS, read_template, render_unit

    dest = stage / "usr/lib/systemd/system"
    dest.mkdir(parents=True)
    for unit in UNITS:
        template = os.path.join(TEMPLATES, unit)
        text = render_unit(read_template(template), f"{PREFIX}/bin/nvhook-hook", None, COMMANDS[unit], template)
        (dest / unit).write_bytes(text)


def files(stage: Path) -> None:
    (stage / "usr/bin").mkdir(parents=True)
    for name in ("nvhook", "nvhook-hook", "nvhook-runtime"):
        os.symlink(f"../lib/nvhook/bin/{name}", stage / "usr/bin" / name)
    share = stage / "usr/share/nvhook"
    share.mkdir(parents=True)
    shutil.copy(HERE / "config.toml", share / "config.toml")
    doc = stage / "usr/share/doc/nvhook"
    doc.mkdir(parents=True)
    shutil.copy(REPO / "README.md", doc / "README.md")
    (stage / "etc/nvidia-container-runtime").mkdir(parents=True)


def control(stage: Path) -> None:
    from libinject import __version__

    meta = stage / "DEBIAN"
    meta.mkdir()
    size = sum(p.lstat().st_size for p in stage.rglob("*") if not p.is_dir()) // 1024 + 1
    (meta / "control").write_text(CONTROL.format(version=__version__, size=size))
    for script in ("postinst", "prerm", "postrm"):
        shutil.copy(HERE / script, meta / script)
        os.chmod(meta / script, 0o755)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        fail("usage: build_deb.py OUT_DIR")
    out = Path(argv[0]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    old = os.umask(0o022)
    try:
        with tempfile.TemporaryDirectory(prefix="nvhook-deb.") as tmp:
            work = Path(tmp)
            stage = work / "root"
            stage.mkdir(mode=0o755)
            venv = build_venv(work, stage)
            relocate(venv, stage)
            units(stage)
            files(stage)
            control(stage)
            from libinject import __version__

            deb = out / f"nvhook_{__version__}_amd64.deb"
            run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(stage), str(deb)], timeout=900)
            print(deb)
    finally:
        os.umask(old)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
