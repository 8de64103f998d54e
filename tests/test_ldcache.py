"""ld.so.cache parser against caches written by the real ldconfig, and ELF SONAME reading."""
from __future__ import annotations

import os
import random
import re
import struct
import subprocess
from pathlib import Path

import pytest

from libinject.discover import ldcache
from libinject.errors import NvhookError
from support.simhost import compile_lib

# name -> (dir inside the root, soname, -m32?)
LAYOUTS = {
    "debian": [("usr/lib/x86_64-linux-gnu", "libnvidia-ml.so.1", False),
               ("usr/lib/x86_64-linux-gnu", "libcuda.so.1", False),
               ("usr/lib/i386-linux-gnu", "libcuda.so.1", True),
               ("usr/lib/i386-linux-gnu", "libnvidia-ml.so.1", True)],
    "rpm": [("usr/lib64", "libnvidia-ml.so.1", False), ("usr/lib64", "libGLX_nvidia.so.0", False),
            ("usr/lib", "libGLX_nvidia.so.0", True)],
    "local-nvidia": [("usr/local/nvidia/lib64", "libnvidia-ml.so.1", False),
                     ("usr/local/nvidia/lib64", "libnvidia-encode.so.1", False),
                     ("usr/local/nvidia/lib", "libnvidia-encode.so.1", True)],
    "hwcaps": [("usr/lib/x86_64-linux-gnu", "libfoo.so.1", False),
               ("usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3", "libfoo.so.1", False)],
    "many": [("usr/lib/x86_64-linux-gnu", f"libnvidia-x{i}.so.{i}", False) for i in range(60)],
}


def _lib(root: Path, d: str, soname: str, m32: bool, version: str = "550.163.01") -> Path:
    return compile_lib(root / d / (soname.split(".so")[0] + ".so." + version), soname, m32)


def _build(tmp: Path, layout: str, fmt: str) -> Path:
    root = tmp / f"{layout}-{fmt}"
    for d, soname, m32 in LAYOUTS[layout]:
        _lib(root, d, soname, m32)
    dirs = sorted({d for d, _, _ in LAYOUTS[layout] if "glibc-hwcaps" not in d})
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "etc/ld.so.conf").write_text("".join(f"/{d}\n" for d in dirs))
    subprocess.run(["ldconfig", "-r", str(root), "-c", fmt], check=True, capture_output=True, timeout=60)
    return root


def _ldconfig_p(root: Path) -> set[tuple[str, str, str]]:
    """(name, arch, path) as `ldconfig -p` prints them."""
    p = subprocess.run(["ldconfig", "-r", str(root), "-p", "-C", "/etc/ld.so.cache"],
                       check=True, capture_output=True, text=True, timeout=60).stdout
    out = set()
    for m in re.finditer(r"^\s+(\S+) \(([^)]*)\) => (\S+)$", p, re.M):
        flags = m[2]
        arch = "x86-64" if "x86-64" in flags else "aarch64" if "AArch64" in flags else "i386"
        out.add((m[1], arch, m[3]))
    return out


@pytest.mark.parametrize("fmt", ["new", "old", "compat"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_matches_ldconfig(tmp_path, layout, fmt):
    root = _build(tmp_path, layout, fmt)
    data = (root / "etc/ld.so.cache").read_bytes()
    assert data.startswith(ldcache.MAGIC_NEW if fmt == "new" else ldcache.MAGIC_OLD)
    entries = ldcache.load(str(root / "etc/ld.so.cache"))
    got = {(e.name, e.arch, e.path) for e in entries}
    assert got == _ldconfig_p(root)
    assert len(entries) == len(got)
    # 32-bit entries carry no "required" arch bits; 64-bit ones FLAG_X8664_LIB64.
    for e in entries:
        assert e.flags & 0xFF00 == (0 if e.arch == "i386" else 0x0300)


def test_i386_entries_from_m32_libs(tmp_path):
    root = _build(tmp_path, "debian", "new")
    by = {(e.name, e.arch): e for e in ldcache.load(str(root / "etc/ld.so.cache"))}
    assert by[("libcuda.so.1", "i386")].path == "/usr/lib/i386-linux-gnu/libcuda.so.1"
    assert by[("libcuda.so.1", "x86-64")].path == "/usr/lib/x86_64-linux-gnu/libcuda.so.1"


def test_hwcaps_subdir_entries_flagged(tmp_path):
    root = _build(tmp_path, "hwcaps", "new")
    entries = ldcache.load(str(root / "etc/ld.so.cache"))
    sub = [e for e in entries if "glibc-hwcaps" in e.path]
    plain = [e for e in entries if "glibc-hwcaps" not in e.path]
    assert sub and all(e.hwcaps_subdir for e in sub)
    assert plain and not any(e.hwcaps_subdir for e in plain)


def _synthetic(entries: list[tuple[str, str, int]]) -> bytes:
    """A new-format cache written by hand (for arches this host's ldconfig cannot index)."""
    strings = b""
    offs = []
    header = 48 + 24 * len(entries)
    for name, path, _ in entries:
        k = header + len(strings)
        strings += name.encode() + b"\0"
        v = header + len(strings)
        strings += path.encode() + b"\0"
        offs.append((k, v))
    out = ldcache.MAGIC_NEW + struct.pack("<II", len(entries), len(strings)) + bytes([2, 0, 0, 0])
    out += struct.pack("<I", 0) + bytes(12)
    for (k, v), (_, _, flags) in zip(offs, entries):
        out += struct.pack("<iIIIQ", flags, k, v, 0, 0)
    return out + strings


def test_aarch64_and_other_arches():
    data = _synthetic([("libcuda.so.1", "/usr/lib/aarch64-linux-gnu/libcuda.so.1", 0x0A03),
                       ("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", 0x0303),
                       ("libcuda.so.1", "/usr/libx32/libcuda.so.1", 0x0803),
                       ("libcuda.so.1", "/usr/lib/arm-linux-gnueabihf/libcuda.so.1", 0x0903)])
    assert [e.arch for e in ldcache.parse(data)] == ["aarch64", "x86-64", "x32", "armhf"]


def test_big_endian_cache():
    data = bytearray(_synthetic([("libcuda.so.1", "/usr/lib64/libcuda.so.1", 0x0A03)]))
    # rewrite the counts and the entry big-endian, flags byte 3 = big
    n, ls = struct.unpack_from("<II", data, 20)
    struct.pack_into(">II", data, 20, n, ls)
    data[28] = 3
    vals = struct.unpack_from("<iIIIQ", data, 48)
    struct.pack_into(">iIIIQ", data, 48, *vals)
    (e,) = ldcache.parse(bytes(data))
    assert (e.name, e.path, e.arch) == ("libcuda.so.1", "/usr/lib64/libcuda.so.1", "aarch64")


def _cstr_at(data: bytes, off: int) -> str:
    return os.fsdecode(data[off:data.index(b"\0", off)])


def _assert_read_from(data: bytes, entries: list) -> None:
    """entries are what data's records say, decoded by the layout in dl-cache.h (the
    module docstring): the block parse() reads (new, or old when there is no new one),
    as many entries as its header counts, each one's flags and hwcap from its record and
    its name and path the NUL-terminated strings its offsets point at."""
    assert all(type(e) is ldcache.Entry for e in entries)
    new_at = 0 if data.startswith(ldcache.MAGIC_NEW) else None
    if new_at is None:
        assert data.startswith(ldcache.MAGIC_OLD)
        (nold,) = struct.unpack_from("<I", data, 12)
        strings = 16 + 12 * nold
        aligned = (strings + 7) & ~7
        if data[aligned:aligned + len(ldcache.MAGIC_NEW)] == ldcache.MAGIC_NEW:
            new_at = aligned
    if new_at is None:
        assert len(entries) == nold
        for i, e in enumerate(entries):
            flags, key, value = struct.unpack_from("<iII", data, 16 + 12 * i)
            assert (e.name, e.path, e.flags, e.hwcap) == (
                _cstr_at(data, strings + key), _cstr_at(data, strings + value), flags, 0)
        return
    order = ">" if data[new_at + 28] == 3 else "<"
    (nlibs,) = struct.unpack_from(order + "I", data, new_at + 20)
    assert len(entries) == nlibs
    for i, e in enumerate(entries):
        flags, key, value, _osv, hwcap = struct.unpack_from(order + "iIIIQ", data, new_at + 48 + 24 * i)
        assert (e.name, e.path, e.flags, e.hwcap) == (
            _cstr_at(data, new_at + key), _cstr_at(data, new_at + value), flags, hwcap)


def _parse_or_error(data: bytes, what: str) -> list | None:
    """parse(data): its entries, or None after a clean error (NvhookError, one line
    naming the file); any other exception fails the test."""
    try:
        entries = ldcache.parse(data)
    except NvhookError as e:
        msg = str(e)
        assert msg.startswith("ld.so.cache: ") and "\n" not in msg, (what, msg)
        return None
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"{what}: {type(e).__name__} instead of NvhookError: {e}")
    _assert_read_from(data, entries)
    return entries


@pytest.mark.parametrize("fmt", ["new", "old", "compat"])
def test_truncated_and_corrupt_files_give_errors(tmp_path, fmt):
    root = _build(tmp_path, "debian", fmt)
    data = (root / "etc/ld.so.cache").read_bytes()
    whole = _parse_or_error(data, "the whole file")
    assert whole and all(e.name and e.path.startswith("/") for e in whole)
    for n in range(len(data)):
        entries = _parse_or_error(data[:n], f"its first {n} bytes")
        # a prefix that still parses gives entries that really are in the file
        assert entries is None or all(e.name and e.path.startswith("/") for e in entries)
    rnd = random.Random(1234)
    parsed = 0
    for i in range(2000):
        bad = bytearray(data)
        for _ in range(rnd.randint(1, 8)):
            bad[rnd.randrange(len(bad))] = rnd.randrange(256)
        parsed += _parse_or_error(bytes(bad), f"corruption #{i}") is not None
    assert 0 < parsed < 2000        # both outcomes were exercised


def _whole_or_none(data: bytes, keys: tuple[bytes, ...] | None = None) -> list | None:
    try:
        return ldcache.parse(data, keys=keys)
    except NvhookError:
        return None


@pytest.mark.parametrize("fmt", ["new", "old", "compat"])
def test_keyed_parse_is_the_whole_parse_filtered(tmp_path, fmt):
    """parse(keys=...) (what the snapshot check reads on every start) gives exactly the
    entries of a whole parse whose names start with a key (a whole name: with its NUL),
    and fails exactly where a whole parse fails: on the file, its prefixes, corruptions."""
    root = _build(tmp_path, "debian", fmt)
    data = (root / "etc/ld.so.cache").read_bytes()
    # a prefix (both libnvidia-ml entries) and a whole name no entry has (not libcuda.so.1)
    keys = (b"libnvidia-m", b"libcuda.so\0")

    def wanted(entries: list) -> list:
        return [e for e in entries if (os.fsencode(e.name) + b"\0").startswith(keys)]

    whole = ldcache.parse(data)
    assert [e.name for e in wanted(whole)] == ["libnvidia-ml.so.1"] * 2 and len(whole) == 4
    assert ldcache.parse(data, keys=keys) == wanted(whole)
    rnd = random.Random(4321)
    cases = [data[:n] for n in range(len(data))]
    for _ in range(1500):
        bad = bytearray(data)
        for _ in range(rnd.randint(1, 8)):
            bad[rnd.randrange(len(bad))] = rnd.randrange(256)
        cases.append(bytes(bad))
    outcomes = set()
    for case in cases:
        full, keyed = _whole_or_none(case), _whole_or_none(case, keys)
        assert (full is None) == (keyed is None)
        assert full is None or keyed == wanted(full)
        outcomes.add(full is None)
    assert outcomes == {True, False}


@pytest.mark.parametrize("data", [b"", b"glibc-ld.so.cache1.1", b"ld.so-1.7.0", b"\x7fELF" + bytes(60),
                                  ldcache.MAGIC_NEW + struct.pack("<II", 0xFFFFFFFF, 0) + bytes(24),
                                  ldcache.MAGIC_OLD + b"\0" + struct.pack("<I", 0x7FFFFFFF)])
def test_garbage(data):
    with pytest.raises(NvhookError):
        ldcache.parse(data)


def test_unreadable_file_is_an_error(tmp_path):
    with pytest.raises(NvhookError, match="cannot read ld.so.cache"):
        ldcache.load(str(tmp_path / "missing"))


def test_read_elf_soname_and_class(tmp_path):
    root = tmp_path / "r"
    lib64 = _lib(root, "lib64", "libnvidia-ml.so.1", False)
    lib32 = _lib(root, "lib", "libnvidia-ml.so.1", True)
    assert ldcache.read_elf(str(lib64)) == ("libnvidia-ml.so.1", 0x0303)
    assert ldcache.read_elf(str(lib32)) == ("libnvidia-ml.so.1", 0x0003)
    (root / "notelf.so.1").write_bytes(b"hello" * 20)
    assert ldcache.read_elf(str(root / "notelf.so.1")) is None
    # truncated ELF: still an ELF (its header says x86-64), but no SONAME to be read
    (root / "trunc.so.1").write_bytes(lib64.read_bytes()[:200])
    assert ldcache.read_elf(str(root / "trunc.so.1")) == (None, 0x0303)


def test_search_finds_sonames_without_a_cache(tmp_path):
    root = tmp_path / "r"
    _lib(root, "usr/local/nvidia/lib64", "libcuda.so.1", False)
    _lib(root, "usr/local/nvidia/lib", "libcuda.so.1", True)
    os.symlink("libcuda.so.550.163.01", root / "usr/local/nvidia/lib64/libcuda.so.1")
    entries = ldcache.search(str(root), ["usr/local/nvidia/lib64", "usr/local/nvidia/lib", "missing"],
                             lambda n: n.startswith("libcuda"))
    assert {(e.name, e.arch, e.path) for e in entries} == {
        ("libcuda.so.1", "x86-64", "/usr/local/nvidia/lib64/libcuda.so.550.163.01"),
        ("libcuda.so.1", "i386", "/usr/local/nvidia/lib/libcuda.so.550.163.01"),
    }
