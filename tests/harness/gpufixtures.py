"""pytest fixtures of the GPU tests (marked gpu, run by make test-gpu): the real driver, the UUID of
its GPU 0, and the runtimes a GPU test starts containers with."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .runtime import Runc


@pytest.fixture(scope="module")
def gpu0_uuid() -> str:
    pynvml = pytest.importorskip("pynvml")
    if not Path("/proc/driver/nvidia/version").exists():
        pytest.fail("no NVIDIA driver on this machine: GPU tests need one")
    pynvml.nvmlInit()
    try:
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
    finally:
        pynvml.nvmlShutdown()
    return uuid.decode() if isinstance(uuid, bytes) else uuid


@pytest.fixture(params=["crun", "runc"])
def runtime(request: pytest.FixtureRequest, tmp_path: Path) -> Runc:
    binary = shutil.which(request.param)
    if binary is None:
        pytest.skip(f"{request.param} is not installed")
    return Runc(tmp_path / "state", binary)


@pytest.fixture(scope="module")
def gpu_driver() -> None:
    if not Path("/proc/driver/nvidia/version").exists():
        pytest.fail("no NVIDIA driver on this machine: GPU tests need one")


@pytest.fixture
def crun(gpu_driver, tmp_path: Path) -> Runc:
    binary = shutil.which("crun")
    if binary is None:
        pytest.skip("crun is not installed")
    return Runc(tmp_path / "state", binary)
