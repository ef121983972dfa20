"""Reader of the sharing shim's shared region (native/shim/base/region.h, version 1) for `nvc-py share status`.

The layout is fixed (little-endian, x86-64 alignment, offsets asserted in C), so a snapshot is
a plain read of the file: the shim's fields are naturally aligned 64-bit values and readers need
no lock (native/README.md).
"""

from __future__ import annotations

import struct

from nvc.records import NamedTuple

MAGIC = b"NVCSHRG\0"
VERSION = 1
DEVICES = 16
SLOTS = 1024

_HEADER = struct.Struct("<8sIIQIIIIQII72x")  # 128 bytes
_DEVICE = struct.Struct("<40sQIIqQQQQ32x")  # 128 bytes
_SLOT = struct.Struct(f"<iIQQ{DEVICES}Q8x")  # 160 bytes
SIZE = _HEADER.size + DEVICES * _DEVICE.size + SLOTS * _SLOT.size


class RegionDevice(NamedTuple):
    key: str  # the device's UUID without its GPU-/MIG- prefix, lower case
    memory_limit: int  # bytes, 0 = unlimited
    compute: int  # percent, 100 = unthrottled
    sm_count: int
    busy_ns: int  # measured SM-weighted GPU time of throttled launches, cumulative
    throttled_ns: int  # time launches waited for credit, cumulative
    launches: int  # launches seen while throttling was active


class RegionSlot(NamedTuple):
    pid: int  # in the container's pid namespace
    start_time: int  # /proc/<pid>/stat field 22 (clock ticks since boot)
    pidns_ino: int
    used: tuple[int, ...]  # bytes per region device


class Region(NamedTuple):
    config_hash: int
    memory_default: int
    compute_default: int
    devices: tuple[RegionDevice, ...]
    slots: tuple[RegionSlot, ...]  # registered processes only


class RegionFormatError(ValueError):
    """Not (or not yet) a version-1 region: e.g. still all zeros because no CUDA process ran."""


def parse_region(data: bytes) -> Region:
    if len(data) < SIZE:
        raise RegionFormatError(
            f"{len(data)} bytes (no CUDA process has initialised it yet)"
            if not data
            else f"{len(data)} bytes, want {SIZE}"
        )
    if not data[: len(MAGIC)].strip(b"\0"):
        raise RegionFormatError("no CUDA process has initialised it yet")  # as the hook made it: zeros
    magic, version, size, config_hash, ndevices, nslots, hwm, _, memory_default, compute_default, _ = (
        _HEADER.unpack_from(data, 0)
    )
    if magic != MAGIC or version != VERSION or size != SIZE:
        raise RegionFormatError(f"magic {magic!r} version {version} size {size}, want version {VERSION}")
    devices = []
    for i in range(min(ndevices, DEVICES)):
        key, limit, compute, sms, _credit, _refill, busy, throttled, launches = _DEVICE.unpack_from(
            data, _HEADER.size + i * _DEVICE.size
        )
        devices.append(
            RegionDevice(key.rstrip(b"\0").decode("ascii", "replace"), limit, compute, sms, busy, throttled, launches)
        )
    slots = []
    base = _HEADER.size + DEVICES * _DEVICE.size
    for i in range(min(hwm, nslots, SLOTS)):
        pid, _flags, start, pidns, *used = _SLOT.unpack_from(data, base + i * _SLOT.size)
        if pid:
            slots.append(RegionSlot(pid, start, pidns, tuple(used[: len(devices)])))
    return Region(config_hash, memory_default, compute_default, tuple(devices), tuple(slots))
