"""libinject.tomlfast: the import-free parser for the TOML subset real config.toml files
use. For every input it gives exactly what tomllib.loads gives (same dicts, same key
order, same leaf types), or None ("ask tomllib"); never a value where tomllib raises.
And the real configs (NVIDIA's, the ones the tests write) do take the fast path, so an
exec'd hook loads its config without importing re or tomllib."""
from __future__ import annotations

import random
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from libinject import config, tomlfast
from test_config import NVIDIA_CTK_DEFAULT, NVIDIA_DEBIAN

REPO = Path(__file__).resolve().parent.parent

# What a node with nvidia-container-toolkit 1.17 has (`nvidia-ctk config default`, as a
# public bug report shows it): NVIDIA_CTK_DEFAULT with the plain ldconfig path.
NVIDIA_1_17 = NVIDIA_CTK_DEFAULT.replace('"@/sbin/ldconfig.real"', '"@/sbin/ldconfig"')

# The shapes the test suite writes (hookenv.write_config, test_config, the CLI tests).
SUITE = [
    '\n[nvidia-container-cli]\nroot = "/tmp/pytest-of-root/sim/a100x8"\n[nvhook]\nsnapshot = false\n'
    'log-file = "/tmp/x/hook.log"\nlog-level = "debug"\n',
    '[nvidia-container-cli]\nroot = "/driver"\nno-cgroups = true\n[nvhook]\nsnapshot = false\n',
    '[nvidia-container-cli]\nroot = "/driver"\n[nvhook]\nnvml-timeout = 7\n',
    '[nvidia-container-cli]\nroot = "/h"\nuser = "root:video"\n[nvhook]\nsnapshot = false\n',
    '[nvidia-container-cli]\nroot = "/h"\nldconfig = "@/sbin/ldconfig.real"\n[nvhook]\nsnapshot = false\n',
    '[nvidia-container-runtime.modes.cdi]\nannotation-prefixes = ["nvidia.cdi.k8s.io/"]\n',
    '[nvidia-container-runtime.modes.cdi]\nannotation-prefixes = ["x/"]\ndefault-kind = "k.com/g"',
    '[nvidia-container-cli]\nno-cgroups = true\nldconfig = "/sbin/ldconfig"\n'
    '[nvidia-container-runtime.modes.legacy]\ncuda-compat-mode = "mount"\n',
    '#runtimes = ["crun"]\n[nvidia-container-runtime]\nmode = "cdi"\n',
    '[nvidia-container-cli]\ndebug = "cli.log"\n[nvidia-container-runtime]\ndebug = "logs/runtime.log"\n'
    '[nvhook]\nsnapshot-dir = "snaps"\n',
    'future-key = 1\n[nvidia-container-cli]\nnew = "x"\n[other]\na = 1\n',
    """
disable-require = true
supported-driver-capabilities = "utility,compute"
swarm-resource = "DOCKER_RESOURCE_GPU, OTHER"
accept-nvidia-visible-devices-envvar-when-unprivileged = false
accept-nvidia-visible-devices-as-volume-mounts = true
[nvidia-container-cli]
root = "/run/nvidia/driver"
environment = ["A=1"]
load-kmods = false
[nvidia-container-runtime]
mode = "legacy"
runtimes = ["runc"]
[nvidia-container-runtime.modes.cdi]
annotation-prefixes = ["a/", "b/"]
spec-dirs = ["/x"]
[nvhook]
nvml-timeout = 3
snapshot = false
dev-root = "/devroot"
log-level = "warning"
""",
]
REAL = [NVIDIA_DEBIAN, NVIDIA_CTK_DEFAULT, NVIDIA_1_17, *SUITE]


def _same(a: object, b: object) -> bool:
    """Equal, with the same type at every node (True is not 1) and the same key order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _check(text: str) -> object:
    """tomlfast agrees with tomllib on text; tomlfast's answer."""
    fast = tomlfast.loads(text)
    try:
        slow = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, ValueError, RecursionError):
        assert fast is None, f"tomllib refuses, tomlfast gives {fast!r} for {text!r}"
        return fast
    assert fast is None or _same(fast, slow), f"{fast!r} != {slow!r} for {text!r}"
    return fast


@pytest.mark.parametrize("text", REAL)
def test_real_configs_take_the_fast_path(text):
    assert _check(text) is not None
    assert _check(text.replace("\n", "\r\n")) is not None


def test_config_parse_is_unchanged_for_real_configs():
    for text in REAL:
        want = config._build(config.Config, tomllib.loads(text), "c.toml", "")
        assert config._build(config.Config, config._parse_toml(text.encode(), "c.toml"),
                             "c.toml", "") == want


# (text, what tomlfast gives: None, or "same" for tomllib's value)
EDGES = [
    ("[ a . b ]\n", "same"), ("[a]#c\n", "same"), ("[\ta\t]\t# c\t\n", "same"),
    ("a=1#c", "same"), ("a = true#c", "same"), ('a = "x"#c', "same"), ("a = -0", "same"),
    ("a = +5", "same"), ("a = 1_000", "same"), ("a = 0", "same"), ("a = 999999999999999999", "same"),
    ('a = [ ]', "same"), ('a = ["x",]', "same"), ("a = [ 'x' , \"y\" , ]  # c", "same"),
    ('a . b = 1\na.c = 2', "same"), ("[x]\na.b = 1\na.c = 2\n[y]", "same"),
    ("[a.b]\n[a]\n", "same"), ("[a]\n[a.b]\n", "same"),
    # a header may pass through a table made by dotted keys (tomllib allows it)
    ("a.b = 1\n[a.c]\nd = 2", "same"), ("[x]\na.b.c = 1\n[x.a.d]\n[x.a.b.e]", "same"),
    # dotted keys through a [header]'s table: tomllib refuses ([a.b] was defined) ...
    ("[a.b]\n[a]\nb.c = 1", None), ("[x.y]\na.b = 1\n[x]\ny.a.c = 2", None),
    # ... or allows (only passed through): None all the same, tomllib decides
    ("[a.b.c]\n[a]\nb.d = 1", None), ("[x.a.b]\n[x]\na.c = 1", None), ('a = "é # \' ]"', "same"),
    ("a = '\\\\ \"'", "same"), ("\t \n# é \t\n\n", "same"), ("", "same"), ("a = 1\r\nb = 2\r\n", "same"),
    ("a = '''x'''", None), ('a = """x"""', None), ('a = "\\n"', None), ('a = "\\""', None),
    ('"a" = 1', None), ("a = 1.5", None), ("a = 1e3", None), ("a = 0x10", None), ("a = inf", None),
    ("a = 1979-05-27", None), ("a = 07:32:00", None), ("a = {b = 1}", None), ("a = [1]", None),
    ('a = [\n"x"]', None), ("[[a]]", None), ("a = 9999999999999999999", None),
    # invalid TOML: tomllib raises, tomlfast must say None
    ("a = 1\na = 2", None), ("[a]\n[a]", None), ("a = 1\n[a]", None), ("a.b = 1\n[a]", None),
    ("[a]\nb.c = 1\n[a.b]", None), ("a = [\"x\"]\n[a]", None), ("a = 01", None), ("a = 1__0", None),
    ("a = 1_", None), ("a = _1", None), ("a = truex", None), ("a = True", None), ("a = ", None),
    ("a = 1 2", None), ("a = 'x'y", None), ("# \x00", None), ("# \x7f", None), ("# \r", None),
    ("a = 1\r", None), ('a = "x\x01"', None), ("a = 'x", None), ("[a", None), ("[a.]", None),
    ("[.a]", None), ("[]", None), ("[ [a]]", None), ("a = [,]", None), ('a = ["x",,]', None),
    ('a = ["x" "y"]', None), ("\ufeffa = 1", None), ("\x0ba = 1", None), ("a\xa0= 1", None),
    ("[a]]", None), ("[a] x", None), ("= 1", None), ("a = 1\nb", None),
]


@pytest.mark.parametrize("text, expected", EDGES)
def test_edges(text, expected):
    fast = _check(text)
    if expected is None:
        assert fast is None
    else:
        assert fast is not None and _same(fast, tomllib.loads(text))


def test_dotted_parts_limit_matches_config():
    """At most MAX_PARTS parts: the fast path; more: tomllib's path, where config refuses
    the key (tomllib is quadratic in a key's parts) with the same message as before."""
    n = config.MAX_KEY_DOTS
    assert tomlfast.MAX_PARTS == n
    for text in (".".join(["a"] * n) + " = 1", "[" + ".".join(["a"] * n) + "]"):
        assert _check(text) is not None
        deeper = text.replace("a", "a.a", 1)
        assert tomlfast.loads(deeper) is None
        with pytest.raises(config.NvhookError, match="a key with more than 32 dotted parts"):
            config._parse_toml(deeper.encode(), "c.toml")


# --- generated documents ---------------------------------------------------------------

WS = ["", "", " ", "\t", "  ", " \t", "\x0b", "\xa0", "\u3000"]
KEYS = ["a", "b", "c", "-", "_0", "1", "root", "A-b_9", "é", "a b", '"a"', "'b'", ""]
STR_BITS = ["x", " ", "'", '"', "\\", "\\n", '\\"', "#", "é", "\t", "\x00", "\x1f", "\x7f",
            "\r", "\u2028", "\x85", "]", ",", "[", "=", "\U0001f600"]
INTS = ["0", "-0", "+0", "00", "01", "1", "-1", "+1", "1_000", "1__0", "_1", "1_", "12_3_4",
        "123456789012345678", "1234567890123456789", "9" * 18, "9" * 19, "0x1F", "0o7", "0b1",
        "1.5", "1e5", "-1.0e-3", "inf", "nan", "-inf", "+nan", "1979-05-27", "07:32:00",
        "1979-05-27T07:32:00Z", "1 2", "-", "+", "1-2"]
COMMENT_BITS = ["", "x", " ", "\t", "#", "é", '"', "'", "\x00", "\x01", "\x1b", "\x7f", "\r",
                "[a]", "a = 1", "\u2028", "\x85"]
ENDS = ["\n"] * 12 + ["\r\n"] * 3 + ["\r", "\n\n", ""]


def _pick(rng: random.Random, items: list) -> str:
    return items[rng.randrange(len(items))]


def _bits(rng: random.Random, items: list, most: int) -> str:
    return "".join(_pick(rng, items) for _ in range(rng.randrange(most + 1)))


def _ws(rng: random.Random) -> str:
    return _pick(rng, WS) if rng.random() < 0.1 else _pick(rng, WS[:6])


def _key(rng: random.Random) -> str:
    common = KEYS[:4] if rng.random() < 0.8 else KEYS
    parts = [_pick(rng, common) for _ in range(1 + (rng.random() < 0.3) * rng.randrange(1, 4))]
    return (_ws(rng) + "." + _ws(rng)).join(parts)


def _string(rng: random.Random) -> str:
    q = '"' if rng.random() < 0.6 else "'"
    safe = ["x", " ", "é", "/", ":", "#", "'" if q == '"' else '"']
    body = _bits(rng, safe if rng.random() < 0.7 else STR_BITS, 5)
    if rng.random() < 0.05:
        return q * 3 + body + q * 3
    return q + body + (q if rng.random() < 0.97 else "")


def _value(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.35:
        return _string(rng)
    if r < 0.5:
        return _pick(rng, ["true", "false", "true", "false", "True", "truex", "tru", "falsey"])
    if r < 0.7:
        return _pick(rng, INTS) if rng.random() < 0.6 else str(rng.randrange(-10**20, 10**20))
    if r < 0.95:
        items = [_string(rng) if rng.random() < 0.9 else _pick(rng, ["1", "[]", "{}", "true", "\n"])
                 for _ in range(rng.randrange(4))]
        inner = (_ws(rng) + "," + _ws(rng)).join(items)
        if items and rng.random() < 0.3:
            inner += _ws(rng) + ","
        if rng.random() < 0.05:
            inner += ",,"
        return "[" + _ws(rng) + inner + _ws(rng) + ("]" if rng.random() < 0.97 else "")
    return _pick(rng, ["{}", "{a = 1}", "", "=", "x"])


def _comment(rng: random.Random) -> str:
    safe = COMMENT_BITS[:10] if rng.random() < 0.8 else COMMENT_BITS
    return "#" + _bits(rng, safe, 4)


def _line(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.1:
        return _ws(rng)
    if r < 0.2:
        return _ws(rng) + _comment(rng)
    tail = _ws(rng) + (_comment(rng) if rng.random() < 0.2 else "")
    if r < 0.45:
        o, c = ("[[", "]]") if rng.random() < 0.03 else ("[", "]")
        return _ws(rng) + o + _ws(rng) + _key(rng) + _ws(rng) + c + tail
    return _ws(rng) + _key(rng) + _ws(rng) + "=" + _ws(rng) + _value(rng) + tail


def _document(rng: random.Random) -> str:
    return "".join(_line(rng) + _pick(rng, ENDS) for _ in range(rng.randrange(1, 10)))


MUTATE = list(" \t\n\r#=[]{}.,\"'\\_-+0123456789aetfx\x00\x7fé") + ["\r\n", "true", "[a]", "\n[a]\n"]


def _mutate(rng: random.Random, text: str) -> str:
    for _ in range(rng.randrange(1, 4)):
        i = rng.randrange(len(text) + 1)
        op = rng.randrange(4)
        if op == 0:
            text = text[:i] + _pick(rng, MUTATE) + text[i:]
        elif op == 1:
            text = text[:i] + text[i + 1:]
        elif op == 2:
            text = text[:i] + _pick(rng, MUTATE) + text[i + 1:]
        else:
            j = rng.randrange(len(text) + 1)
            text = text[:min(i, j)] + text[min(i, j):max(i, j)] * 2 + text[max(i, j):]
    return text


def test_generated_documents_agree():
    rng = random.Random(20240611)
    taken = refused_by_tomllib = 0
    for _ in range(12000):
        text = _document(rng)
        try:
            tomllib.loads(text)
        except (tomllib.TOMLDecodeError, ValueError):
            refused_by_tomllib += 1
        taken += _check(text) is not None
    # the generator reaches both sides of the fence
    assert taken > 1000 and refused_by_tomllib > 1000, (taken, refused_by_tomllib)


def test_mutated_real_configs_agree():
    rng = random.Random(7)
    taken = 0
    for _ in range(6000):
        text = _mutate(rng, _pick(rng, REAL))
        taken += _check(text) is not None
    assert taken > 1000


def test_every_single_character_edit_of_a_config_agrees():
    """Each position of a small config, with each interesting character inserted,
    substituted, or the character deleted."""
    base = '[a.b]\nk = "v" # c\nn = -12\n[c]\nl = [\'x\', "y",]\nt = true\n'
    chars = sorted(set(MUTATE))
    for i in range(len(base) + 1):
        _check(base[:i] + base[i + 1:])
        for c in chars:
            _check(base[:i] + c + base[i:])
            _check(base[:i] + c + base[i + 1:])


def test_hook_loads_a_config_without_re_or_tomllib(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text(NVIDIA_1_17 + '\n[nvhook]\nsnapshot = false\nnvml-timeout = 7\n')
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from libinject import config; "
            f"c = config.load({str(cfg)!r}); assert c.nvhook.nvml_timeout == 7.0; "
            "print('re' in sys.modules, 'tomllib' in sys.modules)")
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False"]


def test_tomlfast_imports_nothing():
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); before = set(sys.modules); "
            "from libinject import tomlfast; "
            "print(sorted(set(sys.modules) - before - {'libinject', 'libinject.tomlfast'}))")
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
