"""A ResourceClaim allocated on this node, turned into what the kubelet hands the runtime: pure functions.

Each prepared claim is a CDI spec of its own, kind ``<driver>/claim``, one CDI device per allocated
device, named ``<claim UID>-<device>`` (so the spec is the claim's alone, and removing it unprepares
the claim). What a CDI device carries:

- a claim without sharing: the device's edits from nvc-py's CDI generator (nvc.cdi: device
  nodes, and the driver's files, control nodes and hooks as the spec's common edits); any runtime
  that injects CDI devices gives the container the GPU, no nvc-py hook needed;
- a shared claim (params.Sharing): what the device plugin answers for ``nvc-py.io/gpu-share``: the
  device and its limits as nvc-py's hook reads them (volume mounts, and the env for a hook that
  does not accept volume mounts), so nvc-py's hook injects the GPU and the sharing shim with the
  claim's limits into every container that uses the claim.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nvc import containerenv
from nvc.errors import InputError, shown
from nvc.k8s.dra import params
from nvc.k8s.dra.slices import Device
from nvc.records import NamedTuple

CLASS = "claim"  # the CDI class: <driver>/claim
_MOUNT_OPTIONS = ["ro", "nosuid", "nodev", "bind"]


class ClaimRef(NamedTuple):
    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class Prepared(NamedTuple):
    """One device of a prepared claim, as NodePrepareResources answers it."""

    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]


class Plan(NamedTuple):
    spec: dict[str, Any]  # the CDI spec
    devices: tuple[Prepared, ...]


def spec_file(driver: str, uid: str) -> str:
    """The claim's CDI spec's file name in the CDI directory."""
    return f"{driver}-{CLASS}_{uid}.json"


def _results(claim: Mapping[str, Any], ref: ClaimRef, driver: str, pool: str) -> tuple[list[dict[str, Any]], list]:
    """This driver's allocation results on this node's pool, and the allocation's configurations."""
    meta = claim.get("metadata") or {}
    if meta.get("uid") != ref.uid:
        raise InputError(
            f"claim {ref}: the API server has UID {shown(str(meta.get('uid')))}, the kubelet "
            f"{shown(ref.uid)} (deleted and made again?)"
        )
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise InputError(f"claim {ref}: not allocated")
    devices = allocation.get("devices") or {}
    results = [r for r in devices.get("results") or [] if r.get("driver") == driver]
    foreign = [r for r in results if r.get("pool") != pool]
    if foreign:
        raise InputError(
            f"claim {ref}: device {shown(str(foreign[0].get('device')))} of pool "
            f"{shown(str(foreign[0].get('pool')))} is not this node's ({pool})"
        )
    configs = [(f"claim {ref}: config[{k}]", c) for k, c in enumerate(devices.get("config") or [])]
    return results, configs


def plan(
    claim: Mapping[str, Any],
    ref: ClaimRef,
    driver: str,
    pool: str,
    known: Mapping[str, Device],
    node_spec: Mapping[str, Any],
    volume_mounts: bool,
) -> Plan:
    """The CDI spec and answer of ``claim`` (the API server's object); ``known``: this node's devices
    by name; ``node_spec``: nvc-py's CDI spec of this node, devices named by UUID."""
    results, configs = _results(claim, ref, driver, pool)
    edits = {d["name"]: d["containerEdits"] for d in node_spec.get("devices", [])}
    kind = f"{driver}/{CLASS}"
    cdi_devices: list[dict[str, Any]] = []
    prepared: list[Prepared] = []
    shared_uuids: list[str] = []
    for result in results:
        request, name = str(result.get("request")), str(result.get("device"))
        device = known.get(name)
        if device is None or device.uuid not in edits:
            raise InputError(f"claim {ref}: device {shown(name)} is not one of this node's")
        sharing = params.for_request(configs, request, driver)
        cdi_name = f"{ref.uid}-{name}"
        if sharing is None:
            cdi_devices.append({"name": cdi_name, "containerEdits": edits[device.uuid]})
        else:
            cdi_devices.append(
                {
                    "name": cdi_name,
                    "containerEdits": _shared_edits(
                        device, params.limits(sharing, device.uuid, device.memory, f"claim {ref}"), volume_mounts
                    ),
                }
            )
            shared_uuids.append(device.uuid)
        prepared.append(Prepared((request,), pool, name, (f"{kind}={cdi_name}",)))
    spec: dict[str, Any] = {"cdiVersion": node_spec["cdiVersion"], "kind": kind, "devices": cdi_devices}
    common: dict[str, Any] = {}
    if len(shared_uuids) < len(results):  # devices given by CDI alone bring the driver's files
        common = dict(node_spec["containerEdits"])
    if shared_uuids and not volume_mounts:  # the hook then reads the env: it must name the shared devices
        common["env"] = [
            containerenv.assignment(containerenv.VISIBLE_DEVICES, containerenv.visible_devices(shared_uuids))
        ]
    if common:
        spec["containerEdits"] = common
    return Plan(spec, tuple(prepared))


def _shared_edits(device: Device, limits: Mapping[str, str], volume_mounts: bool) -> dict[str, Any]:
    """A shared device as the hook reads it: its UUID and limits as /dev/null volume mounts (which only
    the kubelet adds), and the limits in the env too, for a hook that does not accept volume mounts."""
    edits: dict[str, Any] = {"env": [containerenv.assignment(k, v) for k, v in sorted(limits.items())]}
    if volume_mounts:
        targets = [containerenv.device_volume(device.uuid)]
        targets += [containerenv.share_volume(k, v) for k, v in sorted(limits.items())]
        edits["mounts"] = [
            {"hostPath": containerenv.VOLUME_SOURCE, "containerPath": t, "options": _MOUNT_OPTIONS} for t in targets
        ]
    return edits
