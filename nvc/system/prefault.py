"""Take a private copy of the memory a forked process still shares with its parent, while it waits.

A process forked from a large Python one (a hook server's spare worker, the container helper it starts
ahead) shares every page with its parent until it writes one, and Python writes wherever it reads
(reference counts): the first write to each page takes a fault and a copy. A call then pays hundreds
of them on its own time. ``madvise(MADV_POPULATE_WRITE)`` (Linux 5.14) takes them all at once instead;
:func:`copy_ahead` does it while the process waits for its call, a chunk at a time, and stops as soon
as the call comes, which then waits for one chunk at most. Only pages the process has (``mincore``)
are copied: what it reserved and never used stays unallocated. The cost is memory: what the process
shared becomes its own (a spare's and its helper's Python heap, some 15 MiB each on a test host).
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable, Iterator

MADV_POPULATE_WRITE = 23
CHUNK = 1 << 20  # bytes between two looks at whether the call has come

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def writable_private(maps: str) -> Iterator[tuple[int, int]]:
    """The (start, end) of each private writable mapping in ``maps`` (/proc/PID/maps' text)."""
    for line in maps.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[1] == "rw-p":
            start, _, end = fields[0].partition("-")
            yield int(start, 16), int(end, 16)


def resident_runs(vector: bytes, start: int, page: int) -> Iterator[tuple[int, int]]:
    """The (address, length) of each run of resident pages in a ``mincore`` ``vector`` of the range
    at ``start``."""
    index, count = 0, len(vector)
    while index < count:
        if not vector[index] & 1:
            index += 1
            continue
        end = index
        while end < count and vector[end] & 1:
            end += 1
        yield start + index * page, (end - index) * page
        index = end


def copy_ahead(busy: Callable[[], bool]) -> int:
    """Make every resident page of this process's private writable mappings its own, chunk by
    chunk until ``busy()`` says the call has come; return the bytes done. Best effort: a kernel
    without MADV_POPULATE_WRITE, or a range that refuses it, is left as it is."""
    page = os.sysconf("SC_PAGE_SIZE")
    try:
        with open("/proc/self/maps") as maps:
            ranges = list(writable_private(maps.read()))
    except OSError:  # no /proc to read: the call takes its faults, as before
        return 0
    done = 0
    for start, end in ranges:
        for low in range(start, end, CHUNK):
            if busy():
                return done
            length = min(CHUNK, end - low)
            vector = ctypes.create_string_buffer((length + page - 1) // page)
            if _libc.mincore(low, length, vector) != 0:
                continue
            for address, size in resident_runs(vector.raw, low, page):
                if _libc.madvise(address, size, MADV_POPULATE_WRITE) == 0:
                    done += size
                elif ctypes.get_errno() == errno.EINVAL:  # before Linux 5.14: nothing to be had
                    return done
    return done
