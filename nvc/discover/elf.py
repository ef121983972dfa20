"""The few ELF facts library selection checks.

The ld cache says which architecture a library was registered for; the file itself
must agree (a stale cache or a mixed multilib tree can point a 64-bit name at a 32-bit
file). Two driver libraries need more: NVIDIA ships two builds of ``libnvidia-tls``
told apart by their GNU ABI note, and the non-GLVND ``libGL``/``libEGL`` are only the
driver's own when they link against ``libnvidia-glcore``/``libnvidia-eglcore``.

Class and machine sit in the first 20 bytes and are read with ``struct`` (every listed
library needs them, and a full parse of ~80 files would dominate ``list``); notes and
DT_NEEDED are read with pyelftools, imported lazily, for the few libraries that need them, once per
file identity: what a process parsed is kept in root's own tmpfs (:mod:`nvc.system.runcache`), so
that a start with no server to ask (a fresh process) imports pyelftools only after a driver upgrade.
"""

from __future__ import annotations

import os
import struct

from nvc.logger import Logger
from nvc.records import NamedTuple

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, BinaryIO

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


class Links(NamedTuple):
    """What a shared object says about its linking: dependencies and ABI note."""

    needed: tuple[str, ...]  # DT_NEEDED entries
    abi_tag: tuple[int, int, int] | None  # GNU/Linux ABI note version, e.g. (2, 3, 99)

    def needs_any(self, prefixes: tuple[str, ...]) -> bool:
        """Whether some DT_NEEDED entry starts with one of ``prefixes``."""
        return any(n.startswith(prefixes) for n in self.needed)


# Links already parsed, by the identity of the file they were read from (device, inode, mtime, size): a
# warm process (the hook server, whose workers inherit what its warm-up read) parses each library once,
# where pyelftools' parse of the TLS and compat-GL libraries was most of a served ``list``. A replaced
# or rewritten file has another identity, so it is parsed again.
_LinksKey = tuple[str, int, int, int, int]
_parsed: dict[_LinksKey, Links | None] = {}
PARSED_KEPT = 64  # identities remembered; past that the memory starts over (a driver upgrade's leftovers)
# What processes parsed since boot, as a JSON list of [path, device, inode, mtime ns, size, DT_NEEDED or
# null (not parsable), ABI note or null]; read once by a process, the first time it needs links.
LINKS_CACHE = "/run/nvc-py/elf-links.json"
MAX_LINKS_CACHE = 256 * 1024
_cache_read = False


def read_links(path: str) -> Links | None:
    """DT_NEEDED and ABI note of the ELF file at ``path``, or None if it cannot be parsed."""
    try:
        with open(path, "rb") as stream:
            st = os.fstat(stream.fileno())
            key = (path, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
            if key not in _parsed:
                _read_cache()
            if key not in _parsed:
                if len(_parsed) >= PARSED_KEPT:
                    _parsed.clear()
                _parsed[key] = _parse_links(path, stream)
                _store_cache()
            return _parsed[key]
    except OSError as err:
        log.debug("%s: not a parsable ELF file: %s", path, err)
        return None


def _read_cache() -> None:
    """Adds what :data:`LINKS_CACHE` holds to this process's links, once; an entry of any other shape
    (or a file that is not root's own) is ignored, and parsed again when needed."""
    global _cache_read
    if _cache_read:
        return
    _cache_read = True
    from nvc.system import runcache

    raw = runcache.load(LINKS_CACHE, MAX_LINKS_CACHE)
    if raw is None:
        return
    import json

    try:
        entries = json.loads(raw)
    except (ValueError, RecursionError):
        return
    if not isinstance(entries, list) or len(entries) > PARSED_KEPT:
        return
    for entry in entries:
        decoded = _decoded(entry)
        if decoded is not None and len(_parsed) < PARSED_KEPT:
            _parsed.setdefault(*decoded)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _decoded(entry: Any) -> tuple[_LinksKey, Links | None] | None:
    """A cache entry (JSON) as (key, links), or None where it is not one."""
    if not isinstance(entry, list) or len(entry) != 7:
        return None
    path, dev, ino, mtime, size, needed, abi_tag = entry
    if not isinstance(path, str) or not all(_is_int(n) for n in (dev, ino, mtime, size)):
        return None
    key = (path, dev, ino, mtime, size)
    if needed is None:
        return (key, None) if abi_tag is None else None
    if not isinstance(needed, list) or not all(isinstance(n, str) for n in needed):
        return None
    if abi_tag is None:
        return key, Links(tuple(needed), None)
    if not isinstance(abi_tag, list) or len(abi_tag) != 3 or not all(_is_int(n) for n in abi_tag):
        return None
    return key, Links(tuple(needed), (abi_tag[0], abi_tag[1], abi_tag[2]))


def _store_cache() -> None:
    """Writes this process's links to :data:`LINKS_CACHE` (best effort: root only)."""
    import json

    from nvc.system import runcache

    entries = [
        [*key, None, None] if links is None else [*key, list(links.needed), links.abi_tag]
        for key, links in _parsed.items()
    ]
    runcache.store(LINKS_CACHE, json.dumps(entries).encode())


def _parse_links(path: str, stream: BinaryIO) -> Links | None:
    """What :func:`read_links` returns, parsed from the open file."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSegment
    from elftools.elf.elffile import ELFFile
    from elftools.elf.segments import NoteSegment

    try:
        elf = ELFFile(stream)
        needed: list[str] = []
        abi_tag = None
        for segment in elf.iter_segments():
            if isinstance(segment, DynamicSegment):
                needed.extend(t.needed for t in segment.iter_tags() if t.entry.d_tag == "DT_NEEDED")  # type: ignore[attr-defined]  # set on DT_NEEDED tags only
            elif isinstance(segment, NoteSegment):
                for note in segment.iter_notes():
                    desc = note["n_desc"]
                    if note["n_type"] == "NT_GNU_ABI_TAG" and desc["abi_os"] == "ELF_NOTE_OS_LINUX":
                        abi_tag = (desc["abi_major"], desc["abi_minor"], desc["abi_tiny"])
        return Links(tuple(needed), abi_tag)
    except (OSError, ELFError, ValueError, struct.error) as err:
        log.debug("%s: not a parsable ELF file: %s", path, err)
        return None
