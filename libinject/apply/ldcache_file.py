"""The ld.so.cache file (glibc elf/cache.c, stringtable.c): parse() a whole cache,
checking every offset and bounding memory and time by the file's size, into a Cache;
build() one back, as ldconfig writes it. Anything ldconfig would not have written is
Unsupported (the merge then runs ldconfig: libinject.apply.ldcache_merge)."""
from __future__ import annotations

import struct
import sys
from itertools import accumulate, repeat

from libinject.apply.elf import Unsupported

MAGIC_OLD = b"ld.so-1.7.0"
MAGIC_NEW = b"glibc-ld.so.cache1.1"
EXT_MAGIC = 0xEAA42174      # cache_extension_magic, (uint32_t) -358342284
EXT_GENERATOR, EXT_HWCAPS = 0, 1
HWCAP_EXTENSION = 1 << 62   # DL_CACHE_HWCAP_EXTENSION: a glibc-hwcaps subdirectory entry
_NEW_HEAD = struct.Struct("<20sIIB3xI12x")  # magic+version, nlibs, len_strings, flags, extension
_NEW_ENTRY = struct.Struct("<iIIIQ")        # flags, key, value, osversion, hwcap
_OLD_HEAD = struct.Struct("<11sxI")
_OLD_ENTRY = struct.Struct("<iII")
_EXT_HEAD = struct.Struct("<II")
_EXT_SECTION = struct.Struct("<IIII")       # tag, flags, offset, size
_EXT_FULL = _EXT_HEAD.size + 2 * _EXT_SECTION.size   # cache_extension_size: every tag
MAX_NAME = 255      # a SONAME longer than a file name (NAME_MAX) is no library ldconfig met
MAX_PATH = 4095     # nor a path longer than PATH_MAX
STRING_COPIES = 4   # the strings entries name, copied: at most this many times the table
MAX_ORPHANS = 64    # strings in the table no entry names (ldconfig's: unused hwcaps dirs)


class Cache:
    """A parsed ld.so.cache, as much as rewriting it needs; its entries column by
    column, in file order."""

    def __init__(self) -> None:
        self.compat = False          # old table in front (ldconfig -c compat)
        self.endian = 2              # the new header's flags byte (0: unknown, 2: little)
        self.names: list[bytes] = []     # keys: SONAMEs
        self.paths: list[bytes] = []     # values
        self.flags: list[int] = []
        self.osversion: list[int] = []
        self.hwcap: list[int] = []
        self.hwcaps: list[bytes] = []    # glibc-hwcaps subdirectory names, by index
        self.extension = False
        self.generator: bytes | None = None
        self.orphans: list[bytes] = []   # strings in the table no entry uses (hwcaps dirs)


def parse(data: bytes) -> Cache:
    """Parse a whole cache file, checking every offset; Unsupported if anything is not
    as ldconfig writes it (a hostile image's bytes are only ever data here). Memory and
    time are bounded by len(data) before anything is allocated for an entry: the entries
    are read as columns of the file's own bytes, each string the entries name is copied
    once however many entries name it, none longer than MAX_PATH, and all of them at most
    STRING_COPIES times the string table."""
    c = Cache()
    if data.startswith(MAGIC_NEW):
        base = 0
    elif data.startswith(MAGIC_OLD):
        if len(data) < _OLD_HEAD.size:
            raise Unsupported("truncated cache")
        (n_old,) = struct.unpack_from("<I", data, 12)
        if n_old > (len(data) - _OLD_HEAD.size) // _OLD_ENTRY.size:
            raise Unsupported("truncated cache")
        base = (_OLD_HEAD.size + n_old * _OLD_ENTRY.size + 7) & ~7
        if data[base:base + len(MAGIC_NEW)] != MAGIC_NEW:
            raise Unsupported("old-format cache (no new table in it)")
        c.compat = True
    else:
        raise Unsupported("not an ld.so.cache")
    if len(data) - base < _NEW_HEAD.size:
        raise Unsupported("truncated cache")
    _, n, len_strings, c.endian, ext = _NEW_HEAD.unpack_from(data, base)
    if c.endian not in (0, 2) or sys.byteorder != "little":
        raise Unsupported("cache not little-endian")
    lo = _NEW_HEAD.size + n * _NEW_ENTRY.size       # the strings, from the new header
    hi = lo + len_strings
    if n == 0 or n > len(data) // _NEW_ENTRY.size or base + hi > len(data):
        raise Unsupported("empty or truncated cache")
    table = data[base + lo:base + hi]
    if table[-1:] != b"\0":
        raise Unsupported("string table not terminated")
    # The entries' fields, column by column, straight from the file's bytes (24-byte
    # entries, 8-aligned: int32 flags, uint32 key, value, osversion, uint64 hwcap).
    with memoryview(data)[base + _NEW_HEAD.size:base + lo] as raw:
        with raw.cast("I") as words, raw.cast("i") as ints, raw.cast("Q") as quads:
            keys, values = words[1::6].tolist(), words[2::6].tolist()
            c.flags, c.osversion, c.hwcap = ints[0::6].tolist(), words[3::6].tolist(), quads[2::3].tolist()
    if min(keys) < lo or min(values) < lo or max(keys) >= hi or max(values) >= hi:
        raise Unsupported("string offset outside the string table")
    hw_offs: list[int] = []
    if ext:
        c.extension = True
        hw_offs = _parse_extension(c, data, ext, n)
        if hw_offs and (min(hw_offs) < lo or max(hw_offs) >= hi):
            raise Unsupported("glibc-hwcaps name outside the string table")
    refs = set(keys)
    refs.update(values, hw_offs)
    strings = _strings(table, lo, refs)
    c.names = list(map(strings.__getitem__, keys))
    c.paths = list(map(strings.__getitem__, values))
    c.hwcaps = list(map(strings.__getitem__, hw_offs))
    if not all(c.names) or not all(c.paths):
        raise Unsupported("an empty name or path")
    if max(map(len, c.names)) > MAX_NAME or max(map(len, c.hwcaps), default=0) > MAX_NAME:
        raise Unsupported("a name or path longer than ldconfig writes")
    used = set()
    for hw in set(c.hwcap):
        if hw & HWCAP_EXTENSION:
            used.add(hw & 0xFFFFFFFF)
        elif hw:
            raise Unsupported("legacy hwcap entries")
    if used != set(range(len(c.hwcaps))) or c.hwcaps != sorted(c.hwcaps):
        raise Unsupported("glibc-hwcaps section not as ldconfig writes it")
    # Strings the table holds that nothing refers to (names of glibc-hwcaps
    # subdirectories without libraries): ldconfig adds them again, so keep them. It
    # writes a few; a table of many is not its (and splitting it would cost more than it).
    n_chunks = table.count(b"\0")
    if n_chunks > len(refs) + MAX_ORPHANS:
        raise Unsupported("strings in the table that no entry uses")
    if n_chunks > len(refs) - n:   # else every chunk is some entry's path
        chunks = table[:-1].split(b"\0")
        starts = map(int.__add__, accumulate(map(len, chunks), initial=lo), range(len(chunks)))
        c.orphans = [s for s, at in zip(chunks, starts) if at not in refs and s]
        if max(map(len, c.orphans), default=0) > MAX_PATH:
            raise Unsupported("a name or path longer than ldconfig writes")
    return c


def _strings(table: bytes, lo: int, offsets: set[int]) -> dict[int, bytes]:
    """offset -> the string there, for each offset (all inside the NUL-terminated
    table, which starts at offset lo). In offset order: a string's end found once
    serves every offset inside it (a tail, as stringtable.c shares them), so no byte of
    the table is searched twice; each string is copied once, and Unsupported comes
    before a string longer than MAX_PATH, or more than STRING_COPIES times the table in
    all, is copied (ldconfig's tables copy to < 2.5 times: a path, its SONAME as a tail)."""
    out: dict[int, bytes] = {}
    budget = STRING_COPIES * len(table)
    find = table.find
    end = -1
    for o in sorted(offsets):
        i = o - lo
        if i > end:
            end = find(b"\0", i)       # >= 0: the table ends with a NUL
        budget -= end - i
        if end - i > MAX_PATH:
            raise Unsupported("a name or path longer than ldconfig writes")
        if budget < 0:
            raise Unsupported("strings shared more than ldconfig shares them")
        out[o] = table[i:end]
    return out


def _parse_extension(c: Cache, data: bytes, off: int, n: int) -> list[int]:
    """Read the extension at off (generator string, glibc-hwcaps section) of a cache of
    n entries; returns the glibc-hwcaps names' string offsets. Each of those names is
    some entry's subdirectory (parse checks), so there are at most n."""
    if off % 4 or off + _EXT_HEAD.size > len(data):
        raise Unsupported("bad extension offset")
    magic, count = _EXT_HEAD.unpack_from(data, off)
    if magic != EXT_MAGIC or count > 2 or off + _EXT_HEAD.size + count * _EXT_SECTION.size > len(data):
        raise Unsupported("bad extension directory")
    hw_offs: list[int] | None = None
    for i in range(count):
        tag, _flags, s_off, size = _EXT_SECTION.unpack_from(data, off + _EXT_HEAD.size + i * _EXT_SECTION.size)
        if s_off + size > len(data):
            raise Unsupported("extension section outside the file")
        if tag == EXT_GENERATOR and c.generator is None:
            if size > MAX_PATH:
                raise Unsupported("extension section larger than ldconfig writes")
            c.generator = data[s_off:s_off + size]
        elif tag == EXT_HWCAPS and hw_offs is None and size % 4 == 0:
            if size // 4 > n:
                raise Unsupported("more glibc-hwcaps names than entries")
            hw_offs = list(struct.unpack_from(f"<{size // 4}I", data, s_off))
        else:
            raise Unsupported(f"unknown extension section {tag}")
    if c.generator is None:
        raise Unsupported("extension without a generator")
    return hw_offs or []


def build(c: Cache) -> bytes:
    """The file ldconfig's save_cache writes for c's entries (in their order)."""
    strings = set(c.names)
    strings.update(c.paths, c.hwcaps, c.orphans)
    # stringtable_finalize: reversed strings in descending order; a string that ends
    # the one before it is stored inside it (tail merging).
    offs: dict[bytes, int] = {}
    chunks = []
    nxt = 0
    prev = b"\0"        # ends no string (none holds a NUL)
    prev_off = 0
    for _, s in sorted(zip(map(bytes.__getitem__, strings, repeat(_BACKWARDS)), strings),
                       reverse=True):
        if prev.endswith(s):
            o = prev_off + len(prev) - len(s)
        else:
            o = nxt
            chunks.append(s)
            nxt += len(s) + 1
        offs[s] = o
        prev, prev_off = s, o
    chunks.append(b"")
    table = b"\0".join(chunks)
    n = len(c.names)
    str_off = _NEW_HEAD.size + n * _NEW_ENTRY.size
    keys = [str_off + offs[s] for s in c.names]
    values = [str_off + offs[s] for s in c.paths]
    out = []
    old_size = 0
    if c.compat:
        n_old = (n + 1) & ~1        # even: the new header stays 8-aligned after it
        out.append(_OLD_HEAD.pack(MAGIC_OLD, n_old))
        out.append(b"".join(map(_OLD_ENTRY.pack, c.flags, keys, values)))
        if n_old > n:               # the last entry twice, as ldconfig pads it
            out.append(_OLD_ENTRY.pack(c.flags[-1], keys[-1], values[-1]))
        old_size = _OLD_HEAD.size + n_old * _OLD_ENTRY.size
    ext = 0
    if c.extension:
        ext = (old_size + str_off + len(table) + 3) & ~3
    out.append(_NEW_HEAD.pack(MAGIC_NEW, n, len(table), c.endian, ext))
    out.append(b"".join(map(_NEW_ENTRY.pack, c.flags, keys, values, c.osversion, c.hwcap)))
    out.append(table)
    if c.extension:
        gen = c.generator or b""
        out.append(b"\0" * (ext - old_size - str_off - len(table)))
        hw_off = ext + _EXT_FULL
        hw_size = 4 * len(c.hwcaps)
        sections = [(EXT_GENERATOR, 0, hw_off + hw_size if c.hwcaps else hw_off - _EXT_SECTION.size,
                     len(gen))]
        if c.hwcaps:
            sections.append((EXT_HWCAPS, 0, hw_off, hw_size))
        out.append(_EXT_HEAD.pack(EXT_MAGIC, len(sections)))
        out += [_EXT_SECTION.pack(*s) for s in sections]
        out += [struct.pack("<I", str_off + offs[h]) for h in c.hwcaps]
        out.append(gen)
    return b"".join(out)


_BACKWARDS = slice(None, None, -1)
