"""What spares copy ahead: the pages of the server's that requests write.

Pre-faulted spares: a worker is a fork of the server, so every page of the server's it
writes (a refcount, an allocator's free list) is copied on that first write, a fault
(~900 of them, ~4.5 ms of a 1-GPU start's CPU on the development VM). The pages requests
write are much the same each time: a worker, once its status is sent, reports which
pages it holds copies of (/proc/self/pagemap: present, anonymous, mapped by it alone;
the first LEARN_FIRST workers, then one in LEARN_EVERY), the server keeps their union
(in memory, at most MAX_PREFAULT pages: addresses in its own address space, nothing
else) and each spare copies those pages while it waits (MADV_POPULATE_WRITE: faulted in
writable, nothing written), stopping as soon as a request comes. From its fork until
then, the server has it run SCHED_IDLE (CPU nobody else wants: never at the expense of a
start in flight, nor of the runtime going on with the container after one), and gives it
normal priority back as it hands it a request; a worker goes back to SCHED_IDLE once its
status is sent (what is left of it is its report and its exit, unmapping its copy of the
server's address space). Spares and workers run with the cyclic GC off (a collection
walks, and so copies, the inherited heap; a worker lives for one request).
"""
from __future__ import annotations

import os
import select
import socket

PAGE = os.sysconf("SC_PAGE_SIZE")
MAX_PREFAULT = 4096             # pages a spare copies ahead at most (16 MiB); beyond: relearn
PREFAULT_STEP = 64              # pages a spare copies between two looks for a request
LEARN_FIRST = 8                 # workers report their copied pages: the first ones, then
LEARN_EVERY = 16                # every 16th (the page scan is ~1 ms after the status)
PREFAULTING = b"P"              # spare -> server: set up, pre-faulting (its CPU may go idle)
MAX_MAPPING_PAGES = 1 << 16     # a worker's mappings larger than this (256 MiB) are not scanned
MAX_USER_PAGE = (1 << 47) // PAGE   # x86-64's user address space: no report names a page above

# pagemap entry's top byte: bit 63 present (0x80), 61 file page or shared anonymous (0x20),
# 56 mapped by this process alone (0x01): a page of our own, copied or new.
_OWN_PAGE = bytes(1 if b & 0xA1 == 0x81 else 0 for b in range(256))


def copied_pages() -> list[tuple[int, int]]:
    """Runs (first page number, count) of the pages of our private writable mappings that
    this process holds its own copy of: in a worker, the pages of the server's it wrote
    (and pages new since the fork). Stacks and the kernel's [vvar]-like mappings aside."""
    from libinject.linux import proc

    dfd = proc.proc_fd()
    fd = os.open("self/maps", os.O_RDONLY | os.O_CLOEXEC, dir_fd=dfd)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    runs: list[tuple[int, int]] = []
    fd = os.open("self/pagemap", os.O_RDONLY | os.O_CLOEXEC, dir_fd=dfd)
    try:
        for line in b"".join(chunks).splitlines():
            fields = line.split(None, 5)
            if len(fields) < 5 or fields[1][1:2] != b"w" or fields[1][3:4] != b"p":
                continue
            name = fields[5].strip() if len(fields) > 5 else b""
            if name.startswith(b"[") and name != b"[heap]":
                continue
            lo, _, hi = fields[0].partition(b"-")
            first, end = int(lo, 16) // PAGE, int(hi, 16) // PAGE
            if not 0 < end - first <= MAX_MAPPING_PAGES:
                continue
            own = os.pread(fd, (end - first) * 8, first * 8)[7::8].translate(_OWN_PAGE)
            i = own.find(1)
            while i >= 0:
                j = own.find(0, i)
                if j < 0:
                    j = len(own)
                runs.append((first + i, j - i))
                i = own.find(1, j)
    finally:
        os.close(fd)
    return runs


def _as_runs(pages: list[int]) -> list[tuple[int, int]]:
    """Sorted page numbers as (first, count) runs."""
    runs: list[tuple[int, int]] = []
    for p in pages:
        if runs and runs[-1][0] + runs[-1][1] == p:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((p, 1))
    return runs


def populate_write_works() -> bool:
    """Whether this kernel takes MADV_POPULATE_WRITE (5.14), tried on a page of ours."""
    import mmap

    from libinject.linux import native

    m = mmap.mmap(-1, PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        return native.populate_write(native.address_of(m), PAGE) == 0
    finally:
        m.close()


def prefault(runs: list[tuple[int, int]], sock: socket.socket | None = None) -> int:
    """Copy these pages of ours now (MADV_POPULATE_WRITE faults them in as a write would,
    writing nothing); stops early when sock becomes readable (a request: serve it
    first). Returns the number of pages asked for. A run no longer mapped (ENOMEM) is
    only pages left to be copied when written."""
    from libinject.linux.native import populate_write

    done = since = 0
    for first, n in runs:
        for at in range(first, first + n, PREFAULT_STEP):
            if sock is not None and since >= PREFAULT_STEP:
                since = 0
                if select.select([sock], [], [], 0)[0]:
                    return done
            k = min(PREFAULT_STEP, first + n - at)
            populate_write(at * PAGE, k * PAGE)
            done += k
            since += k
    return done
