"""NVIDIA's stack, for the benchmarks to measure beside nvhook in the same run: the
binaries of ../shared/anchors (README there: toolkit 1.20 nvidia-container-runtime-hook,
nvidia-ctk, nvidia-cdi-hook and nvidia-container-runtime; libnvidia-container 1.17
nvidia-container-cli), built from source. Optional: without them a benchmark says so
and measures nvhook alone (CI and `make test` never need them).

Found at $NVHOOK_ANCHORS, else ../shared/anchors or ../../shared/anchors from the repo
(the main checkout, or a worktree under wt/).

One adjustment, charged to NVIDIA's side: toolkit 1.20's hook always passes
`--cuda-compat-mode=...` to the cli, which 1.17.0 does not know (it came with 1.17.4),
so the cli is reached through a small static program that drops that flag and execs
it (one more execve of a ~800 KB static binary, ~0.2-0.4 ms; the cli's behaviour is
1.17.0's, whose default is the mode the hook asks for).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENV = "NVHOOK_ANCHORS"
NVHOOK = str(REPO / ".venv/bin/nvhook")

_FILTER_C = r'''
#include <string.h>
#include <unistd.h>
#include <stdio.h>
extern char **environ;
int main(int argc, char **argv) {
    char *out[argc + 1];
    int n = 0;
    for (int i = 0; i < argc; i++)
        if (strncmp(argv[i], "--cuda-compat-mode=", 19) != 0)
            out[n++] = argv[i];
    out[n] = 0;
    execve(REAL, out, environ);
    perror(REAL);
    return 127;
}
'''


def find() -> Path | None:
    """The anchors dir (holding nvidia/bin/nvidia-ctk), or None."""
    cands = [os.environ[ENV]] if os.environ.get(ENV) else [
        str(REPO.parent / "shared/anchors"), str(REPO.parent.parent / "shared/anchors")]
    for c in cands:
        p = Path(c).resolve()
        if (p / "nvidia/bin/nvidia-ctk").is_file():
            return p
    return None


def absent_note() -> str:
    return (f"NVIDIA's stack not found (${ENV}, ../shared/anchors): measuring nvhook only, "
            "no ratios")


class Nvidia:
    """NVIDIA's binaries made ready to run from `work` (a dir this process owns)."""

    def __init__(self, anchors: Path, work: Path) -> None:
        self.anchors = anchors
        self.bin = anchors / "nvidia/bin"
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        # the anchors' library links are stored as text files: real links here
        self.lib = work / "nvlib"
        self.lib.mkdir(exist_ok=True)
        for name in ("libnvidia-container.so.1", "libnvidia-container-go.so.1"):
            link = self.lib / name
            if not link.is_symlink():
                link.symlink_to(anchors / "nvidia/lib" / f"{name}.17.0")
        src = work / "clifilter.c"
        src.write_text(_FILTER_C)
        self.cli = work / "nvidia-container-cli"
        real = self.bin / "nvidia-container-cli"
        subprocess.run(["cc", "-O2", "-static", f'-DREAL="{real}"', "-o", str(self.cli), str(src)],
                       check=True, capture_output=True, timeout=120)

    @property
    def hook(self) -> str:
        return str(self.bin / "nvidia-container-runtime-hook")

    @property
    def runtime(self) -> str:
        return str(self.bin / "nvidia-container-runtime")

    def config_text(self, root: Path | str, extra: str = "") -> str:
        """config.toml (NVIDIA's format) for its hook, cli and runtime on driver root `root`."""
        return (f'[nvidia-container-cli]\npath = "{self.cli}"\n'
                f'environment = ["LD_LIBRARY_PATH={self.lib}"]\nroot = "{root}"\n'
                'load-kmods = false\nldconfig = "@/sbin/ldconfig"\n'
                f'[nvidia-container-runtime-hook]\npath = "{self.hook}"\nskip-mode-detection = true\n'
                + extra)

    def hook_entry(self, config: Path) -> dict:
        """A prestart hook entry for NVIDIA's hook with `config`: no "env", as NVIDIA's
        runtime writes it (runc then passes on its own environment; the cli needs PATH)."""
        return {"path": self.hook, "args": ["nvidia-container-runtime-hook", "-config", str(config), "prestart"],
                "timeout": 60}

    def cdi_generate(self, host: Path, out: Path) -> dict:
        """nvidia-ctk's spec for the simulated host (under `nvhook sim enter`, where NVIDIA's
        tools see its /proc, /sys and /dev), written to `out`; also returned."""
        argv = [NVHOOK, "sim", "enter", str(host), "--", str(self.bin / "nvidia-ctk"), "cdi", "generate",
                "--driver-root", str(host), "--dev-root", str(host),
                "--nvidia-cdi-hook-path", str(self.bin / "nvidia-cdi-hook"), "--format", "json",
                "--output", str(out)]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if r.returncode != 0 or not out.is_file():
            raise SystemExit(f"nvidia-ctk cdi generate failed ({r.returncode}): {r.stderr[-2000:]}")
        return json.loads(out.read_text())

    def cleanup(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)
