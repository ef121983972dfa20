"""Device health from NVML's critical-XID events: pure bookkeeping, the plugin feeds it events and time.

A critical XID not in ``k8s.ignored-xids`` marks its device unhealthy: a GPU-wide one the GPU
and everything on it (its MIG devices, its share units), a MIG device's one that MIG device only.
NVML has no "error cleared" event, so clearing is defined here: a device is healthy again once
``k8s.xid-recovery`` seconds passed without another critical XID on it **and** a fresh NVML
enumeration still finds it (a GPU that fell off the bus, or needs a reset and is not reset, is
not found or fails the enumeration, and so stays unhealthy: it is checked again a period later).
``xid-recovery: 0`` keeps a device unhealthy until the plugin restarts (the incumbents' only behaviour).
"""

from __future__ import annotations

from collections.abc import Collection

from nvc.k8s.resources import Unit


class Health:
    """Unhealthy device UUIDs and when each last had a critical XID."""

    def __init__(self, ignored_xids: Collection[int], recovery_s: float) -> None:
        self.ignored = frozenset(ignored_xids)
        self.recovery_s = recovery_s
        self.since: dict[str, float] = {}  # UUID -> monotonic time of its last critical XID

    def xid(self, uuid: str, xid: int, now: float) -> bool:
        """Note a critical XID; True when it makes ``uuid`` unhealthy (an ignored one never does)."""
        if xid in self.ignored:
            return False
        self.since[uuid] = now
        return True

    def due(self, now: float) -> list[str]:
        """Unhealthy UUIDs whose quiet period is over: to be looked for in a fresh enumeration."""
        if self.recovery_s <= 0:
            return []
        return sorted(uuid for uuid, when in self.since.items() if now - when >= self.recovery_s)

    def checked(self, uuid: str, found: bool, now: float) -> bool:
        """The outcome of looking for ``uuid`` in a fresh enumeration: found, it is healthy again
        (True); not found, it waits another period."""
        if found:
            self.since.pop(uuid, None)
            return True
        self.since[uuid] = now
        return False

    def healthy(self, unit: Unit) -> bool:
        return unit.uuid not in self.since and unit.gpu not in self.since
