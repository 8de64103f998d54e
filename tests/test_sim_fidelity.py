"""The simulated hosts pass for real ones to tools other than ours.

NVIDIA's nvidia-container-cli (libnvidia-container) reads the ELF notes of the driver's
libraries and refuses a libnvidia-tls.so.* without a `.note.ABI-tag` saying Linux
2.3.99 ("detection error: elf section 0x7 missing"); it and the driver's own tools
name the daemons' sockets /var/run/..., which on a real host is /run through a symlink.

The ELF checks use a parser written here (section headers, notes), independent of the
simulator and of binutils, plus `readelf -n` where binutils is installed. The check
libnvidia-container makes is re-done here in both forms it has had: the first SHT_NOTE
section (older releases) and the section named .note.ABI-tag (newer ones).
"""
from __future__ import annotations

import os
import shutil
import stat
import struct
import subprocess
from pathlib import Path

import pytest

from libinject.discover.driver import discover
from libinject.sim.profile import load_profile

SHT_NOTE = 7
NT_GNU_ABI_TAG = 1
LIBDIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib/i386-linux-gnu")
PROFILES = ["a100x8", "h100x8-mig", "t4x1", "rtx4090x1"]
READELF = shutil.which("readelf") or "/usr/bin/readelf"   # binutils (scripts/install-deps)


# ---------------------------------------------------------------- an ELF reader of our own

def sections(path: Path) -> list[tuple[str, int, bytes]]:
    """[(name, sh_type, contents)] of an ELF file, in section header order."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF", f"{path} is not ELF"
    cls, enc = data[4], data[5]
    assert enc == 1, "little-endian only"      # x86_64 and i386
    if cls == 2:   # ELF64
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        shdr = "<IIQQQQIIQQ"
    else:          # ELF32
        shoff, = struct.unpack_from("<I", data, 0x20)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x2E)
        shdr = "<IIIIIIIIII"
    raw = []
    for i in range(shnum):
        name, typ, _flags, _addr, off, size, *_ = struct.unpack_from(shdr, data, shoff + i * shentsize)
        raw.append((name, typ, data[off:off + size] if typ != 8 else b""))   # 8 = SHT_NOBITS
    strtab = raw[shstrndx][2]
    return [(strtab[n:strtab.index(b"\0", n)].decode(), t, c) for n, t, c in raw]


def notes(contents: bytes) -> list[tuple[bytes, int, bytes]]:
    """[(name, type, desc)] of a note section (4-byte alignment, as on x86)."""
    out, off = [], 0
    while off + 12 <= len(contents):
        namesz, descsz, typ = struct.unpack_from("<III", contents, off)
        off += 12
        name = contents[off:off + namesz]
        off += (namesz + 3) & ~3
        desc = contents[off:off + descsz]
        off += (descsz + 3) & ~3
        out.append((name, typ, desc))
    return out


def abi_tag(path: Path) -> tuple[int, int, int, int] | None:
    """(os, major, minor, patch) of the .note.ABI-tag section, or None."""
    for name, typ, contents in sections(path):
        if name == ".note.ABI-tag":
            assert typ == SHT_NOTE, f"{path}: .note.ABI-tag has type {typ}"
            (nname, ntype, desc), = notes(contents)
            assert (nname, ntype, len(desc)) == (b"GNU\0", NT_GNU_ABI_TAG, 16)
            return struct.unpack("<4I", desc)
    return None


def nvc_has_abi(path: Path, abi: tuple[int, int, int], *, by_name: bool) -> bool:
    """libnvidia-container's elftool_has_abi: the first SHT_NOTE section (by_name=False,
    older releases) or the one named .note.ABI-tag; a missing section is its "elf section
    0x7 missing" error (raised here); else GNU/NT_GNU_ABI_TAG, OS Linux, the version."""
    for name, typ, contents in sections(path):
        if typ == SHT_NOTE and (not by_name or name == ".note.ABI-tag"):
            break
    else:
        raise AssertionError(f"detection error: elf section 0x7 missing: {path}")
    nname, ntype, desc = notes(contents)[0]
    return (ntype == NT_GNU_ABI_TAG and nname == b"GNU\0" and len(desc) >= 16
            and struct.unpack_from("<4I", desc) == (0, *abi))


def driver_libraries(root: Path) -> list[Path]:
    libs = [p for d in LIBDIRS if (root / d).is_dir() for p in sorted((root / d).iterdir())
            if not p.is_symlink() and ".so." in p.name]
    names = {s.name for s in load_profile(_profile_name(root)).libraries}
    return [p for p in libs if p.name.split(".so.")[0] in names]


def _profile_name(root: Path) -> str:
    return root.name


# ---------------------------------------------------------------- ELF notes

@pytest.mark.parametrize("name", PROFILES)
def test_every_driver_library_has_a_linux_abi_tag(sim_host, name):
    root = sim_host(name)
    libs = driver_libraries(root)
    assert len(libs) >= len(load_profile(name).libraries)
    assert {str(p.relative_to(root)): abi_tag(p) for p in libs} == \
        {str(p.relative_to(root)): (0, 2, 3, 99) for p in libs}


def test_both_arches_are_checked(sim_host):
    root = sim_host("a100x8")
    assert {p.parent.name for p in driver_libraries(root)} == {"x86_64-linux-gnu", "i386-linux-gnu"}


@pytest.mark.parametrize("by_name", [True, False], ids=["by-name", "first-note"])
def test_nvidia_container_cli_selects_libnvidia_tls(sim_host, by_name):
    root = sim_host("a100x8")
    tls = [p for p in driver_libraries(root) if p.name.startswith("libnvidia-tls.so.")]
    assert len(tls) == 2 and all(nvc_has_abi(p, (2, 3, 99), by_name=by_name) for p in tls)


def test_abi_tag_is_the_only_note_of_a_library(sim_host):
    # No build id, like the driver's libraries: the ABI tag is the first SHT_NOTE section.
    root = sim_host("a100x8")
    assert {p.name: [n for n, t, _ in sections(p) if t == SHT_NOTE] for p in driver_libraries(root)} == \
        {p.name: [".note.ABI-tag"] for p in driver_libraries(root)}


def test_binaries_have_an_abi_tag(sim_host):
    root = sim_host("a100x8")
    bins = sorted((root / "usr/bin").iterdir())
    assert bins and all(abi_tag(p) is not None and abi_tag(p)[0] == 0 for p in bins)


def test_readelf_agrees(sim_host):
    root = sim_host("a100x8")
    for p in driver_libraries(root):
        out = subprocess.run([READELF, "-n", "-W", str(p)], capture_output=True, text=True, check=True).stdout
        assert "Displaying notes found in: .note.ABI-tag" in out and "OS: Linux, ABI: 2.3.99" in out, p


def test_abi_tag_is_in_a_pt_note_segment(sim_host):
    tls = sim_host("a100x8") / "usr/lib/x86_64-linux-gnu/libnvidia-tls.so.550.163.01"
    out = subprocess.run([READELF, "-l", "-W", str(tls)], capture_output=True, text=True, check=True).stdout
    mapping = out.split("Section to Segment mapping:")[1].splitlines()
    types = [line.split()[0] for line in out.split("Program Headers:")[1].splitlines()[2:] if line.strip()
             and not line.strip().startswith("[")]
    note_index = types.index("NOTE")
    assert ".note.ABI-tag" in next(m for m in mapping if m.strip().startswith(f"{note_index:02d} "))


def test_libraries_still_load(sim_host):
    # The note changes nothing at run time: the loader takes every library (in a child,
    # so that nothing stays loaded in the test process).
    import sys

    root = sim_host("a100x8")
    libs = [str(p) for p in driver_libraries(root) if "x86_64" in str(p)]
    r = subprocess.run([sys.executable, "-c", "import ctypes, sys\nfor p in sys.argv[1:]: ctypes.CDLL(p)", *libs],
                       capture_output=True, text=True, timeout=60)
    assert (len(libs) > 10, r.returncode) == (True, 0), r.stderr


# ---------------------------------------------------------------- /var/run

def test_var_run_is_a_relative_link_to_run(sim_host):
    root = sim_host("a100x8")
    assert os.readlink(root / "var/run") == "../run"


@pytest.mark.parametrize("sock", ["nvidia-persistenced/socket", "nvidia-fabricmanager/socket"])
def test_sockets_under_var_run_resolve_inside_the_root(sim_host, sock):
    root = sim_host("h100x8-mig")
    p = root / "var/run" / sock
    assert stat.S_ISSOCK(os.stat(p).st_mode) and os.path.realpath(p) == str(root.resolve() / "run" / sock)


def test_var_run_stays_inside_a_moved_root(fresh_sim_host, tmp_path):
    host = fresh_sim_host("t4x1")
    moved = tmp_path / "elsewhere"
    os.rename(host, moved)
    assert os.path.realpath(moved / "var/run/nvidia-persistenced/socket") == \
        str(moved.resolve() / "run/nvidia-persistenced/socket")


def test_var_run_socket_as_seen_in_a_chroot(sim_host):
    # What a tool chrooted into the host (or reading it as /) sees at NVIDIA's path.
    root = sim_host("h100x8-mig")
    pid = os.fork()
    if pid == 0:
        try:
            os.chroot(str(root))
            ok = stat.S_ISSOCK(os.stat("/var/run/nvidia-persistenced/socket").st_mode)
        except BaseException:
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("profile", ["a100x8", "h100x8-mig"])
def test_nvhook_discovery_finds_both_sockets(sim_host, profile):
    d = discover(str(sim_host(profile)), snapshot=False)
    assert {f.container_path for f in d.ipcs if f.container_path.endswith("/socket")} == \
        {"/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket"}


def test_nvhook_discovery_uses_the_sockets_themselves(sim_host):
    root = sim_host("a100x8")
    d = discover(str(root), snapshot=False)
    assert all(stat.S_ISSOCK(os.lstat(f.path).st_mode) for f in d.ipcs if f.path.endswith("/socket"))
