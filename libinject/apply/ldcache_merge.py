"""ld.so.cache without ldconfig: the container's cache, updated in-process.

After the driver libraries are mounted, the container's loader must find them through
its /etc/ld.so.cache. Running the (sandboxed) ldconfig for that was the largest single
step of a GPU container's start (7-13 ms: fork, namespaces, exec, a scan of every
library directory). Here the image's cache is read, entries for the libraries we
mounted are merged into it, and the result is written back, all through fds of the
rootfs (libinject.apply.rootfs): what glibc's ldconfig would have written, by default.

What ldconfig -f /etc/ld.so.conf -C /etc/ld.so.cache FOLDER... does, and how it is done
here (glibc elf/ldconfig.c, cache.c, stringtable.c, readelflib.c; checked against the
real ldconfig in tests/test_ldcache_merge.py, byte for byte):
- It scans the command-line folders first, then ld.so.conf's, then its built-in ones;
  a directory met twice (same inode) is scanned once, under the name it had first.
  So the image's entries whose directory *is* one of our folders (merged /usr:
  /lib/x86_64-linux-gnu is /usr/lib/x86_64-linux-gnu) are recorded under the folder's
  name, and come first among equal entries; the others keep their order.
- In one directory, one entry per SONAME: our library replaces an image entry with
  the same SONAME in the same folder. In another directory it is kept, after ours.
- An entry is (SONAME, directory/SONAME, flags from the ELF header: x86-64 libc6, x32,
  or for i386 libc6/plain ELF from DT_NEEDED / PT_INTERP), read from the file we
  mounted (its source fd, reopened through /proc/self/fd). Files ldconfig skips (not
  ELF, not ET_DYN, no dynamic section, another machine) are skipped here too. Links
  count as ldconfig counts them: "libcuda.so" -> libcuda.so.1 (ld's -dev link) gets
  an entry of its own; a link named otherwise (libGLX_indirect.so.0) competes with the
  files of its SONAME, the newest name (_dl_cache_libcmp) winning, a file over a link.
- Entries are kept sorted by cache.c's compare(): _dl_cache_libcmp (digit runs compare
  as numbers) descending, then flags, glibc-hwcaps entries first (by subdirectory
  name), hwcap bits, osversion; equal entries in scan order. The loader binary-searches
  the table with the same compare, so the order is what makes our libraries findable.
- The string table is rebuilt as stringtable.c builds it (sorted by reversed string,
  suffixes shared); the extension (generator string, glibc-hwcaps names) is kept.
- The format the image had is kept: new-only ("glibc-ld.so.cache1.1"), or compat (the
  old "ld.so-1.7.0" table holding the new one, as ldconfig -c compat and glibc < 2.32
  write it). Every glibc since 2.2 reads both. (The host's ldconfig >= 2.32 would have
  rewritten a compat cache as new-only.)
- It links SONAME -> file in the folder when the link is missing or wrong. The planner
  already plans those links (edits.symlinks; each one is checked to be there); any it
  did not are made here (RootFS.symlink, journaled like the planned ones).
- The cache is written to a temp file in its directory and renamed over the old one
  (RootFS.write_file: through the resolved /etc fd, O_EXCL|O_NOFOLLOW, never writing
  through a symlink, owned by the rootfs owner, mode 0644; journaled, so rollback and a
  killed apply's replay put the image's cache back). No fsync (ldconfig does one):
  a cache lost to a host crash is rewritten by the next start's hook.

What is different from running ldconfig, by design: the image's cache is taken as the
truth about the image's own libraries. ldconfig rescans every directory, so it would
also add image libraries missing from a stale cache, drop entries of deleted files,
make their missing SONAME links, write /var/cache/ldconfig/aux-cache, and pick an
image file with the same SONAME as a driver library in the same folder when its file
name sorts newer (a driver library baked into the image). The merge keeps the image's
entries as they are and the planned link to the driver's library.

ldconfig runs instead (libinject.apply.ldconfig, its sandbox) whenever the merge does
not cover the image (Unsupported, raised before anything is changed):
- no /etc/ld.so.cache, or not a regular file (symlink, fifo, directory...), larger
  than journal.SAVE_LIMIT, unreadable, or not a cache this module parses completely
  (old format only, big-endian, bad offsets, unknown extension sections, legacy
  hwcap entries, an unsorted table, non-ASCII or absurd SONAMEs: control characters,
  longer than a file name; strings shared more than ldconfig's string table shares them,
  more glibc-hwcaps names than entries, strings no entry names beyond a few). parse()
  bounds its memory and time by the file's size before it allocates anything per entry
  (tests/test_ldcache_hostile.py measures it, and fuzzes it);
- a folder that none of our library mounts is in (CUDA forward-compat directory in
  cuda-compat-mode=ldconfig, CDI's update-ldcache hook), something else mounted into a
  folder (cuda-compat-mode=mount), two folders that are one directory, a folder the
  image's cache does not cover yet that holds libraries other than ours, a planned
  link that is not there (an image file in its way), two of our files whose order
  ldconfig would leave to readdir(), an a.out library;
- a host other than x86-64 (aarch64 and others: not checked against their ldconfig).
musl images never get here (libinject.apply.ldconfig.update_musl).

The knob: ldconfig = "@PATH" (the default "@/sbin/ldconfig") merges, with PATH as
the fallback. ldconfig = "@!PATH" always runs the host's PATH (as before the merge).
A container path (no "@": the image's own ldconfig, chosen on purpose) always runs.
last_fallback says why the last update() ran ldconfig (None: it merged).

Cost (apply() on the tests' simulated a100x8 host, busybox+glibc images, median on
the development VM): 1 GPU utility,compute ~1.7 ms against ~9.6 ms for the sandboxed
ldconfig; 8 GPUs, every capability (51 libraries) ~4 ms against ~12.5 ms; with a
518-library image cache ~7 ms against ~23-27 ms. Most of it: reading the ELF headers
of the mounted files (~20-30 us each), parsing and rebuilding the string table
(linear in the cache), writing it through the journal. Nothing is forked or executed.
"""
from __future__ import annotations

import os
import stat
from itertools import compress, repeat
from operator import itemgetter

from libinject.apply.elf import Unsupported, read_elf_fd
from libinject.apply.ldcache_file import HWCAP_EXTENSION, MAX_NAME, MAX_PATH, Cache, build, parse
from libinject.errors import NvhookError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable, Sequence

    from libinject.apply.rootfs import RootFS
    from libinject.plan.edits import SymlinkEdit

CACHE = "/etc/ld.so.cache"
MAX_CACHE = 1 << 24        # journal.SAVE_LIMIT: the most it saves for rollback
MAX_DIRS = 4096     # directories an image's cache may name (real ones: a few dozen)
# Subdirectories ldconfig would descend into (glibc-hwcaps; legacy hwcap/platform names)
_HWCAP_DIRS = frozenset({"glibc-hwcaps", "tls", "x86_64", "avx512_1", "i386", "i486", "i586",
                         "i686", "haswell", "xeon_phi"})

last_fallback: str | None = None     # why the last ldconfig.update() ran ldconfig (tests, debugging)


# -- what ldconfig compares --------------------------------------------------------------
_DIGITS_TO_NUL = bytes.maketrans(b"0123456789", b"\0" * 10)
_OTHERS_TO_NUL = bytes(b if 0x30 <= b <= 0x39 else 0 for b in range(256))
# _check_sorted's: digits -> NUL (where a head ends), control characters -> 1 (refused)
_MARK = bytes(0 if 0x30 <= b <= 0x39 else 1 if b < 0x20 or b == 0x7F else b for b in range(256))


def _libkey(name: bytes) -> list:
    """A sort key ordering SONAMEs as _dl_cache_libcmp does: digit runs compare as
    numbers and above any other character; a string ends below everything. ASCII only
    (libcmp compares chars signed on x86), digit runs of at most 9 digits (an int).
    Linear in the name (a hostile cache's names are long)."""
    if not name.isascii():
        raise Unsupported(f"non-ASCII SONAME {name!r}")
    marked = name.translate(_DIGITS_TO_NUL)     # digits -> NUL (no NUL in a name)
    digits = name.translate(_OTHERS_TO_NUL)     # anything else -> NUL
    out: list = []
    i, n = 0, len(name)
    while (j := marked.find(b"\0", i)) >= 0:
        # a non-digit run followed by digits: the digit beats whatever the other has there
        out.append(name[i:j] + b"\xff")
        i = digits.find(b"\0", j)
        if i < 0:
            i = n
        if i - j > 9:
            raise Unsupported(f"SONAME {name!r} has a number libcmp cannot compare")
        out.append(int(name[j:i]))
    out.append(name[i:])
    return out


_SEP = {b"": b"", b"\0": b"\xff"}


class _Keys(dict):
    """SONAME -> _libkey, computed when first asked for (most entries never are), or
    found among the host libraries' names remembered (_HOST_KEYS)."""

    def __missing__(self, name: bytes) -> list:
        k = _HOST_KEYS.get(name)
        if k is None:
            k = _libkey(name)
        self[name] = k
        return k


# _libkey of the host libraries' SONAMEs and file names, by name (a pure function of
# it), filled by remember_host_libraries() alone: what a merge compares most is ours.
_HOST_KEYS: dict[bytes, list] = {}


def _is_dso(name: str) -> bool:
    """elf/dl-is_dso.h: a file name ldconfig looks at."""
    return (((name.startswith("lib") or name.startswith("ld-")) and ".so" in name)
            or name.startswith("ld.so.") or name.startswith("ld64.so."))


# -- the libraries we mounted ------------------------------------------------------------
def _elf_of(fd: int) -> tuple[bytes | None, int] | None:
    """read_elf of a library we mounted: fd is the source we attached (open_tree's
    O_PATH fd, or any fd of the file), reopened for reading through /proc/self/fd;
    or what remember_host_libraries() read of the same file, unchanged since."""
    if _FACTS:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            got = _FACTS.get(_identity(st), _UNKNOWN)
            if got is not _UNKNOWN:
                return got      # type: ignore[return-value]
    return read_elf_fd(fd)[1]


# -- the host's libraries, remembered ------------------------------------------------------
# ELF facts (read_elf) of the driver root's libraries, by the identity of the very file
# read: device, inode, size, modification and change times (a file written or replaced
# since is another key, and read again). Filled only by remember_host_libraries(), which
# `nvhook serve` calls with the libraries its own discovery found (in its own mount
# namespace) before it forks workers, so they inherit it; nothing else fills it, and it
# is never written anywhere. A worker's lookups are by fstat of the source fds the
# applier opened on the host side, or of the runtime's mounts of a CDI spec's libraries
# found in the container (live._image_library): a key is the identity of the very inode
# (device, inode, sizes and times the kernel keeps), so a container's own file never
# matches a driver library's facts unless it is that file.
_FACTS: dict[tuple[int, int, int, int, int], tuple[bytes | None, int] | None] = {}
_UNKNOWN = object()
MAX_FACTS = 4096


def _identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def remember_host_libraries(paths: Iterable[str]) -> int:
    """Read and keep in memory the ELF facts of these host library files (discovery's
    Library.path, all under the driver root), for the merges of this process and its
    forks. Each is opened as the applier opens a host source (no symlink followed, an
    O_PATH fd, read only if a regular file); a file that cannot be read, or that changed
    while read, is left out (the merge reads it itself). Returns how many are known."""
    from libinject.linux.resolve import openat2
    from libinject.linux import native

    n = 0
    added = False
    for path in paths:
        if not path.startswith("/"):
            continue
        try:
            pfd = openat2(native.AT_FDCWD, path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC,
                          native.RESOLVE_NO_SYMLINKS | native.RESOLVE_NO_MAGICLINKS)
        except OSError:
            continue
        try:
            before = os.fstat(pfd)
            if not stat.S_ISREG(before.st_mode):
                continue
            key = _identity(before)
            if key in _FACTS:
                n += 1
                continue
            st, facts = read_elf_fd(pfd)
            if st is None or _identity(st) != key or _identity(os.fstat(pfd)) != key:
                continue
        except (OSError, Unsupported):
            continue
        finally:
            os.close(pfd)
        if len(_FACTS) >= MAX_FACTS:
            _FACTS.clear()
            _HOST_KEYS.clear()
        _FACTS[key] = facts
        for name in (facts[0] if facts else None, os.fsencode(os.path.basename(path))):
            if name and name not in _HOST_KEYS:
                try:
                    _HOST_KEYS[name] = _libkey(name)
                except Unsupported:
                    pass
        n += 1
        added = True
    if added:
        _compact()
    return n


def _compact() -> None:
    """The entries made again, one after the other: a lookup writes to the objects it
    finds (reference counts), and each page of the server's a forked worker writes is
    copied; packed, a merge touches a few pages of them, not a few per library."""
    global _FACTS, _HOST_KEYS
    flags: dict[int, int] = {}
    _FACTS = {(*k,): None if v is None else
              (None if v[0] is None else bytes(bytearray(v[0])), flags.setdefault(v[1], v[1]))
              for k, v in _FACTS.items()}
    _HOST_KEYS = {bytes(bytearray(k)): [bytes(bytearray(p)) if isinstance(p, bytes) else p for p in v]
                  for k, v in _HOST_KEYS.items()}


def forget_host_libraries() -> None:
    _FACTS.clear()
    _HOST_KEYS.clear()


# -- the merge ---------------------------------------------------------------------------
def _ident(root: RootFS, path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of a directory of the image (resolved inside the rootfs, as the
    sandboxed ldconfig's stat() resolves it), or None."""
    try:
        fd = root.resolve(path, os.O_PATH | os.O_DIRECTORY)
    except (OSError, NvhookError):
        return None
    try:
        st = os.fstat(fd)
        return st.st_dev, st.st_ino
    finally:
        os.close(fd)


def _read_cache(root: RootFS) -> bytes:
    try:
        fd = root.open_regular(CACHE, follow=False)
    except FileNotFoundError:
        raise Unsupported(f"no {CACHE}") from None
    except (OSError, NvhookError) as e:
        raise Unsupported(f"{CACHE}: {e.strerror if isinstance(e, OSError) else e}") from None
    try:
        size = os.fstat(fd).st_size
        if size > MAX_CACHE:
            raise Unsupported(f"{CACHE} larger than {MAX_CACHE} bytes")
        data = os.pread(fd, size + 1, 0)
    except OSError as e:
        raise Unsupported(f"{CACHE}: {e.strerror}") from None
    finally:
        os.close(fd)
    if len(data) != size:
        raise Unsupported(f"{CACHE} changed while reading it")
    return data


def merge(root: RootFS, folders: Sequence[str], libraries: Iterable[tuple[str, int]],
          links: Iterable[SymlinkEdit] = ()) -> None:
    """Add the libraries we mounted (container path, fd of the source) in `folders` to
    the image's ld.so.cache, as `ldconfig FOLDER...` would. Raises Unsupported before
    changing anything when the merge does not cover the image (run ldconfig then);
    NvhookError if writing fails (the journal undoes what was done)."""
    if os.uname().machine != "x86_64":
        raise Unsupported(f"host {os.uname().machine}: only x86-64 is checked against ldconfig")
    folders = list(dict.fromkeys(folders))
    index = {}
    for r, f in enumerate(folders):
        if not f.startswith("/"):
            raise Unsupported(f"relative folder {f}")
        index[f.rstrip("/") or "/"] = r
    mounted: list[list[tuple[str, int]]] = [[] for _ in folders]
    paths = set()
    for path, fd in libraries:
        d, _, name = path.rpartition("/")
        r = index.get(d or "/")
        if r is not None:
            mounted[r].append((name, fd))
            paths.add(path)
    for r, f in enumerate(folders):
        if not mounted[r]:
            raise Unsupported(f"folder {f} holds none of the libraries we mounted")
    other = [m for m in root.journal.mounts if m not in paths and m.rpartition("/")[0] in index]
    if other:
        raise Unsupported(f"{other[0]} was mounted into a folder (CUDA forward compat?)")

    image = _read_cache(root)
    digest = _digest(image)
    known = _KNOWN.get(digest)
    c = parse(image) if known is None else None
    dfds: list[int] = []
    try:
        for f in folders:
            try:
                dfds.append(root.resolve(f, os.O_PATH | os.O_DIRECTORY))
            except (OSError, NvhookError):
                raise Unsupported(f"folder {f} does not resolve to a directory") from None
        data, make_links = _merge(root, image, digest, c, folders, dfds, mounted, links)
    finally:
        for fd in dfds:
            os.close(fd)
    for target, link in make_links:
        root.symlink(target, link)
    root.write_file(CACHE, data, 0o644)


def _merge(root: RootFS, image: bytes, digest: bytes, c: Cache | None, folders: list[str],
           dfds: list[int], mounted: list[list[tuple[str, int]]], links: Iterable[SymlinkEdit]
           ) -> tuple[bytes, list[tuple[str, str]]]:
    """merge() once the folders are open: the new cache file, and the links to make.
    c: the image's cache parsed (None: a cache _KNOWN, not parsed unless needed)."""
    global _learn
    nf = len(folders)
    ids = [(st.st_dev, st.st_ino) for st in map(os.fstat, dfds)]
    if len(set(ids)) != nf:
        raise Unsupported("two folders are one directory")
    fpaths = [os.fsencode(f.rstrip("/") or "/") for f in folders]
    bases = _KNOWN[digest] if c is None else _bases(c)
    ranks, represented = _ranks(root, bases, ids)
    keys = _Keys()
    if c is not None:
        _check_sorted(c, keys)

    # Ours, per folder, as ldconfig's search_dir sees them: the files we mounted and
    # the planned links to them.
    by_dir: dict[str, dict[str, str]] = {}
    for ln in links:
        d, _, name = ln.link.rpartition("/")
        by_dir.setdefault(d or "/", {})[name] = ln.target
    new: list[tuple] = []
    make_links: list[tuple[str, str]] = []
    for r in range(nf):
        f = folders[r].rstrip("/") or "/"
        got, mk, ours = _scan(f, fpaths[r], r, mounted[r], by_dir.get(f, {}), keys, dfds[r])
        new += got
        make_links += mk
        if r not in represented:
            _only_ours(root, folders[r], ours)

    # The rest is a function of the image's cache and what was found here (its folders'
    # ranks, our entries): made once per image and request in a service (_KNOWN).
    key = (digest, tuple(fpaths), tuple(ranks), tuple(new))
    data = _MERGED.get(key)
    if data is None:
        data = _combine(c if c is not None else parse(image), fpaths, bases, ranks, new, keys)
        _learn = (image, key) if len(image) <= MAX_LEARN else None
    return data, make_links


def _combine(c: Cache, fpaths: list[bytes], bases: Sequence[bytes], ranks: list[int],
             new: list[tuple], keys: _Keys) -> bytes:
    """The merged cache file: c's entries, those of our folders under the folders'
    names (ranks: each entry's folder, len(fpaths) for none; bases: its directory), our
    entries (new) inserted, replacing the image's of the same SONAME and folder.
    Changes c."""
    nf = len(fpaths)
    paths = c.paths
    renamed: dict[tuple[bytes, bytes, int], bytes] = {}     # (entries may share a path)
    for i, (b, r) in enumerate(zip(bases, ranks)):
        if r < nf and fpaths[r] != b:   # ldconfig records it under the name met first
            k = (paths[i], b, r)
            p = renamed.get(k)
            if p is None:
                p = renamed[k] = fpaths[r] + paths[i][len(b):]
            paths[i] = p
    represented = any(r < nf for r in ranks)

    # Drop the image's entries ours replace (one per SONAME and directory); among equal
    # entries, those from our folders first (ldconfig scans them first); insert ours.
    mine = {(x[5], x[0]) for x in new}
    if not mine.isdisjoint(zip(ranks, c.names)):
        keep = [i for i, rn in enumerate(zip(ranks, c.names))
                if c.hwcap[i] or rn not in mine]
        for col in ("names", "paths", "flags", "osversion", "hwcap"):
            old = getattr(c, col)
            setattr(c, col, [old[i] for i in keep])
        ranks = [ranks[i] for i in keep]
    if represented:
        _scan_order(c, ranks)
    for x in new:
        _insert(c, ranks, x, keys)
    return build(c)


def _bases(c: Cache) -> list[bytes]:
    """Each entry's directory (of a glibc-hwcaps entry: the one holding glibc-hwcaps;
    b"?" if its path is not such). Made once per distinct path (entries may share one)."""
    uniq = dict.fromkeys(c.paths)
    base = dict(zip(uniq, map(itemgetter(0), map(bytes.rpartition, uniq, repeat(b"/")))))
    bases = list(map(base.__getitem__, c.paths))
    hw_base: dict[bytes, bytes] = {}
    for i in compress(range(len(c.hwcap)), c.hwcap):
        p = c.paths[i]      # <dir>/glibc-hwcaps/<subdirectory>/<file>
        b = hw_base.get(p)
        if b is None:
            parts = p.rsplit(b"/", 3)
            b = hw_base[p] = parts[0] if len(parts) == 4 and parts[1] == b"glibc-hwcaps" else b"?"
        bases[i] = b
    return bases


def _ranks(root: RootFS, bases: Sequence[bytes], ids: list) -> tuple[list[int], set[int]]:
    """For each of the image's entries (bases: its directory), which of our folders
    (by inode, as ldconfig tells directories apart) its directory is: 0.., or len(ids)
    for none. Returns (ranks, the folders met)."""
    nf = len(ids)
    rank_of = {i: r for r, i in enumerate(ids)}
    distinct = set(bases)
    if len(distinct) > MAX_DIRS:    # one openat2 each: a hostile cache must not cost seconds
        raise Unsupported(f"the cache names {len(distinct)} directories")
    rank: dict[bytes, int] = {}
    for b in distinct:
        rank[b] = rank_of.get(_ident(root, os.fsdecode(b or b"/")), nf) if b[:1] in (b"/", b"") else nf
    return [rank[b] for b in bases], {r for r in rank.values() if r < nf}


# -- merges made once, in a service --------------------------------------------------------
# What a merge costs beyond reading the rootfs (parsing, checking the order, inserting,
# rebuilding the string table: ~3 ms warm for an image cache of 600 entries) depends on
# the image's cache and what was found in the rootfs alone. `nvhook serve` keeps, for
# its workers, the image caches it knows (digest -> each entry's directory: a cache
# parsed and found sorted) and the merges made (key -> the new file). A worker reports
# what it merged afresh (learned()); the server makes it again itself from those inputs
# (learn()), so a report can name a merge, never choose its result.
_KNOWN: dict[bytes, tuple[bytes, ...]] = {}
_MERGED: dict[tuple, bytes] = {}
_learn: tuple[bytes, tuple] | None = None       # this process's merge made afresh
MAX_LEARN = 128 << 10       # image caches larger than this are not reported (real: < 100 KiB)
MAX_LEARN_ENTRIES = 4096    # nor caches of more entries (real: a few hundred; the host's 620)
MAX_LEARN_NEW = 512         # our entries in one merge (8 GPUs, every capability: ~60)
MAX_LEARN_FOLDERS = 8
MAX_KNOWN = 16
MAX_MERGED = 64


def _digest(data: bytes) -> bytes:
    try:
        from _blake2 import blake2b     # hashlib would load OpenSSL first (~2 ms)
    except ImportError:  # pragma: no cover
        from hashlib import blake2b
    return blake2b(data, digest_size=20).digest()


def learned() -> dict | None:
    """The merge this process made afresh (its inputs, as JSON values), or None."""
    if _learn is None:
        return None
    import binascii

    image, (_, fpaths, ranks, new) = _learn
    if len(ranks) > MAX_LEARN_ENTRIES or len(new) > MAX_LEARN_NEW:
        return None
    return {"image": binascii.b2a_base64(image, newline=False).decode(),
            "folders": [p.decode("latin-1") for p in fpaths], "ranks": list(ranks),
            "new": [[so.decode("latin-1"), path.decode("latin-1"), fl, osv, hw, r]
                    for so, path, fl, osv, hw, r in new]}


def learn(report: object) -> bool:
    """Make, here, the merge a worker's learned() names, and keep it (and the image's
    cache as known) for the workers forked from now on. False: not a merge (malformed,
    or not one merge() makes: its inputs are only data here)."""
    import binascii

    try:
        if type(report) is not dict:
            return False
        image = binascii.a2b_base64(report["image"])
        folders, ranks, new = report["folders"], report["ranks"], report["new"]
        if not (type(folders) is list and type(ranks) is list and type(new) is list
                and len(folders) <= MAX_LEARN_FOLDERS and len(new) <= MAX_LEARN_NEW
                and len(ranks) <= MAX_LEARN_ENTRIES
                and all(type(f) is str and len(f) <= MAX_PATH for f in folders)
                and all(type(r) is int for r in ranks)):
            return False
        fpaths = [f.encode("latin-1") for f in folders]
        nf = len(fpaths)
        entries = []
        for x in new:
            if not (type(x) is list and len(x) == 6 and type(x[0]) is str and type(x[1]) is str
                    and len(x[0]) <= MAX_NAME and len(x[1]) <= MAX_PATH
                    and all(type(v) is int for v in x[2:]) and 0 <= x[5] < nf):
                return False
            entries.append((x[0].encode("latin-1"), x[1].encode("latin-1"), *x[2:]))
        if len(image) > MAX_LEARN:
            return False
        digest = _digest(image)
        key = (digest, tuple(fpaths), tuple(ranks), tuple(entries))
        if key in _MERGED and digest in _KNOWN:
            return True
        c = parse(image)
        if len(c.names) > MAX_LEARN_ENTRIES:
            return False
        keys = _Keys()
        _check_sorted(c, keys)
        bases = _bases(c)
        if len(ranks) != len(bases) or not all(0 <= r <= nf for r in ranks):
            return False
        if key not in _MERGED:
            _MERGED[key] = _combine(c, fpaths, bases, list(ranks), entries, keys)
    except (Unsupported, KeyError, TypeError, ValueError, binascii.Error):
        return False
    _KNOWN.pop(digest, None)
    _KNOWN[digest] = tuple(bases)
    while len(_KNOWN) > MAX_KNOWN:
        del _KNOWN[next(iter(_KNOWN))]
    while len(_MERGED) > MAX_MERGED:
        del _MERGED[next(iter(_MERGED))]
    return True


def _scan(f: str, fpath: bytes, r: int, files: list[tuple[str, int]], links: dict[str, str],
          keys: _Keys, dfd: int) -> tuple[list[tuple], list[tuple[str, str]], set[str]]:
    """What ldconfig's search_dir makes of our entries in folder f (open at dfd): the
    cache entries (soname, path, flags, osversion, hwcap, rank), the SONAME links it
    would (re)make, and the names that are ours there. files: (name, fd) of the
    libraries we mounted; links: name -> target, as planned (and made: checked)."""
    info: dict[str, tuple[bytes | None, int]] = {}
    for name, fd in files:
        if _is_dso(name):
            try:
                got = _elf_of(fd)
            except OSError as e:
                raise Unsupported(f"{f}/{name}: {e.strerror}") from None
            if got is not None:
                info[name] = got    # else ldconfig skips it too (not an ELF it knows)
    for name, target in links.items():
        try:
            now = os.readlink(name, dir_fd=dfd)
        except OSError:
            now = None
        if now != target:       # something of the image's was in the way
            raise Unsupported(f"{f}/{name} is not the planned link to {target}")

    def resolve(name: str) -> str | None:
        """The file of ours a planned link leads to (None: not a library)."""
        for _ in range(8):
            if name in info:
                return name
            if name not in links:
                if any(n == name for n, _ in files):
                    return None     # ours, but not a shared object ldconfig reads
                raise Unsupported(f"planned link to {name} in {f}, which is not ours")
            name = links[name]
            if "/" in name:
                raise Unsupported(f"planned link in {f} to {name}, outside the folder")
        raise Unsupported(f"planned links loop in {f}")

    # (name, is_link, soname, flags, file): search_dir's candidates
    cands = [(n, False, so or os.fsencode(n), fl, n) for n, (so, fl) in info.items()]
    for name in links:
        if not _is_dso(name):
            continue
        target = resolve(name)
        if target is None:
            continue
        so, fl = info[target]
        b = os.fsencode(name)
        soname = so or b            # implicit_soname: the link's own name
        # A link named as the SONAME, or the "libfoo.so" link of ld(1), is an entry of
        # its own name; any other link counts as one more file with that SONAME.
        is_link = b == soname or (b.endswith(b".so") and soname.startswith(b))
        cands.append((name, is_link, b if is_link else soname, fl, target))
    best: dict[bytes, tuple] = {}
    for cand in cands:
        had = best.get(cand[2])
        if had is None:
            best[cand[2]] = cand
            continue
        if had[3] != cand[3]:
            raise Unsupported(f"{had[0]} and {cand[0]} in {f}: same SONAME, other flags")
        if had[1] != cand[1]:
            newer = had[1]          # a file wins over a link
        else:
            ka, kb = keys[os.fsencode(had[0])], keys[os.fsencode(cand[0])]
            if ka == kb:
                raise Unsupported(f"{had[0]} and {cand[0]} in {f}: which one ldconfig takes "
                                  "depends on the directory order")
            newer = ka < kb
        if newer:
            best[cand[2]] = cand
    new = []
    make = []
    ours = {n for n, _ in files} | set(links)
    for soname, (name, is_link, _, flags, file) in best.items():
        so = os.fsdecode(soname)
        if "/" in so or so in (".", ".."):
            raise Unsupported(f"SONAME {so!r}")
        ours.add(so)
        if not is_link and so != name:
            # create_links: SONAME -> name, unless it leads to that file already
            now = resolve(so) if (so in links or so in info) else None
            if now != file:
                make.append((name, f"{f}/{so}" if f != "/" else f"/{so}"))
        new.append((soname, fpath + b"/" + soname, flags, 0, 0, r))
    return new, make, ours


def _only_ours(root: RootFS, folder: str, ours: set[str]) -> None:
    """A folder the image's cache has nothing from: ldconfig would scan all of it, so
    it must hold nothing a scan would find but what we put there."""
    try:
        dfd = root.resolve(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise Unsupported(f"folder {folder}: {e.strerror}") from None
    try:
        with os.scandir(dfd) as it:
            for de in it:
                if de.name in ours:
                    continue
                if _is_dso(de.name) or (de.name in _HWCAP_DIRS and de.is_dir(follow_symlinks=False)):
                    raise Unsupported(f"{folder}/{de.name} is not in the image's cache")
    finally:
        os.close(dfd)


def _scan_order(c: Cache, ranks: list[int]) -> None:
    """Among neighbours that compare equal (same SONAME, flags, hwcap, osversion),
    those from our folders first, in folder order, as ldconfig scans the command-line
    folders first; the rest keep their order."""
    names, flags, hw, osv = c.names, c.flags, c.hwcap, c.osversion
    n = len(names)
    i = 0
    while i < n - 1:
        j = i + 1
        while j < n and names[j] == names[i] and flags[j] == flags[i] and hw[j] == hw[i] \
                and osv[j] == osv[i]:
            j += 1
        if j - i > 1 and ranks[i:j] != sorted(ranks[i:j]):
            order = sorted(range(i, j), key=ranks.__getitem__)
            for col in (c.paths, ranks):        # the rest of the run is the same
                col[i:j] = [col[k] for k in order]
        i = j


def _check_sorted(c: Cache, keys: _Keys) -> None:
    """The image's table must be in cache.c's order: the loader's binary search (and
    our insertion) relies on it. Most neighbours differ before their first digit; only
    the others need _dl_cache_libcmp's whole key. Each distinct SONAME is looked at
    once (a hostile cache's entries may all name one long string)."""
    names = c.names
    uniq = list(dict.fromkeys(names))
    if not b"".join(uniq).isascii():
        raise Unsupported("non-ASCII SONAMEs")
    marked = list(map(bytes.translate, uniq, repeat(_MARK)))    # digits -> NUL, controls -> 1
    if b"\1" in b"".join(marked):
        raise Unsupported("a SONAME with a control character")
    # _head() of each: the part before the first digit, + "\xff" if a digit follows
    head = dict(zip(uniq, [h + _SEP[sep] for h, sep, _ in map(bytes.partition, marked, repeat(b"\0"))]))
    heads = list(map(head.__getitem__, names))
    nxt = heads[1:]
    if any(map(bytes.__lt__, heads, nxt)):
        raise Unsupported("the image's cache is not sorted")
    for i in compress(range(len(nxt)), map(bytes.__eq__, heads, nxt)):
        if _cmp_entries(c, i, i + 1, keys) > 0:
            raise Unsupported("the image's cache is not sorted")


def _cmp_entries(c: Cache, i: int, j: int, keys: _Keys) -> int:
    """cache.c compare() of entries i and j: > 0 when i sorts after j. (For entries of
    a glibc-hwcaps subdirectory ldconfig's in-memory hwcap is 0: the subdirectory name
    sorts them; parse() refuses legacy hwcap entries.)"""
    a, b = c.names[i], c.names[j]
    if a != b:
        ka, kb = keys[a], keys[b]
        if ka != kb:
            return 1 if kb > ka else -1
    fa, fb = c.flags[i], c.flags[j]
    if fa != fb:
        return 1 if fa < fb else -1
    ha, hb = c.hwcap[i], c.hwcap[j]
    if ha != hb:
        if not hb:
            return -1           # glibc-hwcaps entries first
        if not ha:
            return 1
        na, nb = c.hwcaps[ha & 0xFFFFFFFF], c.hwcaps[hb & 0xFFFFFFFF]
        if na != nb:
            return 1 if na > nb else -1
    oa, ob = c.osversion[i], c.osversion[j]
    if oa != ob:
        return 1 if ob > oa else -1
    return 0


def _compare(c: Cache, i: int, x: tuple, keys: _Keys) -> int:
    """cache.c compare() of entry i and x (a new entry: hwcap 0, osversion 0): > 0 when
    entry i sorts after x."""
    name = c.names[i]
    if name != x[0]:
        ki, kx = keys[name], keys[x[0]]
        if ki != kx:
            return 1 if kx > ki else -1
    fi = c.flags[i]
    if fi != x[2]:
        return 1 if fi < x[2] else -1
    hw = c.hwcap[i]
    if hw & HWCAP_EXTENSION:
        return -1               # glibc-hwcaps entries first
    if hw:
        return -1               # more hwcap bits first (never here: parse refuses them)
    return -1 if c.osversion[i] else 0


def _insert(c: Cache, ranks: list[int], x: tuple, keys: _Keys) -> None:
    """Insert x where add_to_cache would: after every entry that sorts before it or
    compares equal and comes from an earlier (or the same) folder."""
    lo, hi = 0, len(c.names)
    r = x[5]
    # the binary search: _compare(c, mid, x, keys), inlined (~10 of them per entry)
    names, flags, hwcap, osv = c.names, c.flags, c.hwcap, c.osversion
    xname, xflags = x[0], x[2]
    kx = keys[xname]
    while lo < hi:
        mid = (lo + hi) // 2
        name = names[mid]
        if name != xname and (ki := keys[name]) != kx:
            d = 1 if kx > ki else -1
        elif flags[mid] != xflags:
            d = 1 if flags[mid] < xflags else -1
        elif hwcap[mid] or osv[mid]:
            d = -1
        else:
            d = 0
        if d < 0 or (d == 0 and ranks[mid] <= r):
            lo = mid + 1
        else:
            hi = mid
    # The image's table must be sorted around it, or the loader's binary search (and
    # ours) would miss entries: check the neighbours.
    if lo > 0:
        d = _compare(c, lo - 1, x, keys)
        if d > 0 or (d == 0 and ranks[lo - 1] > r):
            raise Unsupported("the image's cache is not sorted")
    if lo < len(c.names):
        d = _compare(c, lo, x, keys)
        if d < 0 or (d == 0 and ranks[lo] <= r):
            raise Unsupported("the image's cache is not sorted")
    for col, v in ((c.names, x[0]), (c.paths, x[1]), (c.flags, x[2]), (c.osversion, x[3]),
                   (c.hwcap, x[4]), (ranks, r)):
        col.insert(lo, v)
