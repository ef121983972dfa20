"""pytest fixtures of the GPU tests (marked gpu, run by make test-gpu): the real driver, the UUID of
its GPU 0, the runtimes a GPU test starts containers with, nvc-py-hook as their hook, container
root filesystems that run the GPU machine's own PyTorch, and containers started together."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from .installed import SCRIPTS
from .runtime import Runc

GPU_DIR = Path(__file__).resolve().parent.parent / "gpu"
TORCH_VENV = Path("/opt/torch")


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


def hook_with_log(tmp_path: Path) -> dict[str, list[dict]]:
    """nvc-py-hook as prestart and poststop hook, with a configuration that logs under ``tmp_path``."""
    config = tmp_path / "config.yaml"
    config.write_text(f"log: {{file: {tmp_path / 'hook.log'}}}\n")
    hook = {
        "path": str(SCRIPTS / "nvc-py-hook"),
        "args": ["nvc-py-hook", "prestart"],
        "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", f"NVC_PY_CONFIG={config}"],
    }
    return {"prestart": [hook], "poststop": [{**hook, "args": ["nvc-py-hook", "poststop"]}]}


@pytest.fixture
def torch_rootfs(make_rootfs: Callable[..., Path], tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """torch_rootfs(name) -> a container rootfs that runs the GPU machine's own PyTorch: the test image
    with the host's /usr as an overlay (writes land in a tmpfs, never on the host), /opt/torch bound
    read-only and the PyTorch programs of tests/gpu/ in /gpu."""
    if not (TORCH_VENV / ".venv/bin/python3").exists():
        pytest.skip(f"no {TORCH_VENV} PyTorch on this machine")
    mounted: list[Path] = []

    def mount(*args: str, target: Path) -> None:
        subprocess.run(["mount", *args, str(target)], check=True)
        mounted.append(target)

    def make(name: str) -> Path:
        rootfs = make_rootfs(name=name)
        scratch = tmp_path / f"{name}-scratch"
        scratch.mkdir()
        mount("-t", "tmpfs", "tmpfs", target=scratch)
        (scratch / "upper").mkdir()
        (scratch / "work").mkdir()
        mount(
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir=/usr,upperdir={scratch}/upper,workdir={scratch}/work",
            target=rootfs / "usr",
        )
        (rootfs / TORCH_VENV.relative_to("/")).mkdir(parents=True)
        mount("--bind", str(TORCH_VENV), target=rootfs / TORCH_VENV.relative_to("/"))
        subprocess.run(["mount", "-o", "remount,bind,ro", str(rootfs / TORCH_VENV.relative_to("/"))], check=True)
        (rootfs / "gpu").mkdir()
        for program in GPU_DIR.glob("torch_*.py"):
            shutil.copy2(program, rootfs / "gpu" / program.name)
        return rootfs

    try:
        yield make
    finally:
        for target in reversed(mounted):
            subprocess.run(["umount", "-l", str(target)], check=False)


@contextmanager
def started_together(runtime: Runc, bundles: dict[int, Path], timeout: float) -> Iterator[dict[int, Any]]:
    """Starts each bundle's container in its own thread; on leaving, waits for them (their results, by
    key, in the dict yielded) and unmounts the hooks' scheduler directory where this test mounted it."""
    import threading

    from nvc.plan import share as share_plan

    sched = Path(share_plan.sched_dir_for(share_plan.STATE_DIR))
    was_mounted = os.path.ismount(sched)
    results: dict[int, Any] = {}
    threads = [
        threading.Thread(target=lambda k=key: results.__setitem__(k, runtime.create_start(bundles[k], timeout=timeout)))
        for key in bundles
    ]
    try:
        for thread in threads:
            thread.start()
        yield results
        for thread in threads:
            thread.join(timeout=timeout + 60)
    finally:
        if not was_mounted and os.path.ismount(sched):
            subprocess.run(["umount", "-l", str(sched)], check=True)
