"""Copying ahead the memory a forked process shares with its parent (nvc.system.prefault), as real
processes: the pages it has become its own, so its first writes take no faults; pages it never had
stay unallocated; a call that comes stops it."""

from __future__ import annotations

import ctypes
import mmap
import os
import resource

from nvc.system import prefault

MIB = 1 << 20


def test_the_private_writable_mappings_are_read_from_maps() -> None:
    maps = (
        "55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]\n"
        "7f00a0000000-7f00a0021000 r-xp 00000000 08:01 131                        /usr/lib/libc.so.6\n"
        "7f00b0000000-7f00b0100000 rw-s 00000000 00:01 7                          /dev/zero (deleted)\n"
        "7ffd10000000-7ffd10021000 rw-p 00000000 00:00 0                          [stack]\n"
    )
    assert list(prefault.writable_private(maps)) == [
        (0x55D0C0A00000, 0x55D0C0A21000),
        (0x7FFD10000000, 0x7FFD10021000),
    ]


def test_runs_of_resident_pages() -> None:
    vector = bytes([1, 1, 0, 0, 1, 0, 3, 1])  # mincore's low bit: resident
    assert list(prefault.resident_runs(vector, 0x1000, 0x1000)) == [
        (0x1000, 0x2000),
        (0x5000, 0x1000),
        (0x7000, 0x2000),
    ]


def _faults_writing(buffer: bytearray) -> int:
    page = os.sysconf("SC_PAGE_SIZE")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for offset in range(0, len(buffer), page):
        buffer[offset] = 7
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def _in_child(buffer: bytearray, unused: mmap.mmap, copy: bool, busy: bool = False) -> tuple[int, int, int]:
    """(bytes copied ahead, faults writing ``buffer``, pages of ``unused`` resident) in a forked child."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            done = prefault.copy_ahead(lambda: busy) if copy else 0
            faults = _faults_writing(buffer)
            page = os.sysconf("SC_PAGE_SIZE")
            vector = ctypes.create_string_buffer(len(unused) // page)
            address = ctypes.addressof(ctypes.c_char.from_buffer(unused))
            ctypes.CDLL(None).mincore(ctypes.c_void_p(address), ctypes.c_size_t(len(unused)), vector)
            os.write(write, f"{done} {faults} {sum(b & 1 for b in vector.raw)}".encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        done, faults, resident = (int(v) for v in os.read(read, 100).split())
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    return done, faults, resident


def test_a_forked_child_copies_ahead_what_it_shares_and_nothing_it_never_had() -> None:
    """A 32 MiB buffer the parent wrote: a child that writes it takes a fault per page; one that
    copied ahead first takes next to none. A 64 MiB private mapping nobody touched stays unallocated."""
    buffer = bytearray(32 * MIB)
    _faults_writing(buffer)
    unused = mmap.mmap(-1, 64 * MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        pages = len(buffer) // os.sysconf("SC_PAGE_SIZE")
        _, faults, _ = _in_child(buffer, unused, copy=False)
        assert faults >= pages * 0.9
        done, faults, resident = _in_child(buffer, unused, copy=True)
        assert done >= len(buffer) and faults < pages * 0.05
        assert resident == 0
        # a call already waiting: nothing is copied, the faults stay
        done, faults, _ = _in_child(buffer, unused, copy=True, busy=True)
        assert done == 0 and faults >= pages * 0.9
    finally:
        unused.close()


def test_a_process_that_cannot_read_its_maps_copies_nothing_and_goes_on(monkeypatch) -> None:
    """An idle spare or helper must not die of it (the server would fork spare after spare)."""

    def refused(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", "/proc/self/maps")

    monkeypatch.setattr(prefault, "open", refused, raising=False)
    assert prefault.copy_ahead(lambda: False) == 0
