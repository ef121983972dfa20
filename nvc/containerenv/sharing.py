"""GPU sharing as a container asks for it: a memory budget, a compute share and a weight.

A container asks through ``NVC_SHARE_*`` or, for drop-in compatibility, HAMi's ``CUDA_DEVICE_*``
names; a device plugin answers with the same names, keyed by device UUID (:func:`device_limits`),
in the env or as volume mounts (:func:`share_env`). The grammar is the sharing shim's
(native/shim/base/config.c reads the same names for plain LD_PRELOAD use, and the limits file that
nvc.plan.share writes from what nvc.plan.fromenv reads with it): checked first, so junk stops the
container from starting instead of leaving it unlimited. Also here: where in the container the shim and its files
are (the shim looks there; the hook mounts them there).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from nvc.containerenv import SHARE_VOLUME_DIR, Policy, volume_ids
from nvc.errors import InputError, shown

# Where the shim looks inside a container (native/shim/base/config.h NVC_FIXED_DIR) and its files.
CONTAINER_DIR = "/var/run/nvc-share"
CONTAINER_LIBRARY = "/usr/lib/nvc-share/libnvc-share.so"
PRELOAD = "/etc/ld.so.preload"
# Weighted scheduling between containers (native/shim/scheduling/sched.c): a container sees its own scheduler file
# read-write, and every scheduled container's file read-only.
CONTAINER_SCHED = "/var/run/nvc-share-sched"
CONTAINER_PEERS = "/var/run/nvc-share-peers"

MEMORY_LIMIT, COMPUTE, WEIGHT = "NVC_SHARE_MEMORY_LIMIT", "NVC_SHARE_COMPUTE", "NVC_SHARE_WEIGHT"
# A latency class and a sharing backend per GPU (the DRA driver and the device plugin write them too)
PRIORITY, BACKEND = "NVC_SHARE_PRIORITY", "NVC_SHARE_BACKEND"
# How a GPU is shared: the shim's time slices, or CUDA MPS with a control daemon nvc-py runs (nvc.plan.mps)
BACKENDS = ("timeslice", "mps")
# The latency classes, most urgent first (under MPS: CUDA_MPS_CLIENT_PRIORITY 0, normal, and 1, below normal)
PRIORITY_CLASSES = ("latency-critical", "batch")
# (env prefix, ShareRequest field, the values it takes): the variables that name a choice, not a number
CHOICE_VARIABLES = ((BACKEND, "backend", BACKENDS), (PRIORITY, "priority", PRIORITY_CLASSES))
HAMI_MEMORY_LIMIT, HAMI_SM_LIMIT = "CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT"
# (env prefix, ShareRequest field, HAMi semantics). HAMi's names come first so that NVC_SHARE_* win
# at the same scope, as in the shim; a per-device value beats a global one whatever its name.
VARIABLES = (
    (HAMI_MEMORY_LIMIT, "memory", True),
    (HAMI_SM_LIMIT, "compute", True),
    (MEMORY_LIMIT, "memory", False),
    (COMPUTE, "compute", False),
    (WEIGHT, "weight", False),
)
MAX_PERCENT = 100
MAX_WEIGHT = 1000
# Devices the variables may name: the shim keeps rules for 2 * NVC_MAX_DEVICES (native/shim/base/config.h) and
# refuses a limits file naming more whole, which would leave the container unlimited.
MAX_DEVICES = 32
_SIZE = re.compile(r"([0-9]{1,20})(?:([kKmMgGtT])(i?))?")  # int() takes 4300 digits at most
_SHIFT = {"k": 10, "m": 20, "g": 30, "t": 40}
# A variable's device: ``_<NVML index>`` as the container numbers its GPUs, or ``_<UUID>`` of a GPU or
# MIG device (what the device plugin writes: it holds whatever index the container gives the device).
SCOPE = re.compile(r"_([0-9]{1,3}|(?:GPU|MIG)-[0-9A-Fa-f-]{1,36})")


def parse_size(name: str, text: str) -> int:
    """Bytes from decimal digits with an optional K/M/G/T or Ki/Mi/Gi/Ti (all powers of 1024)."""
    match = _SIZE.fullmatch(text)
    value = 0
    if match:
        unit = (match.group(2) or "").lower()
        value = int(match.group(1)) << _SHIFT.get(unit, 0)
    if not match or value == 0 or value >= 1 << 64:
        raise InputError(
            f"{name}={shown(text)}: not a size (positive decimal bytes, optionally with K, M, G, T, Ki, Mi, Gi or Ti)"
        )
    return value


def parse_percent(name: str, text: str, hami: bool) -> int:
    """A compute share 1..100; HAMi's CUDA_DEVICE_SM_LIMIT=0 means unlimited (100). The digits are
    read through untrusted.decimal (int() takes no more than 4300)."""
    from nvc.system.untrusted import decimal

    value = decimal(text)
    if value == 0 and hami:
        value = MAX_PERCENT
    if value is None or not 1 <= value <= MAX_PERCENT:
        raise InputError(f"{name}={shown(text)}: not a percentage (an integer from 1 to {MAX_PERCENT})")
    return value


def parse_weight(name: str, text: str) -> int:
    """A scheduling weight, 1..1000 (its digits read as parse_percent reads them)."""
    from nvc.system.untrusted import decimal

    value = decimal(text)
    if value is None or not 1 <= value <= MAX_WEIGHT:
        raise InputError(f"{name}={shown(text)}: not a weight (an integer from 1 to {MAX_WEIGHT})")
    return value


def parse_value(name: str, field: str, text: str, hami: bool) -> int:
    """A sharing variable's value, by the ShareRequest field it sets (VARIABLES)."""
    if field == "memory":
        return parse_size(name, text)
    if field == "weight":
        return parse_weight(name, text)
    return parse_percent(name, text, hami)


def parse_choice(name: str, text: str, choices: tuple[str, ...]) -> str:
    """One of ``choices``, exactly as written (a backend, a latency class)."""
    if text not in choices:
        raise InputError(f"{name}={shown(text)}: not one of {', '.join(choices)}")
    return text


def scope_key(text: str) -> str:
    """A scope as the limits file names it: an index without leading zeros, a UUID as given."""
    return str(int(text)) if text.isdigit() else text


def share_env(env: Mapping[str, str], mounts: Iterable[Mapping[str, object]], policy: Policy) -> Mapping[str, str]:
    """Where a container's sharing limits are read: a device plugin's /dev/null mounts at
    ``SHARE_VOLUME_DIR<NAME>=<value>`` when volume mounts are accepted and there are any, else the
    env. With such mounts the env is not read at all: the kubelet puts a plugin's env first and the
    pod's own after it, and the runtime keeps the last, so a pod's variable would replace its limit."""
    if policy.accept_volume_mounts:
        given = [name.partition("=") for name in volume_ids(mounts, SHARE_VOLUME_DIR)]
        if given:
            return {name: value for name, sep, value in given if sep}
    return env


def device_limits(
    device: str, memory: int, compute: int | None = None, weight: int | None = None, backend: str | None = None
) -> dict[str, str]:
    """The variables limiting one device (its UUID: the shim applies them to that device alone,
    whatever index the container gives it): its memory in bytes, its compute percent, weight and
    sharing backend when given."""
    limits = {f"{MEMORY_LIMIT}_{device}": str(memory)}
    for name, value in ((COMPUTE, compute), (WEIGHT, weight), (BACKEND, backend)):
        if value is not None:
            limits[f"{name}_{device}"] = str(value)
    return limits
