"""The in-process ld.so.cache merge (libinject.apply.ldcache_merge) against glibc
itself: the cache (byte for byte) and the SONAME links it leaves are the ones the
sandboxed ldconfig leaves, in every image layout; a dynamic program in the container
loads the driver's libraries through it; hostile caches fall back to ldconfig or fail
with one error and never touch the host; the merge starts no process.

Everything is real: the simulated host's driver libraries are ELF shared objects,
mounted by apply() into busybox+glibc images whose cache the host's ldconfig made.
"""
from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.ldcache_env import (LAYOUTS, LDCONFIG, LDCONFIG_ONLY, MERGE, apply, make_image,
                                 plan_for, run_in_container)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def plans(a100_host, tmp_path_factory):
    """(layout-kind, caps) -> the planner's edits (the same for every image of a kind)."""
    tmp = tmp_path_factory.mktemp("plans")
    out = {}
    for kind in ("debian", "rpm"):
        img = make_image(tmp / kind, kind)
        for caps in ("default", "all"):
            out[kind, caps] = plan_for(a100_host, img, caps)
    return out


def _edits(plans, layout: str, caps: str):
    return plans["rpm" if layout == "rpm" else "debian", caps]


def _twins(tmp_path: Path, layout: str) -> tuple[Path, Path]:
    a = make_image(tmp_path / "merge", layout)
    b = tmp_path / "ldconfig"
    shutil.copytree(a, b, symlinks=True)
    return a, b


# -- what glibc's ldconfig would have written --------------------------------------------
@pytest.mark.parametrize("caps", ["default", "all"])
@pytest.mark.parametrize("layout", [x for x in LAYOUTS if x != "compat"])
def test_merge_equals_sandboxed_ldconfig(tmp_path, plans, layout, caps, no_leaked_mounts):
    """The same apply() with the merge (the default) and with ldconfig ("@!"): the same
    cache bytes and the same links in the library folders; the merge did it."""
    a, b = _twins(tmp_path, layout)
    edits = _edits(plans, layout, caps)
    merged = apply(a, edits, MERGE)
    ran = apply(b, edits, LDCONFIG_ONLY)
    assert (merged["error"], merged["fallback"], merged["cache"], merged["links"]) == \
        (None, None, ran["cache"], ran["links"])


@pytest.mark.parametrize("caps", ["default", "all"])
def test_merge_keeps_compat_format(tmp_path, plans, caps, no_leaked_mounts):
    """An image whose cache is old+new ("ld.so-1.7.0" holding "glibc-ld.so.cache1.1",
    as ldconfig -c compat and glibc < 2.32 write it) keeps that format: the merge's
    bytes are the host's ldconfig -c compat over the same tree."""
    img = make_image(tmp_path / "img", "compat")
    got = apply(img, _edits(plans, "compat", caps), MERGE, reference=["-c", "compat"])
    assert (got["fallback"], got["cache"][:11], got["cache"]) == (None, b"ld.so-1.7.0", got["reference"])


@pytest.mark.parametrize("layout", ["debian", "duplicates"])
def test_restarted_container_equals_ldconfig(tmp_path, plans, layout, no_leaked_mounts):
    """A container started again (its rootfs has our entries and links from the first
    start): the merge replaces its own entries, as ldconfig does (no duplicates)."""
    a, b = _twins(tmp_path, layout)
    edits = _edits(plans, layout, "all")
    merged = apply(a, edits, MERGE, times=2)
    ran = apply(b, edits, LDCONFIG_ONLY, times=2)
    assert (merged["fallback"], merged["cache"], merged["links"]) == (None, ran["cache"], ran["links"])


PROG = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        void *h = dlopen(argv[i], RTLD_NOW);
        struct link_map *lm = NULL;
        if (h == NULL || dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0)
            printf("%s: not found\n", argv[i]);
        else
            printf("%s: %s\n", argv[i], lm->l_name);
    }
    return 0;
}
"""


def test_dynamic_program_loads_driver_libraries_through_cache(tmp_path, plans, no_leaked_mounts):
    """A dynamic program in an RPM-layout image (its libraries go to /usr/lib64, which
    the loader does not search by default) dlopen()s libcuda.so.1 and libnvidia-ml.so.1
    without LD_LIBRARY_PATH: not found with the image's cache, found through the
    merged one."""
    img = make_image(tmp_path / "img", "rpm")
    src = tmp_path / "prog.c"
    src.write_text(PROG)
    subprocess.run(["gcc", "-O1", "-o", str(img / "prog"), str(src)], check=True, timeout=60)
    shutil.copyfile(img / "etc/ld.so.cache", img / "etc/ld.so.cache.image")
    edits = _edits(plans, "rpm", "default")
    libs = ["libcuda.so.1", "libnvidia-ml.so.1"]
    before = run_in_container(img, edits, "/prog", libs, merge=False)
    after = run_in_container(img, edits, "/prog", libs)
    assert (before, after) == (
        "libcuda.so.1: not found\nlibnvidia-ml.so.1: not found\n",
        "libcuda.so.1: /usr/lib64/libcuda.so.1\nlibnvidia-ml.so.1: /usr/lib64/libnvidia-ml.so.1\n")


# -- hostile images ----------------------------------------------------------------------
def _host_file(tmp_path: Path, data: bytes = b"host secret\n", name: str = "file") -> tuple[Path, tuple]:
    p = tmp_path / "host" / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    st = p.stat()
    return p, (data, st.st_mtime_ns, st.st_ino)


def _same(p: Path, was: tuple) -> bool:
    st = p.stat()
    return (p.read_bytes(), st.st_mtime_ns, st.st_ino) == was


def _lists_libcuda(cache: bytes | None, tmp_path: Path) -> bool:
    if cache is None:
        return False
    f = tmp_path / "out.cache"
    f.write_bytes(cache)
    out = subprocess.run([LDCONFIG, "-p", "-C", str(f)], capture_output=True, text=True).stdout
    return "libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1" in out


def test_cache_symlink_to_host_file_falls_back(tmp_path, plans, no_leaked_mounts):
    """/etc/ld.so.cache a symlink to a host file: never followed; ldconfig runs (in its
    sandbox) and replaces the link; the host file is untouched."""
    img = make_image(tmp_path / "img", "debian")
    host, was = _host_file(tmp_path)
    (img / "etc/ld.so.cache").unlink()
    (img / "etc/ld.so.cache").symlink_to(host)
    got = apply(img, _edits(plans, "debian", "default"))
    assert (got["error"], "symlink" in got["fallback"], _lists_libcuda(got["cache"], tmp_path),
            _same(host, was)) == (None, True, True, True)


def test_cache_fifo_falls_back(tmp_path, plans, no_leaked_mounts):
    """A FIFO there is never opened (no hang): ldconfig runs and replaces it."""
    img = make_image(tmp_path / "img", "debian")
    (img / "etc/ld.so.cache").unlink()
    os.mkfifo(img / "etc/ld.so.cache")
    got = apply(img, _edits(plans, "debian", "default"))
    assert (got["error"], "fifo" in got["fallback"], _lists_libcuda(got["cache"], tmp_path)) == \
        (None, True, True)


def test_cache_directory_is_one_error(tmp_path, plans, no_leaked_mounts):
    """A directory there: ldconfig runs and cannot rename its cache over it; one
    nvhook error, everything rolled back (the directory is still there)."""
    img = make_image(tmp_path / "img", "debian")
    (img / "etc/ld.so.cache").unlink()
    (img / "etc/ld.so.cache").mkdir()
    got = apply(img, _edits(plans, "debian", "default"))
    assert (got["error"].startswith("ldconfig failed: exit status 1"), "\n" in got["error"],
            "directory" in got["fallback"], (img / "etc/ld.so.cache").is_dir()) == (True, False, True, True)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "bad-offsets", "empty"])
def test_bogus_cache_falls_back(tmp_path, plans, damage, no_leaked_mounts):
    """Bytes that are not a cache as ldconfig writes it: never merged into; ldconfig
    runs and writes a good cache."""
    img = make_image(tmp_path / "img", "debian")
    cache = img / "etc/ld.so.cache"
    data = cache.read_bytes()
    if damage == "garbage":
        data = os.urandom(len(data))
    elif damage == "truncated":
        data = data[:len(data) // 2]
    elif damage == "bad-offsets":      # the first entry's key points into the header
        data = data[:52] + (4).to_bytes(4, "little") + data[56:]
    else:
        data = b""
    cache.write_bytes(data)
    got = apply(img, _edits(plans, "debian", "default"))
    assert (got["error"], got["fallback"] is not None, _lists_libcuda(got["cache"], tmp_path)) == \
        (None, True, True)


def test_unsorted_cache_falls_back(tmp_path, plans, no_leaked_mounts):
    """A well-formed cache whose table is not in ldconfig's order (the loader's binary
    search would miss entries): ldconfig rebuilds it."""
    from libinject.apply import ldcache_merge as M
    img = make_image(tmp_path / "img", "debian")
    c = M.parse((img / "etc/ld.so.cache").read_bytes())
    for col in ("names", "paths", "flags", "osversion", "hwcap"):
        getattr(c, col).reverse()
    (img / "etc/ld.so.cache").write_bytes(M.build(c))
    got = apply(img, _edits(plans, "debian", "default"))
    assert (got["error"], got["fallback"], _lists_libcuda(got["cache"], tmp_path)) == \
        (None, "the image's cache is not sorted", True)


def test_huge_cache_is_one_error(tmp_path, plans, no_leaked_mounts):
    """A cache larger than what rollback saves (16 MiB, sparse here): not merged;
    the ldconfig path refuses it too, with one error; nothing left mounted."""
    img = make_image(tmp_path / "img", "debian")
    with open(img / "etc/ld.so.cache", "r+b") as f:
        f.truncate(17 << 20)
    got = apply(img, _edits(plans, "debian", "default"))
    assert (got["error"], "larger than" in got["fallback"]) == (
        "cannot save /etc/ld.so.cache in the rootfs for rollback: larger than 16777216 bytes", True)


def test_cache_hard_link_to_host_file_is_replaced_not_written(tmp_path, plans, no_leaked_mounts):
    """The image's cache a hard link to a host file (same file system): the merge
    replaces the directory entry (rename), the host's inode keeps its bytes."""
    img = make_image(tmp_path / "img", "debian")
    host, was = _host_file(tmp_path, (img / "etc/ld.so.cache").read_bytes())
    (img / "etc/ld.so.cache").unlink()
    os.link(host, img / "etc/ld.so.cache")
    got = apply(img, _edits(plans, "debian", "default"))
    assert (got["fallback"], _lists_libcuda(got["cache"], tmp_path), _same(host, was)) == \
        (None, True, True)


def test_etc_symlink_out_of_rootfs_stays_inside(tmp_path, plans, no_leaked_mounts):
    """/etc a symlink to an absolute host path (which exists on the host, with an
    ld.so.cache): it resolves inside the rootfs; the merge reads and writes the image's
    cache there; the host's file is untouched."""
    img = make_image(tmp_path / "img", "debian")
    host, was = _host_file(tmp_path, (img / "etc/ld.so.cache").read_bytes(), "ld.so.cache")
    inside = Path(str(img) + str(host.parent))      # where /etc resolves in the rootfs
    inside.parent.mkdir(parents=True)
    (img / "etc").rename(inside)
    (img / "etc").symlink_to(host.parent)
    got = apply(img, _edits(plans, "debian", "default"))
    in_tree = (inside / "ld.so.cache").read_bytes()
    assert (got["fallback"], _lists_libcuda(in_tree, tmp_path), _same(host, was)) == (None, True, True)


def test_folder_without_our_libraries_falls_back(tmp_path, no_leaked_mounts):
    """A folder none of our mounts is in (CDI's update-ldcache hook, the CUDA compat
    directory): ldconfig scans it."""
    from libinject.plan.edits import ContainerEdits
    img = make_image(tmp_path / "img", "debian")
    got = apply(img, ContainerEdits(ldconfig_folders=("/usr/lib/x86_64-linux-gnu",)))
    assert (got["error"], got["fallback"]) == \
        (None, "folder /usr/lib/x86_64-linux-gnu holds none of the libraries we mounted")


# -- no child process ----------------------------------------------------------------------
STRACED = r"""
import pickle, sys
sys.path.insert(0, sys.argv[1])
from libinject.linux import native
from libinject.apply import live, ldcache_merge
edits, rootfs, spec = pickle.load(open(sys.argv[2], "rb"))
native.unshare(native.CLONE_NEWNS)
native.mount(None, "/", None, native.MS_REC | native.MS_PRIVATE)
live.apply(edits, rootfs, no_cgroups=True, worker=False, ldconfig=spec)
print("fallback:", ldcache_merge.last_fallback)
"""


def _strace_apply(tmp_path: Path, edits, spec: str) -> tuple[str, list[str]]:
    """apply(worker=False) in a fresh Python under strace -f: (its output, the
    process-creating syscalls after Python's own execve)."""
    assert shutil.which("strace"), "strace is not installed (scripts/install-deps installs it)"
    img = make_image(tmp_path / "img", "debian")
    arg = tmp_path / "args.pickle"
    arg.write_bytes(pickle.dumps((edits, str(img), spec)))
    script = tmp_path / "straced.py"
    script.write_text(STRACED)
    log = tmp_path / "strace.log"
    r = subprocess.run(["strace", "-f", "-qq", "-o", str(log), "-e",
                        "trace=execve,execveat,fork,vfork,clone,clone3",
                        sys.executable, "-I", str(script), str(REPO), str(arg)],
                       capture_output=True, text=True, timeout=120)
    calls = [ln for ln in log.read_text().splitlines()
             if any(f" {c}(" in f" {ln.split(None, 1)[-1]}" for c in
                    ("execve", "execveat", "fork", "vfork", "clone", "clone3"))]
    return r.stdout + r.stderr, calls[1:]     # [0]: strace's own execve of Python


def test_merge_runs_no_child_process(tmp_path, plans):
    """The merge path forks and execs nothing (strace -f: no clone/fork/execve)."""
    out, calls = _strace_apply(tmp_path, _edits(plans, "debian", "all"), MERGE)
    assert (out, calls) == ("fallback: None\n", [])


def test_forced_ldconfig_runs_it(tmp_path, plans):
    """"@!PATH" runs the host's ldconfig, merge or not: the same strace sees its
    sandbox's fork and ldconfig's execve."""
    out, calls = _strace_apply(tmp_path, _edits(plans, "debian", "default"), LDCONFIG_ONLY)
    assert (out, any("clone" in c for c in calls), any("execve" in c for c in calls)) == \
        ("fallback: @! or image ldconfig\n", True, True)


# -- the pieces, against ldconfig ---------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_parse_build_round_trip(tmp_path, layout):
    """Every cache the host's ldconfig writes (each layout, and the host's own) comes
    out of parse() and build() byte for byte."""
    from libinject.apply import ldcache_file as F
    data = make_image(tmp_path / "img", layout).joinpath("etc/ld.so.cache").read_bytes()
    host = Path("/etc/ld.so.cache").read_bytes() if layout == "debian" else data
    assert (F.build(F.parse(data)), F.build(F.parse(host))) == (data, host)


def _odd_folder(root: Path, lib: str, lib32: str) -> tuple[list[str], list[tuple[str, str]]]:
    """Libraries that make ldconfig choose: (container paths of 'our' files, planned
    links (target, link))."""
    from support.simhost import compile_lib
    ours = []

    def put(path: str, soname: str | None, m32: bool = False, libc: bool = False) -> None:
        dst = Path(str(root) + path)
        if soname is None:      # no DT_SONAME
            dst.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["gcc", "-shared", "-fPIC", "-nostdlib", "-o", str(dst), "-x", "c", "-"],
                           input=b"int f(void) { return 0; }\n", check=True, timeout=60)
        elif libc:
            dst.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["gcc", *(["-m32"] if m32 else []), "-shared", "-fPIC",
                            f"-Wl,-soname,{soname}", "-Wl,--no-as-needed", "-lc", "-o", str(dst),
                            "-x", "c", "-"], input=b"int f(void) { return 0; }\n", check=True, timeout=60)
        else:
            compile_lib(dst, soname, m32=m32)
        ours.append(path)

    put(f"{lib}/libodd64.so.1.2", "libodd64.so.1")
    put(f"{lib}/libnosoname.so.5", None)
    put(f"{lib}/libaaa.so.3.0", "libaaa.so.3")
    put(f"{lib32}/libplain32.so.1.0", "libplain32.so.1", m32=True)
    put(f"{lib32}/libc32.so.2.0", "libc32.so.2", m32=True, libc=True)
    for name, data in (("libtext.so.1", b"not an ELF file\n"), ("libempty.so.1", b"")):
        Path(str(root) + f"{lib}/{name}").write_bytes(data)
        ours.append(f"{lib}/{name}")
    links = [("libodd64.so.1.2", f"{lib}/libodd64.so.1"), ("libodd64.so.1", f"{lib}/libodd64.so"),
             ("libaaa.so.3.0", f"{lib}/libaaa.so.3"), ("libaaa.so.3", f"{lib}/libzzz.so.3"),
             ("libc32.so.2.0", f"{lib32}/libc32.so.2")]   # libplain32.so.1: made by the merge
    return ours, links


def _merge_copy(root: Path, folders: tuple[str, ...], ours: list[str], links) -> dict:
    from libinject.apply.ldconfig import update
    from libinject.apply.rootfs import RootFS
    from libinject.plan.edits import SymlinkEdit
    from libinject.apply import ldcache_merge as M
    from support.ldcache_env import folder_links
    r = RootFS(str(root))
    fds = [os.open(str(root) + p, os.O_PATH) for p in ours]
    try:
        how = update(r, folders, libraries=list(zip(ours, fds)),
                     links=[SymlinkEdit(t, ln) for t, ln in links])
        r.journal.commit()
    finally:
        for fd in fds:
            os.close(fd)
        r.close()
    return {"how": how, "fallback": M.last_fallback, "cache": (root / "etc/ld.so.cache").read_bytes(),
            "links": folder_links(root, folders)}


def test_odd_libraries_equal_ldconfig(tmp_path):
    """What ldconfig makes of libraries without a SONAME, non-ELF and empty files, i386
    libraries with and without libc (libc6 / plain ELF flags), a -dev link, a link whose
    name sorts above its file: the same cache and links from the merge."""
    lib, lib32 = "/usr/lib/x86_64-linux-gnu", "/usr/lib/i386-linux-gnu"
    a = make_image(tmp_path / "merge", "debian")
    ours, links = _odd_folder(a, lib, lib32)
    for target, link in links:
        Path(str(a) + link).symlink_to(target)
    b = tmp_path / "ldconfig"
    shutil.copytree(a, b, symlinks=True)
    subprocess.run([LDCONFIG, "-r", str(b), "-f", "/etc/ld.so.conf", "-C", "/etc/ld.so.cache", lib, lib32],
                   check=True, capture_output=True, timeout=60)
    from support.ldcache_env import folder_links
    got = _merge_copy(a, (lib, lib32), ours, links)
    assert (got["how"], got["fallback"], got["cache"], got["links"]) == \
        ("merged", None, (b / "etc/ld.so.cache").read_bytes(), folder_links(b, (lib, lib32)))


def test_merge_rolls_back(tmp_path):
    """What the merge did (the cache rewritten, a SONAME link the planner had not
    planned) is undone by the journal's rollback: the image's cache and folder as
    they were."""
    from libinject.apply.ldconfig import update
    from libinject.apply.rootfs import RootFS
    from libinject.plan.edits import SymlinkEdit
    from support.ldcache_env import folder_links
    lib, lib32 = "/usr/lib/x86_64-linux-gnu", "/usr/lib/i386-linux-gnu"
    img = make_image(tmp_path / "img", "debian")
    ours, links = _odd_folder(img, lib, lib32)
    for target, link in links:
        Path(str(img) + link).symlink_to(target)
    before = ((img / "etc/ld.so.cache").read_bytes(), folder_links(img, (lib, lib32)))
    r = RootFS(str(img))
    fds = [os.open(str(img) + p, os.O_PATH) for p in ours]
    try:
        how = update(r, (lib, lib32), libraries=list(zip(ours, fds)),
                     links=[SymlinkEdit(t, ln) for t, ln in links])
        changed = (img / "etc/ld.so.cache").read_bytes() != before[0]
        left = r.journal.rollback()
    finally:
        for fd in fds:
            os.close(fd)
        r.close()
    after = ((img / "etc/ld.so.cache").read_bytes(), folder_links(img, (lib, lib32)))
    assert (how, changed, left, after) == ("merged", True, [], before)


def test_a_cache_naming_too_many_directories_is_not_merged():
    """A hostile cache naming 600k directories would cost one openat2 each (seconds of
    its container's start, with no deadline in-process): past MAX_DIRS the merge gives up
    (and the sandboxed ldconfig, which has one, runs instead)."""
    from types import SimpleNamespace

    from libinject.apply import ldcache_merge as m

    n = m.MAX_DIRS + 1
    fake = SimpleNamespace(paths=[b"/d%d/libx.so.1" % i for i in range(n)], hwcap=[0] * n)
    with pytest.raises(m.Unsupported, match=f"names {n} directories"):
        m._ranks(None, m._bases(fake), [])


# -- the host libraries' ELF facts, remembered (nvhook serve) ----------------------------
@pytest.fixture
def facts():
    """libinject.apply.ldcache_merge with nothing remembered, before and after."""
    from libinject.apply import ldcache_merge

    ldcache_merge.forget_host_libraries()
    yield ldcache_merge
    ldcache_merge.forget_host_libraries()


def _read_now(path: str):
    from libinject.apply.elf import read_elf

    fd = os.open(path, os.O_RDONLY)
    try:
        return read_elf(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def _elf_of_path(m, path) -> tuple:
    fd = os.open(path, os.O_PATH)
    try:
        return m._elf_of(fd)
    finally:
        os.close(fd)


def test_remembered_facts_are_the_files(a100_host, facts, monkeypatch):
    """The service reads its driver's libraries once (remember_host_libraries); a
    lookup through any fd of the same unchanged file gets the same (soname, flags)
    without reading it."""
    from libinject.discover.driver import discover

    paths = [lib.path for lib in discover(str(a100_host), snapshot=False).libraries]
    fresh = {p: _read_now(p) for p in paths}
    assert len(paths) > 40 and all(fresh.values())
    assert facts.remember_host_libraries(paths) == len(paths)
    assert facts.remember_host_libraries(paths) == len(paths)      # known: not read again

    def no_read(*a):
        raise AssertionError("read again")

    from libinject.apply import elf

    monkeypatch.setattr(elf, "read_elf", no_read)
    assert {p: _elf_of_path(facts, p) for p in paths} == fresh


def test_a_changed_library_is_read_again(tmp_path, facts):
    """Keyed by the file's identity, size and times: the same inode rewritten (here
    with another SONAME, same size) is another key and is read again; lookups never
    fill the memory (only remember_host_libraries does)."""
    from support.simhost import compile_lib

    lib = compile_lib(tmp_path / "libx.so.1", "libx.so.1")
    other = compile_lib(tmp_path / "o/liby.so.1", "liby.so.1")
    assert lib.stat().st_size == other.stat().st_size
    assert facts.remember_host_libraries([str(lib)]) == 1
    assert _elf_of_path(facts, lib)[0] == b"libx.so.1"
    ino = lib.stat().st_ino
    with open(lib, "r+b") as f:
        f.write(other.read_bytes())
    assert lib.stat().st_ino == ino
    assert _elf_of_path(facts, lib)[0] == b"liby.so.1"
    assert _elf_of_path(facts, other)[0] == b"liby.so.1"
    assert len(facts._FACTS) == 1                   # still only what was remembered


def test_remember_follows_no_symlink_and_opens_nothing_else(tmp_path, facts):
    """Host paths are opened as the applier opens them: no symlink followed (in any
    component), an O_PATH fd first, read only if it is a regular file (a FIFO or a
    device is never opened for reading)."""
    from support.simhost import compile_lib

    lib = compile_lib(tmp_path / "d/libx.so.1", "libx.so.1")
    (tmp_path / "link.so.1").symlink_to(lib)
    (tmp_path / "dirlink").symlink_to(tmp_path / "d")
    os.mkfifo(tmp_path / "fifo.so.1")
    paths = [tmp_path / "link.so.1", tmp_path / "dirlink/libx.so.1", tmp_path / "fifo.so.1",
             "/dev/null", tmp_path / "d", tmp_path / "missing.so.1", "relative.so.1"]
    assert facts.remember_host_libraries(map(str, paths)) == 0 and not facts._FACTS


def test_merge_uses_remembered_facts(tmp_path, plans, a100_host, facts, no_leaked_mounts):
    """apply() looks the mounted libraries up by their source fds (open_tree clones of
    the host files): with the driver's libraries remembered the merge gives ldconfig's
    cache, and what it used is the remembered facts (a poisoned entry shows)."""
    from libinject.discover.driver import discover

    paths = [lib.path for lib in discover(str(a100_host), snapshot=False).libraries]
    facts.remember_host_libraries(paths)
    a, b = _twins(tmp_path, "debian")
    edits = _edits(plans, "debian", "all")
    merged = apply(a, edits, MERGE)
    ran = apply(b, edits, LDCONFIG_ONLY)
    assert (merged["error"], merged["fallback"], merged["cache"]) == (None, None, ran["cache"])

    cuda = next(p for p in paths if p.rsplit("/", 1)[-1].startswith("libcuda.so."))
    key = facts._identity(os.stat(cuda))
    soname, flags = facts._FACTS[key]
    facts._FACTS[key] = (b"libpoisoned.so.1", flags)
    c = make_image(tmp_path / "poisoned", "debian")
    got = apply(c, edits, MERGE)
    assert got["error"] is None and b"libpoisoned.so.1" in got["cache"] and soname == b"libcuda.so.1"


# -- merges made once, in a service ----------------------------------------------------------
def _apply_reporting(rootfs, edits):
    """apply() as a served worker does it: the result and what it would report."""
    from libinject.apply import ldcache_merge as M
    from support.ldcache_env import _apply

    return _apply(rootfs, edits, MERGE, 1, None), M.learned()


@pytest.fixture
def merge_memory():
    from libinject.apply import ldcache_merge as M

    M._KNOWN.clear()
    M._MERGED.clear()
    M._learn = None
    yield M
    M._KNOWN.clear()
    M._MERGED.clear()
    M._learn = None


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_merge_the_service_made_again_is_the_same_file(tmp_path, plans, layout, merge_memory):
    """`nvhook serve` keeps the merges its workers made: a worker reports the inputs
    (learned()), the server makes the merge again itself (learn()), and a later worker
    with the same image and request takes the file from there (reporting nothing): the
    same cache and links as a merge made afresh (and as ldconfig), in every layout."""
    import json

    from support.applyenv import in_ns

    M = merge_memory
    edits = _edits(plans, layout, "all")
    first, second = _twins(tmp_path, layout)
    ref = tmp_path / "ref"
    shutil.copytree(first, ref, symlinks=True)
    fresh, report = in_ns(_apply_reporting, first, edits)
    assert (fresh["error"], fresh["fallback"]) == (None, None) and report is not None
    assert M.learn(json.loads(json.dumps(report)))          # (as the server reads it)
    again, report2 = in_ns(_apply_reporting, second, edits)
    assert report2 is None                                   # from memory
    assert (again["error"], again["fallback"], again["cache"], again["links"]) == \
        (None, None, fresh["cache"], fresh["links"])
    if layout != "compat":      # (kept compat; the host's ldconfig writes new-only: above)
        ran = apply(ref, edits, LDCONFIG_ONLY)
        assert (ran["cache"], ran["links"]) == (fresh["cache"], fresh["links"])


def test_a_report_names_a_merge_never_chooses_it(tmp_path, plans, merge_memory):
    """What a worker reports is only data to the server: malformed reports, an image
    that is not a sorted cache, ranks or entries out of range are refused and keep
    nothing; a tampered report (another path for one of our entries) is kept under its
    own inputs, so an honest worker's merge does not find it and is made afresh, the
    same as before."""
    import base64
    import json

    from support.applyenv import in_ns

    M = merge_memory
    edits = _edits(plans, "debian", "default")
    a, b = _twins(tmp_path, "debian")
    fresh, report = in_ns(_apply_reporting, a, edits)
    report = json.loads(json.dumps(report))
    nf = len(report["folders"])
    bad = [None, [], {}, {**report, "image": "!!"}, {**report, "ranks": report["ranks"][:-1]},
           {**report, "ranks": [nf + 1] * len(report["ranks"])},
           {**report, "new": [[*report["new"][0][:5], nf]]}, {**report, "new": [["x", "y", 1, 0, 0]]},
           {**report, "folders": [1]},
           {**report, "image": base64.b64encode(b"glibc-ld.so.cache1.1 but not a cache").decode()}]
    unsorted = M.parse(base64.b64decode(report["image"]))
    if len(unsorted.names) > 1:
        unsorted.names.reverse()
        bad.append({**report, "image": base64.b64encode(M.build(unsorted)).decode()})
    for r in bad:
        assert M.learn(r) is False, r
    assert M._KNOWN == {} and M._MERGED == {}
    tampered = json.loads(json.dumps(report))
    tampered["new"][0][1] = "/etc/shadow"
    assert M.learn(tampered)
    again, report2 = in_ns(_apply_reporting, b, edits)
    assert report2 is not None and again["cache"] == fresh["cache"]
    assert b"/etc/shadow" not in again["cache"]


def test_a_hostile_cache_costs_no_more_than_its_size(tmp_path, plans, merge_memory):
    """An image cache whose SONAMEs are long tails of one string ("a1a1..."), a few
    hundred of them in 40 KB, made the order check quadratic: seconds and hundreds of
    MiB in the worker, then again in the server's loop (learn()). A name or path longer
    than ldconfig writes is refused (its sandboxed ldconfig, with a deadline, runs
    instead), the sort key is linear in a name, and what a report names is bounded."""
    import json
    import time

    from support.applyenv import in_ns

    M = merge_memory
    img = make_image(tmp_path / "img", "debian")
    edits = _edits(plans, "debian", "default")
    cache = img / "etc/ld.so.cache"
    c = M.parse(cache.read_bytes())
    for i in range(300):            # (sorted: after every "l..." name, longest first)
        for col, v in ((c.names, b"a1" * (16000 - i)), (c.paths, b"/opt/x/libx.so"),
                       (c.flags, 0x0303), (c.osversion, 0), (c.hwcap, 0)):
            col.append(v)
    cache.write_bytes(M.build(c))
    t = time.monotonic()
    got, report = in_ns(_apply_reporting, img, edits)
    assert got["fallback"] == "a name or path longer than ldconfig writes" and report is None
    assert got["error"] is None and time.monotonic() - t < 20
    t = time.monotonic()
    assert len(M._libkey(b"a1" * (1 << 17))) == 2 * (1 << 17) + 1     # (256 KiB: linear)
    assert time.monotonic() - t < 1

    # what a compromised worker could report instead: refused before any work
    img2 = make_image(tmp_path / "img2", "debian")
    _, honest = in_ns(_apply_reporting, img2, edits)
    honest = json.loads(json.dumps(honest))
    for bad in ({**honest, "new": honest["new"] * (M.MAX_LEARN_NEW // len(honest["new"]) + 1)},
                {**honest, "new": [["lib" + "x" * (1 << 18), *honest["new"][0][1:]]]},
                {**honest, "folders": honest["folders"] * (M.MAX_LEARN_FOLDERS + 1)}):
        t = time.monotonic()
        assert M.learn(bad) is False
        assert time.monotonic() - t < 0.5
    assert M._KNOWN == {} and M._MERGED == {}
