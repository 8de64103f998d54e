"""Forged snapshots through the hook: a root peer that can write the snapshot dir and holds
its key (so the seal holds) names host files discovery would never find.

The driver root is "/" on a normal host, so "under the root" admits any host file: the
host's /etc/shadow (here the simulated root's, standing for it) as a library, firmware
or IPC socket, or a file planted in a directory others can write (a volume, /tmp) as
libcuda or nvidia-smi, would be bind-mounted into every GPU container, the IPC one
read-write. Defence: snapshot.verify checks every host file the way discovery finds it
(hostfiles.could_find_libraries / _binaries / _firmware / _ipcs): a forged one is discarded
with a log line and discovery runs again. Each test starts real runc containers with
the hook (snapshots on); each failed before that check (it was a prefix test).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from support import hookenv
from support.simhost import profile_of

LIB = "/usr/lib/x86_64-linux-gnu"
SECRET = "root:$6$host-secret:19000:0:99999:7:::\n"
PLANTED = "EVIL-PLANTED"
ENV = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=utility,compute"]


def _entry(items: list[dict], key: str, value: str) -> dict:
    (found,) = [x for x in items if x[key] == value]
    return found


def _marks(path: str, mark: str) -> str:
    """A line "<path>: <lines of it with mark>" (a path that is not there: "absent")."""
    return f'if [ -e {path} ]; then echo "{path}: $(grep -a -c {mark} {path})"; else echo "{path}: absent"; fi'


# name -> (edit(doc, root, version), container script, its output once the forgery is
# refused, the discard log's reason)
FORGERIES = {
    # the host's /etc/shadow as libcuda (mounted as <libdir>/shadow)
    "library-is-shadow": (
        lambda d, root, ver: _entry(d["libraries"], "path", f"{root}{LIB}/libcuda.so.{ver}").update(
            path=f"{root}/etc/shadow"),
        lambda ver: f"{_marks(f'{LIB}/shadow', 'host-secret')}; {_marks(f'{LIB}/libcuda.so.{ver}', 'host-secret')}",
        lambda ver: f"{LIB}/shadow: absent\n{LIB}/libcuda.so.{ver}: 0\n",
        "libraries are not ones discovery finds"),
    # a libcuda planted in a directory others write: every CUDA process would load it
    "library-planted": (
        lambda d, root, ver: _entry(d["libraries"], "path", f"{root}{LIB}/libcuda.so.{ver}").update(
            path=f"{root}/tmp/volume/libcuda.so.{ver}"),
        lambda ver: _marks(f"{LIB}/libcuda.so.{ver}", PLANTED),
        lambda ver: f"{LIB}/libcuda.so.{ver}: 0\n",
        "libraries are not ones discovery finds"),
    # a planted nvidia-smi (a binary outside the driver's bin dirs)
    "binary-planted": (
        lambda d, root, ver: _entry(d["binaries"], "container_path", "/usr/bin/nvidia-smi").update(
            path=f"{root}/tmp/volume/nvidia-smi"),
        lambda ver: _marks("/usr/bin/nvidia-smi", PLANTED),
        lambda ver: "/usr/bin/nvidia-smi: 0\n",
        "binaries are not the driver root's"),
    # the host's /etc/shadow as GSP firmware (outside the firmware dir)
    "firmware-is-shadow": (
        lambda d, root, ver: _entry(d["firmware"], "path",
                                    f"{root}/lib/firmware/nvidia/{ver}/gsp_ga10x.bin").update(
            path=f"{root}/etc/shadow"),
        lambda ver: _marks(f"/lib/firmware/nvidia/{ver}/gsp_ga10x.bin", "host-secret"),
        lambda ver: f"/lib/firmware/nvidia/{ver}/gsp_ga10x.bin: 0\n",
        "firmware files are not the driver root's"),
    # the host's /etc/shadow as the persistenced socket: IPC mounts are read-write, so the
    # container would rewrite it (the script tries; the test checks the host's file)
    "ipc-is-shadow": (
        lambda d, root, ver: _entry(d["ipcs"], "container_path", "/run/nvidia-persistenced/socket").update(
            path=f"{root}/etc/shadow"),
        lambda ver: ("echo 'root::0:0:99999:7:::' >> /run/nvidia-persistenced/socket 2>/dev/null; "
                     "if [ -S /run/nvidia-persistenced/socket ]; then echo socket; else echo not-a-socket; fi"),
        lambda ver: "socket\n",
        "IPC paths are not the driver's sockets"),
}


@pytest.fixture(scope="module")
def forged_env(tmp_path_factory):
    """A host (t4x1) with a secret and a directory others write holding planted files, a
    hook config with snapshots on and a log, and the snapshot a first container start
    wrote: (host, config, log, work dir, snapshot path, fingerprint, its document)."""
    from libinject.sim.build import create_host

    work = tmp_path_factory.mktemp("forged")
    host = Path(os.path.realpath(create_host(work / "host", profile="t4x1")))
    (host / "etc/shadow").write_text(SECRET)
    vol = host / "tmp/volume"
    vol.mkdir(parents=True)
    os.chmod(vol, 0o1777)
    ver = profile_of(host)["driver_version"]
    for name in (f"libcuda.so.{ver}", "nvidia-smi"):
        (vol / name).write_text(f"#!/bin/sh\necho {PLANTED}\n")
        os.chmod(vol / name, 0o755)
        os.chown(vol / name, 65534, 65534)
    sdir, log = work / "snaps", work / "hook.log"
    cfg = hookenv.write_config(work / "config.toml", host, log=log, extra=f'snapshot-dir = "{sdir}"\n')
    cfg.write_text(cfg.read_text().replace("snapshot = false", "snapshot = true"))
    (work / "c0").mkdir()
    with hookenv.gpu_container(work / "c0", cfg, ENV, _marks(f"{LIB}/libcuda.so.{ver}", PLANTED)) as c:
        r = c.run()
    assert r.returncode == 0 and r.stdout == f"{LIB}/libcuda.so.{ver}: 0\n", r.stdout + r.stderr
    (snap,) = [p for p in sdir.iterdir() if p.name.startswith("driver-")]
    text = snap.read_text()
    i = text.index("\n{")
    return host, cfg, log, work, snap, text.split("\n", 1)[0], json.loads(text[i + 1:])


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_forged_host_file_is_never_mounted(forged_env, forgery):
    from libinject.discover import snapshot as S

    host, cfg, log, work, snap, fp, original = forged_env
    ver = profile_of(host)["driver_version"]
    edit, script, refused, why = FORGERIES[forgery]
    doc = json.loads(json.dumps(original))
    edit(doc, str(host), ver)
    assert doc != original
    snap.write_bytes(S.seal(fp, json.dumps(doc).encode(), S.read_key(str(snap.parent))))
    logged = log.stat().st_size
    (work / forgery).mkdir()
    with hookenv.gpu_container(work / forgery, cfg, ENV, script(ver)) as c:
        r = c.run()
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == refused(ver), f"the container got the forged file: {r.stdout!r}"
    assert (host / "etc/shadow").read_text() == SECRET
    with open(log, encoding="utf-8") as f:
        f.seek(logged)
        new = f.read()
    assert f"discovery snapshot {snap} discarded ({why}" in new, new
