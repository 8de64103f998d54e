"""Trust boundaries, class 7: the ldconfig sandbox's seccomp filter.

The host's ldconfig runs on the image's files (its ld.so.conf, the libraries it names):
a parser bug there is code execution inside the sandbox, as the rootfs owner with
CAP_DAC_OVERRIDE. The sandbox now also denies (EPERM) what ldconfig never needs and an
exploit would use to reach the kernel: keyrings, new user namespaces (unshare, clone),
ptrace, bpf, the mount API, ... A probe binary runs through the very same code path
(ldconfig.run_sandboxed, what ldconfig.update calls) and reports what it could do; real
ldconfig still builds the cache through it.
"""
from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from libinject.errors import NvhookError
from support.applyenv import LIBDIR, in_ns

PROBE_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/bpf.h>

static FILE *out;
static void say(const char *what, long r) { fprintf(out, "%s=%d\n", what, r < 0 ? errno : 0); }

/* in a child: a user namespace, then a mount in a mount namespace it owns */
static int userns_mount(void)
{
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) < 0)
        return errno;
    if (mount("none", "/tmp", "tmpfs", 0, NULL) < 0)
        return 100 + errno;
    return 0;
}

int main(void)
{
    union bpf_attr a;
    int st;
    pid_t p;
    out = fopen("/probe.out", "w");
    if (!out)
        return 2;
    say("keyctl", syscall(SYS_keyctl, 0 /* GET_KEYRING_ID */, -3 /* session */, 0));
    say("add_key", syscall(SYS_add_key, "user", "nvhook-probe", "x", 1, -2 /* process */));
    say("request_key", syscall(SYS_request_key, "user", "nvhook-probe", NULL, -2));
    p = syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);
    if (p == 0)
        _exit(0);
    say("clone_newuser", p);
    if (p > 0)
        waitpid(p, &st, 0);
    p = fork();
    if (p == 0)
        _exit(userns_mount());
    waitpid(p, &st, 0);
    fprintf(out, "userns_mount=%d\n", WEXITSTATUS(st));
    say("unshare_newuser", unshare(CLONE_NEWUSER));
    p = fork();         /* a tracee stops on signals: not the probe itself */
    if (p == 0)
        _exit(ptrace(PTRACE_TRACEME, 0, 0, 0) < 0 ? errno : 0);
    waitpid(p, &st, 0);
    fprintf(out, "ptrace=%d\n", WEXITSTATUS(st));
    memset(&a, 0, sizeof a);
    a.map_type = BPF_MAP_TYPE_ARRAY;
    a.key_size = 4;
    a.value_size = 4;
    a.max_entries = 1;
    say("bpf", syscall(SYS_bpf, BPF_MAP_CREATE, &a, sizeof a));
    say("mount", mount("none", "/tmp", "tmpfs", 0, NULL));
    say("umount2", umount2("/", MNT_DETACH));
    say("pivot_root", syscall(SYS_pivot_root, "/", "/"));
    say("fsopen", syscall(SYS_fsopen, "tmpfs", 0));
    say("open_tree", syscall(SYS_open_tree, AT_FDCWD, "/", 1 /* OPEN_TREE_CLONE */));
    say("setns", syscall(SYS_setns, 0, 0));
    say("init_module", syscall(SYS_init_module, NULL, 0, ""));
    say("kexec_load", syscall(SYS_kexec_load, 0, 0, NULL, 0));
    say("io_uring_setup", syscall(SYS_io_uring_setup, 1, NULL));
    /* what ldconfig does must still work */
    p = fork();
    if (p == 0)
        _exit(0);
    say("fork", p < 0 ? -1 : waitpid(p, &st, 0));
    say("open", open("/etc/ld.so.conf", O_RDONLY));
    fclose(out);
    return 0;
}
"""
DENIED = ["keyctl", "add_key", "request_key", "clone_newuser", "userns_mount", "unshare_newuser",
          "ptrace", "bpf", "mount", "umount2", "pivot_root", "fsopen", "open_tree", "setns",
          "init_module", "kexec_load", "io_uring_setup"]


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("probe")
    (d / "probe.c").write_text(PROBE_C)
    subprocess.run(["gcc", "-O1", "-static", "-o", str(d / "probe"), str(d / "probe.c")],
                   check=True, capture_output=True, timeout=120)
    return d / "probe"


def _run_probe(rootfs: Path, probe: Path) -> str:
    from libinject.apply import ldconfig
    from libinject.apply.rootfs import RootFS
    fd = os.open(probe, os.O_RDONLY | os.O_CLOEXEC)
    try:
        ldconfig.run_sandboxed(RootFS(str(rootfs)), fd, ["probe"], timeout=20)
    except NvhookError as e:
        return f"failed: {e}"
    finally:
        os.close(fd)
    return "ok"


def _ldconfig(rootfs: Path) -> str:
    from libinject.apply import ldconfig
    from libinject.apply.rootfs import RootFS
    return ldconfig.update(RootFS(str(rootfs)), [LIBDIR])


def test_sandbox_denies_kernel_surface_ldconfig_still_works(rootfs, probe):
    assert in_ns(_run_probe, rootfs, probe) == "ok"
    got = dict(line.split("=") for line in (rootfs / "probe.out").read_text().split())
    named = {k: errno.errorcode.get(int(v), v) if v != "0" else "OK" for k, v in got.items()}
    print(named)
    assert named["fork"] == "OK" and named["open"] == "OK"      # ldconfig's own needs
    # the nested user namespace and mount: the unshare itself is refused
    assert {k: named[k] for k in DENIED} == {k: "EPERM" for k in DENIED}
    assert in_ns(_ldconfig, rootfs) == "ldconfig"
    cache = subprocess.run(["/sbin/ldconfig", "-p", "-C", str(rootfs / "etc/ld.so.cache")],
                           capture_output=True, text=True).stdout
    assert "libc.so.6 (libc6,x86-64)" in cache
