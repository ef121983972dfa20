"""Device allow rules and the cgroup v2 device filter (a BPF_PROG_TYPE_CGROUP_DEVICE program) built from them.

cgroup v2 has no ``devices.allow`` file: the runtime attaches a BPF program that answers every
open/mknod of a device node in the container. To let the container open the GPU nodes we load a
new program made of our allow rules followed by the runtime's own instructions, so our rules are
checked first and every other access falls through to the runtime's decision unchanged. The
layout follows the runtime's (runc/crun) filters: a prologue loads the request fields from the
context into r2..r5, then one block per rule returns 1 (allow) on a match or jumps to the next.

Everything here is pure: rules in, instruction bytes out (and back, to vet a program read from
the kernel).
"""

import struct
import sys
from collections.abc import Iterable, Sequence

from nvc.errors import ContainerError, InputError
from nvc.records import NamedTuple

# Linux dev_t limits (12-bit major, 20-bit minor): they also keep every immediate positive.
MAX_MAJOR = (1 << 12) - 1
MAX_MINOR = (1 << 20) - 1

# struct bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor; }: access_type holds the
# device type in its low 16 bits and the access mask in its high 16 bits.
CTX_ACCESS_TYPE, CTX_MAJOR, CTX_MINOR = 0, 4, 8
DEV_TYPE = {"b": 1, "c": 2}  # BPF_DEVCG_DEV_BLOCK, BPF_DEVCG_DEV_CHAR
ACCESS_BIT = {"m": 1, "r": 2, "w": 4}  # BPF_DEVCG_ACC_MKNOD, _READ, _WRITE

# Opcodes used here (class | op | source), from linux/bpf_common.h and linux/bpf.h.
LDX_MEM_W = 0x61  # dst = *(u32 *)(src + off)
ALU32_AND_K = 0x54  # dst = (u32)dst & imm
ALU32_RSH_K = 0x74  # dst = (u32)dst >> imm
ALU64_MOV_K = 0xB7  # dst = imm
JMP_JNE_K = 0x55  # if dst != imm: pc += off
JMP_JSET_K = 0x45  # if dst & imm: pc += off
JMP_CALL = 0x85
JMP_EXIT = 0x95
LD_IMM_DW = 0x18  # 64-bit immediate; src_reg != 0 marks a map or BTF reference

# Registers the prologue fills; r1 (the context) is never written, so a program appended after
# ours starts with the register state it was written for.
R0, R1, R_TYPE, R_ACCESS, R_MAJOR, R_MINOR = 0, 1, 2, 3, 4, 5

_INSN = struct.Struct("=BBhi")


class _RuleFields(NamedTuple):
    type: str
    major: int | None
    minor: int | None
    access: str


class DeviceRule(_RuleFields):
    """One allow rule: ``type`` c, b or a (any), ``major``/``minor`` None for any, ``access`` ⊆ "rwm".

    Checked when made, so no rule the kernel would misread reaches a cgroup or a BPF program.
    """

    __slots__ = ()

    def __new__(cls, type: str, major: int | None, minor: int | None, access: str) -> "DeviceRule":  # noqa: A002
        rule = super().__new__(cls, type, major, minor, access)
        rule._check()
        return rule

    def _check(self) -> None:
        if self.type not in ("a", "b", "c"):
            raise InputError(f"invalid device type in rule {self}: {self.type!r}")
        if self.major is not None and not 0 <= self.major <= MAX_MAJOR:
            raise InputError(f"invalid device major in rule {self}: {self.major}")
        if self.minor is not None and not 0 <= self.minor <= MAX_MINOR:
            raise InputError(f"invalid device minor in rule {self}: {self.minor}")
        if self.type == "a" and (self.major, self.minor) != (None, None):
            raise InputError(f"invalid device rule {self}: type a (all devices) takes no major or minor")
        if not self.access or set(self.access) - set("rwm") or len(set(self.access)) != len(self.access):
            raise InputError(f"invalid device access in rule {self}: {self.access!r}")

    def __str__(self) -> str:
        """The rule as cgroup v1's devices.allow reads it, e.g. ``c 195:0 rw``."""
        major = "*" if self.major is None else self.major
        minor = "*" if self.minor is None else self.minor
        return f"{self.type} {major}:{minor} {self.access}"


class Insn(NamedTuple):
    """One eBPF instruction (struct bpf_insn)."""

    code: int
    dst: int = 0
    src: int = 0
    off: int = 0
    imm: int = 0

    def encode(self) -> bytes:
        # dst_reg and src_reg are 4-bit fields of one byte, dst first in memory order.
        if sys.byteorder == "little":
            regs = (self.src << 4) | self.dst
        else:
            regs = (self.dst << 4) | self.src
        return _INSN.pack(self.code, regs, self.off, self.imm)


def encode(insns: Iterable[Insn]) -> bytes:
    """The kernel's byte form of a program."""
    return b"".join(insn.encode() for insn in insns)


def decode(program: bytes) -> list[Insn]:
    """Instructions of a program in the kernel's byte form (as BPF_OBJ_GET_INFO_BY_FD returns it)."""
    if len(program) % _INSN.size:
        raise ContainerError(f"device filter of {len(program)} bytes is not a whole number of instructions")
    insns = []
    for code, regs, off, imm in _INSN.iter_unpack(program):
        if sys.byteorder == "little":
            dst, src = regs & 0xF, regs >> 4
        else:
            dst, src = regs >> 4, regs & 0xF
        insns.append(Insn(code, dst, src, off, imm))
    return insns


def prologue() -> list[Insn]:
    """Load device type, access mask, major and minor from the context (r1) into r2..r5."""
    return [
        Insn(LDX_MEM_W, R_TYPE, R1, CTX_ACCESS_TYPE),
        Insn(ALU32_AND_K, R_TYPE, imm=0xFFFF),
        Insn(LDX_MEM_W, R_ACCESS, R1, CTX_ACCESS_TYPE),
        Insn(ALU32_RSH_K, R_ACCESS, imm=16),
        Insn(LDX_MEM_W, R_MAJOR, R1, CTX_MAJOR),
        Insn(LDX_MEM_W, R_MINOR, R1, CTX_MINOR),
    ]


def rule_block(rule: DeviceRule) -> list[Insn]:
    """Instructions returning 1 when the request matches ``rule``, else jumping past themselves.

    The access test is ``if access & ~allowed: skip``, which needs no scratch register, so r1
    survives for whatever program follows.
    """
    tests: list[tuple[int, int, int]] = []  # (opcode, register, immediate)
    if rule.type != "a":
        tests.append((JMP_JNE_K, R_TYPE, DEV_TYPE[rule.type]))
    allowed = sum(ACCESS_BIT[a] for a in rule.access)
    if allowed != sum(ACCESS_BIT.values()):
        tests.append((JMP_JSET_K, R_ACCESS, ~allowed))  # sign-extends: any unknown bit also fails
    if rule.major is not None:
        tests.append((JMP_JNE_K, R_MAJOR, rule.major))
    if rule.minor is not None:
        tests.append((JMP_JNE_K, R_MINOR, rule.minor))
    size = len(tests) + 2
    block = [Insn(code, reg, off=size - i - 1, imm=imm) for i, (code, reg, imm) in enumerate(tests)]
    return block + [Insn(ALU64_MOV_K, R0, imm=1), Insn(JMP_EXIT)]


def deny_all() -> list[Insn]:
    """The tail of a filter that has no previous program to fall through to."""
    return [Insn(ALU64_MOV_K, R0, imm=0), Insn(JMP_EXIT)]


def check_appendable(previous: Sequence[Insn]) -> None:
    """Refuse a previous program that would not survive being reloaded as our tail.

    Its instructions come back from the kernel as translated: helper calls carry kernel
    addresses and map loads carry map ids, neither of which can be loaded again. Runtime device
    filters use neither; anything else is not a filter we know how to extend.
    """
    if not previous:
        raise ContainerError("the attached device filter has no instructions")
    for index, insn in enumerate(previous):
        if insn.code == JMP_CALL or (insn.code == LD_IMM_DW and insn.src != 0):
            raise ContainerError(
                f"the attached device filter cannot be extended: instruction {index} "
                f"(opcode {insn.code:#04x}) calls a helper or references a map"
            )


def build_filter(rules: Sequence[DeviceRule], previous: bytes | None = None) -> bytes:
    """A device filter allowing ``rules``, then deciding as ``previous`` did, or denying if None.

    Jump offsets are relative, so the previous program's instructions stay valid when moved
    behind ours unchanged.
    """
    if not rules:
        raise InputError("no device rules to build a device filter from")
    insns = prologue()
    for rule in rules:
        insns += rule_block(rule)
    if previous is None:
        insns += deny_all()
    else:
        tail = decode(previous)
        check_appendable(tail)
        insns += tail
    return encode(insns)
