"""The few bpf(2) commands a device-cgroup update needs: their attribute layouts, for the system
call of :mod:`nvc.system.syscalls`.

No detach: filters are swapped with BPF_F_REPLACE (or, for a single-program attachment, by
attaching over it), so the cgroup is never left without one.

No BPF library is installed or wanted: five commands with fixed attribute layouts are a page of
code. Failures raise OSError with the kernel's errno; callers add which cgroup they were
working on.
"""

from __future__ import annotations

import ctypes
import errno

from nvc.system import syscalls

# Commands (enum bpf_cmd).
PROG_LOAD = 5
PROG_ATTACH = 8
PROG_GET_FD_BY_ID = 13
OBJ_GET_INFO_BY_FD = 15
PROG_QUERY = 16

PROG_TYPE_CGROUP_DEVICE = 15  # enum bpf_prog_type
ATTACH_CGROUP_DEVICE = 6  # enum bpf_attach_type: BPF_CGROUP_DEVICE

# Attach flags.
F_ALLOW_OVERRIDE = 1
F_ALLOW_MULTI = 2
F_REPLACE = 4

INSN_SIZE = 8
LOG_SIZE = 1 << 16  # verifier log kept when a load fails


class _ProgLoadAttr(ctypes.Structure):
    _fields_ = [
        ("prog_type", ctypes.c_uint32),
        ("insn_cnt", ctypes.c_uint32),
        ("insns", ctypes.c_uint64),
        ("license", ctypes.c_uint64),
        ("log_level", ctypes.c_uint32),
        ("log_size", ctypes.c_uint32),
        ("log_buf", ctypes.c_uint64),
        ("kern_version", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32),
        ("prog_name", ctypes.c_char * 16),
    ]


class _AttachAttr(ctypes.Structure):
    _fields_ = [
        ("target_fd", ctypes.c_uint32),
        ("attach_bpf_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("attach_flags", ctypes.c_uint32),
        ("replace_bpf_fd", ctypes.c_uint32),
    ]


class _QueryAttr(ctypes.Structure):
    _fields_ = [
        ("target_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("query_flags", ctypes.c_uint32),
        ("attach_flags", ctypes.c_uint32),
        ("prog_ids", ctypes.c_uint64),
        ("prog_cnt", ctypes.c_uint32),
    ]


class _GetFdByIdAttr(ctypes.Structure):
    _fields_ = [("prog_id", ctypes.c_uint32), ("next_id", ctypes.c_uint32), ("open_flags", ctypes.c_uint32)]


class _InfoAttr(ctypes.Structure):
    _fields_ = [("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32), ("info", ctypes.c_uint64)]


class _ProgInfo(ctypes.Structure):
    """The head of struct bpf_prog_info: the kernel fills only as much as we pass."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("tag", ctypes.c_uint8 * 8),
        ("jited_prog_len", ctypes.c_uint32),
        ("xlated_prog_len", ctypes.c_uint32),
        ("jited_prog_insns", ctypes.c_uint64),
        ("xlated_prog_insns", ctypes.c_uint64),
    ]


def prog_load(prog_type: int, program: bytes, license: str, name: str) -> int:
    """Load ``program`` (instruction bytes); return its fd. A verifier rejection carries the log."""
    insns = ctypes.create_string_buffer(program, len(program))
    lic = ctypes.create_string_buffer(license.encode())
    attr = _ProgLoadAttr(
        prog_type=prog_type,
        insn_cnt=len(program) // INSN_SIZE,
        insns=ctypes.addressof(insns),
        license=ctypes.addressof(lic),
        prog_name=name.encode()[:15],
    )
    try:
        return syscalls.bpf(PROG_LOAD, attr)
    except OSError as first:
        if first.errno not in (errno.EINVAL, errno.EACCES):
            raise
        # Load again only to get the verifier's explanation: logging slows every load.
        log = ctypes.create_string_buffer(LOG_SIZE)
        attr.log_level, attr.log_size, attr.log_buf = 1, LOG_SIZE, ctypes.addressof(log)
        try:
            return syscalls.bpf(PROG_LOAD, attr)
        except OSError as err:
            text = log.value.decode(errors="replace").strip().splitlines()
            raise OSError(err.errno, f"{err.strerror}: {' / '.join(text[-3:])}") from None


def prog_query(target_fd: int, attach_type: int) -> tuple[int, list[int]]:
    """Attach flags and ids of the programs attached to ``target_fd`` itself (not its ancestors)."""
    capacity = 8
    while True:
        ids = (ctypes.c_uint32 * capacity)()
        attr = _QueryAttr(
            target_fd=target_fd, attach_type=attach_type, prog_ids=ctypes.addressof(ids), prog_cnt=capacity
        )
        try:
            syscalls.bpf(PROG_QUERY, attr)
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
            capacity = attr.prog_cnt  # the kernel reports how many there are
            continue
        return attr.attach_flags, list(ids[: attr.prog_cnt])


def prog_attach(target_fd: int, prog_fd: int, attach_type: int, flags: int, replace_fd: int = 0) -> None:
    """Attach ``prog_fd``; with F_REPLACE, atomically in place of ``replace_fd``."""
    syscalls.bpf(
        PROG_ATTACH,
        _AttachAttr(
            target_fd=target_fd,
            attach_bpf_fd=prog_fd,
            attach_type=attach_type,
            attach_flags=flags,
            replace_bpf_fd=replace_fd,
        ),
    )


def prog_get_fd_by_id(prog_id: int) -> int:
    return syscalls.bpf(PROG_GET_FD_BY_ID, _GetFdByIdAttr(prog_id=prog_id))


def _prog_info(prog_fd: int, info: _ProgInfo) -> None:
    syscalls.bpf(
        OBJ_GET_INFO_BY_FD, _InfoAttr(bpf_fd=prog_fd, info_len=ctypes.sizeof(info), info=ctypes.addressof(info))
    )


def prog_xlated(prog_fd: int) -> bytes:
    """The loaded program's instructions as the verifier left them."""
    info = _ProgInfo()
    _prog_info(prog_fd, info)
    size = info.xlated_prog_len
    buf = ctypes.create_string_buffer(size)
    info = _ProgInfo(xlated_prog_len=size, xlated_prog_insns=ctypes.addressof(buf))
    _prog_info(prog_fd, info)
    if info.xlated_prog_insns == 0:
        # The kernel withholds raw instructions from readers who may not see kernel addresses.
        raise OSError(errno.EPERM, "the kernel withholds program instructions (kernel.kptr_restrict)")
    return buf.raw[: min(size, info.xlated_prog_len)]
