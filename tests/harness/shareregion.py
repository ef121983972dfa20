"""A container's shared region and scheduler file with the content the sharing shim writes there
(native/shim/base/region.h, native/shim/scheduling/sched.c: the layouts nvc/share/region.py and sched.py read), or whatever
else a container may write: for tests/test_exporter_collector.py and bench/exporter."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import NamedTuple

from nvc.share import region, sched


class Device(NamedTuple):
    key: str  # UUID without its GPU-/MIG- prefix, lower case (anything, for a hostile container)
    memory_limit: int = 0
    compute: int = 100
    busy_ns: int = 0
    throttled_ns: int = 0
    launches: int = 0


class Slot(NamedTuple):
    pid: int
    start_time: int
    pidns: int
    used: Sequence[int]  # bytes per device


class Entry(NamedTuple):
    key: str
    weight: int
    share_permille: int
    seen_ns: int | None = None  # CLOCK_MONOTONIC of its last launch; None: now (busy)
    cap: int = 100
    busy_ns: int = 0
    duty_percent: int = 0  # the duty cycle it publishes (0: none)
    backlog_permille: int = 0  # its looks that found its work queued
    steady_permille: int = 0  # those whose previous look's work had not run yet


def region_bytes(
    devices: Sequence[Device], slots: Sequence[Slot] = (), ndevices: int | None = None, hwm: int | None = None
) -> bytes:
    """A version-1 region; ``ndevices`` and ``hwm`` (the slots in use) as the header claims them."""
    data = bytearray(region.SIZE)
    region._HEADER.pack_into(
        data,
        0,
        region.MAGIC,
        region.VERSION,
        region.SIZE,
        1,
        len(devices) if ndevices is None else ndevices,
        region.SLOTS,
        len(slots) if hwm is None else hwm,
        0,
        0,
        100,
        0,
    )
    for i, d in enumerate(devices[: region.DEVICES]):
        key = d.key.encode("utf-8", "surrogateescape")[:40]
        region._DEVICE.pack_into(
            data,
            region._HEADER.size + i * region._DEVICE.size,
            key,
            d.memory_limit,
            d.compute,
            132,
            0,
            0,
            d.busy_ns,
            d.throttled_ns,
            d.launches,
        )
    base = region._HEADER.size + region.DEVICES * region._DEVICE.size
    for i, s in enumerate(slots[: region.SLOTS]):
        used = (list(s.used) + [0] * region.DEVICES)[: region.DEVICES]
        region._SLOT.pack_into(data, base + i * region._SLOT.size, s.pid, 1, s.start_time, s.pidns, *used)
    return bytes(data)


def sched_bytes(entries: Sequence[Entry], ndevices: int | None = None) -> bytes:
    """A version-1 scheduler file; ``ndevices`` as its header claims it."""
    data = bytearray(sched.SIZE)
    sched._HEADER.pack_into(data, 0, sched.MAGIC, sched.VERSION, len(entries) if ndevices is None else ndevices)
    now = time.monotonic_ns()
    for i, e in enumerate(entries[: sched.DEVICES]):
        sched._ENTRY.pack_into(
            data,
            sched._HEADER.size + i * sched._ENTRY.size,
            e.key.encode()[:40],
            0,
            now if e.seen_ns is None else e.seen_ns,
            0,
            e.busy_ns,
            0,
            0,
            e.weight,
            e.cap,
            1,
            0,
            e.share_permille,
            0,
            0,
            e.backlog_permille,
            e.steady_permille,
            e.duty_percent,
        )
    return bytes(data)
