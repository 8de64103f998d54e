"""Binaries are the driver's programs, not a host's wrapper scripts. Seen on a real GPU
node (a cloud image with the driver under /usr/local/nvidia): /usr/bin/nvidia-smi was
`exec /usr/local/nvidia/bin/nvidia-smi "$@"`; injected, it failed in every container
("/usr/local/nvidia/bin/nvidia-smi: not found"). The search goes on to the real one."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from libinject.discover import hostfiles

REPO = Path(__file__).resolve().parent.parent


def test_a_wrapper_script_is_passed_over_for_the_real_binary(fresh_sim_host):
    host = fresh_sim_host("a100x8")
    real = host / "usr/local/nvidia/bin/nvidia-smi"
    real.parent.mkdir(parents=True)
    shutil.move(host / "usr/bin/nvidia-smi", real)
    wrapper = host / "usr/bin/nvidia-smi"
    wrapper.write_text('#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi "$@"\n')
    wrapper.chmod(0o755)
    found = {f.container_path: f.path for f in hostfiles.find_binaries(str(host))}
    assert found["/usr/bin/nvidia-smi"] == str(real)
    assert hostfiles.could_find_binaries(str(host), hostfiles.find_binaries(str(host)))
    r = subprocess.run([str(REPO / ".venv/bin/nvhook"), "--root", str(host), "list", "--binaries"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    listed = r.stdout.split()        # paths as the driver root has them, as nvidia-container-cli
    assert "/usr/local/nvidia/bin/nvidia-smi" in listed and "/usr/bin/nvidia-smi" not in listed
