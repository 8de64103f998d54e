"""The hand-written parsers that replaced small regular expressions on the hook's path
(`import re` alone costs an exec'd `python -I -S` hook ~8 ms) accept exactly what the
regexes did and give the same groups; and the modules that hold them no longer import re.
"""
from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from libinject.discover import decode, migminors
from libinject.linux import mountinfo
from libinject.plan import select
from libinject.request import oci_spec

ROOT = Path(__file__).resolve().parent.parent

# Characters that trip hand-written parsers: non-ASCII digits (Arabic-Indic, superscript,
# fullwidth), whitespace that is and is not " " or "\t", line ends, and non-ASCII letters.
TRICKY = ["", "\n", "\r", "\t", " ", "\x0b", "\x0c", "\x1c", "\x85", "\xa0", "\u2028",
          "\u3000", "١", "²", "０", "Ａ", "ａ", "ß", "é", "İ", "K", "\x00", "\\", "+", "-",
          ".", ":", "/", "v", "V", "g", "G", "x", "Z", "z", "0", "9"]
N_RANDOM = 4000


def mutate(rng: random.Random, s: str, alphabet: str) -> str:
    """s with a few random edits: insert, delete or replace a character (from the pattern's
    alphabet or TRICKY), duplicate or drop a slice, append a newline."""
    for _ in range(rng.randrange(4)):
        op = rng.randrange(6)
        i = rng.randrange(len(s) + 1)
        c = rng.choice(alphabet) if rng.random() < 0.6 else rng.choice(TRICKY)
        if op == 0:
            s = s[:i] + c + s[i:]
        elif op == 1 and s:
            s = s[:i] + s[i + 1:]
        elif op == 2 and s:
            s = s[:i] + c + s[i + 1:]
        elif op == 3:
            j = rng.randrange(len(s) + 1)
            s = s[:min(i, j)] + s[min(i, j):max(i, j)] * 2 + s[max(i, j):]
        elif op == 4:
            s = s + rng.choice(["\n", "\r", " ", "\t", "\r\n"])
        else:
            s = s[i:] if rng.random() < 0.5 else s[:i]
    return s


def random_strings(seed: int, parts: list, alphabet: str, n: int = N_RANDOM) -> list[str]:
    """n strings: each a concatenation of `parts` (each part a callable giving a string
    that mostly fits the pattern), randomly mutated half of the time."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = "".join(p(rng) for p in parts)
        out.append(mutate(rng, s, alphabet) if rng.random() < 0.5 else s)
    return out


def run(chars: str, lo: int, hi: int):
    return lambda rng: "".join(rng.choice(chars) for _ in range(rng.randint(lo, hi)))


def lit(*options: str):
    return lambda rng: rng.choice(options)


HEX = "0123456789abcdefABCDEF"
DIGITS = "0123456789"


# ---- plan/select.py: _PCI and _MIG_INDEX (fullmatch; groups 1..3 / 1..2) ----

PCI_RE = re.compile(r"([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.0")
PCI_CASES = [
    "", "0:0:0.0", "00000000:07:00.0", "0000:07:00.0", "00000000:07:00.0\n", "0:0:0.0\n",
    "000000000:07:00.0", "0:000:0.0", "0:0:000.0", "0:0:0.1", "0:0:0.00", "0:0:0.", "0:0:0",
    "::.0", "0::0.0", ":0:0.0", "0:0:.0", "0:0:0:0.0", "ABCDEF01:Ff:aB.0", "abcdefg0:00:00.0",
    "١:0:0.0", "0:0:١.0", "０:0:0.0", "Ａ:0:0.0", " 0:0:0.0", "0:0:0.0 ", "\t0:0:0.0",
    "0:0:0.0\r", "0:0 :0.0", "0x1:0:0.0", "+1:0:0.0", "-1:0:0.0", "0:0:0\n.0", "0:0:0.0.0",
    "00000000:07:00.0.0", "0:0:0,0", "0:0:0.0\x00",
]


def check_pci(s: str) -> None:
    m = PCI_RE.fullmatch(s)
    assert select._pci(s) == (m.groups() if m else None), repr(s)


@pytest.mark.parametrize("s", PCI_CASES)
def test_pci_cases(s):
    check_pci(s)


def test_pci_random():
    parts = [run(HEX, 1, 8), lit(":", ":", ":", ":", "::", ""), run(HEX, 1, 2),
             lit(":", ":", ":", ":", ""), run(HEX, 1, 2), lit(".0", ".0", ".0", ".0", ".1", ".")]
    parts = [lambda rng, p=p: p(rng) if rng.random() < 0.95 else rng.choice(["", "0" * 9, "1٢"])
             for p in parts]
    for s in random_strings(1, parts, HEX + ":.0"):
        check_pci(s)


MIG_RE = re.compile(r"([0-9]+):([0-9]+)")
MIG_CASES = [
    "", ":", "0:0", "1:2", "01:002", "0:0\n", "0:0\r", " 0:0", "0:0 ", "0:", ":0", "0::0",
    "0:0:0", "١:0", "0:١", "²:0", "0:０", "a:0", "0:a", "-1:0", "+1:0", "1.0:0", "0\n:0",
    "12345678901234567890:1", "0:0\x00", "0\t:0",
]


def check_mig(s: str) -> None:
    m = MIG_RE.fullmatch(s)
    assert select._mig_index(s) == (m.groups() if m else None), repr(s)


@pytest.mark.parametrize("s", MIG_CASES)
def test_mig_index_cases(s):
    check_mig(s)


def test_mig_index_random():
    parts = [run(DIGITS, 0, 4), lit(":", ":", "::", ""), run(DIGITS, 0, 4)]
    for s in random_strings(2, parts, DIGITS + ":"):
        check_mig(s)


# ---- discover/decode.py: _BUS_ID (fullmatch, lowercase hex only) ----

BUS_RE = re.compile(r"[0-9a-f]{8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
BUS_CASES = [
    "", "00000000:07:00.0", "00000000:07:00.7", "00000000:07:00.8", "00000000:07:00.0\n",
    "0000:07:00.0", "00000000:0A:00.0", "0000000A:07:00.0", "abcdef01:ff:fe.3",
    "00000000:07:00.00", "00000000:07:00:0", "00000000.07:00.0", "00000000:07.00.0",
    "0000000١:07:00.0", "00000000:07:00.١", "00000000:07:00.²", "00000000:0７:00.0",
    " 0000000:07:00.0", "0000000 :07:00.0", "00000000:07:00.0 ", "00000000:07:00.\n",
    "0000000g:07:00.0", "000000000:07:00.0", "00000000:07:00.", "0000000:007:00.0",
    "00000000:07:00.0\r", "\n00000000:07:00.0",
]


def check_bus(s: str) -> None:
    assert decode._is_bus_id(s) == bool(BUS_RE.fullmatch(s)), repr(s)


@pytest.mark.parametrize("s", BUS_CASES)
def test_bus_id_cases(s):
    check_bus(s)


def test_bus_id_random():
    lower = "0123456789abcdef"
    parts = [run(lower, 8, 8), lit(":", ":", ":", ":", "."), run(lower, 2, 2),
             lit(":", ":", ":", "."), run(lower, 2, 2), lit(".", ".", ".", ":"),
             run("012345678", 1, 1)]
    parts = [lambda rng, p=p: p(rng) if rng.random() < 0.95 else rng.choice(["", "000", "A", "١"])
             for p in parts]
    for s in random_strings(3, parts, lower + "ABCDEF:.89"):
        check_bus(s)


# ---- linux/mountinfo.py: _OCTAL (re.sub of \\ooo with the character) ----

OCTAL_RE = re.compile(r"\\([0-7]{3})")
OCTAL_CASES = [
    "", "\\", "\\\\", "\\0", "\\04", "\\040", "\\0400", "\\040\\011", "\\\\040", "\\\\\\040",
    "a\\040b", "\\8", "\\080", "\\048", "\\400", "\\777", "\\377", "\\012\n", "\\04\\040",
    "\\0١0", "\\٠٤٠", "\\040\\", "x\\\\", "/mnt/with\\040space\\134back\\011tab\\012nl",
    "\\\\\\", "\\0\\40", "\\040\r", "\\ 040",
]


def check_unescape(s: str) -> None:
    expected = OCTAL_RE.sub(lambda m: chr(int(m.group(1), 8)), s)
    assert mountinfo.unescape(s) == expected, repr(s)


@pytest.mark.parametrize("s", OCTAL_CASES)
def test_unescape_cases(s):
    check_unescape(s)


def test_unescape_random():
    piece = lit("\\", "\\", "\\\\", "\\0", "\\04", "\\040", "\\777", "\\8", "a", "/", " ", "0", "7")
    parts = [piece] * 6
    for s in random_strings(4, parts, "\\01234567890a/ "):
        check_unescape(s)


# ---- request/oci_spec.py: _SEMVER (re.ASCII, fullmatch; groups 1..3) ----

SEMVER_RE = re.compile(r"v?(0|[1-9]\d*)(?:\.(0|[1-9]\d*)(?:\.(0|[1-9]\d*))?)?"
                       r"(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?", re.ASCII)
SEMVER_CASES = [
    "", "v", "vv1", "V1", "0", "1", "01", "00", "10", "1.0", "1.01", "1.0.0", "1.0.00",
    "1.2.3.4", "1.", "1..2", ".1", "1.2.", "10.0.130", "v12.4.1", "12.4.1\n", "12.4\n",
    "12.4.1\r", " 12.4", "12.4 ", "1-", "1-a", "1-a.b-c", "1-a+b", "1+b", "1+", "1-+b",
    "1+b+c", "1+b-c.d", "1-a-b-c", "1.2-rc1", "1.2.3-rc.1+build.5", "1_2", "1-a_b",
    "١", "1.١", "1.2.١", "²", "1-١", "1+١", "1-é", "1-K", "1-ß", "０", "1.2.3-", "1.2.3+",
    "v-1", "v+1", "-1", "+1", "1--", "1-.", "1+.", "1++", "1-\n", "99999999999999999999.1",
]


def check_semver(s: str) -> None:
    m = SEMVER_RE.fullmatch(s)
    assert oci_spec._semver(s) == (m.groups() if m else None), repr(s)


@pytest.mark.parametrize("s", SEMVER_CASES)
def test_semver_cases(s):
    check_semver(s)


def test_semver_random():
    num = lit("0", "1", "01", "10", "123", "", "00")
    tag = run("0123456789ABCZabcz.-+", 0, 4)
    parts = [lit("v", "", "", "V"), num, lit(".", "", "."), num, lit(".", "", "."), num,
             lit("-", "", "+", "-"), tag, lit("+", "", "-"), tag]
    for s in random_strings(5, parts, "0123456789.-+vAz"):
        check_semver(s)


def test_legacy_cuda_version_unchanged():
    assert oci_spec.legacy_cuda_version(" 10.0.130 ") == "10.0"
    assert oci_spec.legacy_cuda_version("v12") == "12.0"
    with pytest.raises(Exception, match="not a version"):
        oci_spec.legacy_cuda_version("1.2.3.4")


# ---- discover/migminors.py: mig_minors_for's per-GPU findall ----

def mig_findall(block: str, needle: str) -> list[tuple[str, str]]:
    return re.findall(rf"(?m)^({needle}\S*)[ \t]+([0-9]+)[ \t]*$", block)


def test_backslash_s_is_str_isspace():
    """\\S (str pattern) and str.split() / str.isspace() agree on every code point, which
    _mig_lines relies on."""
    ws = re.compile(r"\s")
    for cp in range(sys.maxunicode + 1):
        c = chr(cp)
        assert bool(ws.match(c)) == c.isspace(), hex(cp)


MIG_BLOCKS = [
    "", "\n", "gpu0/gi1/access 5", "gpu0/gi1/access 5\n", "\ngpu0/gi1/access 5\n",
    "gpu0/gi1/access\t5", "gpu0/gi1/access \t 5 \t", "gpu0/gi1/access 5\r",
    "gpu0/gi1/access 5\r\n", "gpu0/gi1/access\r5", "gpu0/gi1/access\x0b5", "gpu0/gi1/access\xa05",
    "gpu0/gi1/access 5 \xa0", "gpu0/gi1/access\u20285", "gpu0/gi1/access 5 6",
    "gpu0/gi1/access 05", "gpu0/gi1/access ١", "gpu0/gi1/access ²", "gpu0/gi1/access ",
    "gpu0/gi1/access", "gpu0/ 3", "gpu0/", " gpu0/gi1/access 5", "xgpu0/gi1/access 5",
    "gpu01/gi1/access 5", "gpu0/gi1/access 5\ngpu0/gi1/access 6", "gpu0/a\x1cb 5",
    "gpu0/gi1/ci0/access 7\ngpu0/gi1/access 8\ngpu1/gi1/access 9\n",
    "gpu0/gi1/access 5\n\ngpu0/gi2/access 6\n", "gpu0/é 5", "gpu0/gi1/access -5",
    "gpu0/gi1/access +5", "gpu0/gi1/access 5a", "gpu0/gi1/access 5\x00",
    "gpu0/gi1/access\x0c5", "gpu0/gi1/access\x1c5", "gpu0/gi1/access\x1f5",
    "gpu0/gi1/access 5\x1d", "gpu0/gi1/access 5\x1e", "gpu0/gi1/access 5\x0b",
    "gpu0/gi1/access 5\u3000", "gpu0/gi1/access\x855",
]


@pytest.mark.parametrize("block", MIG_BLOCKS)
def test_mig_lines_cases(block):
    assert migminors._mig_lines(block, "gpu0/") == mig_findall(block, "gpu0/")


def test_mig_lines_random():
    line = [lit("gpu0/", "gpu0/", "gpu1/", "gpu10/", " gpu0/", "gpu0", ""),
            lit("gi1/access", "gi2/ci0/access", "", "x\xa0y", "a\rb"),
            lit(" ", " ", "\t", " \t", "", "  ", "\r", "\xa0", "\x0b", "\x0c", "\x1c", "\x1f",
                "\x85"),
            lit("5", "12", "0", "١", "5a", "", "007"),
            lit("", "", "", " ", "\t", "\r", " x", "\xa0", "\x1d", "\x1e", "\x0c")]
    rng = random.Random(6)
    alphabet = "gpu0123456789/ \tacs\n"
    for _ in range(N_RANDOM):
        lines = ["".join(p(rng) for p in line) for _ in range(rng.randint(0, 5))]
        block = rng.choice(["\n", "\r\n", "\n\n"]).join(lines) + rng.choice(["", "\n", "\r"])
        if rng.random() < 0.5:
            block = mutate(rng, block, alphabet)
        for needle in ("gpu0/", "gpu1/"):
            assert migminors._mig_lines(block, needle) == mig_findall(block, needle), repr(block)


def test_mig_minors_for_real_table():
    """A kernel-shaped table (32 GPUs x 135 lines) gives the regex's entries."""
    lines = ["config 1", "monitor 2"]
    minor = 3
    for g in range(32):
        for gi in range(15):
            lines.append(f"gpu{g}/gi{gi}/access {minor}")
            minor += 1
            for ci in range(8):
                lines.append(f"gpu{g}/gi{gi}/ci{ci}/access {minor}")
                minor += 1
    text = "\n".join(lines) + "\n"

    class G:
        def __init__(self, minor):
            self.minor = minor

    got = migminors.mig_minors_for(text, [G(0), G(7), G(31)])
    want = {"config": 1, "monitor": 2}
    for m in (0, 7, 31):
        want.update((k, int(v)) for k, v in mig_findall(text, f"gpu{m}/"))
    assert got == want
    assert len(got) == 2 + 3 * 135


# ---- the modules that hold them import no re ----

def test_no_re_on_the_hooks_path():
    code = r"""
import sys
sys.path.insert(0, sys.argv[1])
from libinject.request import oci_spec
from libinject.plan import select, require
from libinject.discover import decode
from libinject.linux import mountinfo
assert select._pci("0000:07:00.0") == ("0000", "07", "00")
assert select._mig_index("0:1") == ("0", "1")
assert decode._is_bus_id("00000000:07:00.0")
assert mountinfo.unescape("a\\040b") == "a b"
assert oci_spec.legacy_cuda_version("12.4.1") == "12.4"
assert require.evaluate("cuda>=12.0 brand=tesla", require.Facts("12.4", "550.54.15"))
mods = sorted(m for m in ("re", "enum", "sre_compile", "_sre") if m in sys.modules)
print(" ".join(mods))
"""
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(ROOT)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "re" not in r.stdout.split(), r.stdout


def test_no_re_for_mig_minors():
    """discover.migminors (mig_minors_for runs on every warm start), and discover.driver
    with its imports."""
    code = r"""
import sys
sys.path.insert(0, sys.argv[1])
from libinject.discover import driver, migminors
assert migminors._mig_lines("gpu0/gi1/access 5\n", "gpu0/") == [("gpu0/gi1/access", "5")]
print(" ".join(sorted(m for m in ("re", "enum", "sre_compile", "_sre") if m in sys.modules)))
"""
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(ROOT)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "re" not in r.stdout.split(), r.stdout


def test_nvidia_named_is_fnmatchcase():
    """libraries.nvidia_named against fnmatch's patterns, over names built from their parts."""
    import fnmatch

    from libinject.discover.libraries import nvidia_named

    rng = random.Random(11)
    parts = ["lib", "nvidia", ".so", ".so.", "550.54", "x", ".", "/", "\n", "li", "nvidi", "a", "s", "o", "1"]
    for _ in range(20000):
        name = "".join(rng.choice(parts) for _ in range(rng.randint(0, 7)))
        assert nvidia_named(name) == fnmatch.fnmatchcase(name, "lib*nvidia*.so*"), name
        for tail in ("550.54", "1"):
            assert nvidia_named(name, tail) == fnmatch.fnmatchcase(name, "lib*nvidia*.so." + tail), (name, tail)
    assert nvidia_named("libnvidia-ml.so.550.54") and nvidia_named("libnvidia-ml.so.550.54", "550.54")
    assert nvidia_named("libnvidia.so") and not nvidia_named("libcuda.so") and not nvidia_named("nvidia-lib.so")
