"""The driver helper's interface, as it travels: the parameters a helper starts with, and its
snapshot's result turned into records.

Two helpers answer the same ``snapshot``: the Python driver helper (:mod:`nvc.rpc.driver_service`) and
the native one (native/driver/driver_snapshot.c, started and taken by :mod:`nvc.rpc.native_snapshot`),
which answers every snapshot no warm Python helper does. Their callers build their parameters and
records here, without the Python helper's machinery, which an ``info`` answered by the native helper
never imports.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from nvc.model.devices import DriverSnapshot

# nvmlBrandType_t's names as the reference prints them, by NVML's value (values after the reference's
# list print as Unknown). Both helpers send NVML's value.
BRAND_NAMES = (
    "Unknown", "Quadro", "Tesla", "NVS", "GRID", "GeForce", "TITAN", "VApps", "VPC", "VCS", "VWS",
    "CloudGaming", "QuadroRTX", "NvidiaRTX", "Nvidia", "GeForceRTX", "TitanRTX",
)  # fmt: skip


def brand_name(value: int) -> str:
    """The reference's name of an nvmlBrandType_t value."""
    return BRAND_NAMES[value] if 0 <= value < len(BRAND_NAMES) else "Unknown"


def overflow_ids(proc: str = "/proc") -> tuple[int, int]:
    """The kernel's overflow uid/gid (normally 65534): the reference's default helper identity.

    Read by the parent: once chrooted, the helper may have no /proc to read them from.
    """
    ids = []
    for name in ("overflowuid", "overflowgid"):
        with open(f"{proc}/sys/kernel/{name}") as f:
            ids.append(int(f.read()))
    return ids[0], ids[1]


def setup_params(root: str, user: tuple[int, int] | None, events: bool = False) -> dict[str, Any]:
    """A driver helper's parameters; ``user`` None: the kernel's overflow ids as root (as the
    reference), else the caller's own identity, the only one it can keep."""
    if user is None:
        user = overflow_ids() if os.geteuid() == 0 else (os.geteuid(), os.getegid())
    uid, gid = user
    return {"root": os.path.abspath(root), "uid": uid, "gid": gid, **({"events": True} if events else {})}


def snapshot_from_wire(data: dict[str, Any]) -> DriverSnapshot:
    """Build the snapshot's records from a helper's JSON answer."""
    from nvc.model.devices import DriverSnapshot, Gpu, MigDevice

    gpus = tuple(
        Gpu(
            **{key: value for key, value in gpu.items() if key not in ("mig_devices", "brand")},
            brand=brand_name(gpu["brand"]),
            mig_devices=tuple(MigDevice(**mig) for mig in gpu["mig_devices"]),
        )
        for gpu in data["gpus"]
    )
    return DriverSnapshot(data["driver_version"], data["cuda_version"], gpus)
