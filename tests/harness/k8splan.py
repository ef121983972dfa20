"""GPUs and the default k8s: section for the device plugin's pure parts (tests/test_k8s_plan_*.py)."""

from __future__ import annotations

from nvc import config
from nvc.model.devices import Gpu, MigDevice

GIB = 1 << 30
K8S = config.K8s()


def gpu(index: int, memory_gib: int = 80, mig: tuple[MigDevice, ...] = ()) -> Gpu:
    return Gpu(
        index,
        index,
        "NVIDIA H100",
        "Nvidia",
        f"GPU-{index}",
        f"00000000:{index + 1:02X}:00.0",
        "9.0",
        memory_gib * GIB,
        bool(mig),
        mig,
    )
