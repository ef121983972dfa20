"""libnvc-share on a real GPU (H100, driver 580, CUDA 13): the acceptance checks of issue 6 with
LD_PRELOAD and a share directory written by nvc.share (the hook's limits writer). Run by
`make test-gpu` on the GPU machine; deselected elsewhere.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
import sharegpu  # noqa: E402

pytestmark = pytest.mark.gpu
GIB = 1 << 30
TORCH_SCRIPT = sharegpu.GPU_DIR / "torch_share.py"


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sharegpu.build(tmp_path_factory.mktemp("share_gpu"))


@pytest.fixture
def limited(tmp_path: Path) -> dict[str, str]:
    """Environment of a process under a 4 GiB budget."""
    return sharegpu.shim_env(sharegpu.limits_dir(tmp_path, {"NVC_SHARE_MEMORY_LIMIT": "4Gi"}))


def test_cudamalloc_gets_oom_once_the_limit_is_allocated(program, limited):
    out = sharegpu.run([program, "meminfo", "fill", 256, "meminfo", "freeall", "asyncfill", 256], limited)
    assert int(out["meminfo"][1]) == 4 * GIB
    assert out["fill"] == ["4096", "cudaErrorMemoryAllocation"]
    assert int(out["meminfo"][0]) == 0
    assert out["asyncfill"] == ["4096", "cudaErrorMemoryAllocation"]


def test_total_memory_is_the_limit_and_physical_without_one(program, limited, tmp_path):
    physical = sharegpu.run([program, "totalmem"], sharegpu.shim_env(None))["totalmem"]
    assert sharegpu.run([program, "totalmem"], limited)["totalmem"] == [str(4 * GIB)]
    unlimited = sharegpu.shim_env(sharegpu.limits_dir(tmp_path / "c", {"NVC_SHARE_COMPUTE": "100"}))
    assert sharegpu.run([program, "totalmem"], unlimited)["totalmem"] == physical


@pytest.mark.parametrize("alloc_conf", ["", "expandable_segments:True"])
def test_pytorch_sees_the_limit_and_gets_out_of_memory(limited, alloc_conf):
    env = dict(limited, PYTORCH_CUDA_ALLOC_CONF=alloc_conf)
    out = sharegpu.run([sys.executable, TORCH_SCRIPT], env)
    assert int(out["mem_get_info"][1]) == 4 * GIB
    assert out["alloc3"] == ["ok"]
    assert out["alloc2"] == ["OutOfMemoryError"]


def test_two_processes_share_the_budget(program, limited):
    first = sharegpu.holder([program, "alloc", 3072, "hold"], limited)
    try:
        out = sharegpu.run([program, "meminfo", "fill", 256], limited)
        assert int(out["meminfo"][0]) == 1 * GIB
        assert out["fill"] == ["1024", "cudaErrorMemoryAllocation"]
    finally:
        first.kill()
        first.wait()
    assert sharegpu.run([program, "fill", 256], limited)["fill"] == ["4096", "cudaErrorMemoryAllocation"]


def test_nvidia_smi_shows_the_limit(limited):
    smi = shutil.which("nvidia-smi")
    assert smi, "nvidia-smi not on PATH"
    out = sharegpu.subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader"], env=limited,
                                  capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split("\n")[0].strip() == "4096 MiB"


@pytest.fixture(scope="module")
def native_rate(program) -> float:
    return float(sharegpu.run([program, "compute", 3, sharegpu.COMPUTE_ITERS], sharegpu.shim_env(None))["compute"][0])


@pytest.mark.parametrize("percent", [25, 50, 75])
def test_compute_share_within_five_points(program, native_rate, tmp_path, percent):
    env = sharegpu.shim_env(sharegpu.limits_dir(tmp_path, {"NVC_SHARE_COMPUTE": str(percent)}))
    rate = float(sharegpu.run([program, "compute", 3, sharegpu.COMPUTE_ITERS], env)["compute"][0])
    achieved = 100 * rate / native_rate
    print(f"compute {percent}%: {rate:.0f} kernels/s of {native_rate:.0f} native = {achieved:.1f}%")
    assert abs(achieved - percent) <= 5, achieved


def test_hami_names_are_honoured(program, tmp_path):
    env = sharegpu.shim_env(None, CUDA_DEVICE_MEMORY_LIMIT_0="2048m", LD_PRELOAD=str(sharegpu.SHIM),
                            NVC_SHARE_DIR=str(tmp_path))
    assert sharegpu.run([program, "fill", 256], env)["fill"] == ["2048", "cudaErrorMemoryAllocation"]
    assert os.path.exists(tmp_path / "region")
