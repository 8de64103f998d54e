"""What ldconfig reads of a shared object (glibc elf/readelflib.c, readlib.c): its
DT_SONAME and the cache flags its ELF header gives (x86-64 libc6, x32, or for i386
libc6/plain ELF from DT_NEEDED / PT_INTERP). Files ldconfig skips (not ELF, not ET_DYN,
no dynamic section, another machine) are None here too. For the in-process ld.so.cache
merge (libinject.apply.ldcache_merge), which reads the libraries it mounted."""
from __future__ import annotations

import os
import stat
import struct

from libinject.linux.proc import proc_fd

FLAG_ELF, FLAG_ELF_LIBC6 = 1, 3
FLAG_X8664_LIB64 = 0x0303   # FLAG_X8664_LIB64 | FLAG_ELF_LIBC6
FLAG_X8664_LIBX32 = 0x0803
# readlib.c / sysdeps x86 ldconfig.h: what makes an i386 library "libc6" rather than "ELF"
_LIBC6_NEEDED = frozenset({b"libc.so.6", b"libm.so.6"})
_LIBC6_INTERP = frozenset({b"/lib/ld-linux-x86-64.so.2", b"/lib/ld-linux.so.2",
                           b"/libx32/ld-linux-x32.so.2", b"/lib64/ld-linux-x86-64.so.2"})


class Unsupported(Exception):
    """The merge does not cover this image: run ldconfig (the text says why)."""


_EHDR = {1: struct.Struct("<16xHHIIIIIHHHHHH"), 2: struct.Struct("<16xHHIQQQIHHHHHH")}
_PHDR = {1: struct.Struct("<IIIIIIII"), 2: struct.Struct("<IIQQQQQQ")}
_DYN = {1: struct.Struct("<iI"), 2: struct.Struct("<qQ")}
PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
DT_NULL, DT_NEEDED, DT_STRTAB, DT_SONAME = 0, 1, 5, 14
EM_386, EM_X86_64 = 3, 62


def _cstr(fd: int, off: int, size: int) -> bytes | None:
    """The NUL-terminated string at file offset off (None if it runs off the file)."""
    got = b""
    while off < size and len(got) < 1 << 16:
        chunk = os.pread(fd, 256, off)
        if not chunk:
            break
        end = chunk.find(b"\0")
        if end >= 0:
            return got + chunk[:end]
        got += chunk
        off += len(chunk)
    return None


def read_elf(fd: int, size: int) -> tuple[bytes | None, int] | None:
    """(DT_SONAME or None, cache flags) of the shared object open at fd (size bytes),
    as the x86-64 ldconfig's process_file / process_elf_file read it; None for a file
    it skips (too small, not ELF, not ET_DYN, another machine, no dynamic section or
    string table)."""
    if size < 64:                   # sizeof (Elf64_Ehdr)
        return None
    head = os.pread(fd, 1024, 0)    # the program headers are right behind, as a rule
    if len(head) < 64:
        return None
    if head[:4] != b"\x7fELF":
        if head[0] | head[1] << 8 in (0o413, 0o314):      # a.out ZMAGIC / QMAGIC: libc4
            raise Unsupported("an a.out library")
        return None
    cls = head[4]
    if cls not in (1, 2):
        return None
    e_type, machine, _, _, phoff, _, _, _, _, phnum, _, _, _ = _EHDR[cls].unpack_from(head)
    if machine == EM_X86_64:
        file_flag = FLAG_X8664_LIB64 if cls == 2 else FLAG_X8664_LIBX32
    elif machine == EM_386 and cls == 1:
        file_flag = 0
    else:
        return None                 # "is for unknown machine"
    if e_type != 3:                 # ET_DYN
        return None
    ph = _PHDR[cls]
    end = phoff + phnum * ph.size
    if phnum == 0 or end > size:
        return None
    phdrs = head[phoff:end] if end <= len(head) else os.pread(fd, end - phoff, phoff)
    # the fields, column by column (p_type, p_offset, p_vaddr, p_filesz)
    f = struct.unpack("<" + ph.format[1:] * phnum, phdrs)
    if cls == 2:
        types, offsets, vaddrs, filesz = f[0::8], f[2::8], f[3::8], f[5::8]
    else:
        types, offsets, vaddrs, filesz = f[0::8], f[1::8], f[2::8], f[4::8]
    if PT_DYNAMIC not in types:
        return None
    last = len(types) - 1 - types[::-1].index(PT_DYNAMIC)    # the last one counts
    dyn_off, dyn_size = offsets[last], filesz[last]
    if dyn_size == 0 or dyn_off >= size:
        return None
    flag = FLAG_ELF
    if not file_flag and PT_INTERP in types:
        for t, o in zip(types, offsets):
            if t == PT_INTERP and _cstr(fd, o, size) in _LIBC6_INTERP:
                flag = FLAG_ELF_LIBC6
    dyn = _DYN[cls]
    raw = os.pread(fd, min(dyn_size, size - dyn_off, 1 << 20), dyn_off)
    count = len(raw) // dyn.size
    d = struct.unpack("<" + dyn.format[1:] * count, raw[:count * dyn.size])
    tags, vals = d[0::2], d[1::2]
    if DT_NULL in tags:
        count = tags.index(DT_NULL)
        tags, vals = tags[:count], vals[:count]
    if DT_STRTAB not in tags:
        return None
    val = vals[tags.index(DT_STRTAB)]
    loadoff = next((v - o for t, v, o, fs in zip(types, vaddrs, offsets, filesz)
                    if t == PT_LOAD and v <= val < v + fs), 0)
    strtab = val - loadoff
    if not 0 <= strtab < size:
        return None
    soname = None
    if DT_SONAME in tags:
        soname = _cstr(fd, strtab + vals[tags.index(DT_SONAME)], size)
        if soname is None:
            return None
    if not file_flag and flag == FLAG_ELF:
        for t, v in zip(tags, vals):
            if t == DT_NEEDED and _cstr(fd, strtab + v, size) in _LIBC6_NEEDED:
                flag = FLAG_ELF_LIBC6
                break
    return soname, file_flag or flag


def read_elf_fd(fd: int) -> tuple[os.stat_result | None, tuple[bytes | None, int] | None]:
    """(stat of the file read, its read_elf) through a reopening of fd (an O_PATH fd,
    or any) for reading; (None, None) when it is not a regular file."""
    rfd = os.open(f"self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK,
                  dir_fd=proc_fd())
    try:
        st = os.fstat(rfd)
        if not stat.S_ISREG(st.st_mode):
            return None, None
        return st, read_elf(rfd, st.st_size)
    finally:
        os.close(rfd)
