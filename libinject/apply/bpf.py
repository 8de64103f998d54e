"""eBPF cgroup device programs (BPF_PROG_TYPE_CGROUP_DEVICE) as raw instructions.

The program gets `struct bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor; }`
in r1: access_type's low 16 bits are the device type (BPF_DEVCG_DEV_BLOCK=1,
BPF_DEVCG_DEV_CHAR=2), the high 16 bits the requested access (MKNOD=1, READ=2,
WRITE=4). Returning 1 allows, 0 denies. With several programs attached
(BPF_F_ALLOW_MULTI) every one of them must allow.

To add devices to a container we *prepend* an allow block to the runtime's own
program (read back as the kernel's translated instructions): the block reads the ctx
through r1 without changing r1, returns 1 on a match and otherwise falls through into
the runtime's unchanged program. Jumps are relative, so the old code needs no fixing up;
at entry a program can only rely on r1 (and r10), so the registers we clobber are
invisible to it. Translated code that cannot be loaded again as is (helper calls, maps,
BTF/func info) is refused by `reusable()`; `program_from_rules()` then builds a complete
program from OCI rules instead.
"""
from __future__ import annotations

import struct

from libinject.linux import native as n
from libinject.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterable, Mapping, Sequence

DEV_BLOCK = n.BPF_DEVCG_DEV_BLOCK
DEV_CHAR = n.BPF_DEVCG_DEV_CHAR
ACC_MKNOD = n.BPF_DEVCG_ACC_MKNOD
ACC_READ = n.BPF_DEVCG_ACC_READ
ACC_WRITE = n.BPF_DEVCG_ACC_WRITE
ACC_ALL = ACC_MKNOD | ACC_READ | ACC_WRITE

# opcodes, from linux/bpf.h and linux/bpf_common.h
_LDX_W = n.BPF_LDX | n.BPF_MEM | n.BPF_W
_ALU32_AND_K = n.BPF_ALU | n.BPF_AND | n.BPF_K
_ALU32_RSH_K = n.BPF_ALU | n.BPF_RSH | n.BPF_K
_ALU32_MOV_K = n.BPF_ALU | n.BPF_MOV | n.BPF_K
_ALU32_MOV_X = n.BPF_ALU | n.BPF_MOV | n.BPF_X
_JNE_K = n.BPF_JMP | n.BPF_JNE | n.BPF_K
_EXIT = n.BPF_JMP | n.BPF_EXIT
_CALL = n.BPF_JMP | n.BPF_CALL
# xlated tail call: BPF_JMP | BPF_TAIL_CALL; BPF_TAIL_CALL (0xf0) is the kernel's own
# (include/linux/filter.h), in no uapi header
_TAIL_CALL = n.BPF_JMP | 0xf0
_LD_IMM64 = n.BPF_LD | n.BPF_IMM | n.BPF_DW       # maps, BTF ids, addresses
_CLASS_LD = n.BPF_LD                              # legacy packet loads: never valid here
_CLASS_JMP, _CLASS_JMP32 = n.BPF_JMP, n.BPF_JMP32
_OP_CALL = n.BPF_CALL

INSN = struct.Struct("<BBhi")


@record(frozen=True)
class DevRule:
    """One device rule: type "c" | "b" | "a", major/minor None for any, access "rwm"."""
    type: str
    major: int | None
    minor: int | None
    access: str = "rwm"
    allow: bool = True


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return INSN.pack(code, (src << 4) | dst, off, imm)


def access_mask(access: str) -> int:
    bits = {"m": ACC_MKNOD, "r": ACC_READ, "w": ACC_WRITE}
    mask = 0
    for ch in access:
        if ch not in bits:
            raise ValueError(f"bad device access {access!r}")
        mask |= bits[ch]
    return mask


def _type_code(t: str) -> int | None:
    if t == "a":
        return None
    if t == "c":
        return DEV_CHAR
    if t == "b":
        return DEV_BLOCK
    raise ValueError(f"bad device type {t!r}")


_PROLOGUE = b"".join((
    insn(_LDX_W, 2, 1, 0),            # r2 = ctx->access_type
    insn(_ALU32_AND_K, 2, imm=0xFFFF),  # w2 = type
    insn(_LDX_W, 3, 1, 0),
    insn(_ALU32_RSH_K, 3, imm=16),     # w3 = requested access
    insn(_LDX_W, 4, 1, 4),            # r4 = major
    insn(_LDX_W, 5, 1, 8),            # r5 = minor
))


def _rule_block(rule: DevRule, verdict: int) -> bytes:
    """Return `verdict` if the request matches rule, else fall through (r1 untouched)."""
    checks: list[list[bytes]] = []   # each check: insns ending in a jump to "next"
    t = _type_code(rule.type)
    if t is not None:
        checks.append([insn(_JNE_K, 2, imm=t)])
    mask = access_mask(rule.access)
    if mask != ACC_ALL:
        # requested bits outside the rule's access -> no match
        checks.append([insn(_ALU32_MOV_X, 6, 3), insn(_ALU32_AND_K, 6, imm=~mask & 0xFFFF),
                       insn(_JNE_K, 6, imm=0)])
    if rule.major is not None:
        checks.append([insn(_JNE_K, 4, imm=rule.major)])
    if rule.minor is not None:
        checks.append([insn(_JNE_K, 5, imm=rule.minor)])
    tail = [insn(_ALU32_MOV_K, 0, imm=verdict), insn(_EXIT)]
    flat: list[tuple[bytes, bool]] = [(i, k == len(c) - 1) for c in checks
                                      for k, i in enumerate(c)]
    out = []
    n = len(flat) + len(tail)
    for pos, (raw, is_jump) in enumerate(flat):
        if is_jump:   # patch the offset: skip to the end of this block
            code, regs, _, imm = INSN.unpack(raw)
            raw = INSN.pack(code, regs, n - pos - 1, imm)
        out.append(raw)
    return b"".join(out + tail)


def allow_block(rules: Iterable[DevRule]) -> bytes:
    """Prologue + one `return 1` block per rule; falls through when nothing matched."""
    return _PROLOGUE + b"".join(_rule_block(r, 1) for r in rules)


def prepend_allow(rules: Iterable[DevRule], program: bytes) -> bytes:
    """A program that allows `rules` and otherwise behaves exactly like `program`."""
    return allow_block(rules) + program


def program_from_rules(rules: Sequence[DevRule]) -> bytes:
    """A complete program for OCI-ordered rules (the last matching rule wins, as in
    runc), default deny."""
    blocks = []
    for r in reversed(rules):
        blocks.append(_rule_block(r, 1 if r.allow else 0))
        if _matches_all(r):   # what follows is unreachable, which the verifier rejects
            return _PROLOGUE + b"".join(blocks)
    return _PROLOGUE + b"".join(blocks) + insn(_ALU32_MOV_K, 0, imm=0) + insn(_EXIT)


def _matches_all(r: DevRule) -> bool:
    return (r.type == "a" and r.major is None and r.minor is None
            and access_mask(r.access) == ACC_ALL)


# What runc allows in every container after the config's rules (runc
# libcontainer/specconv AllowedDevices, appended to the config's list); used with
# program_from_rules(rules_from_oci(...) + DEFAULT_ALLOWED + ours).
DEFAULT_ALLOWED: tuple[DevRule, ...] = (
    DevRule("c", None, None, "m"), DevRule("b", None, None, "m"),
    DevRule("c", 1, 3, "rwm"), DevRule("c", 1, 8, "rwm"), DevRule("c", 1, 7, "rwm"),
    DevRule("c", 5, 0, "rwm"), DevRule("c", 1, 5, "rwm"), DevRule("c", 1, 9, "rwm"),
    DevRule("c", 136, None, "rwm"), DevRule("c", 5, 2, "rwm"), DevRule("c", 10, 200, "rwm"),
)


def rules_from_oci(devices: Iterable[Mapping[str, Any]]) -> list[DevRule]:
    """linux.resources.devices of an OCI config -> DevRules (same order)."""
    out = []
    for d in devices:
        out.append(DevRule(d.get("type", "a") or "a", d.get("major"), d.get("minor"),
                           d.get("access", "rwm") or "rwm", bool(d.get("allow"))))
    return out


def reusable(program: bytes) -> str | None:
    """Why the kernel's translated code cannot be loaded again, or None if it can.

    Translated code keeps ctx loads and jumps as loaded (cgroup device programs have no
    ctx rewriting) but turns helper calls into kernel addresses and map references into
    ids, so anything with calls or 64-bit immediates is refused."""
    if not program or len(program) % INSN.size:
        return "empty or truncated program"
    for i in range(0, len(program), INSN.size):
        code = program[i]
        cls = code & 0x07           # BPF_CLASS(code) (a function-like macro: not from cffi)
        if code == _LD_IMM64:
            return "uses 64-bit immediates (maps)"
        if cls in (_CLASS_JMP, _CLASS_JMP32) and (code & 0xF0) == _OP_CALL:   # BPF_OP(code)
            return "calls helpers or functions"
        if code == _TAIL_CALL:
            return "uses tail calls"
        if cls == _CLASS_LD:
            return "uses legacy loads"
    return None


def decode(program: bytes) -> list[tuple[int, int, int, int, int]]:
    """(code, dst, src, off, imm) per instruction, for tests and debugging."""
    out = []
    for i in range(0, len(program), INSN.size):
        code, regs, off, imm = INSN.unpack_from(program, i)
        out.append((code, regs & 0xF, regs >> 4, off, imm))
    return out
