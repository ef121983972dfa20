"""The driver version and GPUs, from NVML or, when that is enough, from /proc alone.

NVML (through the driver helper: :func:`nvc.rpc.driver_service.inventory`) knows everything
but costs a helper process, a chroot and the library's initialisation. /proc knows
GPU identities and the driver version; requests needing no more (no MIG devices, no
CUDA version, brand or architecture) take that fast path. Both paths agree on what
they both know; index order on the fast path is bus id order, NVML's default order.
"""

from __future__ import annotations

from nvc.discover import procfs
from nvc.discover.procfs import ProcGpu
from nvc.logger import Logger
from nvc.model.devices import Gpu
from nvc.records import NamedTuple

TYPE_CHECKING = False
if TYPE_CHECKING:
    from nvc.model.devices import DriverSnapshot

log = Logger(__name__)


class Inventory(NamedTuple):
    """What the driver reports. ``cuda_version`` is None when NVML was not asked."""

    driver_version: str
    cuda_version: int | None
    gpus: tuple[Gpu, ...] | tuple[ProcGpu, ...]


def from_procfs(proc: procfs.StrPath = procfs.PROC) -> Inventory:
    """The fast path: /proc/driver/nvidia only, NVML never loaded."""
    inventory = Inventory(procfs.read_version(proc), None, procfs.read_gpus(proc))
    log.debug("inventory from %s: driver %s, %d GPUs", proc, inventory.driver_version, len(inventory.gpus))
    return inventory


def from_snapshot(snap: DriverSnapshot, proc: procfs.StrPath = procfs.PROC) -> Inventory:
    """What NVML reported (:func:`nvc.rpc.driver_service.inventory`), with each MIG device's
    /proc access files and nvidia-caps minors added."""
    names = [name for gpu in snap.gpus for mig in gpu.mig_devices for name in procfs.mig_minor_names(gpu, mig)]
    minors = procfs.lookup_mig_minors(names, proc) if names else {}  # not the whole table: thousands of lines
    gpus = tuple(procfs.with_mig_caps(gpu, minors, proc) for gpu in snap.gpus)
    log.debug("inventory from NVML: driver %s, CUDA %d, %d GPUs", snap.driver_version, snap.cuda_version, len(gpus))
    return Inventory(snap.driver_version, snap.cuda_version, gpus)
