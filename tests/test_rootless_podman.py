"""Rootless podman (an unprivileged user runs podman 4.3.1; podman, runc and the OCI hooks
run in a user namespace where that user is root), on a simulated a100x8 host.

- The OCI hook (hooks.d) cannot give a container GPUs there: no device cgroup can be set
  from a user namespace, and the hook cannot tell its config is root's. A container that
  asks for GPUs fails with one `nvhook:` line pointing to CDI; one that asks for none
  (void, or a CDI spec's NVIDIA_VISIBLE_DEVICES=void) runs.
- CDI works rootless: `podman run --device nvidia.com/gpu=1` with the spec of
  `nvhook cdi generate` gives the container exactly GPU 1, its createContainer hooks
  (`nvhook-hook cdi-hook ...`) included.

The user (`nvhook-rootless`, with subordinate ids) is made if missing
(support.podman.rootless_user). Everything the user must read (the simulated host, the
rootfs, podman's state) lives in one world-readable dir; podman runs in a private mount
namespace (support.podman.rootless_sh) where /etc/cdi is the spec dir, /dev has the
simulated driver's nodes (a rootless runc bind-mounts device nodes from the host's
/dev), and the hook's Python is reachable when a 0700 dir such as /root holds it.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from conftest import NVHOOK, host_mounts, run
from support import hookenv
from support.podman import RootlessPodman, rootless_user, unreachable_dirs

HOOK_LINE = ("nvhook: {stage}: cannot give this container GPUs: the hook runs in a user "
             "namespace (a rootless engine, or a container's own user namespace at "
             "createContainer), where no device cgroup can be set (NVIDIA's "
             "rootless set-up: no-cgroups = true in [nvidia-container-cli]); use CDI "
             "instead: as root `nvhook cdi generate --output /etc/cdi/nvidia.yaml`, then "
             "`podman run --device nvidia.com/gpu=0 ...`\n")
PROBE = ("nvidia-smi -L; ls /proc/driver/nvidia/gpus; "
         "for d in /dev/nvidia1 /dev/nvidia0; do dd if=$d of=/dev/null bs=1 count=0 2>&1 | "
         "grep -o \"can't open.*\" || echo \"$d: OK\"; done; "
         "mknod /tmp/n0 c 195 0 2>&1 || true")


@pytest.fixture(scope="module")
def world():
    """(user, base dir, simulated host, rootfs owned by the user, CDI spec dir, hooks dir
    with the front, the hook's config), all readable by the user."""
    from libinject.runtime import hooksd
    from libinject.sim.build import create_host
    from libinject.sim.rootfs import build_rootfs

    user = rootless_user()
    base = Path(tempfile.mkdtemp(prefix="nvrl", dir="/tmp"))
    try:
        base.chmod(0o755)
        host = create_host(base / "host", profile="a100x8")
        rootfs = build_rootfs(base / "rootfs")
        # podman creates /etc/mtab in the rootfs before its overlay is up; the user owns
        # the image's files, as with an image it pulled
        (rootfs / "etc/mtab").symlink_to("/proc/mounts")
        subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(rootfs)], check=True, timeout=60)
        front = hookenv.ensure_front()
        specs = base / "specs"
        specs.mkdir()
        r = run([NVHOOK, "cdi", "generate", "--driver-root", str(host), "--hook-path", front,
                 "--output", str(specs / "nvidia.yaml")])
        assert r.returncode == 0, r.stderr
        config = hookenv.write_config(base / "config.toml", host)
        hooks = base / "hooks.d"
        hooksd.install(str(hooks), "always", front, str(config))
        hooks.chmod(0o755)
        yield user, base, host, rootfs, specs, hooks
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def podman(world):
    user = world[0]
    reach = unreachable_dirs([hookenv.ensure_front(), hookenv.PY, hookenv.REPO,
                              sysconfig.get_paths()["purelib"], sys.base_prefix])
    state = Path(tempfile.mkdtemp(prefix="pm", dir="/tmp"))   # short: conmon's socket path
    p = RootlessPodman(state, user, reach)
    try:
        yield p
    finally:
        p.cleanup()
        shutil.rmtree(state, ignore_errors=True)


def _bus_id(host: Path, minor: int) -> str:
    for info in sorted((host / "proc/driver/nvidia/gpus").glob("*/information")):
        if re.search(rf"^Device Minor:\s+{minor}$", info.read_text(), re.M):
            return info.parent.name
    raise LookupError(minor)


def _tree(d: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(d)), p.lstat().st_mode) for p in d.rglob("*"))


# -- the OCI hook under rootless podman --------------------------------------------------

def test_hook_refuses_a_gpu_container(world, podman):
    user, base, host, rootfs, specs, hooks = world
    mounts, tree = host_mounts(), _tree(rootfs)
    r = podman.run(rootfs, ["true"], hooks_dir=hooks, env=["NVIDIA_VISIBLE_DEVICES=1"])
    assert r.returncode != 0
    # podman quotes the hook's stderr inside its own error line
    assert HOOK_LINE.format(stage="prestart").strip() in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert host_mounts() == mounts and _tree(rootfs) == tree     # nothing mounted or written


def test_hook_lets_a_container_without_gpus_run(world, podman):
    user, base, host, rootfs, specs, hooks = world
    r = podman.run(rootfs, ["sh", "-c", "test -e /usr/bin/nvidia-smi || echo no-gpu-files"],
                   hooks_dir=hooks, env=["NVIDIA_VISIBLE_DEVICES=void"])
    assert (r.returncode, r.stdout) == (0, "no-gpu-files\n"), r.stderr


@pytest.mark.parametrize("stage", ["prestart", "createContainer"])
@pytest.mark.parametrize("who", ["rootless-user", "root"])
def test_hook_in_a_user_namespace_says_one_line(world, podman, tmp_path, stage, who):
    """The front run as a runtime would run it, in a user namespace (`unshare --user
    --map-root-user`: the user, or root itself): exactly one line and status 1 for a
    GPU container, nothing for one without GPUs."""
    user, base, host, rootfs, specs, hooks = world
    bundle = Path(tempfile.mkdtemp(prefix="b", dir=base))
    bundle.chmod(0o755)
    front = hookenv.ensure_front()
    config = base / "config.toml"
    for env, want in ((["NVIDIA_VISIBLE_DEVICES=1"], (1, HOOK_LINE.format(stage=stage))),
                      (["NVIDIA_VISIBLE_DEVICES=void"], (0, ""))):
        (bundle / "config.json").write_text(json.dumps(
            {"ociVersion": "1.0.2", "process": {"env": env, "args": ["true"]},
             "root": {"path": str(rootfs)}}))
        state = json.dumps({"ociVersion": "1.0.2", "id": "rl", "status": "creating", "pid": 1,
                            "bundle": str(bundle)})
        argv = ["unshare", "--user", "--map-root-user", front, "--config", str(config),
                "--socket", "none", stage]
        if who == "root":
            r = subprocess.run(argv, input=state, capture_output=True, text=True, timeout=60)
        else:
            r = podman.as_user(argv, input=state, timeout=60)
        assert (r.returncode, r.stderr) == want, r.stdout


# -- CDI under rootless podman -----------------------------------------------------------

def test_cdi_gives_exactly_gpu1(world, podman):
    """`--device nvidia.com/gpu=1` with nvhook's CDI spec, the hooks.d hook installed as
    well (the spec's NVIDIA_VISIBLE_DEVICES=void keeps it out): nvidia-smi lists GPU 1
    only, /proc/driver/nvidia holds GPU 1 only (the mask-procfs hook), /dev/nvidia1 opens
    as far as the (absent) driver (ENXIO), /dev/nvidia0 is not there and cannot be made."""
    user, base, host, rootfs, specs, hooks = world
    mounts = host_mounts()
    r = podman.run(rootfs, ["sh", "-c", PROBE], hooks_dir=hooks, cdi_specs=specs,
                   dev_nodes=host / "dev", devices=["nvidia.com/gpu=1"])
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert re.findall(r"UUID: (GPU-[0-9a-f-]+)", out) == [hookenv.gpu_uuids(host)[1]], out
    assert re.findall(r"^0000:\S+$", r.stdout, re.M) == [_bus_id(host, 1)], out
    assert "can't open '/dev/nvidia1': No such device or address" in out, out
    assert "can't open '/dev/nvidia0': No such file or directory" in out, out
    assert "mknod: /tmp/n0: Operation not permitted" in out, out
    assert host_mounts() == mounts


# -- the OCI hook with NVIDIA's rootless set-up: no-cgroups = true -------------------------

@pytest.mark.parametrize("stage", ["prestart", "createContainer"])
def test_hook_with_no_cgroups_gives_exactly_gpu1(world, podman, stage):
    """NVIDIA's documented rootless set-up (`no-cgroups = true` in [nvidia-container-cli]):
    its legacy hook starts the container, without a device cgroup (none can be set from a
    user namespace). So does ours, in the runtime's user namespace: GPU 1's node, the
    driver's files and the masked /proc/driver/nvidia; no other GPU's node to open, none
    to make; nothing mounted on the host."""
    from libinject.runtime import hooksd

    user, base, host, rootfs, specs, hooks = world
    config = base / "no-cgroups.toml"
    config.write_text(f'[nvidia-container-cli]\nroot = "{host}"\nno-cgroups = true\n'
                      '[nvhook]\nsnapshot = false\n')
    own = base / f"hooks-no-cgroups-{stage}.d"
    if not own.exists():
        written = hooksd.install(str(own), "always", hookenv.ensure_front(), str(config))
        doc = json.loads(written.read_text())
        doc["stages"] = [stage]
        doc["hook"]["args"] = [a if a != "prestart" else stage for a in doc["hook"]["args"]]
        written.write_text(json.dumps(doc))
        own.chmod(0o755)
    mounts, tree = host_mounts(), _tree(rootfs)
    r = podman.run(rootfs, ["sh", "-c", PROBE], hooks_dir=own, dev_nodes=host / "dev",
                   env=["NVIDIA_VISIBLE_DEVICES=1"])
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert re.findall(r"UUID: (GPU-[0-9a-f-]+)", out) == [hookenv.gpu_uuids(host)[1]], out
    assert re.findall(r"^0000:\S+$", r.stdout, re.M) == [_bus_id(host, 1)], out
    assert "can't open '/dev/nvidia1': No such device or address" in out, out
    assert "can't open '/dev/nvidia0': No such file or directory" in out, out
    assert "mknod: /tmp/n0: Operation not permitted" in out, out
    assert host_mounts() == mounts


@pytest.mark.parametrize("where", ["dir-writable-by-all", "file-writable-by-group"])
def test_hook_in_a_user_namespace_refuses_a_config_others_can_write(world, podman, where):
    """Attack: in a user namespace the hook reads its config (host root shows as the
    overflow uid there); one in a directory anyone can write to, or writable by its
    group, could be another user's choice of driver root and ldconfig: refused with one
    line, nothing done (old code: read no config there at all)."""
    user, base, host, rootfs, specs, hooks = world
    d = Path(tempfile.mkdtemp(prefix="cfg", dir=base))
    config = d / "config.toml"
    config.write_text(f'[nvidia-container-cli]\nroot = "{host}"\nno-cgroups = true\n'
                      '[nvhook]\nsnapshot = false\n')
    if where == "dir-writable-by-all":
        d.chmod(0o777)
        config.chmod(0o644)
        what = f"directory {d}"
    else:
        d.chmod(0o755)
        config.chmod(0o664)
        what = "the file"
    bundle = Path(tempfile.mkdtemp(prefix="b", dir=base))
    bundle.chmod(0o755)
    (bundle / "config.json").write_text(json.dumps(
        {"ociVersion": "1.0.2", "process": {"env": ["NVIDIA_VISIBLE_DEVICES=1"], "args": ["true"]},
         "root": {"path": str(rootfs)}}))
    state = json.dumps({"ociVersion": "1.0.2", "id": "rl", "status": "creating", "pid": 1,
                        "bundle": str(bundle)})
    tree = _tree(rootfs)
    r = podman.as_user(["unshare", "--user", "--map-root-user", hookenv.ensure_front(), "--config",
                        str(config), "--socket", "none", "prestart"], input=state, timeout=60)
    assert (r.returncode, r.stderr) == (1, f"nvhook: config file {config}: {what} must be owned by "
                                           "root and writable by nobody else\n"), r.stdout
    assert _tree(rootfs) == tree
