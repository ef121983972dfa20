"""NVML's critical-XID events and GPU topology, in the driver helper (``nvc:[driver]``).

The Kubernetes device plugin (nvc/k8s/) keeps one driver helper for its whole life and asks it,
in a loop, for the XIDs that happened since the last call: the event set is made on the first
call and lives in the helper, with NVML, behind the helper's confinement and timeout. Imported
(before the chroot) only by a helper started with ``events`` (:func:`nvc.rpc.driver_service.open_driver`),
never by the hook's or the CLI's.
"""

from __future__ import annotations

import time
from typing import Any

from nvc.errors import DriverError

ALL_INSTANCES = 0xFFFFFFFF  # nvmlEventData_t instance ids of an event that concerns the whole GPU


class XidWatch:
    """One event set over every GPU of the helper's NVML that supports critical-XID events."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml  # driver_service._Nvml
        self.event_set: Any = None
        self.watched: list[str] = []

    def _start(self) -> None:
        lib = self.nvml.nvml
        self.event_set = self.nvml.call("nvmlEventSetCreate")
        for index in range(self.nvml.call("nvmlDeviceGetCount")):
            handle = self.nvml.call("nvmlDeviceGetHandleByIndex", index)
            try:
                supported = lib.nvmlDeviceGetSupportedEventTypes(handle)
                if supported & lib.nvmlEventTypeXidCriticalError:
                    lib.nvmlDeviceRegisterEvents(handle, lib.nvmlEventTypeXidCriticalError, self.event_set)
                    self.watched.append(self.nvml.call("nvmlDeviceGetUUID", handle))
            except lib.NVMLError_NotSupported:
                continue  # this GPU reports no XIDs: its health never changes through events

    def _uuid(self, data: Any) -> str:
        """The UUID of the device an event concerns: the GPU, or the MIG device its instance ids name."""
        gpu = data.device
        if data.gpuInstanceId != ALL_INSTANCES and self.nvml.mig_mode(gpu):
            for mig in self.nvml.mig_devices(gpu):
                if (mig["gpu_instance_id"], mig["compute_instance_id"]) == (data.gpuInstanceId, data.computeInstanceId):
                    return mig["uuid"]
        return self.nvml.call("nvmlDeviceGetUUID", gpu)

    def wait(self, timeout_ms: int) -> dict[str, Any]:
        """The critical XIDs that arrive within ``timeout_ms`` (all those already queued, or the first
        one to come), and the GPUs watched."""
        lib = self.nvml.nvml
        if self.event_set is None:
            self._start()
        if not self.watched:  # no GPU reports XIDs: wait all the same, the caller calls in a loop
            time.sleep(timeout_ms / 1000)
        events = []
        wait = timeout_ms
        while self.watched:
            try:
                data = self.nvml.call("nvmlEventSetWait_v2", self.event_set, wait)
            except DriverError as err:
                if getattr(err, "code", None) == lib.NVML_ERROR_TIMEOUT:
                    break
                raise
            if data.eventType & lib.nvmlEventTypeXidCriticalError:
                events.append({"uuid": self._uuid(data), "xid": int(data.eventData)})
            wait = 0  # collect what is queued already, then answer
        return {"watched": self.watched, "events": events}


def topology(nvml: Any) -> dict[str, dict[str, int]]:
    """How close each pair of GPUs is, by UUID, lower is closer: NVML's common PCI ancestor level
    (10 same board … 50 across CPUs), and for GPUs joined by NVLink minus the number of links (closer
    than any PCI path). A pair the driver says nothing about is left out (the plugin then prefers GPUs
    by index)."""
    handles = [nvml.call("nvmlDeviceGetHandleByIndex", i) for i in range(nvml.call("nvmlDeviceGetCount"))]
    uuids = [nvml.call("nvmlDeviceGetUUID", h) for h in handles]
    levels: dict[str, dict[str, int]] = {}
    for (i, j), level in {**_pci_levels(nvml, handles), **_nvlinks(nvml, handles)}.items():
        levels.setdefault(uuids[i], {})[uuids[j]] = level
        levels.setdefault(uuids[j], {})[uuids[i]] = level
    return levels


def _pci_levels(nvml: Any, handles: list[Any]) -> dict[tuple[int, int], int]:
    lib = nvml.nvml
    try:
        return {
            (i, j): int(lib.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j]))
            for i in range(len(handles))
            for j in range(i + 1, len(handles))
        }
    except lib.NVMLError:  # no topology from this driver (or the fake one)
        return {}


def _nvlinks(nvml: Any, handles: list[Any]) -> dict[tuple[int, int], int]:
    """Minus the number of active NVLinks between each pair of GPUs joined by any."""
    lib = nvml.nvml
    by_bus = {}
    for index, handle in enumerate(handles):
        pci = nvml.call("nvmlDeviceGetPciInfo", handle)
        by_bus[pci.domain, pci.bus, pci.device] = index
    links: dict[tuple[int, int], int] = {}
    for index, handle in enumerate(handles):
        for link in range(lib.NVML_NVLINK_MAX_LINKS):
            try:
                if lib.nvmlDeviceGetNvLinkState(handle, link) != lib.NVML_FEATURE_ENABLED:
                    continue
                remote = lib.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
            except lib.NVMLError:
                break  # no NVLink (NOT_SUPPORTED), or no link with this number
            peer = by_bus.get((remote.domain, remote.bus, remote.device))
            if peer is not None and peer > index:  # each link counted from its lower GPU (an NVSwitch: none)
                links[index, peer] = links.get((index, peer), 0) - 1
    return links
