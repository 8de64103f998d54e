"""Hostile ld.so.cache files (and musl .path files) cost the host what their size allows,
never what they choose (issue 19, part 2).

An image's /etc/ld.so.cache is read by the host-root hook. Its entries name strings by
offset: one long string named by every entry, its tails named by many, a glibc-hwcaps
section of thousands of names, a table of millions of empty strings made the parser copy
a string per entry before it checked any length (a 332 KiB cache asked for ~2 GB, and
the hook was OOM-killed in a 1 GiB cgroup); SONAMEs with a newline ended in an internal
error. Here each of those files is parsed with its peak memory measured (tracemalloc:
every Python allocation), then given to the real hook (runc, the compiled front, the
exec'd Python and a served worker) in a memory cgroup of 512 MiB: the start succeeds
with ldconfig's cache (the merge falls back), and nothing is OOM-killed. A served
worker takes the image's data with oom_score_adj 0 and a data ceiling. A seeded fuzz
of mutated real caches checks the same bounds on every mutant.
"""
from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import time
import tracemalloc
from pathlib import Path

import pytest

from libinject.apply import ldcache_file as F
from libinject.apply import ldcache_merge as M
from support import hookenv
from support.ldcache_env import LDCONFIG, make_image
from support.memcg import MemoryCgroup
from support.runc import RUNC, RuncContainer

GPU1 = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=utility,compute"]
CGROUP_LIMIT = 512 << 20
PEAK_FACTOR = 12        # what parsing may allocate, times the file's size (+ SLACK)
SLACK = 64 << 10


def _raw(entries: list[tuple[int, int, int, int, int]], table: bytes,
         hwcaps: list[int] | None = None) -> bytes:
    """A new-format cache file as written, offsets and all: entries (flags, key,
    value, osversion, hwcap) with key and value relative to the string table; hwcaps:
    the glibc-hwcaps section's name offsets, relative to the table too."""
    n = len(entries)
    lo = F._NEW_HEAD.size + n * F._NEW_ENTRY.size
    body = b"".join(F._NEW_ENTRY.pack(f, lo + k, lo + v, o, h) for f, k, v, o, h in entries)
    ext, tail = 0, b""
    if hwcaps is not None:
        gen = b"ldconfig (GNU libc) hostile"
        ext = (lo + len(table) + 3) & ~3
        hw = struct.pack(f"<{len(hwcaps)}I", *(lo + o for o in hwcaps))
        at = ext + F._EXT_FULL
        tail = (b"\0" * (ext - lo - len(table)) + F._EXT_HEAD.pack(F.EXT_MAGIC, 2)
                + F._EXT_SECTION.pack(F.EXT_GENERATOR, 0, at + len(hw), len(gen))
                + F._EXT_SECTION.pack(F.EXT_HWCAPS, 0, at, len(hw)) + hw + gen)
    return F._NEW_HEAD.pack(F.MAGIC_NEW, n, len(table), 2, ext) + body + table + tail


def shared_string(size: int, length: int) -> bytes:
    """Every entry's SONAME and path: one string of `length` bytes (the file: `size`)."""
    n = (size - length) // F._NEW_ENTRY.size
    return _raw([(0x0303, 0, 0, 0, 0)] * n, b"/" + b"l" * (length - 2) + b"\0")


def tails(size: int) -> bytes:
    """Each entry names another tail of one 4000-byte string (each short enough)."""
    n = (size - 4000) // F._NEW_ENTRY.size
    return _raw([(0x0303, 3999 - i % 3990, 3999 - i % 3990, 0, 0) for i in range(n)],
                b"/" + b"l" * 3998 + b"\0")


def hwcaps_count(size: int, length: int) -> bytes:
    """A glibc-hwcaps section of (size - length) / 4 names, all one long string."""
    name = b"x" * (length - 1) + b"\0"
    count = (size - length - 200) // 4
    return _raw([(0x0303, length, length, 0, F.HWCAP_EXTENSION)],
                name + b"/usr/lib/glibc-hwcaps/x/libx.so.1\0", hwcaps=[0] * count)


def empty_strings(size: int) -> bytes:
    """One entry, then a table of NULs: millions of empty strings no entry names."""
    return _raw([(0x0303, 0, 0, 0, 0)], b"/lib/libx.so.1\0" + b"\0" * (size - 100))


def newline_sonames(image_cache: bytes) -> bytes:
    """A real cache plus an entry whose SONAME holds newlines (sorted last, as ldconfig
    sorts it)."""
    c = F.parse(image_cache)
    for col, v in ((c.names, b"a\na\na"), (c.paths, b"/opt/a\na\na"), (c.flags, 0x0303),
                   (c.osversion, 0), (c.hwcap, 0)):
        col.append(v)
    return F.build(c)


def _parse_all(data: bytes) -> None:
    """What a merge does with the image's cache before it looks at the rootfs."""
    c = F.parse(data)
    M._check_sorted(c, M._Keys())
    M._bases(c)


def _peak_of(fn, *args) -> tuple[str | None, int]:
    """(Unsupported's text, or None; peak bytes allocated) of fn(*args)."""
    tracemalloc.start()
    try:
        fn(*args)
        why = None
    except M.Unsupported as e:
        why = str(e)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return why, peak


HOSTILE = {
    "shared-string": (lambda: shared_string(64 << 10, 32 << 10), "a name or path longer than ldconfig writes"),
    "shared-short-string": (lambda: shared_string(64 << 10, 4000), "a name or path longer than ldconfig writes"),
    "tails": (lambda: tails(96 << 10), "strings shared more than ldconfig shares them"),
    "hwcaps-count": (lambda: hwcaps_count(64 << 10, 16 << 10), "more glibc-hwcaps names than entries"),
    "empty-strings": (lambda: empty_strings(1 << 20), "strings in the table that no entry uses"),
}


@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_cache_costs_its_size(kind):
    """Each hostile cache is refused (the merge falls back to ldconfig) before the
    parser allocates more than PEAK_FACTOR times its size."""
    make, why = HOSTILE[kind]
    data = make()
    got, peak = _peak_of(_parse_all, data)
    assert (got, peak <= PEAK_FACTOR * len(data) + SLACK) == (why, True), (peak, len(data))


def test_newline_sonames_fall_back(tmp_path):
    """SONAMEs with newlines: one Unsupported (the order check no longer joins names on
    newlines; a control character in a SONAME is not something to merge into)."""
    img = make_image(tmp_path / "img", "debian")
    data = newline_sonames((img / "etc/ld.so.cache").read_bytes())
    assert _peak_of(_parse_all, data)[0] == "a SONAME with a control character"


def test_a_real_cache_parses_within_the_bound():
    """The host's own cache (hundreds of entries), as a reference: inside the bound."""
    data = Path("/etc/ld.so.cache").read_bytes()
    got, peak = _peak_of(_parse_all, data)
    assert (got, peak <= PEAK_FACTOR * len(data) + SLACK) == (None, True), (peak, len(data))


# -- through the real hook, in a memory cgroup ------------------------------------------------
REAL = {        # the sizes the issue measured (332 KiB: ~2 GB asked for) and more
    "shared-string": lambda img: shared_string(332 << 10, 166 << 10),
    "hwcaps-count": lambda img: hwcaps_count(3 << 20, 64 << 10),
    "newline-sonames": lambda img: newline_sonames(img.read_bytes()),
}


def _lists_libcuda(cache: Path) -> bool:
    out = subprocess.run([LDCONFIG, "-p", "-C", str(cache)], capture_output=True, text=True,
                         timeout=60).stdout
    return "libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1" in out


def _run_in(cg: MemoryCgroup, c: RuncContainer) -> subprocess.CompletedProcess:
    """`runc run` of c with runc (so its hooks) started in cgroup cg."""
    c.write_config()
    c._created = True
    return subprocess.run(cg.wrap([RUNC, "--root", str(c.state_root), "run", "--bundle",
                                   str(c.bundle), c.id]),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


def _hostile_image(tmp_path: Path, kind: str) -> Path:
    img = make_image(tmp_path / "img", "debian")
    cache = img / "etc/ld.so.cache"
    cache.write_bytes(REAL[kind](cache))
    return img


@pytest.mark.parametrize("kind", REAL)
def test_exec_hook_starts_hostile_image_in_a_small_cgroup(tmp_path, a100_host, kind):
    """The exec'd hook (runc -> front -> python) in a 512 MiB memory cgroup, an image
    with a hostile cache: the container starts, its cache is ldconfig's (with the
    driver's libcuda), the hook said nothing, nothing was OOM-killed."""
    img = _hostile_image(tmp_path, kind)
    cfg = hookenv.write_config(tmp_path / "config.toml", a100_host)
    with MemoryCgroup(CGROUP_LIMIT) as cg, RuncContainer(
            tmp_path, rootfs=img, args=["sh", "-c", "echo started"], env=["PATH=/bin", *GPU1],
            hooks={"prestart": [hookenv.hook_entry(cfg)]}) as c:
        r = _run_in(cg, c)
        kills = cg.oom_kills()
    assert (r.returncode, r.stdout, "nvhook" in r.stderr, kills,
            _lists_libcuda(img / "etc/ld.so.cache")) == (0, "started\n", False, 0, True), r.stderr


def test_served_hook_starts_hostile_image_in_a_small_cgroup(tmp_path, a100_host):
    """The same through `nvhook serve` (the server, so its workers, in the cgroup): the
    start succeeds, nothing is OOM-killed, the server is still there."""
    from support.serve import Serve

    img = _hostile_image(tmp_path, "shared-string")
    cfg = hookenv.write_config(tmp_path / "config.toml", a100_host)
    sock = tmp_path / "serve/hook.sock"
    sock.parent.mkdir()
    with MemoryCgroup(CGROUP_LIMIT) as cg:
        front = hookenv.ensure_front()
        server = _serve_in(cg, front, cfg, sock)
        try:
            with RuncContainer(tmp_path, rootfs=img, args=["sh", "-c", "echo started"],
                               env=["PATH=/bin", *GPU1],
                               hooks={"prestart": [hookenv.hook_entry(cfg, socket=str(sock))]}) as c:
                r = c.run(timeout=120)
            statuses = server.statuses(1)
            kills = cg.oom_kills()
            alive = server.proc.poll() is None
        finally:
            server.stop()
    assert (r.returncode, r.stdout, "nvhook" in r.stderr, statuses, kills, alive,
            _lists_libcuda(img / "etc/ld.so.cache")) == (0, "started\n", False, [0], 0, True, True), \
        r.stderr + server.log()


def _serve_in(cg: MemoryCgroup, front: str, cfg: Path, sock: Path, *extra: str):
    """support.serve.Serve, with the server started in cgroup cg."""
    from support import serve as S

    real = S.hookenv.ensure_front
    S.hookenv.ensure_front = lambda: front       # (Serve starts what this names)
    popen = S.subprocess.Popen

    def in_cgroup(argv, *a, **kw):
        return popen(cg.wrap(list(argv)), *a, **kw)

    S.subprocess.Popen = in_cgroup
    try:
        return S.Serve(cfg, sock, *extra)
    finally:
        S.subprocess.Popen = popen
        S.hookenv.ensure_front = real


def test_served_worker_takes_the_image_under_a_ceiling(tmp_path, fresh_sim_host):
    """The worker that sets up a container runs with its data limited to
    ceiling.MEMORY_CEILING and an oom_score_adj of at least 0 (seen while it waits on a
    slow NVML, after it took the request); the server keeps no limit. (This machine
    cannot lower an oom_score_adj, so the server's -500 is not reproduced here:
    test_contain_raises_the_oom_score_never_lowers_it checks the raising.)"""
    from libinject.runtime.ceiling import MEMORY_CEILING
    from support.serve import Serve

    host = fresh_sim_host()
    (host / "etc/nvhook-sim").mkdir(parents=True, exist_ok=True)
    (host / "etc/nvhook-sim/nvml.conf").write_text("delay_ms = 3000\n")
    cfg = hookenv.write_config(tmp_path / "config.toml", host)
    sock = tmp_path / "serve/hook.sock"
    sock.parent.mkdir()
    server = Serve(cfg, sock)
    try:
        with RuncContainer(tmp_path, args=["sh", "-c", "echo started"], env=["PATH=/bin", *GPU1],
                           hooks={"prestart": [hookenv.hook_entry(cfg, socket=str(sock))]}) as c:
            c.write_config()
            c._created = True
            proc = subprocess.Popen([RUNC, "--root", str(c.state_root), "run", "--bundle",
                                     str(c.bundle), c.id], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            seen = _worker_while_busy(server, proc)
            out, err = proc.communicate(timeout=120)
        server_limit = _data_limit(server.proc.pid)
    finally:
        server.stop()
    assert (proc.returncode, out, server_limit, seen) == \
        (0, "started\n", "unlimited", ("0", str(MEMORY_CEILING))), err + server.log()


def _data_limit(pid: int) -> str:
    limits = Path(f"/proc/{pid}/limits").read_text()
    return next(ln.split()[3] for ln in limits.splitlines() if ln.startswith("Max data size"))


def test_contain_raises_the_oom_score_never_lowers_it():
    """ceiling.contain() in a child: an oom_score_adj below the floor is raised to it, one
    above is kept; the data limit is set, and an allocation past it fails (MemoryError)
    instead of growing the process."""
    from libinject.runtime import ceiling

    def child(start: int, floor: int) -> str:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                Path("/proc/self/oom_score_adj").write_text(str(start))
                ceiling.OOM_SCORE_ADJ = floor
                ceiling.contain(64 << 20)
                adj = Path("/proc/self/oom_score_adj").read_text().strip()
                try:
                    b = bytearray(128 << 20)
                    got = f"allocated {len(b)}"
                except MemoryError:
                    got = "MemoryError"
                os.write(w, f"{adj} {_data_limit(os.getpid())} {got}".encode())
            finally:
                os._exit(0)
        os.close(w)
        os.waitpid(pid, 0)
        with os.fdopen(r) as f:
            return f.read()

    assert (child(100, 300), child(500, 300)) == \
        (f"300 {64 << 20} MemoryError", f"500 {64 << 20} MemoryError")


def _worker_while_busy(server, proc: subprocess.Popen) -> tuple[str, str] | None:
    """(oom_score_adj, data limit) of the server's worker once it has taken the request
    (its limit set), polled until runc is done."""
    while proc.poll() is None:
        for pid in server.workers():
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() != "nvhook-worker":
                    continue
                limits = Path(f"/proc/{pid}/limits").read_text()
                adj = Path(f"/proc/{pid}/oom_score_adj").read_text().strip()
            except OSError:
                continue
            data = next(ln.split()[3] for ln in limits.splitlines() if ln.startswith("Max data size"))
            if data != "unlimited":
                return adj, data
        time.sleep(0.005)
    return None


# -- a seeded fuzz of mutated real caches ------------------------------------------------------
FUZZ_SEED = 19
FUZZ_MUTANTS = 150          # per seed cache
FUZZ_FACTOR = 16            # parse + merge + build, times the file's size (+ SLACK)
OURS = (b"libnvhookfuzz.so.1", b"/fuzz/libnvhookfuzz.so.1", 0x0303, 0, 0, 0)


def _libcmp(a: bytes, b: bytes) -> int:
    """glibc's _dl_cache_libcmp, as written in dl-cache.c (digit runs compare as
    numbers, above any other character): > 0 when a sorts after b."""
    i = j = 0
    while i < len(a) and j < len(b):
        if 48 <= a[i] <= 57:
            if 48 <= b[j] <= 57:
                x = i
                while i < len(a) and 48 <= a[i] <= 57:
                    i += 1
                y = j
                while j < len(b) and 48 <= b[j] <= 57:
                    j += 1
                va, vb = int(a[x:i]), int(b[y:j])
                if va != vb:
                    return va - vb
            else:
                return 1
        elif 48 <= b[j] <= 57:
            return -1
        else:
            if a[i] != b[j]:
                return a[i] - b[j]
            i += 1
            j += 1
    return (i < len(a)) - (j < len(b))


def _ref_compare(x, y) -> int:
    """cache.c compare() on discover.ldcache entries (name, flags, hwcap, osversion):
    < 0 when x comes first in the file (descending libcmp, then flags...)."""
    d = _libcmp(y[0], x[0])
    if d:
        return d
    if x[1] != y[1]:
        return y[1] - x[1]
    return 0        # (glibc-hwcaps order: ours has none; stable for the rest)


def _mutants(data: bytes, rng: random.Random):
    """Mutations of a cache: flipped bytes, 32-bit fields set to edge values (offsets,
    counts), a slice repeated or cut, the file truncated."""
    n = len(data)
    edges = [0, 1, 47, 48, n // 2, n - 1, n, n + 1, 0x7FFFFFFF, 0xFFFFFFFF, 1 << 16, 1 << 20]
    for _ in range(FUZZ_MUTANTS):
        b = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            op = rng.choices(range(7), weights=(6, 6, 1, 1, 1, 2, 2))[0]
            at = rng.randrange(len(b)) if b else 0
            if op == 0 and b:
                b[at] ^= 1 << rng.randrange(8)
            elif op == 1 and len(b) >= 4:
                at -= at % 4
                b[at:at + 4] = struct.pack("<I", rng.choice(edges) if rng.random() < 0.7 else
                                           struct.unpack_from("<I", b, rng.randrange(len(b) - 3) & ~3)[0])
            elif op == 2:
                end = min(len(b), at + rng.randrange(1, 256))
                b[at:at] = b[at:end] * rng.randrange(1, 8)
            elif op == 3:
                del b[at:at + rng.randrange(1, 64)]
            elif op == 4:
                del b[rng.randrange(len(b) + 1):]
            elif op == 5:       # strings run together: a window of the file without NULs
                end = min(len(b), at + rng.randrange(1, len(b) // 2 + 2))
                b[at:end] = b[at:end].replace(b"\0", b"l")
            elif len(b) > 48 + 24 * 4:     # many entries name one string (key or value)
                first = rng.randrange((len(b) - 48) // 24)
                field = 48 + first * 24 + rng.choice((4, 8))
                v = b[field:field + 4]
                for i in range(first, min(first + rng.randrange(2, 400), (len(b) - 48) // 24)):
                    b[48 + i * 24 + 4:48 + i * 24 + 12] = v + v
        yield bytes(b)


def _merge_bytes(data: bytes) -> bytes:
    """What merge() makes of an image cache, less the rootfs: parse, check, rank (no
    entry in our folder), insert OURS, rebuild."""
    c = F.parse(data)
    keys = M._Keys()
    M._check_sorted(c, keys)
    bases = M._bases(c)
    return M._combine(c, [b"/fuzz"], bases, [1] * len(bases), [OURS], keys)


def _entries(data: bytes) -> list[tuple]:
    from libinject.discover import ldcache

    return [(os.fsencode(e.name), e.flags, e.hwcap, os.fsencode(e.path))
            for e in ldcache.parse(data)]


@pytest.fixture(scope="module")
def seed_caches(tmp_path_factory) -> list[bytes]:
    tmp = tmp_path_factory.mktemp("seeds")
    return [Path("/etc/ld.so.cache").read_bytes()] + [
        (make_image(tmp / layout, layout) / "etc/ld.so.cache").read_bytes()
        for layout in ("hwcaps", "compat", "duplicates")]


def test_fuzz_mutated_caches(seed_caches):
    """Seeded mutants of real caches (the host's; images with glibc-hwcaps, compat
    format, duplicates): merging OURS into each either falls back (Unsupported, nothing
    else) or gives a cache that glibc's reader (read back independently) lists as the
    mutant's entries with OURS inserted where cache.c's compare puts it; peak memory at
    most FUZZ_FACTOR times the mutant's size. The seeds themselves merge."""
    rng = random.Random(FUZZ_SEED)
    outcomes = {"merged": 0, "fallback": 0}
    bad = []
    for seed in seed_caches:
        for data in [seed, *_mutants(seed, rng)]:
            tracemalloc.start()
            try:
                out = _merge_bytes(data)
            except M.Unsupported:
                out = None
            except Exception as e:  # noqa: BLE001 - the finding, reported below
                out = e
            finally:
                _, peak = tracemalloc.get_traced_memory()
                tracemalloc.stop()
            if isinstance(out, Exception) or peak > FUZZ_FACTOR * len(data) + SLACK:
                bad.append((data, repr(out)[:200], peak))
                continue
            if out is None:
                outcomes["fallback"] += 1
                continue
            outcomes["merged"] += 1
            import functools

            image = _entries(data)
            want = sorted([(OURS[0], OURS[2], 0, OURS[1]), *image],
                          key=functools.cmp_to_key(_ref_compare))
            if _entries(out) != want:
                bad.append((data, "merged cache is not the mutant's entries and ours, in order", peak))
    assert (bad[:3], outcomes["merged"] >= len(seed_caches), outcomes["fallback"] > 0) == \
        ([], True, True), outcomes


# -- musl's .path ------------------------------------------------------------------------------
def _musl(rootfs: Path, folders: list[str]) -> str:
    # runs in in_ns's child
    from libinject.apply import ldconfig
    from libinject.apply.rootfs import RootFS
    from libinject.errors import NvhookError

    root = RootFS(str(rootfs))
    try:
        return ldconfig.update(root, folders)
    except NvhookError as e:
        return f"error: {e}"
    finally:
        root.close()


def test_musl_path_file_larger_than_musl_reads_is_one_error(rootfs):
    """An image's /etc/ld-musl-x86_64.path of 2 MiB (a real one: ~30 bytes) is one
    error naming it, read no further than the bound and left as it was (it was read up to
    1 MiB, split into a string per word, and rewritten cut short)."""
    from libinject.apply.ldconfig import MAX_MUSL_PATH
    from support.applyenv import LIBDIR, in_ns

    (rootfs / "lib/ld-musl-x86_64.so.1").write_text("musl loader")
    path = rootfs / "etc/ld-musl-x86_64.path"
    data = b"/lib\n" + b"/x\n" * (1 << 20)
    path.write_bytes(data)
    got = in_ns(_musl, rootfs, [LIBDIR])
    assert (got, path.read_bytes() == data) == (
        f"error: /etc/ld-musl-x86_64.path in the rootfs: larger than {MAX_MUSL_PATH} bytes", True)


def test_musl_path_file_bytes_are_kept(rootfs):
    """Folders that are not UTF-8 stay the bytes they were (they became U+FFFD)."""
    from support.applyenv import LIBDIR, in_ns

    (rootfs / "lib/ld-musl-x86_64.so.1").write_text("musl loader")
    path = rootfs / "etc/ld-musl-x86_64.path"
    path.write_bytes(b"/lib:/opt/\xff\xfe\n")
    assert in_ns(_musl, rootfs, [LIBDIR]) == "musl"
    assert path.read_bytes() == b"/lib\n/opt/\xff\xfe\n" + LIBDIR.encode() + b"\n"
