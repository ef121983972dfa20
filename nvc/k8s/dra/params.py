"""A claim's opaque configuration for the driver: how the containers sharing the claim share its GPUs.

In a ResourceClaim (or its DeviceClass), ``spec.devices.config[].opaque`` with ``driver`` this
driver's name and ``parameters``::

    apiVersion: gpu.nvc-py.io/v1alpha1
    kind: GpuSharingConfig
    memoryLimit: 4Gi        # each container's device memory on each of the claim's devices
    computeShare: 50        # percent of the GPU's compute, 1..100
    weight: 2               # scheduling weight between the GPU's containers, 1..1000
    latencyClass: batch     # latency-critical or batch: handed to the hook as NVC_SHARE_PRIORITY_<UUID>
    backend: timeslice      # timeslice or mps: handed to the hook as NVC_SHARE_BACKEND_<UUID>

Every field is optional; the parameters of later configurations (the claim's after the class's) replace
those of earlier ones field by field. The grammar of the limits is nvc.containerenv.sharing's, so the
hook never meets a value it refuses; an unknown field or a bad value stops the claim's preparation
with an error naming it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from nvc.containerenv.sharing import BACKEND, BACKENDS, PRIORITY, PRIORITY_CLASSES
from nvc.errors import InputError, shown
from nvc.records import NamedTuple

KIND = "GpuSharingConfig"
_FIELDS = {"apiVersion", "kind", "memoryLimit", "computeShare", "weight", "latencyClass", "backend"}


class Sharing(NamedTuple):
    memory: int | None = None  # bytes
    compute: int | None = None  # percent
    weight: int | None = None
    latency_class: str | None = None
    backend: str | None = None

    def merged(self, later: Sharing) -> Sharing:
        return Sharing(*(b if b is not None else a for a, b in zip(self, later, strict=True)))


def api_version(driver: str) -> str:
    return f"{driver}/v1alpha1"


def _text(where: str, value: object) -> str:
    """A limit given as a YAML number or string, as the text the sharing grammar reads."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InputError(f"{where}={shown(str(value))}: not a number or string")
    return str(value)


def parse(parameters: object, driver: str, where: str) -> Sharing:
    """The sharing parameters of one opaque configuration; ``where`` names it in errors."""
    from nvc.containerenv.sharing import parse_choice, parse_percent, parse_size, parse_weight

    if not isinstance(parameters, Mapping):
        raise InputError(f"{where}: not an object (want apiVersion {api_version(driver)}, kind {KIND})")
    if parameters.get("apiVersion") != api_version(driver) or parameters.get("kind") != KIND:
        raise InputError(
            f"{where}: apiVersion {shown(str(parameters.get('apiVersion')))}, kind "
            f"{shown(str(parameters.get('kind')))}: want apiVersion {api_version(driver)}, kind {KIND}"
        )
    unknown = sorted(str(k) for k in parameters if k not in _FIELDS)
    if unknown:
        raise InputError(f"{where}.{unknown[0]}: unknown field (known: {', '.join(sorted(_FIELDS))})")
    found = Sharing()
    if "memoryLimit" in parameters:
        name = f"{where}.memoryLimit"
        found = found._replace(memory=parse_size(name, _text(name, parameters["memoryLimit"])))
    if "computeShare" in parameters:
        name = f"{where}.computeShare"
        found = found._replace(compute=parse_percent(name, _text(name, parameters["computeShare"]), False))
    if "weight" in parameters:
        name = f"{where}.weight"
        found = found._replace(weight=parse_weight(name, _text(name, parameters["weight"])))
    # the classes and backends the hook reads (nvc.containerenv.sharing), so it never refuses what is handed it
    if "latencyClass" in parameters:
        name = f"{where}.latencyClass"
        found = found._replace(latency_class=parse_choice(name, str(parameters["latencyClass"]), PRIORITY_CLASSES))
    if "backend" in parameters:
        name = f"{where}.backend"
        found = found._replace(backend=parse_choice(name, str(parameters["backend"]), BACKENDS))
    return found


def for_request(configs: Iterable[tuple[str, Mapping[str, Any]]], request: str, driver: str) -> Sharing | None:
    """The sharing of the claim's ``request``, from the allocation's configurations ((where, entry) in
    the claim's order: the class's first); None when none of this driver's applies to it."""
    found: Sharing | None = None
    for where, entry in configs:
        opaque = entry.get("opaque")
        applies = (
            not entry.get("requests") or request in entry["requests"] or request.partition("/")[0] in entry["requests"]
        )  # a firstAvailable subrequest's parent
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver or not applies:
            continue
        parsed = parse(opaque.get("parameters"), driver, f"{where}.opaque.parameters")
        found = parsed if found is None else found.merged(parsed)
    return found


def limits(sharing: Sharing, uuid: str, memory_total: int, where: str) -> dict[str, str]:
    """The variables nvc-py's hook reads for one device (nvc.containerenv.sharing's names, keyed by
    the device's UUID); a memory limit over what the device has is an error."""
    from nvc.containerenv.sharing import COMPUTE, MEMORY_LIMIT, WEIGHT

    if sharing.memory is not None and memory_total and sharing.memory > memory_total:
        raise InputError(f"{where}.memoryLimit: {sharing.memory} bytes is more than {uuid} has ({memory_total})")
    values = {
        MEMORY_LIMIT: sharing.memory,
        COMPUTE: sharing.compute,
        WEIGHT: sharing.weight,
        PRIORITY: sharing.latency_class,
        BACKEND: sharing.backend,
    }
    return {f"{name}_{uuid}": str(value) for name, value in values.items() if value is not None}
