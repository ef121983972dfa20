"""The fake two-gpu-mig machine (tests/fakedriver/machines/two-gpu-mig.yaml) as containers show it:
its GPUs' and MIG devices' UUIDs, its driver version, and a command listing what a container got."""

from __future__ import annotations

import re

H100 = "GPU-4f6a2c1e-8b3d-5e7f-9a1b-2c3d4e5f6a7b"
A100 = "GPU-0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6"
MIG_2G = "MIG-5a6b7c8d-9e0f-5a1b-8c2d-3e4f5a6b7c8d"
MIG_3G = "MIG-b1c2d3e4-f5a6-5b7c-9d8e-0f1a2b3c4d5e"
DRIVER_VERSION = "580.95.05"
SHOW = ["sh", "-c", "nvidia-smi -L 2>&1; ls /dev | grep '^nvidia[0-9]' || true"]


def uuids(stdout: str) -> list[str]:
    return re.findall(r"UUID: ((?:GPU|MIG)-[0-9a-f-]+)\)", stdout)
