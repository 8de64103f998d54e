"""safefs.RootFS and the sandboxed ldconfig, for real (root, private mount namespaces)."""
from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from libinject.linux import native
from libinject.errors import NvhookError
from support.applyenv import HOST_LDCONFIG, LIBDIR, in_ns, mountinfo, new_mounts, snapshot


# -- RootFS --------------------------------------------------------------------------
def _rootfs(path):
    from libinject.apply.rootfs import RootFS
    return RootFS(str(path))


def test_resolve_keeps_symlinks_inside(rootfs, tmp_path):
    host = tmp_path / "hostdir"
    host.mkdir()
    (host / "canary").write_text("host")
    (rootfs / "abs").symlink_to(str(host))
    (rootfs / "rel").symlink_to("../../../../../../../../../.." + str(host))
    (rootfs / "magic").symlink_to("/proc/self/root" + str(host))
    r = _rootfs(rootfs)
    for name in ("abs", "rel"):
        assert r.lookup(f"/{name}/canary") is None          # resolved inside: absent
    (rootfs / str(host).lstrip("/")).mkdir(parents=True)
    (rootfs / str(host).lstrip("/") / "canary").write_text("inside")
    for name in ("abs", "rel"):
        assert r.read_file(f"/{name}/canary") == b"inside"
    with pytest.raises(OSError) as e:
        r.resolve("/magic/canary")
    assert e.value.errno in (errno.ENOENT, errno.ELOOP, errno.EXDEV)
    with pytest.raises(NvhookError):
        r.resolve("relative/path")
    with pytest.raises(NvhookError):
        r.resolve("/usr/../etc")


def test_makedirs_through_hostile_symlink_stays_inside(rootfs, tmp_path):
    host = tmp_path / "hostlib"
    host.mkdir()
    before = snapshot(host)
    shutil.rmtree(rootfs / "usr/lib")
    (rootfs / "usr/lib").symlink_to(str(host))       # absolute: a host path
    r = _rootfs(rootfs)
    with pytest.raises(NvhookError, match="symlink"):
        r.makedirs(f"{LIBDIR}/sub")                  # dangling inside the root: refused
    assert r.journal.rollback() == []
    (rootfs / "usr/lib").unlink()
    (rootfs / "usr/lib").symlink_to("../../../../../../.." + str(host))
    (rootfs / str(host).lstrip("/")).mkdir(parents=True)   # now it resolves inside
    fd = r.makedirs(f"{LIBDIR}/sub")
    os.close(fd)
    assert (rootfs / str(host).lstrip("/") / "x86_64-linux-gnu/sub").is_dir()
    assert snapshot(host) == before
    assert r.journal.created == [LIBDIR, f"{LIBDIR}/sub"]
    assert r.journal.rollback() == []
    assert not (rootfs / str(host).lstrip("/") / "x86_64-linux-gnu").exists()


def test_created_entries_owned_by_rootfs_owner(rootfs):
    os.chown(rootfs, 1234, 5678)
    r = _rootfs(rootfs)
    os.close(r.makedirs("/a/b"))
    r.make_file("/a/b/f")
    r.symlink("f", "/a/b/l")
    for p in ("a", "a/b", "a/b/f", "a/b/l"):
        st = os.lstat(rootfs / p)
        assert (st.st_uid, st.st_gid) == (1234, 5678), p
    assert stat.S_IMODE(os.lstat(rootfs / "a/b").st_mode) == 0o755
    assert stat.S_IMODE(os.lstat(rootfs / "a/b/f").st_mode) == 0o644


def test_make_file_never_follows_last_symlink(rootfs, tmp_path):
    host_file = tmp_path / "shadow"
    host_file.write_text("secret")
    (rootfs / "usr/bin/tool").symlink_to(str(host_file))
    r = _rootfs(rootfs)
    assert r.make_file("/usr/bin/tool") is False
    # dangling inside the root: what it names is made there (NVIDIA's cli does the same)
    os.close(r.target("/usr/bin/tool", is_dir=False))
    assert (rootfs / str(host_file).lstrip("/")).read_text() == ""
    assert host_file.read_text() == "secret"
    assert r.journal.rollback() == []
    assert not (rootfs / str(host_file).lstrip("/")).exists()


def _bind_ro(rootfs, src):
    from libinject.apply.rootfs import RootFS
    r = RootFS(str(rootfs))
    before = mountinfo()
    r.bind_mount(str(src), f"{LIBDIR}/libx.so.1", ("ro", "nosuid", "nodev"))
    mnts = new_mounts(before, mountinfo())
    try:
        with open(rootfs / LIBDIR.lstrip("/") / "libx.so.1", "w") as f:
            f.write("no")
        wrote = True
    except OSError as e:
        wrote = e.errno
    content = (rootfs / LIBDIR.lstrip("/") / "libx.so.1").read_text()
    left = r.journal.rollback()
    after = new_mounts(before, mountinfo())
    return mnts, wrote, content, left, after, (rootfs / LIBDIR.lstrip("/") / "libx.so.1").exists()


def test_bind_mount_read_only_really(rootfs, tmp_path, no_leaked_mounts):
    src = tmp_path / "libx.so.1.0"
    src.write_text("payload")
    mnts, wrote, content, left, after, exists = in_ns(_bind_ro, rootfs, src)
    assert len(mnts) == 1
    m = mnts[0]
    assert m.mountpoint == f"{rootfs}{LIBDIR}/libx.so.1"
    assert {"ro", "nosuid", "nodev"} <= m.options
    assert wrote == errno.EROFS
    assert content == "payload"
    assert src.read_text() == "payload"
    assert left == [] and after == [] and not exists


def _wrong_types(rootfs, tmp_path):
    from libinject.apply.rootfs import RootFS
    r = RootFS(str(rootfs))
    f = tmp_path / "f"
    f.write_text("x")
    d = tmp_path / "d"
    d.mkdir()
    (rootfs / "dev/nvidia0").mkdir()
    (rootfs / "etc/x").write_text("file")
    out = []
    for src, dst in ((f, "/dev/nvidia0"), (d, "/etc/x")):
        try:
            r.bind_mount(str(src), dst)
            out.append("mounted")
        except NvhookError as e:
            out.append(str(e))
    try:
        r.bind_mount(str(f), "/x", expect="char")
    except NvhookError as e:
        out.append(str(e))
    out.append(len(r.journal.mounts))
    return out


def test_refuses_wrong_target_type(rootfs, tmp_path, no_leaked_mounts):
    a, b, c, n = in_ns(_wrong_types, rootfs, tmp_path)
    assert "is a directory, expected a regular file" in a
    assert b == "cannot create /etc/x in the rootfs: not a directory"
    assert "expected char" in c
    assert n == 0


def _proc_target(rootfs, tmp_path):
    from libinject.apply.rootfs import RootFS
    native.mount("proc", str(rootfs / "proc"), "proc", 0)
    (rootfs / "usr/lib/x86_64-linux-gnu/libcuda.so.1").symlink_to("/proc/sys/kernel/core_pattern")
    src = tmp_path / "lib"
    src.write_text("x")
    r = RootFS(str(rootfs))
    try:
        r.bind_mount(str(src), f"{LIBDIR}/libcuda.so.1")
        return "mounted"
    except NvhookError as e:
        return str(e)


def test_refuses_target_on_procfs(rootfs, tmp_path, no_leaked_mounts):
    assert "procfs/sysfs" in in_ns(_proc_target, rootfs, tmp_path)


def _tmpfs(rootfs):
    from libinject.apply.rootfs import RootFS
    r = RootFS(str(rootfs))
    before = mountinfo()
    r.tmpfs("/proc/driver/nvidia", files={"params": b"ModifyDeviceFiles: 0\n"}, dirs=("gpus/a",))
    m = new_mounts(before, mountinfo())
    base = rootfs / "proc/driver/nvidia"
    res = (m, sorted(os.listdir(base)), (base / "params").read_text(),
           oct(stat.S_IMODE(os.stat(base / "params").st_mode)))
    try:
        (base / "new").write_text("x")
        res += ("writable",)
    except OSError as e:
        res += (e.errno,)
    return res


def test_tmpfs_filled_then_read_only(rootfs, no_leaked_mounts):
    m, names, params, mode, wr = in_ns(_tmpfs, rootfs)
    assert len(m) == 1 and m[0].fstype == "tmpfs"
    assert {"ro", "nosuid", "nodev", "noexec"} <= m[0].options
    assert names == ["gpus", "params"]
    assert params == "ModifyDeviceFiles: 0\n" and mode == "0o444"
    assert wr == errno.EROFS


def _dir_cache_and_mounts(rootfs):
    """Targets in a directory that a later directory mount covers go into the mount,
    not into the covered (cached) directory."""
    from libinject.apply.rootfs import RootFS
    r = RootFS(str(rootfs))
    r.make_file("/opt/a/b/one")                    # caches /opt/a/b
    r.tmpfs("/opt/a", readonly=False, mode=0o755)  # covers /opt/a and /opt/a/b
    r.make_file("/opt/a/b/two")
    r.close()
    return sorted(os.listdir(rootfs / "opt/a")), sorted(os.listdir(rootfs / "opt/a/b"))


def test_dir_cache_follows_directory_mounts(rootfs, no_leaked_mounts):
    top, inner = in_ns(_dir_cache_and_mounts, rootfs)
    assert top == ["b"] and inner == ["two"]        # made in the tmpfs
    assert sorted(os.listdir(rootfs / "opt/a/b")) == ["one"]   # outside: the covered dir


def test_dir_cache_after_rollback(rootfs):
    """A directory removed by rollback is not reused from the cache."""
    from libinject.apply.journal import Journal
    from libinject.apply.rootfs import RootFS
    r = RootFS(str(rootfs), Journal())
    assert r.make_file("/opt/x/y/f")
    assert r.journal.rollback() == []
    assert not (rootfs / "opt").exists()
    assert r.make_file("/opt/x/y/g")
    assert os.listdir(rootfs / "opt/x/y") == ["g"]
    r.close()


def test_new_entries_skip_needless_chown(rootfs, tmp_path):
    """Entries are created with their final mode; owner fixed only when it differs."""
    from libinject.apply.rootfs import RootFS
    os.chown(rootfs, 1234, 1234)
    try:
        r = RootFS(str(rootfs))
        r.make_file("/opt/d/f")
        r.symlink("f", "/opt/d/l")
        r.close()
        for p, mode in (("opt", 0o755), ("opt/d", 0o755), ("opt/d/f", 0o644)):
            st = os.stat(rootfs / p)
            assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 1234, mode)
        st = os.lstat(rootfs / "opt/d/l")
        assert (st.st_uid, st.st_gid) == (1234, 1234)
    finally:
        os.chown(rootfs, 0, 0)


def test_symlinks_create_replace_restore(rootfs, tmp_path):
    host = tmp_path / "hostfile"
    host.write_text("host")
    r = _rootfs(rootfs)
    lib = rootfs / LIBDIR.lstrip("/")
    (lib / "libold.so").symlink_to(str(host))
    (lib / "libreal.so").write_text("image file")
    assert r.symlink("libcuda.so.1", f"{LIBDIR}/libcuda.so") is True
    assert r.symlink("libcuda.so.1", f"{LIBDIR}/libcuda.so") is False     # idempotent
    assert r.symlink("libnew.so.1", f"{LIBDIR}/libold.so") is True        # replaced
    assert r.symlink("libnew.so.1", f"{LIBDIR}/libreal.so") is False      # left alone
    assert os.readlink(lib / "libcuda.so") == "libcuda.so.1"
    assert os.readlink(lib / "libold.so") == "libnew.so.1"
    assert host.read_text() == "host"
    assert r.journal.rollback() == []
    assert not os.path.lexists(lib / "libcuda.so")
    assert os.readlink(lib / "libold.so") == str(host)
    assert (lib / "libreal.so").read_text() == "image file"
    assert sorted(os.listdir(lib)) == ["libold.so", "libreal.so"]


def test_write_file_replaces_symlink_never_writes_through(rootfs, tmp_path):
    host = tmp_path / "host.conf"
    host.write_text("host")
    (rootfs / "etc/ld-musl-x86_64.path").symlink_to(str(host))
    r = _rootfs(rootfs)
    r.write_file("/etc/ld-musl-x86_64.path", b"/lib\n")
    assert (rootfs / "etc/ld-musl-x86_64.path").read_text() == "/lib\n"
    assert not (rootfs / "etc/ld-musl-x86_64.path").is_symlink()
    assert host.read_text() == "host"
    r.journal.rollback()
    assert os.readlink(rootfs / "etc/ld-musl-x86_64.path") == str(host)
    assert not [n for n in os.listdir(rootfs / "etc") if "nvhook" in n]


def test_a_replaced_file_is_freed_by_the_next_rootfs_not_before(rootfs):
    """write_file() keeps the inode it replaced referenced (freeing it is ext4 work a
    served start need not wait for) until the next RootFS, never longer; rollback puts
    the old contents back all the same."""
    (rootfs / "etc/ld.so.cache").write_bytes(b"image cache")
    old = os.stat(rootfs / "etc/ld.so.cache")
    r = _rootfs(rootfs)
    r.write_file("/etc/ld.so.cache", b"merged cache")
    assert (rootfs / "etc/ld.so.cache").read_bytes() == b"merged cache"

    def held() -> list[str]:
        out = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                st = os.stat(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (old.st_dev, old.st_ino):
                out.append(fd)
        return out

    assert len(held()) == 1 and os.stat(f"/proc/self/fd/{held()[0]}").st_nlink == 0
    r.journal.rollback()
    assert (rootfs / "etc/ld.so.cache").read_bytes() == b"image cache"
    r.close()
    _rootfs(rootfs).close()
    assert held() == []


def test_mount_options_validated():
    from libinject.apply.rootfs import mount_attrs
    assert mount_attrs(("ro", "nosuid", "nodev", "bind"))[0] == (
        native.MOUNT_ATTR_RDONLY | native.MOUNT_ATTR_NOSUID | native.MOUNT_ATTR_NODEV)
    assert mount_attrs(("rbind",))[1] is True
    with pytest.raises(NvhookError, match="unsupported mount option"):
        mount_attrs(("ro", "suidx"))


# -- ldconfig ------------------------------------------------------------------------
def _cache(rootfs) -> str:
    return subprocess.run([HOST_LDCONFIG, "-p", "-C", str(rootfs / "etc/ld.so.cache")],
                          capture_output=True, text=True).stdout


def _ldconfig(rootfs, folders, spec="@/sbin/ldconfig"):
    from libinject.apply import ldconfig
    r = _rootfs(rootfs)
    return ldconfig.update(r, folders, ldconfig=spec)


def test_ldconfig_host_binary_in_rootfs_without_ldconfig(rootfs):
    lib = rootfs / LIBDIR.lstrip("/")
    shutil.copy(os.path.realpath("/lib/x86_64-linux-gnu/libz.so.1"), lib / "libnvidia-ml.so.550.1")
    (lib / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.550.1")
    assert not (rootfs / "sbin/ldconfig").exists()
    how = in_ns(_ldconfig, rootfs, [LIBDIR])
    assert how == "ldconfig"
    out = _cache(rootfs)
    # the copied library, cached by its SONAME through the link ldconfig made beside it
    assert f"\tlibz.so.1 (libc6,x86-64) => {LIBDIR}/libz.so.1\n" in out
    assert os.readlink(lib / "libz.so.1") == "libnvidia-ml.so.550.1"
    assert "libc.so.6" in out
    confs = [n for n in os.listdir(rootfs / "etc/ld.so.conf.d") if n.startswith("00-nvcr-")]
    assert len(confs) == 1
    assert (rootfs / "etc/ld.so.conf.d" / confs[0]).read_text() == f"{LIBDIR}\n"
    in_ns(_ldconfig, rootfs, [LIBDIR])                        # no second conf file
    assert len([n for n in os.listdir(rootfs / "etc/ld.so.conf.d") if n.startswith("00-nvcr-")]) == 1


def test_ldconfig_symlinked_cache_and_confdir_stay_inside(rootfs, tmp_path):
    host = tmp_path / "hostetc"
    host.mkdir()
    (host / "ld.so.cache").write_bytes(b"host cache")
    (host / "conf.d").mkdir()
    (host / "conf.d/host.conf").write_text("/host\n")
    before = snapshot(host)
    (rootfs / "etc/ld.so.cache").symlink_to(str(host / "ld.so.cache"))
    shutil.rmtree(rootfs / "etc/ld.so.conf.d")
    (rootfs / "etc/ld.so.conf.d").symlink_to("../../../../../../../.." + str(host / "conf.d"))
    how = in_ns(_ldconfig, rootfs, [LIBDIR])
    assert how == "ldconfig"
    assert snapshot(host) == before
    assert "libc.so.6" in _cache(rootfs)          # the image got its own, real cache
    assert not (rootfs / "etc/ld.so.cache").is_symlink()


def _ldconfig_with_proc(rootfs, folders):
    native.mount("proc", str(rootfs / "proc"), "proc", 0)
    return _ldconfig(rootfs, folders)


def test_ldconfig_cannot_reach_host_through_proc(rootfs, tmp_path):
    """An image whose ld.so.conf points at /proc/1/root/<host dir>: with the container's
    procfs mounted (as at runc prestart), ldconfig must not make links in the host dir."""
    host = tmp_path / "hostlibs"
    host.mkdir()
    shutil.copy(os.path.realpath("/lib/x86_64-linux-gnu/libz.so.1"), host / "libz.so.1.2.99")
    before = snapshot(host)
    (rootfs / "etc/ld.so.conf.d/evil.conf").write_text(f"/proc/1/root{host}\n")
    assert in_ns(_ldconfig_with_proc, rootfs, [LIBDIR]) == "ldconfig"
    assert snapshot(host) == before
    assert str(host) not in _cache(rootfs)


def test_ldconfig_musl_path_file(rootfs, tmp_path):
    (rootfs / "lib/ld-musl-x86_64.so.1").write_text("musl loader")
    how = in_ns(_ldconfig, rootfs, [LIBDIR, "/usr/lib64"])
    assert how == "musl"
    assert (rootfs / "etc/ld-musl-x86_64.path").read_text().split() == [
        "/lib", "/usr/local/lib", "/usr/lib", LIBDIR, "/usr/lib64"]
    assert not (rootfs / "etc/ld.so.cache").exists()
    # an existing file is extended
    (rootfs / "etc/ld-musl-x86_64.path").write_text("/lib:/opt/lib\n")
    in_ns(_ldconfig, rootfs, [LIBDIR])
    assert (rootfs / "etc/ld-musl-x86_64.path").read_text().split() == ["/lib", "/opt/lib", LIBDIR]
    # a symlink (to the host, resolving inside the rootfs) is replaced, neither
    # written through nor read: the new file starts from musl's default path
    host = tmp_path / "musl.path"
    host.write_text("/opt/lib\n")
    (rootfs / "etc/ld-musl-x86_64.path").unlink()
    (rootfs / "etc/ld-musl-x86_64.path").symlink_to(str(host))
    (rootfs / str(host).lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    (rootfs / str(host).lstrip("/")).write_text("/lib:/opt/lib\n")
    in_ns(_ldconfig, rootfs, [LIBDIR])
    assert host.read_text() == "/opt/lib\n"
    assert (rootfs / "etc/ld-musl-x86_64.path").read_text().split() == [
        "/lib", "/usr/local/lib", "/usr/lib", LIBDIR]


def test_ldconfig_container_path(rootfs, tmp_path):
    with pytest.raises(NvhookError, match="ldconfig /sbin/ldconfig in the rootfs"):
        in_ns(_ldconfig, rootfs, [LIBDIR], "/sbin/ldconfig")
    (rootfs / "sbin/ldconfig").symlink_to("/usr" + HOST_LDCONFIG)   # host path: resolves inside
    with pytest.raises(NvhookError, match="No such file"):
        in_ns(_ldconfig, rootfs, [LIBDIR], "/sbin/ldconfig")
    (rootfs / "sbin/ldconfig").unlink()
    shutil.copy(HOST_LDCONFIG, rootfs / "sbin/ldconfig")
    assert in_ns(_ldconfig, rootfs, [LIBDIR], "/sbin/ldconfig") == "ldconfig"
    assert "libc.so.6" in _cache(rootfs)


def test_ldconfig_errors(tmp_path, rootfs):
    from libinject.apply import ldconfig
    script = tmp_path / "ldconfig.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    with pytest.raises(NvhookError, match="script"):
        ldconfig.open_ldconfig(f"@{script}")
    with pytest.raises(NvhookError, match="No such file"):
        ldconfig.open_ldconfig(f"@{tmp_path}/missing")


def _sandbox(rootfs, argv, timeout):
    from libinject.apply import ldconfig
    r = _rootfs(rootfs)
    fd = os.open(rootfs / "bin/busybox", os.O_RDONLY | os.O_CLOEXEC)
    try:
        ldconfig.run_sandboxed(r, fd, argv, timeout=timeout)
        return "ok"
    except NvhookError as e:
        return str(e)


def test_sandbox_environment_and_limits(rootfs):
    """What runs in the sandbox: pivoted into the rootfs (no /proc), empty env (sh
    itself sets PWD, SHLVL, PATH),
    only stdio fds; failures and their last stderr line reach the caller."""
    script = ("test -z \"$(env | grep -v -e ^PWD= -e ^SHLVL= -e ^_= -e ^PATH=)\" || exit 3; "
              "test -e /bin/busybox || exit 4; "
              "test -e /proc/self || test -e " + str(rootfs) + " || test -e /sbin/ldconfig && exit 5; "
              "for i in 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19; do "
              "(: >&$i) 2>&1 && exit 6; done; exit 0")
    assert in_ns(_sandbox, rootfs, ["sh", "-c", script], 10) == "ok"
    assert in_ns(_sandbox, rootfs, ["sh", "-c", "echo boom >&2; exit 7"], 10) == \
        "ldconfig failed: exit status 7: boom"


def _sandbox_with_inherited_fd(rootfs):
    # a caller's fd that is not close-on-exec, far above the usual range
    fd = os.open("/dev/null", os.O_RDONLY)
    os.dup2(fd, 900, inheritable=True)
    os.close(fd)
    try:
        return _sandbox(rootfs, ["sh", "-c", "(: <&900) 2>/dev/null && exit 6; exit 0"], 10)
    finally:
        os.close(900)


def test_sandbox_closes_every_inherited_fd(rootfs):
    assert in_ns(_sandbox_with_inherited_fd, rootfs) == "ok"


def test_sandbox_timeout(rootfs):
    assert in_ns(_sandbox, rootfs, ["sleep", "10"], 0.5) == "ldconfig failed: timed out after 0.5s"


def _caps_after_limit():
    import prctl
    from libinject.linux.privileges import limit_capabilities
    limit_capabilities({prctl.CAP_SYS_ADMIN, prctl.CAP_CHOWN})
    status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines()
                  if line.startswith("Cap"))
    return {k: int(v, 16) for k, v in status.items()}


def test_limit_capabilities():
    caps = in_ns(_caps_after_limit)
    want = (1 << 21) | (1 << 0)           # CAP_SYS_ADMIN, CAP_CHOWN
    assert caps["CapEff"] == caps["CapPrm"] == caps["CapBnd"] == want
    assert caps["CapInh"] == 0


# -- the sandbox's namespaces and mount flags (security review, finding 2) -----------
def _sandbox_seen_from_outside(rootfs, marker):
    """Run `sh` in the sandbox; from outside, find it by a marker in its command line
    and read its namespaces and mount table while it runs."""
    import threading
    import time
    seen = {}

    def watch():
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and not seen:
            for p in os.listdir("/proc"):
                if not p.isdigit():
                    continue
                try:
                    if marker.encode() not in open(f"/proc/{p}/cmdline", "rb").read():
                        continue
                    seen["ns"] = {n: os.readlink(f"/proc/{p}/ns/{n}") for n in ("pid", "net", "ipc", "mnt")}
                    seen["mounts"] = mountinfo(p)
                    seen["status"] = open(f"/proc/{p}/status").read()
                except OSError:
                    continue
                break
            time.sleep(0.01)

    t = threading.Thread(target=watch)
    t.start()
    out = _sandbox(rootfs, ["sh", "-c", f"sleep 1; : {marker}"], 10)
    t.join(timeout=10)      # the watcher gives up after 8 s
    assert not t.is_alive()
    mine = {n: os.readlink(f"/proc/self/ns/{n}") for n in ("pid", "net", "ipc", "mnt")}
    return out, seen, mine


def test_sandbox_own_namespaces_nodev_nosuid(rootfs):
    marker = f"nvhook-marker-{os.urandom(4).hex()}"
    out, seen, mine = in_ns(_sandbox_seen_from_outside, rootfs, marker)
    assert out == "ok"
    assert seen, "sandboxed process not found"
    for n in ("pid", "net", "ipc", "mnt"):
        assert seen["ns"][n] != mine[n], n
    nspid = [ln for ln in seen["status"].splitlines() if ln.startswith("NSpid:")][0].split()
    assert nspid[-1] == "1"                      # pid 1 of its own pid namespace
    assert seen["mounts"]
    for m in seen["mounts"]:
        assert {"nodev", "nosuid"} <= m.options, m
    # and this process's children are in our pid namespace again
    assert subprocess.run(["true"]).returncode == 0


def test_sandbox_cannot_signal_host_processes(rootfs):
    victim = subprocess.Popen(["sleep", "30"])
    try:
        out = in_ns(_sandbox, rootfs, ["sh", "-c", f"kill -9 {victim.pid} 2>/dev/null && exit 3; "
                                       "test $$ = 1 || exit 4; exit 0"], 10)
        assert out == "ok"
        assert victim.poll() is None              # still alive
    finally:
        victim.kill()
        victim.wait(timeout=10)


def test_sandbox_cannot_open_image_device_nodes(rootfs):
    os.mknod(rootfs / "etc/evildev", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    out = in_ns(_sandbox, rootfs, ["sh", "-c", "cat /etc/evildev"], 10)
    assert "Permission denied" in out, out


def test_ldconfig_include_of_device_node_not_opened(rootfs, tmp_path):
    """The host's ldconfig follows the image's `include` (any path in the image): into
    a char device it must fail with EACCES (nodev), never open the device."""
    import sys
    os.mknod(rootfs / "etc/evildev", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    conf = rootfs / "etc/ld.so.conf"
    conf.write_text("include /etc/evildev\n" + (conf.read_text() if conf.exists() else ""))
    script = tmp_path / "run.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(native.__file__).resolve().parents[2])!r})\n"
        "from libinject.linux import native\nfrom libinject.apply import ldconfig\n"
        "from libinject.apply.rootfs import RootFS\n"
        "native.unshare(native.CLONE_NEWNS)\n"
        "native.mount(None, '/', None, native.MS_REC | native.MS_PRIVATE)\n"
        f"print(ldconfig.update(RootFS({str(rootfs)!r}), [{LIBDIR!r}]))\n")
    log = tmp_path / "strace.log"
    r = subprocess.run(["strace", "-f", "-qq", "-e", "trace=open,openat,openat2", "-o", str(log),
                        sys.executable, str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ldconfig"
    opens = [ln for ln in log.read_text().splitlines() if "evildev" in ln]
    assert opens, "ldconfig never looked at the include"
    assert all("EACCES" in ln for ln in opens), opens


def _ldconfig_umount_fails(rootfs, folders):
    from libinject.apply import ldconfig
    real = ldconfig.native.umount2

    def failing(target, flags=0):
        if target != ".":               # the old root still detaches; nothing else does
            raise OSError(errno.EBUSY, "busy", target)
        return real(target, flags)
    ldconfig.native.umount2 = failing
    native.mount("proc", str(rootfs / "proc"), "proc", 0)
    try:
        return _ldconfig(rootfs, folders)
    except NvhookError as e:
        return str(e)


def test_ldconfig_fails_closed_if_proc_stays(rootfs):
    cache = rootfs / "etc/ld.so.cache"
    before = cache.read_bytes() if cache.exists() else None
    out = in_ns(_ldconfig_umount_fails, rootfs, [LIBDIR])
    assert "cannot detach kernel filesystem at /proc" in out, out
    assert (cache.read_bytes() if cache.exists() else None) == before   # ldconfig never ran


# -- reading image files (security review, finding 3) --------------------------------
def _read(rootfs, path, **kw):
    try:
        return _rootfs(rootfs).read_file(path, **kw)
    except NvhookError as e:
        return str(e)


def test_read_file_never_opens_a_fifo(rootfs):
    """A fifo (or a device node) of the image is refused without being open()ed: a
    writer blocked in open() on the fifo would be released by any reader's open."""
    import threading
    fifo = rootfs / "etc/ld.so.conf.d/00-nvcr-evil.conf"
    os.mkfifo(fifo)
    opened = threading.Event()

    def writer():
        fd = os.open(fifo, os.O_WRONLY)
        opened.set()
        os.close(fd)
    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        assert "is a fifo, not a regular file" in in_ns(_read, rootfs, "/etc/ld.so.conf.d/00-nvcr-evil.conf")
        assert not opened.wait(0.3)
    finally:
        if not opened.is_set():          # release the writer
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        t.join(5)
    os.mknod(rootfs / "etc/evildev", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    assert "is a char device, not a regular file" in in_ns(_read, rootfs, "/etc/evildev")


def _read_with_proc(rootfs, path):
    native.mount("proc", str(rootfs / "proc"), "proc", 0)
    return _read(rootfs, path)


def test_read_file_refuses_procfs(rootfs):
    (rootfs / "etc/ld-musl-x86_64.path").symlink_to("/proc/self/environ")
    assert "on procfs/sysfs" in in_ns(_read_with_proc, rootfs, "/etc/ld-musl-x86_64.path")
    assert "symlink" in in_ns(_read, rootfs, "/etc/ld-musl-x86_64.path", follow=False)


def test_musl_symlinked_path_file_not_copied(rootfs):
    """A musl image's .path is a symlink to a file only root may read (inside the
    rootfs): its contents must not end up in a new 0644 file."""
    (rootfs / "lib/ld-musl-x86_64.so.1").write_text("musl loader")
    secret = rootfs / "etc/secret"
    secret.write_text("/top-secret-dir\n")
    os.chmod(secret, 0o600)
    (rootfs / "etc/ld-musl-x86_64.path").symlink_to("/etc/secret")
    assert in_ns(_ldconfig, rootfs, [LIBDIR]) == "musl"
    new = rootfs / "etc/ld-musl-x86_64.path"
    assert not new.is_symlink()
    assert "top-secret" not in new.read_text()
    assert secret.read_text() == "/top-secret-dir\n"


def test_glibc_image_with_musl_path_symlink_is_not_musl(rootfs):
    (rootfs / "etc/ld-musl-x86_64.path").symlink_to("/etc/hostname")
    (rootfs / "etc/hostname").write_text("x\n")
    assert in_ns(_ldconfig, rootfs, [LIBDIR]) == "ldconfig"
    assert os.readlink(rootfs / "etc/ld-musl-x86_64.path") == "/etc/hostname"
    assert "libc.so.6" in _cache(rootfs)
