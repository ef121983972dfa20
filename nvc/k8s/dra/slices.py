"""The node's devices as DRA sees them, and the ResourceSlices that publish them: pure functions.

One device per GPU without MIG (``gpu-<index>``) and per MIG device (``mig-<gpu index>-<MIG
index>``); a MIG-enabled GPU is never also a whole device (as in the device plugin). Attributes
and capacities are in the driver's domain, so a CEL selector reads them as
``device.attributes["gpu.nvc-py.io"].productName`` and ``device.capacity["gpu.nvc-py.io"].memory``.
Versions are semantic versions (CEL compares them with ``.compareTo(semver("9.0.0"))``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from nvc.k8s.resources import mig_profile
from nvc.model.devices import Gpu
from nvc.records import NamedTuple

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES = 128  # per ResourceSlice (the API's limit)
# compute capability major -> architecture (NVIDIA's names; 12.x is Blackwell's consumer part)
_ARCHITECTURES = {
    "7.0": "Volta",
    "7.2": "Volta",
    "7.5": "Turing",
    "8.0": "Ampere",
    "8.6": "Ampere",
    "8.7": "Ampere",
    "8.9": "Ada Lovelace",
    "9.0": "Hopper",
    "10.0": "Blackwell",
    "10.3": "Blackwell",
    "12.0": "Blackwell",
    "12.1": "Blackwell",
}


class Device(NamedTuple):
    """One allocatable device: a whole GPU or a MIG device."""

    name: str  # the device's name in its pool (a DNS label)
    uuid: str  # what a container gets
    gpu: str  # the physical GPU's UUID
    gpu_index: int
    memory: int  # bytes (0 where NVML did not say)
    attributes: dict[str, dict[str, Any]]  # name -> {"string"|"int"|"version": value}


def semver(text: str) -> str | None:
    """``580.95.05`` → ``580.95.5``, ``9.0`` → ``9.0.0``: the numbers of a dotted version as a
    semantic version (no leading zeros, three parts); None when ``text`` is no such version."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 3 or not all(re.fullmatch(r"[0-9]{1,9}", p) for p in parts):
        return None
    return ".".join(str(int(p)) for p in (parts + ["0", "0"])[:3])


def cuda_text(version: int) -> str:
    """NVML's CUDA driver version (13000) as ``13.0.0``."""
    return f"{version // 1000}.{version % 1000 // 10}.0"


def devices(gpus: Sequence[Gpu], driver_version: str, cuda_version: int | None) -> tuple[Device, ...]:
    """The node's DRA devices, in NVML order."""
    common: dict[str, dict[str, Any]] = {}
    if semver(driver_version):
        common["driverVersion"] = {"version": semver(driver_version)}
    if cuda_version:
        common["cudaDriverVersion"] = {"version": cuda_text(cuda_version)}
    out: list[Device] = []
    for gpu in gpus:
        shared = {**common, "productName": {"string": gpu.model}, "pciBusID": {"string": gpu.bus_id}}
        if semver(gpu.architecture):
            shared["cudaComputeCapability"] = {"version": semver(gpu.architecture)}
        if gpu.architecture in _ARCHITECTURES:
            shared["architecture"] = {"string": _ARCHITECTURES[gpu.architecture]}
        if not gpu.mig_enabled:
            out.append(
                Device(
                    f"gpu-{gpu.index}",
                    gpu.uuid,
                    gpu.uuid,
                    gpu.index,
                    gpu.memory_total or 0,
                    {**shared, "type": {"string": "gpu"}, "uuid": {"string": gpu.uuid}, "index": {"int": gpu.index}},
                )
            )
            continue
        for mig in gpu.mig_devices:
            profile = mig_profile(mig.name)
            attributes = {
                **shared,
                "type": {"string": "mig"},
                "uuid": {"string": mig.uuid},
                "index": {"int": mig.index},
                "parentUUID": {"string": gpu.uuid},
                "parentIndex": {"int": gpu.index},
            }
            if profile:
                attributes["migProfile"] = {"string": profile}
            out.append(
                Device(f"mig-{gpu.index}-{mig.index}", mig.uuid, gpu.uuid, gpu.index, mig.memory_total or 0, attributes)
            )
    return tuple(out)


def quantity(size: int) -> str:
    """Bytes as the API server writes the quantity back (binary suffixes, the largest that divides)."""
    for suffix, shift in (("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if size and size % (1 << shift) == 0:
            return f"{size >> shift}{suffix}"
    return str(size)


def slice_name(node: str, driver: str, number: int) -> str:
    return f"{node}-{driver}-{number}".lower()


def resource_slices(
    node: str, driver: str, found: Sequence[Device], generation: int, owner: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The ResourceSlices of pool ``node`` (at least one, so an empty node says it has nothing):
    ``MAX_DEVICES`` devices each; ``owner``: the Node's reference, so they go with the Node."""
    chunks = [list(found[k : k + MAX_DEVICES]) for k in range(0, len(found), MAX_DEVICES)] or [[]]
    out = []
    for number, chunk in enumerate(chunks):
        metadata: dict[str, Any] = {"name": slice_name(node, driver, number)}
        if owner is not None:
            metadata["ownerReferences"] = [owner]
        out.append(
            {
                "apiVersion": API_VERSION,
                "kind": "ResourceSlice",
                "metadata": metadata,
                "spec": {
                    "driver": driver,
                    "nodeName": node,
                    "pool": {"name": node, "generation": generation, "resourceSliceCount": len(chunks)},
                    "devices": [
                        {
                            "name": d.name,
                            "attributes": d.attributes,
                            **({"capacity": {"memory": {"value": quantity(d.memory)}}} if d.memory else {}),
                        }
                        for d in chunk
                    ],
                },
            }
        )
    return out


def node_owner(node: dict[str, Any]) -> dict[str, Any]:
    """The ownerReference naming the Node object ``node`` (as the API server returned it)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "name": node["metadata"]["name"],
        "uid": node["metadata"]["uid"],
        "controller": True,
    }


class Changes(NamedTuple):
    """What makes the API server's slices of the pool the wanted ones."""

    create: list[dict[str, Any]]
    update: list[dict[str, Any]]  # each with the resourceVersion it replaces
    delete: list[str]


def changes(
    existing: Sequence[dict[str, Any]],
    node: str,
    driver: str,
    found: Sequence[Device],
    owner: dict[str, Any] | None = None,
) -> Changes:
    """From the pool's slices on the API server to those of ``found``: nothing when they already say
    it; else every slice of a new pool generation (the scheduler then ignores the older ones)."""
    current = {s["metadata"]["name"]: s for s in existing}
    generation = max((int(s["spec"]["pool"].get("generation", 0)) for s in existing), default=0)
    wanted = resource_slices(node, driver, found, generation, owner)
    if current.keys() == {s["metadata"]["name"] for s in wanted} and all(
        current[s["metadata"]["name"]]["spec"] == s["spec"] for s in wanted
    ):
        return Changes([], [], [])
    wanted = resource_slices(node, driver, found, generation + 1, owner)
    create = [s for s in wanted if s["metadata"]["name"] not in current]
    update = []
    for s in wanted:
        if s["metadata"]["name"] in current:
            version = current[s["metadata"]["name"]]["metadata"].get("resourceVersion")
            update.append({**s, "metadata": {**s["metadata"], "resourceVersion": version}})
    names = {s["metadata"]["name"] for s in wanted}
    return Changes(create, update, sorted(n for n in current if n not in names))
