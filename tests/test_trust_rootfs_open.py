"""Trust boundaries, class 5: no image file is opened by name after a check.

Saving the image's /etc/ld.so.cache (before ldconfig rewrites it) or its musl .path file
(before we replace it) used to lstat the name, then open() it by name: an image that
swaps a device node in between got it opened, and read, by host root (with CAP_MKNOD a
container read a host block device this way). Now every image file is looked up once
with O_PATH, its type checked on that fd, and only a regular file is reopened, through
/proc/self/fd of that very inode.

The race is run for real: a thread swaps the file with a char device node (1:3, like
/dev/null) with renameat2(RENAME_EXCHANGE), as fast as it can, while a child applies
again and again; an inotify watch on the device node sees every open() of it.
"""
from __future__ import annotations

import ctypes
import os
import stat
import struct
import threading
from pathlib import Path

from libinject.errors import NvhookError
from support.applyenv import in_ns, make_host

AT_FDCWD = -100
RENAME_EXCHANGE = 2
IN_OPEN = 0x20
IN_ACCESS = 0x01
MUSL_PATH = "etc/ld-musl-x86_64.path"
_libc = ctypes.CDLL(None, use_errno=True)


class _Swapper:
    """Swap `path` with a device node, in a loop, in a thread; the node keeps an extra
    name (keep) so an apply that renames over `path` cannot lose it."""

    def __init__(self, path: Path):
        self.path, self.other, self.keep = path, path.with_name(".swap-" + path.name), \
            path.with_name(".dev-" + path.name)
        os.mknod(self.keep, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        os.link(self.keep, self.other)
        self.dev_ino = os.lstat(self.keep).st_ino
        self.stop = threading.Event()
        self.swaps = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        a, b = bytes(self.path), bytes(self.other)
        n = 0
        while not self.stop.is_set():
            if _libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) == 0:
                self.swaps += 1
            n += 1
            if n % 64 == 0:
                self._repair()

    def _repair(self) -> None:
        """Both names present, the device under one of them (an apply's rename may
        have replaced it: it renames its new file over the name)."""
        try:
            inos = [os.lstat(p).st_ino if os.path.lexists(p) else None for p in (self.path, self.other)]
            if self.dev_ino not in inos:
                tmp = self.other.with_name(".relink")
                os.link(self.keep, tmp)
                os.rename(tmp, self.other if inos[0] is not None else self.path)
            for p in (self.path, self.other):
                if not os.path.lexists(p):
                    p.write_bytes(b"/lib\n")
        except OSError:
            pass


def _watch(node: Path) -> int:
    fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert fd >= 0
    assert _libc.inotify_add_watch(fd, bytes(node), IN_OPEN | IN_ACCESS) >= 0
    return fd


def _events(fd: int) -> list[int]:
    masks = []
    while True:
        try:
            buf = os.read(fd, 65536)
        except BlockingIOError:
            return masks
        off = 0
        while off < len(buf):
            _wd, mask, _cookie, size = struct.unpack_from("iIII", buf, off)
            masks.append(mask)
            off += 16 + size


def _saves(rootfs: Path, n: int) -> set[str]:
    """The two paths that save an image file for rollback, called directly, n times."""
    from libinject.apply.rootfs import RootFS
    errors = set()
    for _ in range(n):
        r = RootFS(str(rootfs))
        try:
            r.preserve("/etc/ld.so.cache")              # before ldconfig rewrites it
            r.write_file(f"/{MUSL_PATH}", b"/lib\n")    # replaces the image's musl path
        except NvhookError as e:
            errors.add(str(e).split(":")[0])
        finally:
            r.journal.commit()
            r.close()
    return errors


def _applies(rootfs: Path, edits, n: int) -> set[str]:
    """Full applies of a musl image (its .path file gets our folder: saved, replaced)."""
    from libinject.apply.live import apply
    errors = set()
    for _ in range(n):
        try:
            apply(edits, str(rootfs))
        except NvhookError as e:
            errors.add(str(e))
    return errors


def test_swapped_in_device_node_never_opened(rootfs, tmp_path):
    (rootfs / "etc/ld.so.cache").write_bytes(b"the image's cache")
    (rootfs / MUSL_PATH).write_text("/lib\n/usr/lib\n")
    edits = make_host(tmp_path / "drv")
    swappers = [_Swapper(rootfs / "etc/ld.so.cache"), _Swapper(rootfs / MUSL_PATH)]
    watches = [_watch(s.keep) for s in swappers]
    try:
        for s in swappers:
            s.thread.start()
        errors = in_ns(_saves, rootfs, 3000)
        errors |= in_ns(_applies, rootfs, edits, 20)
    finally:
        for s in swappers:
            s.stop.set()
            s.thread.join(timeout=10)
    opened = [_events(w) for w in watches]
    for w in watches:
        os.close(w)
    assert all(s.swaps > 1000 for s in swappers), [s.swaps for s in swappers]
    print(f"swaps {[s.swaps for s in swappers]}; apply errors (the image racing itself): "
          f"{sorted(errors)[:3]}")
    assert opened == [[], []], "a device node of the image was opened by the applier"
