"""What the device plugin advertises and answers, from nvc-py's inventory: pure functions.

Three kinds of resource: whole GPUs (``nvidia.com/gpu``; GPUs without MIG that are not shared),
one resource per MIG profile (``nvidia.com/mig-2g.10gb``; "mixed" naming: a MIG device is never
counted as a whole GPU), and GPU shares (``nvc-py.io/gpu-share``): each GPU named in
``k8s.share-gpus`` is cut into units of ``share-slice`` bytes, one kubelet device each, so the
kubelet's own accounting of devices is the memory accounting: the units handed out on a GPU never
add up to more than its memory, with no lock or bookkeeping of ours (HAMi's Allocate raced on a
node lock for this). Allocate turns units into the env the hook reads (nvc.containerenv: the
variables and volume mounts are written with the contract's own writers).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

from nvc import containerenv
from nvc.cdi import qualified_name
from nvc.config import K8s
from nvc.errors import InputError, shown
from nvc.model.devices import Gpu
from nvc.records import NamedTuple

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"  # the kubelet's constants
MAX_SHARE_UNITS = 1024  # per GPU: the kubelet lists every unit as a device of its own
MAX_ID = 63  # characters of a kubelet device ID
_COMBINATIONS = 20000  # GPU sets GetPreferredAllocation weighs at most before it goes greedy


class Unit(NamedTuple):
    """One kubelet device: a whole GPU, a MIG device, or one memory slice of a shared GPU."""

    id: str  # the device ID the kubelet sees
    uuid: str  # what the container gets (GPU- or MIG- UUID)
    gpu: str  # the UUID of the physical GPU it is on
    gpu_index: int  # that GPU's NVML index (the container numbers its GPUs in this order)
    memory: int = 0  # bytes of a share unit; 0 for a whole device
    gpu_memory: int = 0  # the GPU's memory (a share's compute fraction)
    numa: int | None = None  # NUMA node of the GPU, when the host knows it


class Resource(NamedTuple):
    """One extended resource: registered with the kubelet on a socket of its own."""

    name: str
    kind: str  # "gpu", "mig" or "share"
    units: tuple[Unit, ...]

    @property
    def socket(self) -> str:
        """The plugin's socket name in the device plugin directory (the Register endpoint)."""
        return "nvc-py-" + self.name.replace("/", "_") + ".sock"

    def by_id(self, ids: Iterable[str]) -> list[Unit]:
        """The units of ``ids``, in order; an ID this resource does not have is an error."""
        known = {unit.id: unit for unit in self.units}
        missing = [i for i in ids if i not in known]
        if missing:
            raise InputError(f"{self.name}: unknown device ID {shown(missing[0])}")
        return [known[i] for i in ids]


class Answer(NamedTuple):
    """One container's Allocate answer."""

    envs: dict[str, str]
    mounts: tuple[tuple[str, str, bool], ...] = ()  # (container path, host path, read-only)
    cdi_devices: tuple[str, ...] = ()


def mig_profile(name: str | None) -> str | None:
    """The profile in NVML's MIG device name: "NVIDIA A100-SXM4-40GB MIG 2g.10gb" → "2g.10gb"."""
    if not name or " MIG " not in name:
        return None
    return name.rpartition(" MIG ")[2].strip() or None


def shared_gpus(gpus: Sequence[Gpu], wanted: Sequence[str]) -> set[str]:
    """UUIDs of the GPUs ``k8s.share-gpus`` names (UUIDs, NVML indices or ``all``); MIG-enabled
    ones are left out (their MIG devices are the unit); a name that matches no GPU is an error."""
    chosen: set[str] = set()
    for name in wanted:
        found = [g for g in gpus if name in ("all", g.uuid, str(g.index))]
        if not found and name != "all":
            raise InputError(f"k8s.share-gpus: {shown(name)} is no GPU of this host")
        chosen.update(g.uuid for g in found if not g.mig_enabled)
    return chosen


def plan(
    gpus: Sequence[Gpu],
    k8s: K8s,
    numa: Callable[[str], int | None] = lambda bus_id: None,
    warn: Callable[[str], None] = lambda line: None,
) -> tuple[Resource, ...]:
    """The resources of these GPUs: whole GPUs and shares always (maybe empty: the kubelet then shows
    a capacity of 0 rather than nothing), one resource per MIG profile found."""
    from nvc.containerenv.sharing import parse_size

    slice_size = parse_size("k8s.share-slice", k8s.share_slice)
    shared = shared_gpus(gpus, k8s.share_gpus)
    whole: list[Unit] = []
    shares: list[Unit] = []
    migs: dict[str, list[Unit]] = {}
    for gpu in gpus:
        node = numa(gpu.bus_id)
        if gpu.mig_enabled:
            for mig in gpu.mig_devices:
                profile = mig_profile(mig.name)
                if profile is None:
                    warn(f"MIG device {mig.uuid} of {gpu.uuid}: NVML names no profile ({mig.name!r}); not advertised")
                    continue
                migs.setdefault(k8s.mig_resource_prefix + profile, []).append(
                    Unit(mig.uuid, mig.uuid, gpu.uuid, gpu.index, numa=node)
                )
        elif gpu.uuid in shared:
            count = (gpu.memory_total or 0) // slice_size
            if count > MAX_SHARE_UNITS:
                raise InputError(
                    f"k8s.share-slice: {k8s.share_slice} cuts {gpu.uuid} into {count} units "
                    f"(at most {MAX_SHARE_UNITS}: the kubelet lists each one)"
                )
            shares += [
                Unit(f"{gpu.uuid}::{k}", gpu.uuid, gpu.uuid, gpu.index, slice_size, gpu.memory_total or 0, node)
                for k in range(count)
            ]
        else:
            whole.append(Unit(gpu.uuid, gpu.uuid, gpu.uuid, gpu.index, numa=node))
    resources = [Resource(k8s.gpu_resource, "gpu", tuple(whole)), Resource(k8s.share_resource, "share", tuple(shares))]
    resources += [Resource(name, "mig", tuple(units)) for name, units in sorted(migs.items())]
    names = [r.name for r in resources]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise InputError(
            f"k8s: resource {clash[0]} named twice (gpu-resource, share-resource and MIG names must differ)"
        )
    return tuple(resources)


# ---- GetPreferredAllocation -------------------------------------------------------------------


def preferred(
    resource: Resource,
    available: Sequence[str],
    must: Sequence[str],
    size: int,
    topology: Mapping[str, Mapping[str, int]],
) -> list[str]:
    """The IDs this plugin would pick: ``must`` and more from ``available`` up to ``size``.

    Shares: every unit from one GPU (the GPU already holding ``must``'s units, else the one whose
    free units fit most tightly, keeping whole GPUs free for large requests), spilling to the GPUs
    with most free units only when no single GPU can hold the request. Whole GPUs: the set with the
    lowest sum of pairwise distances (nvc.rpc.nvml_events.topology: NVLinks, else the common PCI
    ancestor), by index where the topology is unknown. An ID given twice counts once; asking for
    more devices than offered is an error.
    """
    must = list(dict.fromkeys(must))
    units = resource.by_id(list(dict.fromkeys([*must, *available])))
    chosen = units[: len(must)]
    rest = units[len(must) :]
    need = size - len(chosen)
    if need <= 0:
        return [u.id for u in chosen]
    if need > len(rest):
        raise InputError(f"{resource.name}: {size} devices asked for, {len(units)} offered")
    if resource.kind == "share":
        picked = _share_pick(chosen, rest, need)
    elif resource.kind == "gpu" and topology:
        picked = _closest(chosen, rest, need, topology)
    else:
        picked = sorted(rest, key=lambda u: (u.gpu_index, u.id))[:need]
    return [u.id for u in (*chosen, *picked)]


def _share_pick(chosen: list[Unit], rest: list[Unit], need: int) -> list[Unit]:
    free: dict[str, list[Unit]] = {}
    for unit in sorted(rest, key=lambda u: (u.gpu_index, _unit_number(u))):
        free.setdefault(unit.gpu, []).append(unit)
    held = {u.gpu for u in chosen}
    fits = [g for g in free if g in held and len(free[g]) >= need] or sorted(
        (g for g in free if len(free[g]) >= need), key=lambda g: (len(free[g]), free[g][0].gpu_index)
    )
    if fits:
        return free[fits[0]][:need]
    picked: list[Unit] = []  # no single GPU holds it: the fewest GPUs, those with most free units
    for gpu in sorted(free, key=lambda g: (g not in held, -len(free[g]), free[g][0].gpu_index)):
        picked += free[gpu][: need - len(picked)]
    return picked


def _unit_number(unit: Unit) -> int:
    return int(unit.id.rpartition("::")[2]) if "::" in unit.id else 0


def _closest(chosen: list[Unit], rest: list[Unit], need: int, topology: Mapping[str, Mapping[str, int]]) -> list[Unit]:
    """The ``need`` units of ``rest`` whose GPUs, with ``chosen``'s, have the lowest sum of pairwise
    topology levels; ties go to lower indices. Greedy past ``_COMBINATIONS`` sets."""
    worst = max((level for row in topology.values() for level in row.values()), default=0) + 1

    def cost(group: Sequence[Unit]) -> int:
        return sum(topology.get(a.gpu, {}).get(b.gpu, worst) for a, b in itertools.combinations(group, 2))

    rest = sorted(rest, key=lambda u: u.gpu_index)
    if math.comb(len(rest), need) <= _COMBINATIONS:
        best = min(
            itertools.combinations(rest, need),
            key=lambda group: (cost([*chosen, *group]), [u.gpu_index for u in group]),
        )
        return list(best)
    picked: list[Unit] = []
    for _ in range(need):
        unit = min((u for u in rest if u not in picked), key=lambda u: (cost([*chosen, *picked, u]), u.gpu_index))
        picked.append(unit)
    return picked


# ---- Allocate --------------------------------------------------------------------------------


def allocate(resource: Resource, ids: Sequence[str], k8s: K8s) -> Answer:
    """What the hook needs for one container given ``ids``: the devices by UUID (env, or /dev/null
    volume mounts with the env set to ``void`` so an image's own value selects nothing), for shares
    the memory budget (the units' bytes per GPU), compute cap and weight (env, or with volume mounts
    mounts too: nvc.containerenv.sharing.share_env), CDI names when asked. An ID named twice is refused."""
    twice = sorted(i for i, n in Counter(ids).items() if n > 1)
    if twice:  # a share unit counted twice would grant its memory twice
        raise InputError(f"{resource.name}: device ID {shown(twice[0])} named twice")
    units = resource.by_id(ids)
    uuids = sorted({u.uuid for u in units}, key=lambda uuid: (_index_of(units, uuid), uuid))
    envs: dict[str, str] = {}
    mounts: tuple[tuple[str, str, bool], ...] = ()
    if k8s.device_list_strategy == "volume-mounts":
        envs[containerenv.VISIBLE_DEVICES] = containerenv.VOID
        mounts = tuple((containerenv.device_volume(uuid), containerenv.VOLUME_SOURCE, True) for uuid in uuids)
    else:
        envs[containerenv.VISIBLE_DEVICES] = containerenv.visible_devices(uuids)
    if resource.kind == "share":
        limits = _share_env(units, uuids, k8s)
        if k8s.device_list_strategy == "volume-mounts":  # a pod's own env cannot replace them
            mounts += tuple(
                (containerenv.share_volume(name, value), containerenv.VOLUME_SOURCE, True)
                for name, value in limits.items()
            )
        else:
            envs.update(limits)
    cdi = tuple(qualified_name(uuid) for uuid in uuids) if k8s.cdi_devices else ()
    return Answer(envs, mounts, cdi)


def _index_of(units: Sequence[Unit], uuid: str) -> int:
    return next(u.gpu_index for u in units if u.uuid == uuid)


def _share_env(units: Sequence[Unit], uuids: Sequence[str], k8s: K8s) -> dict[str, str]:
    """The sharing variables of the units, each keyed by its GPU's UUID: the shim applies a limit to
    that GPU alone, whatever index the container gives it, so a whole GPU or MIG device of another
    resource in the same container stays unlimited."""
    from nvc.containerenv.sharing import MAX_PERCENT, MAX_WEIGHT, device_limits

    envs: dict[str, str] = {}
    for uuid in uuids:
        mine = [u for u in units if u.uuid == uuid]
        memory = sum(u.memory for u in mine)
        compute = None
        if k8s.share_compute == "proportional" and mine[0].gpu_memory:
            compute = min(MAX_PERCENT, max(1, math.ceil(MAX_PERCENT * memory / mine[0].gpu_memory)))
        weight = min(MAX_WEIGHT, len(mine)) if k8s.share_weight else None
        backend = k8s.share_backend if k8s.share_backend != "timeslice" else None  # timeslice: the node's choice
        envs.update(device_limits(uuid, memory, compute, weight, backend))
    return envs
