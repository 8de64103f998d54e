"""Reader for glibc's ld.so.cache (what `ldconfig` writes and `ldconfig -p` prints).

Formats (glibc elf/cache.c, sysdeps/generic/dl-cache.h):
  new:    "glibc-ld.so.cache" "1.1" header (48 bytes), nlibs x 24-byte entries
          {int32 flags; uint32 key, value; uint32 osversion; uint64 hwcap}, strings.
          String offsets are relative to the start of this header.
  old:    "ld.so-1.7.0" header (16 bytes), nlibs x 12-byte entries {int32 flags;
          uint32 key, value}; offsets relative to the end of the entry array.
  compat: an old block, padded to 8 bytes, then a new block (ldconfig -c compat).
We read the new block whenever there is one (it carries hwcaps) and the old one
otherwise. A file that does not parse gives NvhookError, never an exception trace.
"""
from __future__ import annotations

import os
import struct
from _operator import itemgetter     # compiled in: no file to import

from libinject.errors import NvhookError
from libinject.record import record

MAGIC_OLD = b"ld.so-1.7.0"
MAGIC_NEW = b"glibc-ld.so.cache1.1"
_OLD_HEADER = 16          # char magic[11]; (pad 1); uint32 nlibs
_OLD_ENTRY = 12
_NEW_HEADER = 48
_NEW_ENTRY = 24

# dl-cache.h: low byte = library type, next byte = "required" arch bits.
FLAG_TYPE_MASK = 0x00FF
FLAG_ELF_LIBC6 = 0x0003
FLAG_REQUIRED_MASK = 0xFF00
_ARCH_BY_REQUIRED = {
    0x0000: "i386",          # no required bits: the 32-bit x86 (or other 32-bit) libs
    0x0100: "sparc64",
    0x0200: "ia64",
    0x0300: "x86-64",        # FLAG_X8664_LIB64
    0x0400: "s390x",
    0x0500: "ppc64",
    0x0600: "mips64-n32",
    0x0700: "mips64",
    0x0800: "x32",           # FLAG_X8664_LIBX32
    0x0900: "armhf",         # FLAG_ARM_LIBHF
    0x0A00: "aarch64",       # FLAG_AARCH64_LIB64
    0x0B00: "armel",         # FLAG_ARM_LIBSF
    0x0F00: "riscv64-soft",
    0x1000: "riscv64",
    0x1100: "loongarch64-soft",
    0x1200: "loongarch64",
}
# Bit 62 of hwcap: the entry belongs to a glibc-hwcaps subdirectory (x86-64-v3 ...).
HWCAP_EXTENSION = 1 << 62


@record(frozen=True)
class Entry:
    name: str      # key: the SONAME ("libcuda.so.1")
    path: str      # value: the path ldconfig recorded (inside the driver root)
    flags: int
    hwcap: int = 0

    @property
    def arch(self) -> str:
        return _ARCH_BY_REQUIRED.get(self.flags & FLAG_REQUIRED_MASK, f"unknown-{self.flags:#x}")

    @property
    def elf_libc6(self) -> bool:
        return (self.flags & FLAG_TYPE_MASK) == FLAG_ELF_LIBC6

    @property
    def hwcaps_subdir(self) -> bool:
        return bool(self.hwcap & HWCAP_EXTENSION)


def _cstr(data: bytes, off: int, what: str) -> str:
    if not 0 <= off < len(data):
        raise NvhookError(f"{what}: string offset {off} outside the file")
    end = data.find(b"\0", off)
    if end < 0:
        raise NvhookError(f"{what}: unterminated string at offset {off}")
    return os.fsdecode(data[off:end])


def _parse_new(data: bytes, base: int, what: str, keys: tuple[bytes, ...] | None) -> list[Entry]:
    if len(data) - base < _NEW_HEADER:
        raise NvhookError(f"{what}: truncated ld.so.cache header")
    # flags byte: 0 unknown (assume little), 2 little, 3 big endian (dl-cache.h).
    endian_flag = data[base + 28]
    order = ">" if endian_flag == 3 else "<"
    nlibs, len_strings = struct.unpack_from(order + "II", data, base + 20)
    table_end = base + _NEW_HEADER + nlibs * _NEW_ENTRY
    if nlibs > (len(data) - base) // _NEW_ENTRY or table_end > len(data):
        raise NvhookError(f"{what}: truncated ld.so.cache ({nlibs} entries do not fit)")
    rows = struct.iter_unpack(order + "iIIIQ", data[base + _NEW_HEADER:table_end])
    if keys is not None:
        rows = _keyed(list(rows), data, base, keys, what)
    return [Entry(_cstr(data, base + key, what), _cstr(data, base + value, what), flags, hwcap)
            for flags, key, value, _osv, hwcap in rows]


def _parse_old(data: bytes, what: str, keys: tuple[bytes, ...] | None) -> tuple[list[Entry], int]:
    """Returns the old-format entries and where the block after them starts."""
    if len(data) < _OLD_HEADER:
        raise NvhookError(f"{what}: truncated ld.so.cache header")
    (nlibs,) = struct.unpack_from("<I", data, 12)
    table_end = _OLD_HEADER + nlibs * _OLD_ENTRY
    if nlibs > len(data) // _OLD_ENTRY or table_end > len(data):
        raise NvhookError(f"{what}: truncated ld.so.cache ({nlibs} entries do not fit)")
    # A compat file hides the new block in the old "string table": look for it first.
    new_at = (table_end + 7) & ~7
    if data[new_at:new_at + len(MAGIC_NEW)] == MAGIC_NEW:
        return [], new_at
    rows = struct.iter_unpack("<iII", data[_OLD_HEADER:table_end])
    if keys is not None:
        rows = _keyed(list(rows), data, table_end, keys, what)
    return [Entry(_cstr(data, table_end + key, what), _cstr(data, table_end + value, what), flags)
            for flags, key, value in rows], -1


def _keyed(rows: list[tuple], data: bytes, at: int, keys: tuple[bytes, ...], what: str) -> list[tuple]:
    """The rows whose name (the string at `at` + its key offset) starts with one of
    `keys`, found by searching the file for each key rather than decoding every name.
    Raises where a whole parse would: a string offset outside the file or unterminated."""
    if rows:
        top = at + max(max(map(itemgetter(1), rows)), max(map(itemgetter(2), rows)))
        if top > data.rfind(b"\0"):    # _cstr fails on it: past the last NUL, or the file
            raise NvhookError(f"{what}: string offset {top} outside the file or unterminated")
    starts = set()
    for k in keys:
        i = data.find(k, at)
        while i >= 0:
            starts.add(i - at)
            i = data.find(k, i + 1)
    return [r for r in rows if r[1] in starts]


def parse(data: bytes, what: str = "ld.so.cache", keys: tuple[bytes, ...] | None = None) -> list[Entry]:
    """Entries in file order (ldconfig sorts them: the order ld.so searches).
    keys: only the entries whose name starts with one of these (a whole name: with its
    NUL), the others not decoded (a host's cache has ~600 entries, ~2 ms to parse
    whole: the snapshot check wants a few dozen on every container start); what
    fails to parse whole fails here too."""
    if data.startswith(MAGIC_NEW):
        return _parse_new(data, 0, what, keys)
    if data.startswith(MAGIC_OLD):
        entries, new_at = _parse_old(data, what, keys)
        return _parse_new(data, new_at, what, keys) if new_at >= 0 else entries
    raise NvhookError(f"{what}: not an ld.so.cache (unknown magic)")


def load(path: str, keys: tuple[bytes, ...] | None = None) -> list[Entry]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise NvhookError(f"cannot read ld.so.cache {path}: {e.strerror}") from None
    return parse(data, path, keys)


# ----------------------------------------------------------------------------- no cache
# Driver roots without a usable cache (drivers unpacked under /usr/local/nvidia or
# /run/nvidia/driver): search library directories and read DT_SONAME from each ELF.

_EM_FLAGS = {3: 0x0003, 62: 0x0303, 183: 0x0A03, 40: 0x0903, 20: 0x0003, 21: 0x0503, 243: 0x1003}
_EM_X86_64, _ELFCLASS32 = 62, 1
PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_STRTAB, DT_SONAME = 0, 5, 14


def read_elf(path: str) -> tuple[str | None, int] | None:
    """(DT_SONAME or None, ld.so.cache-style flags) of a shared object; None if not ELF."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 52 or head[:4] != b"\x7fELF":
                return None
            is32 = head[4] == _ELFCLASS32
            order = ">" if head[5] == 2 else "<"
            (machine,) = struct.unpack_from(order + "H", head, 18)
            if is32:
                phoff, = struct.unpack_from(order + "I", head, 28)
                phentsize, phnum = struct.unpack_from(order + "HH", head, 42)
                ph_fmt, dyn_fmt = order + "IIIIIIII", order + "iI"
            else:
                phoff, = struct.unpack_from(order + "Q", head, 32)
                phentsize, phnum = struct.unpack_from(order + "HH", head, 54)
                ph_fmt, dyn_fmt = order + "IIQQQQQQ", order + "qQ"
            flags = _EM_FLAGS.get(machine, 0x0003)
            if machine == _EM_X86_64 and is32:
                flags = 0x0803  # x32
            if phnum > 512 or phentsize < struct.calcsize(ph_fmt):
                return None
            f.seek(phoff)
            raw = f.read(phentsize * phnum)
            loads, dynamic = [], None
            for i in range(min(phnum, len(raw) // phentsize)):
                ph = struct.unpack_from(ph_fmt, raw, i * phentsize)
                if is32:  # p_type, p_offset, p_vaddr, p_paddr, p_filesz, ...
                    p_type, p_offset, p_vaddr, p_filesz = ph[0], ph[1], ph[2], ph[4]
                else:     # p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, ...
                    p_type, p_offset, p_vaddr, p_filesz = ph[0], ph[2], ph[3], ph[5]
                if p_type == PT_LOAD:
                    loads.append((p_vaddr, p_offset, p_filesz))
                elif p_type == PT_DYNAMIC:
                    dynamic = (p_offset, p_filesz)
            if dynamic is None:
                return None, flags
            f.seek(dynamic[0])
            dyn = f.read(min(dynamic[1], 1 << 20))
            size = struct.calcsize(dyn_fmt)
            strtab = soname = None
            for i in range(len(dyn) // size):
                tag, val = struct.unpack_from(dyn_fmt, dyn, i * size)
                if tag == DT_NULL:
                    break
                if tag == DT_STRTAB:
                    strtab = val
                elif tag == DT_SONAME:
                    soname = val
            if strtab is None or soname is None:
                return None, flags
            # DT_STRTAB is a virtual address: map it to a file offset through PT_LOAD.
            for vaddr, offset, filesz in loads:
                if vaddr <= strtab < vaddr + filesz:
                    f.seek(offset + (strtab - vaddr) + soname)
                    name = f.read(256).split(b"\0", 1)[0]
                    return (os.fsdecode(name) or None), flags
            return None, flags
    except (OSError, struct.error):
        return None


def search(root: str, dirs: list[str], want) -> list[Entry]:
    """Entries for the regular ELF files in root/dir whose name passes want(name).

    The path recorded is inside the root, as ldconfig would record it."""
    out = []
    for d in dirs:
        try:
            names = sorted(os.listdir(os.path.join(root, d)))
        except OSError:
            continue
        out += [e for name in names if (e := search_entry(root, d, name, want)) is not None]
    return out


def search_entry(root: str, d: str, name: str, want) -> Entry | None:
    """The entry search() makes of the file `name` in root/d, if it makes one."""
    if ".so" not in name or not want(name):
        return None
    host = os.path.join(root, d, name)
    if os.path.islink(host) or not os.path.isfile(host):
        return None
    elf = read_elf(host)
    if elf is None:
        return None
    soname, flags = elf
    return Entry(soname or name, "/" + d.strip("/") + "/" + name, flags)
