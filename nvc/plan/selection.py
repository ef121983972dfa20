"""The ``--device`` grammar: which GPUs and MIG devices a request names.

Comma-separated selectors (empty ones ignored): ``all``; ``GPU-…`` and ``MIG-…`` UUIDs
(case-insensitive); a PCI id ``domain:bus:device.0`` (any domain width); a decimal GPU
index; ``G:M`` (GPU index G, M the position in NVML's MIG handle enumeration). Selecting
a MIG device also selects its parent GPU. Parsing is separate from resolution so that
the caller can tell, before loading NVML, whether the request can be answered without it.
"""

from __future__ import annotations

import re

from nvc.discover import procfs
from nvc.discover.procfs import normalize_bus_id
from nvc.errors import DeviceError, cut
from nvc.model.devices import MigDevice
from nvc.records import NamedTuple
from nvc.system.untrusted import decimal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    class GpuLike(Protocol):
        """What selection and the mount plan read of a GPU: both NVML's Gpu and the /proc-only ProcGpu have it."""

        @property
        def index(self) -> int: ...
        @property
        def uuid(self) -> str: ...
        @property
        def bus_id(self) -> str: ...
        @property
        def minor(self) -> int: ...
        @property
        def mig_devices(self) -> tuple[MigDevice, ...]: ...


_MIG_INDEX = r"([0-9]{1,9}):([0-9]{1,9})"


class Selector(NamedTuple):
    """One parsed selector. ``kind``: all, uuid, bus_id, index, mig_uuid, mig_index."""

    text: str  # as the user wrote it, for error messages
    kind: str
    value: str | int | tuple[int, int] | None = None

    @property
    def needs_mig(self) -> bool:
        """Whether resolving it needs NVML's MIG enumeration (``all`` may, if MIG devices exist)."""
        return self.kind in ("mig_uuid", "mig_index")


def parse(spec: str | tuple[str, ...]) -> tuple[Selector, ...]:
    """Selectors of a ``--device`` value, or of several (each a comma list, or one word of one)."""
    values = (spec,) if isinstance(spec, str) else spec
    selectors = []
    for token in (t.strip() for value in values for t in value.split(",")):
        if not token:
            continue
        lower = token.lower()
        mig = re.fullmatch(_MIG_INDEX, token)
        index = decimal(token, 9)
        if lower == "all":
            selectors.append(Selector(token, "all"))
        elif lower.startswith("gpu-"):
            selectors.append(Selector(token, "uuid", lower))
        elif lower.startswith("mig-"):
            selectors.append(Selector(token, "mig_uuid", lower))
        elif mig:
            selectors.append(Selector(token, "mig_index", (int(mig.group(1)), int(mig.group(2)))))
        elif index is not None:
            selectors.append(Selector(token, "index", index))
        elif (bus_id := normalize_bus_id(token)) is not None:
            selectors.append(Selector(token, "bus_id", bus_id))
        else:
            raise DeviceError(f"{cut(token)}: unknown device")
    return tuple(selectors)


class Selection(NamedTuple):
    """Selected GPUs (NVML index order) and MIG devices (parent, MIG index order)."""

    gpus: tuple[GpuLike, ...]
    migs: tuple[tuple[GpuLike, MigDevice], ...]


def _match(gpus: tuple[GpuLike, ...], sel: Selector) -> tuple[set[int], set[tuple[int, int]]]:
    """(GPU indexes, (GPU index, MIG index) pairs) that one selector names."""
    if sel.kind == "all":
        return {g.index for g in gpus}, {(g.index, m.index) for g in gpus for m in g.mig_devices}
    for gpu in gpus:
        if sel.kind == "uuid" and gpu.uuid.lower() == sel.value:
            return {gpu.index}, set()
        if sel.kind == "bus_id" and normalize_bus_id(gpu.bus_id) == sel.value:
            return {gpu.index}, set()
        if sel.kind == "index" and gpu.index == sel.value:
            return {gpu.index}, set()
        for mig in gpu.mig_devices:
            if (sel.kind == "mig_uuid" and mig.uuid.lower() == sel.value) or (
                sel.kind == "mig_index" and (gpu.index, mig.index) == sel.value
            ):
                return {gpu.index}, {(gpu.index, mig.index)}
    raise DeviceError(f"{sel.text}: unknown device")


def select(gpus: tuple[GpuLike, ...], selectors: tuple[Selector, ...]) -> Selection:
    """Resolve ``selectors`` against ``gpus``; any selector naming nothing is an error."""
    gpu_ids: set[int] = set()
    mig_ids: set[tuple[int, int]] = set()
    for sel in selectors:
        g, m = _match(gpus, sel)
        gpu_ids |= g
        mig_ids |= m
    return Selection(
        gpus=tuple(g for g in gpus if g.index in gpu_ids),
        migs=tuple((g, m) for g in gpus for m in g.mig_devices if (g.index, m.index) in mig_ids),
    )


def needs_nvml(selectors: tuple[Selector, ...], mig_files: bool, proc: procfs.StrPath = procfs.PROC) -> bool:
    """Whether answering needs NVML: MIG selectors, MIG config/monitor, or ``all`` with MIG devices present."""
    if mig_files or any(s.needs_mig for s in selectors):
        return True
    return any(s.kind == "all" for s in selectors) and procfs.any_mig_instances(proc)
