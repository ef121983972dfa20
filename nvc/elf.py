"""The few ELF facts library selection checks.

The ld cache says which architecture a library was registered for; the file itself
must agree (a stale cache or a mixed multilib tree can point a 64-bit name at a 32-bit
file). Two driver libraries need more: NVIDIA ships two builds of ``libnvidia-tls``
told apart by their GNU ABI note, and the non-GLVND ``libGL``/``libEGL`` are only the
driver's own when they link against ``libnvidia-glcore``/``libnvidia-eglcore``.

Class and machine sit in the first 20 bytes and are read with ``struct`` (every listed
library needs them, and a full parse of ~80 files would dominate ``list``); notes and
DT_NEEDED are read from the program headers, for the few libraries that need them.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from nvc.logger import Logger

log = Logger(__name__)

EM_386, EM_PPC64, EM_ARM, EM_X86_64, EM_AARCH64 = 3, 21, 40, 62, 183

# ld cache architecture → (ELF class in bits, e_machine) of the files it may point at.
ARCH_ELF: dict[str, tuple[int, int]] = {
    "x86_64": (64, EM_X86_64),
    "i386": (32, EM_386),
    "x32": (32, EM_X86_64),
    "aarch64": (64, EM_AARCH64),
    "armhf": (32, EM_ARM),
    "ppc64le": (64, EM_PPC64),
}

_CLASSES = {1: 32, 2: 64}
_BYTE_ORDERS = {1: "<", 2: ">"}


def identity(path: str) -> tuple[int, int] | None:
    """(class in bits, e_machine) of the ELF file at ``path``, or None if it is not one."""
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError as err:
        log.debug("%s: %s", path, err.strerror)
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[4] not in _CLASSES or head[5] not in _BYTE_ORDERS:
        return None
    (machine,) = struct.unpack_from(_BYTE_ORDERS[head[5]] + "H", head, 18)
    return _CLASSES[head[4]], machine


def matches(path: str, arch: str) -> bool:
    """Whether ``path`` is an ELF file built for the ld cache architecture ``arch``."""
    return identity(path) == ARCH_ELF[arch]


@dataclass(frozen=True)
class Links:
    """What a shared object says about its linking: dependencies and ABI note."""

    needed: tuple[str, ...]  # DT_NEEDED entries
    abi_tag: tuple[int, int, int] | None  # GNU/Linux ABI note version, e.g. (2, 3, 99)

    def needs_any(self, prefixes: tuple[str, ...]) -> bool:
        """Whether some DT_NEEDED entry starts with one of ``prefixes``."""
        return any(n.startswith(prefixes) for n in self.needed)


PT_LOAD, PT_DYNAMIC, PT_NOTE = 1, 2, 4
DT_NULL, DT_NEEDED, DT_STRTAB = 0, 1, 5
NT_GNU_ABI_TAG, ELF_NOTE_OS_LINUX = 1, 0
MAX_TABLE = 1 << 20  # bytes of one dynamic table or note segment read (real ones are a few KiB)
# Per ELF class: e_phoff's format and offset, e_phentsize's offset (e_phnum follows), the program
# header's leading fields up to p_filesz, and a dynamic entry's format.
_LAYOUT = {32: ("I", 28, 42, "IIIII", "iI"), 64: ("Q", 32, 54, "IIQQQQ", "qQ")}


class _Reader:
    """Reads of one open ELF file at file offsets, failing with struct.error when short."""

    def __init__(self, fd: int, order: str) -> None:
        self.fd, self.order = fd, order

    def unpack(self, fmt: str, offset: int) -> tuple[int, ...]:
        fmt = self.order + fmt
        return struct.unpack(fmt, os.pread(self.fd, struct.calcsize(fmt), offset))

    def read(self, size: int, offset: int) -> bytes:
        return os.pread(self.fd, min(size, MAX_TABLE), offset)


def _segments(r: _Reader, bits: int) -> list[tuple[int, int, int, int]]:
    """(p_type, p_offset, p_vaddr, p_filesz) of each program header."""
    off_fmt, off_at, count_at, header, _ = _LAYOUT[bits]
    (phoff,) = r.unpack(off_fmt, off_at)
    entsize, count = r.unpack("HH", count_at)
    out = []
    for i in range(count):
        fields = r.unpack(header, phoff + i * entsize)
        if bits == 64:  # p_flags comes second here, last in 32-bit headers
            fields = fields[:1] + fields[2:]
        p_type, p_offset, p_vaddr, _paddr, p_filesz = fields
        out.append((p_type, p_offset, p_vaddr, p_filesz))
    return out


def _needed(r: _Reader, bits: int, segments: list[tuple[int, int, int, int]], offset: int, size: int) -> list[str]:
    """DT_NEEDED names of the dynamic table at ``offset``; DT_STRTAB's address is mapped to a file
    offset through the PT_LOAD segments, as the dynamic loader sees the file."""
    fmt = r.order + _LAYOUT[bits][4]
    entries = []
    for tag, value in struct.iter_unpack(fmt, r.read(size - size % struct.calcsize(fmt), offset)):
        if tag == DT_NULL:
            break
        entries.append((tag, value))
    strtab = next((v for t, v in entries if t == DT_STRTAB), None)
    names = [v for t, v in entries if t == DT_NEEDED]
    if not names:
        return []
    base = next((strtab - vaddr + off for t, off, vaddr, filesz in segments
                 if strtab is not None and t == PT_LOAD and vaddr <= strtab < vaddr + filesz), None)
    if base is None:
        raise ValueError("DT_STRTAB outside the loaded segments")
    return [r.read(4096, base + name).split(b"\0", 1)[0].decode() for name in names]


def _abi_tag(r: _Reader, offset: int, size: int) -> tuple[int, int, int] | None:
    """The GNU/Linux ABI note in the note segment at ``offset``, if it holds one."""
    data, at = r.read(size, offset), 0
    while at + 12 < len(data):
        namesz, descsz, kind = struct.unpack_from(r.order + "III", data, at)
        name = data[at + 12:at + 12 + namesz].split(b"\0", 1)[0]
        desc = at + 12 + (namesz + 3) // 4 * 4
        if kind == NT_GNU_ABI_TAG and name == b"GNU":
            abi_os, major, minor, tiny = struct.unpack_from(r.order + "IIII", data, desc)
            return (major, minor, tiny) if abi_os == ELF_NOTE_OS_LINUX else None
        at = desc + (descsz + 3) // 4 * 4
    return None


def read_links(path: str) -> Links | None:
    """DT_NEEDED and ABI note of the ELF file at ``path``, or None if it cannot be parsed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as err:
        log.debug("%s: not a parsable ELF file: %s", path, err)
        return None
    try:
        head = os.pread(fd, 16, 0)
        if len(head) < 16 or head[:4] != b"\x7fELF" or head[4] not in _CLASSES or head[5] not in _BYTE_ORDERS:
            raise ValueError("not an ELF file")
        r, bits = _Reader(fd, _BYTE_ORDERS[head[5]]), _CLASSES[head[4]]
        segments = _segments(r, bits)
        needed: list[str] = []
        abi_tag = None
        for p_type, p_offset, _vaddr, p_filesz in segments:
            if p_type == PT_DYNAMIC:
                needed.extend(_needed(r, bits, segments, p_offset, p_filesz))
            elif p_type == PT_NOTE:
                abi_tag = _abi_tag(r, p_offset, p_filesz) or abi_tag
        return Links(tuple(needed), abi_tag)
    except (OSError, ValueError, struct.error) as err:  # UnicodeDecodeError is a ValueError
        log.debug("%s: not a parsable ELF file: %s", path, err)
        return None
    finally:
        os.close(fd)
