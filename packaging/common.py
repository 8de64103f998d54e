"""What the package builders share: one-line failures, steps said as they start, quiet
subprocesses, the version, and this tree's wheel."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
VERSION_RE = re.compile(r"[0-9][A-Za-z0-9.+~]*")


def fail(msg: str) -> None:
    print(f"nvhook: {msg}", file=sys.stderr)
    sys.exit(1)


def step(msg: str) -> None:
    """What a long build is doing now (stderr: stdout names what was made)."""
    print(f"nvhook-build: {msg}", file=sys.stderr, flush=True)


def run(argv: list[str], **kw) -> None:
    r = subprocess.run(argv, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        lines = [ln for ln in (r.stderr or r.stdout).splitlines() if ln.strip()]
        fail(f"`{' '.join(map(str, argv[:4]))} ...` failed: {lines[-1] if lines else r.returncode}")


def version() -> str:
    sys.path.insert(0, str(REPO))
    from libinject import __version__

    return __version__


def check_version(v: str) -> str:
    if not VERSION_RE.fullmatch(v):
        fail(f"--version must be a version (digits, letters, . + ~): {v!r}")
    return v


def wheel_of_tree(work: Path, version: str | None = None, env: dict[str, str] | None = None) -> Path:
    """This tree's wheel (with its static fronts), built in work/ from a copy of the tracked
    files: no build dirs left in the checkout. version: stamped into the copy's
    libinject.__version__ (a test's second release); env: the build's (arch.cross_env:
    another machine's wheel)."""
    dist, src = work / "dist", work / "src"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for rel in tracked.decode().split("\0"):
        if rel and (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    if version is not None:
        init = src / "libinject/__init__.py"
        init.write_text(re.sub(r'(?m)^__version__ = ".*"$', f'__version__ = "{version}"', init.read_text()))
    step("building the wheel (the static fronts compile here)")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist),
         str(src)], timeout=900, env=env)
    [wheel] = dist.glob("nvhook-*.whl")
    return wheel
