"""NVIDIA_REQUIRE_* / --require: nvidia-container-cli's constraint language.

Grammar and semantics follow libnvidia-container's src/cli/dsl.c and configure.c
exactly, quirks included, so that an image's constraints pass or fail here as they do
there:
  - a predicate is split on " " (OR) and each part on "," (AND); empty parts are skipped;
  - evaluation short-circuits: an AND group stops at its first false atom and the
    predicate stops at the first true group, so atoms after that are never parsed;
  - an atom is NAME OP VALUE, NAME one of cuda|driver|arch|brand (case-insensitive),
    OP the longest run of "<>=!" characters, compared with strncmp against
    = != < <= > >= in that order (so a lone "!" reads as "!=");
  - versions (cuda, driver, arch) compare component-wise as unsigned integers, trailing
    ".0" components ignored; anything but digits and dots is an invalid expression;
  - brand compares case-insensitively, = and != only;
  - without a device (driver only), arch and brand are always true; a missing cuda or
    driver version is true as well.
Failure message: "unsatisfied condition: <first space-separated token of the
predicate>", with the cuda>= hint when that token starts with "cuda>="; a parse error:
"invalid expression". The CLI prefixes both with "requirement error: ".
"""
from __future__ import annotations

from libinject.errors import NvhookError
from libinject.discover.model import DriverInfo, Gpu
from libinject.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Sequence

# Order matters: the first operator whose text strncmp-matches the operator run wins.
_OPERATORS = ("=", "!=", "<", "<=", ">", ">=")
_OP_CHARS = "<>=!"
_UINTMAX = 2**64 - 1
_UINTMAX_DIGITS = len(str(_UINTMAX))   # more significant digits overflow strtoumax
_CUDA_GE = "cuda>="
_CUDA_HINT = ", please update your driver to a newer version, or use an earlier cuda container"


class InvalidExpression(Exception):
    """An atom that cannot be parsed or compared (dsl.c returns -1)."""


@record(frozen=True)
class Facts:
    """What the atoms are checked against (dsl_data: driver + one device)."""
    cuda_version: str | None
    driver_version: str | None
    arch: str | None = None     # "8.0" (compute capability); None = no device
    brand: str | None = None
    has_device: bool = False


def facts_for(info: DriverInfo, gpu: Gpu | None) -> Facts:
    if gpu is None:
        return Facts(info.cuda_version or None, info.driver_version or None)
    return Facts(info.cuda_version or None, info.driver_version or None,
                 f"{gpu.cc[0]}.{gpu.cc[1]}", gpu.brand or None, True)


def _strtoumax(s: str) -> tuple[int, str]:
    """Leading digits as an int and the rest; raise if none or on overflow (UINTMAX_MAX)."""
    i = 0
    while i < len(s) and s[i] in "0123456789":      # ASCII only, as C's isdigit
        i += 1
    if i == 0:
        raise InvalidExpression(s)
    # Overflow (ERANGE) before int(): int() of thousands of digits raises ValueError.
    if len(s[:i].lstrip("0")) > _UINTMAX_DIGITS:
        raise InvalidExpression(s)
    n = int(s[:i])
    if n >= _UINTMAX:
        raise InvalidExpression(s)
    return n, s[i:]


def compare_version(v1: str, op: str, v2: str) -> bool:
    """dsl_compare_version: v1 OP v2, component-wise; raises InvalidExpression."""
    allowed = set("0123456789.")
    if not set(v1) <= allowed or not set(v2) <= allowed:
        raise InvalidExpression(f"{v1} {op} {v2}")
    while v1 and v2:
        n1, r1 = _strtoumax(v1)
        n2, r2 = _strtoumax(v2)
        if n1 != n2:
            if op == "=":
                return False
            if op == "!=":
                return True
            if op in ("<", "<="):
                return n1 < n2
            return n1 > n2
        v1, v2 = r1.lstrip("."), r2.lstrip(".")
    # strspn(v, ".0"): leftover components count unless they are all zeros.
    v1, v2 = v1.lstrip(".0"), v2.lstrip(".0")
    if op == "!=":
        return bool(v1 or v2)
    if op in ("=", "<=", ">=") and not v1 and not v2:
        return True
    if op == "=":
        return False
    if op in ("<", "<="):
        return not v1 and bool(v2)
    return bool(v1) and not v2


def compare_string(s1: str, op: str, s2: str) -> bool:
    if op == "=":
        return s1.lower() == s2.lower()
    if op == "!=":
        return s1.lower() != s2.lower()
    raise InvalidExpression(f"{s1} {op} {s2}")


def _parse_atom(atom: str) -> tuple[str, str, str]:
    n = 0
    while n < len(atom) and atom[n] not in _OP_CHARS:
        n += 1
    if n == 0:
        raise InvalidExpression(atom)
    name, rest = atom[:n], atom[n:]
    m = 0
    while m < len(rest) and rest[m] in _OP_CHARS:
        m += 1
    if m == 0:
        raise InvalidExpression(atom)
    run = rest[:m]
    for op in _OPERATORS:
        # strncmp(run, op, m) == 0: equal over m chars, NUL-terminated strings.
        if (op + "\0" * m)[:m] == run:
            break
    else:
        raise InvalidExpression(atom)
    value = rest[m:]
    if not value:
        raise InvalidExpression(atom)
    return name, op, value


def evaluate_atom(atom: str, facts: Facts) -> bool:
    name, op, value = _parse_atom(atom)
    key = name.lower()
    if key == "cuda":
        return True if facts.cuda_version is None else compare_version(facts.cuda_version, op, value)
    if key == "driver":
        return True if facts.driver_version is None else compare_version(facts.driver_version, op, value)
    if key == "arch":
        if not facts.has_device or facts.arch is None:
            return True
        return compare_version(facts.arch, op, value)
    if key == "brand":
        if not facts.has_device or facts.brand is None:
            return True
        return compare_string(facts.brand, op, value)
    raise InvalidExpression(atom)


def evaluate(predicate: str, facts: Facts) -> bool:
    """dsl_evaluate's truth value; raises InvalidExpression."""
    ret = True
    for or_expr in predicate.split(" "):
        if not or_expr:
            continue
        group_ok = True
        for and_expr in or_expr.split(","):
            if not and_expr:
                continue
            ret = evaluate_atom(and_expr, facts)
            if not ret:
                group_ok = False
                break
        if group_ok:
            break
    return ret


def failure_message(predicate: str) -> str:
    first = predicate.split(" ", 1)[0]
    if first.startswith(_CUDA_GE):
        return f"unsatisfied condition: {first}{_CUDA_HINT}"
    return f"unsatisfied condition: {first}"


def check_one(predicate: str, facts: Facts) -> str | None:
    """None if the predicate holds, else nvidia-container-cli's message."""
    try:
        ok = evaluate(predicate, facts)
    except InvalidExpression:
        return "invalid expression"
    return None if ok else failure_message(predicate)


def check(requirements: Sequence[str], info: DriverInfo, gpus: Sequence[Gpu]) -> None:
    """Raise NvhookError("requirement error: ...") on the first failure.

    gpus: the selected GPUs in selection order (MIG devices: their parents); each
    requirement is checked against each of them in that order, as configure.c does.
    With no GPU (devices "none"), checked once without a device.
    """
    if not requirements:
        return
    targets: list[Gpu | None] = list(dict.fromkeys(gpus)) or [None]
    for gpu in targets:
        facts = facts_for(info, gpu)
        for pred in requirements:
            msg = check_one(pred, facts)
            if msg is not None:
                raise NvhookError(f"requirement error: {msg}")
