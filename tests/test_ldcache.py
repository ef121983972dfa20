"""ld.so.cache parsing: the host's real cache against ``ldconfig -p``, compat-format caches, crafted damage."""

from __future__ import annotations

import re
import struct
import subprocess
from pathlib import Path

import pytest

from nvc.discover import ldcache
from nvc.errors import DetectionError

HOST_CACHE = Path("/etc/ld.so.cache")
_LDCONFIG_LINE = re.compile(r"^\t(\S+) \(([^)]*)\) => (.+)$")


def ldconfig_p(cache: Path) -> list[tuple[str, str, bool]]:
    """(key, path, is x86-64) per entry, as glibc's own ``ldconfig -p`` prints them."""
    out = subprocess.run(["ldconfig", "-p", "-C", str(cache)], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in (line for line in out.splitlines() if line.startswith("\t")):
        m = _LDCONFIG_LINE.match(line)
        assert m, line
        rows.append((m.group(1), m.group(3), "x86-64" in m.group(2).split(",")))
    return rows


def build_cache(entries: list[tuple[str, str, int]], old_prefix: bool = False, align: int = 8) -> bytes:
    """A cache in glibc's new format (optionally behind an old-format table), written the way ldconfig lays it out."""
    strings = b""
    offsets = []
    header_size, entry_size = 48, 24
    string_base = header_size + entry_size * len(entries)
    for key, value, _ in entries:
        k = string_base + len(strings)
        strings += key.encode() + b"\0"
        v = string_base + len(strings)
        strings += value.encode() + b"\0"
        offsets.append((k, v))
    new = struct.pack("=20sIIB3xI12x", b"glibc-ld.so.cache1.1", len(entries), len(strings), 0, 0)
    for (k, v), (_, _, flags) in zip(offsets, entries, strict=True):
        new += struct.pack("=iIIIQ", flags, k, v, 0, 0)
    new += strings
    if not old_prefix:
        return new
    old = struct.pack("=11sxI", b"ld.so-1.7.0", len(entries))
    old += b"".join(struct.pack("=iII", flags, 0, 0) for _, _, flags in entries)
    pad = (-len(old)) % align
    return old + b"\0" * pad + new


ENTRIES = [
    ("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", 0x0303),
    ("libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1", 0x0003),
    ("libfoo.so.1", "/usr/libx32/libfoo.so.1", 0x0803),
    ("libbar.so.5", "/usr/lib/libbar.so.5", 0x0300),  # arch bits but not ELF
]


@pytest.mark.skipif(not HOST_CACHE.exists(), reason="no /etc/ld.so.cache")
def test_host_cache_matches_ldconfig() -> None:
    entries = ldcache.read(HOST_CACHE)
    expected = ldconfig_p(HOST_CACHE)
    assert len(entries) == len(expected) > 10
    assert [(e.key, e.value) for e in entries] == [(k, v) for k, v, _ in expected]
    assert [e.arch_flags == ldcache.ARCH_FLAGS["x86_64"] for e in entries] == [x for _, _, x in expected]
    native = ldcache.select(entries, "x86_64")
    assert native and all(e.is_elf and e.flags & 0xFF00 == 0x0300 for e in native)


def test_compat_format_written_by_ldconfig(tmp_path: Path) -> None:
    """``ldconfig -c compat`` prefixes an old-format table; its new part must parse like ``-c new``."""
    compat, new = tmp_path / "compat", tmp_path / "new"
    for fmt, out in (("compat", compat), ("new", new)):
        subprocess.run(["ldconfig", "-X", "-c", fmt, "-C", str(out)], check=True)
    assert compat.read_bytes().startswith(b"ld.so-1.7.0")
    parsed = ldcache.read(compat)
    assert parsed == ldcache.read(new)
    assert [(e.key, e.value) for e in parsed] == [(k, v) for k, v, _ in ldconfig_p(compat)]


@pytest.mark.parametrize("align", [8, 4])
def test_crafted_old_prefix_any_alignment(align: int) -> None:
    data = build_cache(ENTRIES, old_prefix=True, align=align)
    assert ldcache.parse(data, "c") == ldcache.parse(build_cache(ENTRIES), "c")


def test_arch_filter() -> None:
    entries = ldcache.parse(build_cache(ENTRIES), "c")
    assert [e.value for e in ldcache.select(entries, "x86_64")] == ["/usr/lib/x86_64-linux-gnu/libcuda.so.1"]
    assert [e.value for e in ldcache.select(entries, "i386")] == ["/usr/lib/i386-linux-gnu/libcuda.so.1"]
    assert [e.value for e in ldcache.select(entries, "x32")] == ["/usr/libx32/libfoo.so.1"]
    assert ldcache.select(entries, "aarch64") == ()


def _truncations() -> list[bytes]:
    good = build_cache(ENTRIES)
    return [good[:30], good[:60], good[:-5], good.replace(b"libbar.so.5\0", b"libbar.so.5x")[:-1]]


@pytest.mark.parametrize("data", _truncations(), ids=["header", "entries", "strings", "unterminated"])
def test_truncated(data: bytes) -> None:
    with pytest.raises(DetectionError, match=r"^detection error: /x/ld.so.cache: truncated$"):
        ldcache.parse(data, "/x/ld.so.cache")


def test_string_offset_out_of_range() -> None:
    data = bytearray(build_cache(ENTRIES))
    struct.pack_into("=I", data, 48 + 4, 1 << 30)  # first entry's key offset
    with pytest.raises(DetectionError, match="truncated"):
        ldcache.parse(bytes(data), "c")


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"garbage" * 10,
        struct.pack("=11sxI", b"ld.so-1.7.0", 0),  # old format only
        struct.pack("=11sxI", b"ld.so-1.7.0", 1) + b"\0" * 12 + b"glibc-ld.so.cache1.0" + b"\0" * 40,
    ],
    ids=["empty", "garbage", "old-only", "wrong-version"],
)
def test_unsupported_format(data: bytes) -> None:
    with pytest.raises(DetectionError, match=r"^detection error: c: unsupported file format$"):
        ldcache.parse(data, "c")


def test_old_table_count_beyond_file() -> None:
    with pytest.raises(DetectionError, match="truncated"):
        ldcache.parse(struct.pack("=11sxI", b"ld.so-1.7.0", 1000), "c")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DetectionError, match=f"{tmp_path}/none: No such file"):
        ldcache.read(tmp_path / "none")


def test_reread_gives_the_same_entries_and_a_rewrite_is_parsed_again(tmp_path: Path) -> None:
    """read() keeps the last parse (the hook server plans before forking); contents decide, not names."""
    cache = tmp_path / "ld.so.cache"
    cache.write_bytes(build_cache([("libfoo.so.1", "/lib/libfoo.so.1", 0x0303)]))
    first = ldcache.read(cache)
    assert ldcache.read(cache) is first
    cache.write_bytes(build_cache([("libbar.so.2", "/lib/libbar.so.2", 0x0303)]))
    assert [e.key for e in ldcache.read(cache)] == ["libbar.so.2"]
    cache.write_bytes(b"junk")
    with pytest.raises(DetectionError):
        ldcache.read(cache)
