"""Running the packaging scripts (packaging/build_*.py) as `make deb`, `make rpm`, `make
repo`, `make bundle` and `make image` run them: this Python, a fresh output dir; what they
print is what they made. A repository served over HTTP as a node reaches it."""
from __future__ import annotations

import functools
import http.server
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def build(script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 1200) -> list[str]:
    """packaging/<script> ARGS...; its stdout's lines (a failure fails the test, with the
    end of its stderr)."""
    r = subprocess.run([sys.executable, str(REPO / "packaging" / script), *args], capture_output=True,
                       text=True, timeout=timeout, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.splitlines()


# ---------------------------------------------------------------- packages, repositories, roots

VERSION = __import__("libinject").__version__
NEXT_VERSION = f"{VERSION}+test1"      # a later release, for upgrades (dpkg orders it after)


class Repo:
    """`make repo`'s output for some packages, served over HTTP on 127.0.0.1 (a port of
    its own) while the test session runs; publish() rewrites it, as a release does."""

    def __init__(self, base: Path) -> None:
        self.dir = base / "repo"
        self.key = base / "repo.key"      # the signing key's GNUPGHOME, kept across publishes
        self.dir.mkdir()
        handler = functools.partial(_QuietHandler, directory=str(self.dir))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def publish(self, *packages: Path) -> None:
        out = build("build_repo.py", str(self.dir), *map(str, packages), "--gnupghome", str(self.key),
                    "--url", self.url)
        assert out == [str(self.dir)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:   # the test's output is not the place
        pass


def add_apt_repo(root: Path, repo: Repo) -> None:
    """What README's apt path has a node do: the key (fetched as curl would) and the list."""
    keyrings = root / "usr/share/keyrings"
    keyrings.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(f"{repo.url}/nvhook.gpg", timeout=30) as r:
        (keyrings / "nvhook.gpg").write_bytes(r.read())
    (root / "etc/apt/sources.list.d/nvhook.list").write_text(
        f"deb [signed-by=/usr/share/keyrings/nvhook.gpg] {repo.url}/deb /\n")
