"""GPU sharing's MPS backend on a real GPU (H100, driver 580): PyTorch in two runc containers started
through nvc-py-hook with NVC_SHARE_BACKEND=mps shares GPU 0 through the driver's own MPS control
daemon, which the hook starts and the last poststop stops. Run by `make test-gpu` on the GPU machine;
deselected elsewhere.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from harness.bundle import make_bundle
from harness.gpufixtures import gpu0_uuid, hook_with_log, torch_rootfs  # noqa: F401  (fixtures)
from harness.runtime import Runc
from nvc.apply import mps
from nvc.plan import mps as mpsplan

pytestmark = pytest.mark.gpu
GIB = 1 << 30


def test_two_pytorch_containers_share_gpu0_through_nvc_pys_mps_daemon(torch_rootfs, gpu0_uuid, tmp_path):  # noqa: F811
    """Each container's processes get their MPS client variables (the cap, the pinned memory limit,
    the class's priority) and the shim's 4 GiB budget on top (3 GiB fits, 2 more do not); both run
    while one daemon serves GPU 0; after the last, no daemon and no directory is left."""
    runc = shutil.which("runc")
    if runc is None:
        pytest.skip("runc is not installed")
    hooks = hook_with_log(tmp_path)
    python = "/opt/torch/.venv/bin/python3"
    script = (
        f"{python} -c \"import os; print('env', sorted(k + '=' + v for k, v in os.environ.items() "
        "if k.startswith('CUDA_MPS_')))\"; "
        f"touch /tmp/started; {python} /gpu/torch_share.py"
    )
    seen: dict[str, list[mps.DeviceState]] = {}
    results = {}

    def bundle(name: str, env: dict[str, str]) -> Path:
        """Made before the threads start: the rootfs cache builds one image at a time."""
        full = {"NVIDIA_VISIBLE_DEVICES": "0", "NVC_SHARE_BACKEND": "mps", "HOME": "/tmp", **env}
        return make_bundle(tmp_path / name, torch_rootfs(f"rootfs-{name}"), ["sh", "-c", script], env=full, hooks=hooks)

    def run(name: str, bundle: Path) -> None:
        results[name] = Runc(tmp_path / f"state-{name}", runc).create_start(bundle, timeout=300)

    envs = {
        "fast": {"NVC_SHARE_MEMORY_LIMIT": "4Gi", "NVC_SHARE_PRIORITY": "latency-critical"},
        "batch": {"NVC_SHARE_MEMORY_LIMIT": "4Gi", "NVC_SHARE_COMPUTE": "30", "NVC_SHARE_PRIORITY": "batch"},
    }
    bundles = {name: bundle(name, env) for name, env in envs.items()}
    threads = [threading.Thread(target=run, args=item) for item in bundles.items()]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        seen.setdefault("states", []).extend(mps.status())
        threads[0].join(timeout=0.2)
    for thread in threads:
        thread.join()
    for name, result in results.items():
        print(f"--- {name}:\n{result.stdout}{result.stderr}")
        assert result.returncode == 0, result.stderr
        lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
        assert lines["mem_get_info"].split()[1] == str(4 * GIB)
        assert (lines["alloc3"], lines["alloc2"]) == ("ok", "OutOfMemoryError")
    pinned = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=5120M"
    pipe = "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"
    assert results["fast"].stdout.splitlines()[0] == f"env {['CUDA_MPS_CLIENT_PRIORITY=0', pinned, pipe]}"
    assert results["batch"].stdout.splitlines()[0] == (
        f"env {['CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30', 'CUDA_MPS_CLIENT_PRIORITY=1', pinned, pipe]}"
    )
    running = [state for state in seen.get("states", []) if state.pid]
    assert running and {state.device for state in running} == {gpu0_uuid}
    assert len({state.pid for state in running}) == 1  # one daemon served both
    assert mps.status() == [] and not (Path(mpsplan.MPS_DIR) / gpu0_uuid).exists()
