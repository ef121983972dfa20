"""Parser for glibc's ``ld.so.cache``.

The driver's libraries are found the way the dynamic linker finds them: through the
cache, not by globbing directories, so that a driver installed anywhere ldconfig knows
about (``/usr/lib/x86_64-linux-gnu``, ``/usr/local/nvidia/lib64`` …) is picked up.

Only glibc's new format (``glibc-ld.so.cache`` version ``1.1``) is understood. Caches
written with ``ldconfig -c compat`` start with an old-format (``ld.so-1.7.0``) table;
it is skipped using its entry count, the new header following at the next aligned
offset. String offsets of new-format entries are relative to the new header.
"""

import os
import struct

from nvc.errors import DetectionError
from nvc.records import NamedTuple

OLD_MAGIC = b"ld.so-1.7.0"
NEW_MAGIC = b"glibc-ld.so.cache1.1"

# struct cache_file { char magic[6]; char version[5]; unsigned nlibs; entries[] }: the
# 11 magic bytes are padded to 12 before nlibs; each entry is (int flags, key, value).
_OLD_HEADER = struct.Struct("=11sxI")
_OLD_ENTRY_SIZE = 12
# struct cache_file_new { magic+version[20]; nlibs; len_strings; flags; pad[3];
# extension_offset; unused[3] }, then entries (flags, key, value, osversion, hwcap).
_NEW_HEADER = struct.Struct("=20sIIB3xI12x")
_NEW_ENTRY = struct.Struct("=iIIIQ")

FLAG_ELF = 0x0001
FLAG_ARCH_MASK = 0xFF00

# Architecture bits of an entry's flags (glibc's FLAG_*_LIB* values).
ARCH_FLAGS: dict[str, int] = {
    "i386": 0x0000,
    "x86_64": 0x0300,
    "ppc64le": 0x0500,
    "x32": 0x0800,
    "armhf": 0x0900,
    "aarch64": 0x0A00,
}

# os.uname().machine → cache architecture of the native (64-bit) and compat32 libraries.
_MACHINE_ARCHES: dict[str, tuple[str, str | None]] = {
    "x86_64": ("x86_64", "i386"),
    "aarch64": ("aarch64", None),
    "ppc64le": ("ppc64le", None),
}


class CacheEntry(NamedTuple):
    """One library the cache maps from a name (usually a SONAME) to a path."""

    key: str  # "libcuda.so.1"
    value: str  # "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
    flags: int

    @property
    def arch_flags(self) -> int:
        return self.flags & FLAG_ARCH_MASK

    @property
    def is_elf(self) -> bool:
        return bool(self.flags & FLAG_ELF)


def native_arches(machine: str) -> tuple[str, str | None]:
    """Cache architectures of the native and the 32-bit compat libraries on ``machine``."""
    try:
        return _MACHINE_ARCHES[machine]
    except KeyError:
        raise DetectionError(f"unsupported architecture: {machine}") from None


def _new_header_offset(data: bytes, path: str) -> int:
    """Where the new-format header starts: 0, or after a leading old-format table."""
    if data.startswith(NEW_MAGIC):
        return 0
    if not data.startswith(OLD_MAGIC):
        raise DetectionError(f"{path}: unsupported file format")
    if len(data) < _OLD_HEADER.size:
        raise DetectionError(f"{path}: truncated")
    nlibs: int = _OLD_HEADER.unpack_from(data, 0)[1]
    end = _OLD_HEADER.size + nlibs * _OLD_ENTRY_SIZE
    if end > len(data):
        raise DetectionError(f"{path}: truncated")
    # ldconfig aligns the new header to the struct's alignment: 8 where uint64_t is
    # 8-aligned (64-bit writers), 4 on i386; accept either.
    for align in (8, 4):
        offset = (end + align - 1) & ~(align - 1)
        if data.startswith(NEW_MAGIC, offset):
            return offset
    raise DetectionError(f"{path}: unsupported file format")


def _c_string(data: bytes, offset: int, path: str) -> str:
    end = data.find(b"\0", offset)
    if offset >= len(data) or end < 0:
        raise DetectionError(f"{path}: truncated")
    return data[offset:end].decode("utf-8", errors="surrogateescape")


def parse(data: bytes, path: str) -> tuple[CacheEntry, ...]:
    """Entries of a cache file's contents, in file order; ``path`` names it in errors."""
    base = _new_header_offset(data, path)
    if len(data) < base + _NEW_HEADER.size:
        raise DetectionError(f"{path}: truncated")
    _, nlibs, len_strings, _, _ = _NEW_HEADER.unpack_from(data, base)
    first = base + _NEW_HEADER.size
    if first + nlibs * _NEW_ENTRY.size + len_strings > len(data):
        raise DetectionError(f"{path}: truncated")
    entries = []
    for i in range(nlibs):
        flags, key, value, _, _ = _NEW_ENTRY.unpack_from(data, first + i * _NEW_ENTRY.size)
        entries.append(CacheEntry(_c_string(data, base + key, path), _c_string(data, base + value, path), flags))
    return tuple(entries)


# The last file contents parsed and their entries: a process that discovers more than once (the
# hook server plans once before forking its workers) parses an unchanged cache once. Keyed by the
# contents themselves, so a rewritten cache is always parsed again.
_last_parsed: tuple[bytes, tuple[CacheEntry, ...]] = (b"", ())


def read(path: str | os.PathLike[str]) -> tuple[CacheEntry, ...]:
    """Parse the cache file at ``path`` (a host path: callers resolve it inside the driver root)."""
    global _last_parsed
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as err:
        raise DetectionError(f"{path}: {err.strerror or err}") from None
    if data and data == _last_parsed[0]:
        return _last_parsed[1]
    entries = parse(data, os.fspath(path))
    _last_parsed = (data, entries)
    return entries


def select(entries: tuple[CacheEntry, ...], arch: str) -> tuple[CacheEntry, ...]:
    """ELF entries built for ``arch`` (a key of :data:`ARCH_FLAGS`), in cache order."""
    wanted = ARCH_FLAGS[arch]
    return tuple(e for e in entries if e.is_elf and e.arch_flags == wanted)
