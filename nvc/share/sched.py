"""Reader of a container's scheduler file (native/shim/scheduling/sched.c, version 2) for `nvc-py share status`.

Fixed layout (little-endian): a 64-byte header, then one 128-byte entry per device the container
has used with a weight or a cap. The container writes this file itself, so what it says about its
own share is the container's word; the weight and cap that bind it are in its limits file.
"""

from __future__ import annotations

import struct

from nvc.records import NamedTuple

MAGIC = b"NVCSCHD\0"
VERSION = 2
SIZE = 4096
DEVICES = 16
IDLE_NS = 1_000_000_000  # not seen launching for a second: idle, no current share

_HEADER = struct.Struct("<8sII48x")  # 64 bytes
_ENTRY = struct.Struct("<40sQQQQQQIIIIIIIIII")  # 128 bytes


class SchedDevice(NamedTuple):
    key: str  # the device's UUID without its GPU-/MIG- prefix
    weight: int
    cap: int  # percent, 100 = none
    busy_ns: int  # measured GPU time, cumulative
    charged_ns: int  # the part of it charged against its weight (shared moments divided), cumulative
    share_permille: int  # of the GPU over the last half second the container was busy
    seen_ns: int  # CLOCK_MONOTONIC of its last launch
    duty_percent: int = 0  # the duty cycle it last found itself in (schedpolicy.h nvc_sched_duty), 0 for none
    backlog_permille: int = 0  # the part of its recent looks at its backlog that found its work queued
    steady_permille: int = 0  # the part whose previous look's work had not run yet (what a duty beside it needs)


class SchedFormatError(ValueError):
    """Not (or not yet) a version-1 scheduler file: e.g. zeros because no CUDA process ran."""


def parse_sched(data: bytes) -> tuple[SchedDevice, ...]:
    if len(data) != SIZE:
        raise SchedFormatError(f"{len(data)} bytes, want {SIZE}")
    magic, version, ndevices = _HEADER.unpack_from(data, 0)
    if not magic.strip(b"\0"):
        raise SchedFormatError("no CUDA process has used it yet")
    if magic != MAGIC or version != VERSION:
        raise SchedFormatError(f"magic {magic!r} version {version}, want version {VERSION}")
    devices = []
    for i in range(min(ndevices, DEVICES)):
        fields = _ENTRY.unpack_from(data, _HEADER.size + i * _ENTRY.size)
        key, charged, seen, _until, busy, _acc, _acc_at, weight, cap, _running, _capped, permille, *_ = fields
        backlog, steady, duty = fields[-3:]
        name = key.rstrip(b"\0").decode("ascii", "replace")
        devices.append(
            SchedDevice(
                name, weight, cap, busy, charged, permille, seen, min(duty, 100), min(backlog, 1000), min(steady, 1000)
            )
        )
    return tuple(devices)
