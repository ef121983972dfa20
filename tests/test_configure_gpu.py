"""``nvc-py configure --pid`` from a shell prestart hook of crun/runc containers on a real GPU
(``make test-gpu``; deselected elsewhere).

The spec allows no NVIDIA device (the runtime's own eBPF device filter denies them) and
configure runs with cgroups on, so the GPU is usable inside only if nvc-py's device program
replaced the runtime's. The CUDA program is tests/gpu/share_gpu.cu (static cudart), copied into
the rootfs. Container output is printed (``pytest -rP`` shows it) so it can be quoted.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from harness.bundle import make_bundle
from harness.configurehook import HOOK, NVC, PROBE
from harness.gpufixtures import gpu0_uuid, runtime  # noqa: F401  (fixtures)

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
import sharegpu  # noqa: E402

pytestmark = pytest.mark.gpu
# nvidia-smi, the CUDA program (256 MiB kept, then kernels for 0.3 s), and whether /dev/nvidia0 opens.
# With no GPU given, the node is made by hand first: only the device cgroup can then stop its use.
INSIDE = (
    f"nvidia-smi -L 2>&1; share_gpu alloc 256 meminfo compute 0.3 {sharegpu.COMPUTE_ITERS} 2>&1; "
    f"[ -e /dev/nvidia0 ] || mknod /dev/nvidia0 c 195 0; {PROBE}; probe /dev/nvidia0"
)


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sharegpu.build(tmp_path_factory.mktemp("share_gpu"))


def _start(runtime, make_rootfs, program: Path, tmp_path: Path, device: str) -> dict[str, list[str]]:
    """A container whose prestart hook runs configure --device=DEVICE; {first word: rest} of its output."""
    rootfs = make_rootfs(name=f"rootfs-{device}")
    shutil.copy2(program, rootfs / "usr/local/bin/share_gpu")
    log = tmp_path / f"hook-{device}.log"
    script = tmp_path / f"hook-{device}.sh"
    script.write_text(
        HOOK.format(prefix="", nvc=NVC, root="/", rootfs=rootfs, log=log, args=f"--device={device} --compute --utility")
    )
    script.chmod(0o755)
    hook = {"path": str(script), "args": [script.name], "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]}
    bundle = make_bundle(tmp_path / f"bundle-{device}", rootfs, ["sh", "-c", INSIDE], hooks={"prestart": [hook]})
    result = runtime.create_start(bundle, timeout=120)
    print(
        f"--- {Path(runtime.binary).name}, prestart hook: nvc-py configure --pid PID --device={device} "
        f"--compute --utility (cgroups on, no NVIDIA device in the spec):\n{result.stdout}{result.stderr}"
    )
    assert result.returncode == 0, result.stderr + (log.read_text() if log.exists() else "")
    return {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines() if line.strip()}


def test_configured_container_lists_the_gpu_and_runs_a_kernel(runtime, make_rootfs, program, gpu0_uuid, tmp_path):
    out = _start(runtime, make_rootfs, program, tmp_path, "0")
    assert out["GPU"][0] == "0:" and f"{gpu0_uuid})" in out["GPU"]
    assert out["alloc"] == ["cudaSuccess"]
    assert out["meminfo"][2] == "cudaSuccess" and int(out["meminfo"][1]) > 70 << 30  # the 80 GB H100's total
    assert out["compute"][1] == "cudaSuccess" and float(out["compute"][0]) > 100  # kernels per second
    assert out["/dev/nvidia0"] == ["open"]


def test_device_none_leaves_the_gpu_node_unusable(runtime, make_rootfs, program, tmp_path):
    out = _start(runtime, make_rootfs, program, tmp_path, "none")
    assert "GPU" not in out  # nvidia-smi (the driver is there) finds no device
    assert out["alloc"] != ["cudaSuccess"]
    assert out["/dev/nvidia0"] == ["denied"]  # the node exists, the device cgroup refuses it
