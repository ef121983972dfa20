"""Device rules and the cgroup v2 device filter: encoding, semantics, and the real verifier."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess

import pytest

from nvc.apply import bpf
from nvc.errors import ContainerError, InputError
from nvc.plan.devfilter import (
    ACCESS_BIT,
    ALU32_AND_K,
    ALU32_RSH_K,
    ALU64_MOV_K,
    DEV_TYPE,
    JMP_CALL,
    JMP_EXIT,
    JMP_JNE_K,
    JMP_JSET_K,
    LD_IMM_DW,
    LDX_MEM_W,
    DeviceRule,
    Insn,
    build_filter,
    decode,
)


def run_filter(program: bytes, dev_type: str, access: str, major: int, minor: int) -> int:
    """Evaluate a device filter the way the kernel would, for the opcodes filters use."""
    ctx = [DEV_TYPE[dev_type] | (sum(ACCESS_BIT[a] for a in access) << 16), major, minor]
    insns = decode(program)
    regs = [0] * 11
    regs[1] = "ctx"
    pc = 0
    while True:
        insn = insns[pc]
        pc += 1
        imm64 = insn.imm & 0xFFFFFFFFFFFFFFFF  # immediates are sign-extended to 64 bits
        if insn.code == LDX_MEM_W:
            assert regs[insn.src] == "ctx", f"load from r{insn.src}, which no longer holds the context"
            regs[insn.dst] = ctx[insn.off // 4]
        elif insn.code == ALU32_AND_K:
            regs[insn.dst] = regs[insn.dst] & insn.imm & 0xFFFFFFFF
        elif insn.code == ALU32_RSH_K:
            regs[insn.dst] = (regs[insn.dst] & 0xFFFFFFFF) >> insn.imm
        elif insn.code == ALU64_MOV_K:
            regs[insn.dst] = imm64
        elif insn.code == JMP_JNE_K:
            pc += insn.off if regs[insn.dst] != imm64 else 0
        elif insn.code == JMP_JSET_K:
            pc += insn.off if regs[insn.dst] & imm64 else 0
        elif insn.code == JMP_EXIT:
            return regs[0]
        else:
            raise AssertionError(f"unexpected opcode {insn.code:#x}")


def test_rule_text_is_devices_allow_syntax() -> None:
    assert str(DeviceRule("c", 195, 0, "rw")) == "c 195:0 rw"
    assert str(DeviceRule("b", 8, None, "r")) == "b 8:* r"
    assert str(DeviceRule("a", None, None, "rwm")) == "a *:* rwm"


@pytest.mark.parametrize(
    "args",
    [
        ("x", 1, 3, "rw"),
        ("c", 4096, 0, "rw"),
        ("c", 1, 1 << 20, "rw"),
        ("c", -1, 3, "rw"),
        ("c", 1, 3, ""),
        ("c", 1, 3, "rwx"),
        ("c", 1, 3, "rr"),
        ("a", 1, None, "rw"),
    ],
)
def test_invalid_rule_is_refused(args: tuple) -> None:
    with pytest.raises(InputError, match="rule"):
        DeviceRule(*args)


def test_encoding_of_a_rule_set() -> None:
    rules = [DeviceRule("c", 195, 255, "rw"), DeviceRule("b", 8, None, "rwm"), DeviceRule("a", None, None, "m")]
    insns = decode(build_filter(rules))
    prologue = [
        Insn(LDX_MEM_W, 2, 1, 0),
        Insn(ALU32_AND_K, 2, imm=0xFFFF),
        Insn(LDX_MEM_W, 3, 1, 0),
        Insn(ALU32_RSH_K, 3, imm=16),
        Insn(LDX_MEM_W, 4, 1, 4),
        Insn(LDX_MEM_W, 5, 1, 8),
    ]
    allow = [Insn(ALU64_MOV_K, 0, imm=1), Insn(JMP_EXIT)]
    char_195_255_rw = [
        Insn(JMP_JNE_K, 2, off=5, imm=2),
        Insn(JMP_JSET_K, 3, off=4, imm=~6),
        Insn(JMP_JNE_K, 4, off=3, imm=195),
        Insn(JMP_JNE_K, 5, off=2, imm=255),
    ] + allow
    block_8_any = [Insn(JMP_JNE_K, 2, off=3, imm=1), Insn(JMP_JNE_K, 4, off=2, imm=8)] + allow
    any_mknod = [Insn(JMP_JSET_K, 3, off=2, imm=~1)] + allow
    deny = [Insn(ALU64_MOV_K, 0, imm=0), Insn(JMP_EXIT)]
    assert insns == prologue + char_195_255_rw + block_8_any + any_mknod + deny
    assert not any(i.dst == 1 for i in insns), "r1 (the context) must survive for an appended program"


def test_decisions_of_a_fresh_filter() -> None:
    program = build_filter([DeviceRule("c", 195, 0, "rw"), DeviceRule("c", 238, None, "r")])
    assert run_filter(program, "c", "rw", 195, 0) == 1
    assert run_filter(program, "c", "r", 195, 0) == 1
    assert run_filter(program, "c", "rwm", 195, 0) == 0  # mknod not granted
    assert run_filter(program, "b", "r", 195, 0) == 0
    assert run_filter(program, "c", "rw", 195, 1) == 0
    assert run_filter(program, "c", "r", 238, 7) == 1
    assert run_filter(program, "c", "w", 238, 7) == 0
    assert run_filter(program, "c", "r", 1, 3) == 0


def test_prepended_rules_fall_through_to_the_previous_program() -> None:
    runtime = build_filter([DeviceRule("c", 1, 3, "rwm"), DeviceRule("c", 136, None, "rw")])
    program = build_filter([DeviceRule("c", 195, 0, "rw")], previous=runtime)
    assert decode(program)[-len(decode(runtime)) :] == decode(runtime)
    for dev_type, access, major, minor in itertools.product("cb", ["r", "w", "rw", "m", "rwm"], [1, 136, 195], [0, 3]):
        expected = run_filter(runtime, dev_type, access, major, minor) or int(
            (dev_type, major, minor) == ("c", 195, 0) and "m" not in access
        )
        assert run_filter(program, dev_type, access, major, minor) == expected, (dev_type, access, major, minor)


@pytest.mark.parametrize(
    "bad", [Insn(JMP_CALL, imm=5), Insn(LD_IMM_DW, 1, 1, imm=3)], ids=["helper call", "map reference"]
)
def test_previous_program_that_cannot_be_reloaded_is_refused(bad: Insn) -> None:
    previous = bad.encode() + Insn(ALU64_MOV_K, 0, imm=1).encode() + Insn(JMP_EXIT).encode()
    with pytest.raises(ContainerError, match="cannot be extended: instruction 0"):
        build_filter([DeviceRule("c", 1, 3, "rw")], previous=previous)


def test_truncated_program_is_refused() -> None:
    with pytest.raises(ContainerError, match="not a whole number"):
        build_filter([DeviceRule("c", 1, 3, "rw")], previous=b"\x95" * 12)


def test_kernel_verifier_accepts_filters_unchanged() -> None:
    """The kernel loads our programs and hands them back byte for byte, so one can be appended again."""
    runtime = build_filter([DeviceRule("c", 1, 3, "rwm"), DeviceRule("a", None, None, "m")])
    for program in (runtime, build_filter([DeviceRule("c", 195, 0, "rw")], previous=runtime)):
        fd = bpf.prog_load(bpf.PROG_TYPE_CGROUP_DEVICE, program, "Apache-2.0", "nvc_test")
        try:
            assert bpf.prog_xlated(fd) == program
        finally:
            os.close(fd)


def test_verifier_rejection_is_explained() -> None:
    no_exit = Insn(ALU64_MOV_K, 0, imm=1).encode()
    with pytest.raises(OSError) as info:
        bpf.prog_load(bpf.PROG_TYPE_CGROUP_DEVICE, no_exit, "Apache-2.0", "nvc_test")
    assert ":" in info.value.strerror  # errno text, then the verifier's last lines


def _prog_id(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        return int(next(line.split()[1] for line in f if line.startswith("prog_id:")))


@pytest.mark.skipif(shutil.which("bpftool") is None, reason="bpftool not installed")
def test_bpftool_reads_the_program_as_intended() -> None:
    """An independent decoder (bpftool) prints the instructions we meant to write."""
    program = build_filter([DeviceRule("c", 195, 255, "rw")])
    fd = bpf.prog_load(bpf.PROG_TYPE_CGROUP_DEVICE, program, "Apache-2.0", "nvc_test")
    try:
        out = subprocess.run(
            ["bpftool", "prog", "dump", "xlated", "id", str(_prog_id(fd))], capture_output=True, text=True, check=True
        ).stdout
    finally:
        os.close(fd)
    lines = [line.split(": ", 1)[1] for line in out.strip().splitlines()]
    assert lines == [
        "(61) r2 = *(u32 *)(r1 +0)",
        "(54) w2 &= 65535",
        "(61) r3 = *(u32 *)(r1 +0)",
        "(74) w3 >>= 16",
        "(61) r4 = *(u32 *)(r1 +4)",
        "(61) r5 = *(u32 *)(r1 +8)",
        "(55) if r2 != 0x2 goto pc+5",
        "(45) if r3 & 0xfffffff9 goto pc+4",
        "(55) if r4 != 0xc3 goto pc+3",
        "(55) if r5 != 0xff goto pc+2",
        "(b7) r0 = 1",
        "(95) exit",
        "(b7) r0 = 0",
        "(95) exit",
    ]
