"""Helpers for tests/test_ldcache_merge.py: container images with a real ld.so.cache
(made by the host's ldconfig) in several layouts, the planner's edits for a simulated
host, and an apply() in a private mount namespace that reports which way the cache
was updated (the in-process merge, or the sandboxed ldconfig) and what it left.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from libinject.sim.rootfs import build_rootfs
from support.applyenv import in_ns, umount_under
from support.simhost import compile_lib

LDCONFIG = "/sbin/ldconfig"
ALL_CAPS = frozenset({"utility", "compute", "video", "graphics", "display", "ngx", "compat32"})
MERGE, LDCONFIG_ONLY = "@/sbin/ldconfig", "@!/sbin/ldconfig"
TIMEOUT = 60

# The layouts an image may have (each also gets the host ldconfig's cache, below).
LAYOUTS = ("debian", "merged-usr", "rpm", "hwcaps", "duplicates", "compat")


def make_image(dest: Path, layout: str) -> Path:
    """A busybox+glibc rootfs in `layout`, with /etc/ld.so.cache made by the host's
    ldconfig -r (as an image build leaves it):
    debian      glibc in /lib/x86_64-linux-gnu, libraries go to /usr/lib/x86_64-linux-gnu
    merged-usr  /lib -> usr/lib (Debian 12, Ubuntu 22.04+): the cache names
                /lib/x86_64-linux-gnu, ldconfig's command line /usr/lib/x86_64-linux-gnu
    rpm         glibc in /lib64, libraries go to /usr/lib64 and /usr/lib (Fedora-like)
    hwcaps      a library of the image in glibc-hwcaps/x86-64-v2 (the 2.33+ extension
                section), and an empty glibc-hwcaps/x86-64-v3
    duplicates  the image's own libcuda.so.1 and libnvidia-ml.so.1 in /usr/local/lib
                (listed first in ld.so.conf), and a library with a -dev link in the
                folder the driver's libraries go to
    compat      debian, the cache in the old+new format (ldconfig -c compat; glibc < 2.32)
    """
    root = build_rootfs(dest, lib_layout="rpm" if layout == "rpm" else "debian")
    lib = root / "usr/lib/x86_64-linux-gnu"
    if layout == "merged-usr":
        for p in (root / "lib/x86_64-linux-gnu").iterdir():
            p.rename(lib / p.name)
        shutil.rmtree(root / "lib")
        (root / "lib").symlink_to("usr/lib")
    elif layout == "hwcaps":
        compile_lib(lib / "libhw.so.1", "libhw.so.1")
        compile_lib(lib / "glibc-hwcaps/x86-64-v2/libhw.so.1", "libhw.so.1")
        (lib / "glibc-hwcaps/x86-64-v3").mkdir()
    elif layout == "duplicates":
        local = root / "usr/local/lib"
        compile_lib(local / "libcuda.so.1", "libcuda.so.1")
        compile_lib(local / "libnvidia-ml.so.1", "libnvidia-ml.so.1")
        (root / "etc/ld.so.conf.d/000-local.conf").write_text("/usr/local/lib\n")
        compile_lib(lib / "libimg.so.1.0", "libimg.so.1")
        (lib / "libimg.so.1").symlink_to("libimg.so.1.0")
        (lib / "libimg.so").symlink_to("libimg.so.1")
    fmt = ["-c", "compat"] if layout == "compat" else []
    subprocess.run([LDCONFIG, *fmt, "-r", str(root)], check=True, capture_output=True,
                   timeout=TIMEOUT)
    return root


def plan_for(host: Path, rootfs: Path, caps: str):
    """The planner's edits for `rootfs` on simulated host `host`: caps "default" (one
    GPU, utility+compute) or "all" (every GPU, every capability, compat32)."""
    from libinject.discover.driver import discover
    from libinject.discover.libraries import container_lib_dirs
    from libinject.plan.planner import plan
    from libinject.request.model import Request

    driver = discover(str(host), snapshot=False)
    lib_dir, lib32_dir = container_lib_dirs(str(rootfs))
    req = Request(devices="0") if caps == "default" else Request(devices="all", capabilities=ALL_CAPS)
    return plan(req, driver, lib_dir=lib_dir, lib32_dir=lib32_dir)


def folder_links(rootfs: Path, folders) -> dict[str, str]:
    """Every symlink in the folders: container path -> target."""
    out = {}
    for f in folders:
        d = Path(str(rootfs) + f)
        if d.is_dir():
            for p in d.iterdir():
                if p.is_symlink():
                    out[f"{f}/{p.name}"] = os.readlink(p)
    return out


def _apply(rootfs: Path, edits, ldconfig: str, times: int, reference: list[str] | None) -> dict:
    # runs in in_ns's child: apply() in this process, its mounts in our namespace
    from libinject.apply import ldcache_merge, live
    from libinject.errors import NvhookError

    out: dict = {"error": None}
    try:
        for i in range(times):
            if i:       # the container stopped: its mounts are gone, its rootfs stays
                umount_under(rootfs)
            live.apply(edits, str(rootfs), no_cgroups=True, worker=False, ldconfig=ldconfig)
    except NvhookError as e:
        out["error"] = str(e)
    out["fallback"] = ldcache_merge.last_fallback
    cache = rootfs / "etc/ld.so.cache"
    out["cache"] = cache.read_bytes() if cache.is_file() and not cache.is_symlink() else None
    out["links"] = folder_links(rootfs, edits.ldconfig_folders)
    if reference is not None:   # the host's ldconfig -r over the same tree, for compare
        subprocess.run([LDCONFIG, *reference, "-r", str(rootfs), "-f", "/etc/ld.so.conf",
                        "-C", "/etc/ld.so.cache.ref", *edits.ldconfig_folders],
                       check=True, capture_output=True, timeout=TIMEOUT)
        out["reference"] = (rootfs / "etc/ld.so.cache.ref").read_bytes()
    return out


def apply(rootfs: Path, edits, ldconfig: str = MERGE, *, times: int = 1,
          reference: list[str] | None = None) -> dict:
    """apply(edits) to rootfs `times` times (as a restarted container: the mounts of the
    one before gone) in a private mount namespace, in-process; returns {"error": the
    NvhookError's text or None, "fallback": why ldconfig ran (None: the merge did),
    "cache": the rootfs's /etc/ld.so.cache bytes (None if not a regular file), "links":
    the symlinks in the ldconfig folders, and with `reference` (ldconfig options) the
    cache the host's ldconfig -r makes of the tree afterwards (mounts still there)}."""
    return in_ns(_apply, rootfs, edits, ldconfig, times, reference)


def _run_prog(rootfs: Path, edits, prog: str, args: list[str], merge: bool) -> str:
    from libinject.apply import live
    if merge:
        live.apply(edits, str(rootfs), no_cgroups=True, worker=False, ldconfig=MERGE)
    else:       # the driver's files, but the image's own cache
        live.apply(edits, str(rootfs), no_cgroups=True, worker=False, ldconfig=MERGE)
        shutil.copyfile(str(rootfs) + "/etc/ld.so.cache.image", str(rootfs) + "/etc/ld.so.cache")
    r = subprocess.run([shutil.which("chroot") or "/usr/sbin/chroot", str(rootfs), prog, *args],
                       env={}, capture_output=True,
                       text=True, timeout=TIMEOUT)
    return r.stdout + r.stderr


def run_in_container(rootfs: Path, edits, prog: str, args: list[str], *, merge: bool = True) -> str:
    """Apply the edits (merge: with the merged cache; else with the image's own cache
    put back after it), then run `prog` (a container path) chrooted into the rootfs with
    an empty environment (no LD_LIBRARY_PATH); its output."""
    return in_ns(_run_prog, rootfs, edits, prog, args, merge)
