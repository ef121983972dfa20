"""libnvc-share on a real GPU (H100, driver 580, CUDA 13): the acceptance checks of issue 6 with
LD_PRELOAD and a share directory written by nvc.apply.sharefiles (the hook's limits writer); the memory
checks under each backend (time slices, and a client of an MPS daemon as nvc-py's MPS backend serves
it). Run by `make test-gpu` on the GPU machine; deselected elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.bundle import make_bundle
from harness.gpufixtures import gpu_driver, hook_with_log, runtime, started_together, torch_rootfs  # noqa: F401  (fixtures)
from harness.installed import SCRIPTS

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
import sharegpu  # noqa: E402

pytestmark = pytest.mark.gpu
GIB = 1 << 30
MIB = 1 << 20
TORCH_SCRIPT = sharegpu.GPU_DIR / "torch_share.py"


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sharegpu.build(tmp_path_factory.mktemp("share_gpu"))


@pytest.fixture
def mps_daemon(tmp_path: Path) -> Iterator[dict[str, str]]:
    """An MPS control daemon for GPU 0 as nvc-py's MPS backend runs it, stopped (its server with it)
    after the test: what a client's environment needs to reach it."""
    with sharegpu.mps_daemon(tmp_path / "mps") as daemon:
        yield daemon


@pytest.fixture(params=["timeslice", "mps"])
def limited(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """Environment of a process under a 4 GiB budget, under each sharing backend: time slices (the shim
    alone), and as a client of nvc-py's MPS backend (the shim's accounting and MPS's own pinned memory
    limit both on it)."""
    limits = {"NVC_SHARE_MEMORY_LIMIT": "4Gi"}
    if request.param == "mps":
        return sharegpu.mps_client_env(tmp_path / "client", limits, [], request.getfixturevalue("mps_daemon"))
    return sharegpu.shim_env(sharegpu.limits_dir(tmp_path, limits))


def test_cudamalloc_gets_oom_once_the_limit_is_allocated(program, limited):
    out = sharegpu.run([program, "meminfo", "fill", 256, "meminfo", "freeall", "asyncfill", 256], limited)
    assert int(out["meminfo"][1]) == 4 * GIB
    assert out["fill"] == ["4096", "cudaErrorMemoryAllocation"]
    assert int(out["meminfo"][0]) == 0
    assert out["asyncfill"] == ["4096", "cudaErrorMemoryAllocation"]


ESCAPE_PATHS = [
    "malloc",
    "managed",
    "pitch",
    "malloc3d",
    "async",
    "frompool",
    "vmm",
    "driver",
    "array",
    "array3d",
    "mipmap",
    "graph",
    "graphnode",
    "graphparams",
    "capture",
]


@pytest.mark.parametrize("path", ESCAPE_PATHS)
def test_no_allocation_path_passes_the_limit(program, limited, path):
    """512 MiB at a time through each allocation path (native/README.md's table), kept, until one
    fails: each stops at the 4 GiB budget with an out-of-memory error (arrays: the shim's estimate
    is the element size x extents, the driver's padding is not seen)."""
    out = sharegpu.run([program, "escape", path], limited)["escape"]
    print(f"escape {path}: {out[1]} MiB held, then {out[2]}")
    assert out[2] == "cudaErrorMemoryAllocation"
    assert 3584 <= int(out[1]) <= 4096


def test_graph_memory_nodes_and_arrays_are_charged(program, limited):
    """Paths PyTorch and cudaMalloc do not take: a graph's memory allocation node (charged when the
    node is created) and a CUDA array (charged by its size)."""
    out = sharegpu.run([program, "graphalloc", 3072, "meminfo", "alloc", 2048], limited)
    assert out["graphalloc"] == ["cudaSuccess"]
    assert 1 * GIB - 64 * MIB <= int(out["meminfo"][0]) <= 1 * GIB
    assert out["alloc"] == ["cudaErrorMemoryAllocation"]
    out = sharegpu.run([program, "array", 8192, 8192, "meminfo", "fill", 256], limited)  # 1 GiB of float4
    assert out["array"] == ["cudaSuccess"]
    assert 3 * GIB - 64 * MIB <= int(out["meminfo"][0]) <= 3 * GIB
    assert out["fill"] == ["3072", "cudaErrorMemoryAllocation"]


def test_total_memory_is_the_limit_and_physical_without_one(program, limited, tmp_path):
    physical = sharegpu.run([program, "totalmem"], sharegpu.shim_env(None))["totalmem"]
    assert sharegpu.run([program, "totalmem"], limited)["totalmem"] == [str(4 * GIB)]
    unlimited = sharegpu.shim_env(sharegpu.limits_dir(tmp_path / "c", {"NVC_SHARE_COMPUTE": "100"}))
    assert sharegpu.run([program, "totalmem"], unlimited)["totalmem"] == physical


@pytest.mark.parametrize("alloc_conf", ["", "expandable_segments:True"])
def test_pytorch_sees_the_limit_and_gets_out_of_memory(limited, alloc_conf):
    env = dict(limited, PYTORCH_CUDA_ALLOC_CONF=alloc_conf)
    out = sharegpu.run([sharegpu.TORCH_PYTHON, TORCH_SCRIPT], env)
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
    out = sharegpu.subprocess.run(
        [smi, "--query-gpu=memory.total", "--format=csv,noheader"],
        env=limited,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
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
    env = sharegpu.shim_env(
        None, CUDA_DEVICE_MEMORY_LIMIT_0="2048m", LD_PRELOAD=str(sharegpu.SHIM), NVC_SHARE_DIR=str(tmp_path)
    )
    assert sharegpu.run([program, "fill", 256], env)["fill"] == ["2048", "cudaErrorMemoryAllocation"]
    assert os.path.exists(tmp_path / "region")


def test_through_the_hook_in_a_container(runtime, make_rootfs, program, native_rate, tmp_path):
    """nvc-py-hook as prestart hook: the container's env asks for 4 GiB and a 50 % share; inside, the
    static-cudart program gets OOM at 4 GiB, two processes share the budget, nvidia-smi shows
    4096 MiB, the compute share holds; the workload cannot raise its limits through its env."""
    hooks = hook_with_log(tmp_path)
    rootfs = make_rootfs(name="rootfs-share")
    (rootfs / "usr/local/bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(program, rootfs / "usr/local/bin/share_gpu")
    script = (
        "mkdir -p /tmp; share_gpu meminfo fill 256; "
        "NVC_SHARE_MEMORY_LIMIT=80Gi share_gpu alloc 5120 alloc 3072 hold > /tmp/h & "
        "while ! grep -q holding /tmp/h; do sleep 0.1; done; share_gpu fill 256; kill $!; head -2 /tmp/h; "
        f"share_gpu compute 3 {sharegpu.COMPUTE_ITERS}; "
        "nvidia-smi --query-gpu=memory.total --format=csv,noheader 2>&1 || true"
    )
    env = {
        "NVIDIA_VISIBLE_DEVICES": "0",
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
        "NVC_SHARE_MEMORY_LIMIT": "4Gi",
        "NVC_SHARE_COMPUTE": "50",
    }
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["sh", "-c", script], env=env, hooks=hooks)
    result = runtime.create_start(bundle, timeout=120)
    print(f"--- {Path(runtime.binary).name}, {env}:\n{result.stdout}{result.stderr}")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert int(lines[0].split()[2]) == 4 * GIB  # meminfo total
    assert lines[1] == "fill 4096 cudaErrorMemoryAllocation"
    assert lines[2] == "fill 1024 cudaErrorMemoryAllocation"  # the holder has 3 GiB
    # the holder's env asked for 80 GiB: the read-only limits file wins
    assert lines[3:5] == ["alloc cudaErrorMemoryAllocation", "alloc cudaSuccess"]
    achieved = 100 * float(lines[5].split()[1]) / native_rate
    print(f"compute share in the container: {achieved:.1f}% of native (50% requested)")
    assert abs(achieved - 50) <= 5
    assert lines[6:] == ["4096 MiB"]


@pytest.mark.parametrize("percent", [25, 75])
def test_compute_share_through_the_hook_in_a_container(runtime, make_rootfs, program, native_rate, tmp_path, percent):
    """The other shares of the compute-share acceptance (50 % is in the test above), in a container."""
    rootfs = make_rootfs(name="rootfs-share")
    (rootfs / "usr/local/bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(program, rootfs / "usr/local/bin/share_gpu")
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "NVC_SHARE_COMPUTE": str(percent)}
    bundle = make_bundle(
        tmp_path / "bundle",
        rootfs,
        ["share_gpu", "compute", "3", str(sharegpu.COMPUTE_ITERS)],
        env=env,
        hooks=hook_with_log(tmp_path),
    )
    result = runtime.create_start(bundle, timeout=120)
    assert result.returncode == 0, result.stderr
    achieved = 100 * float(result.stdout.split()[1]) / native_rate
    print(
        f"--- {Path(runtime.binary).name}: compute share in the container {achieved:.1f}% of native "
        f"({percent}% requested)"
    )
    assert abs(achieved - percent) <= 5


def test_pytorch_through_the_hook_in_a_container(torch_rootfs, tmp_path):
    """PyTorch in a runc container started through nvc-py-hook with a 4 GiB budget in its env."""
    from harness.runtime import Runc

    runc = shutil.which("runc")
    if runc is None:
        pytest.skip("runc is not installed")
    hooks = hook_with_log(tmp_path)
    python = "/opt/torch/.venv/bin/python3 /gpu/torch_share.py"
    script = f"{python}; echo ---; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True {python}"
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "NVC_SHARE_MEMORY_LIMIT": "4Gi", "HOME": "/tmp"}
    bundle = make_bundle(tmp_path / "bundle", torch_rootfs("rootfs-torch"), ["sh", "-c", script], env=env, hooks=hooks)
    result = Runc(tmp_path / "state", runc).create_start(bundle, timeout=300)
    print(f"--- runc, {env}:\n{result.stdout}{result.stderr}")
    assert result.returncode == 0, result.stderr
    for run in result.stdout.split("---\n"):
        lines = dict(line.split(" ", 1) for line in run.splitlines())
        assert lines["mem_get_info"].split()[1] == str(4 * GIB)
        assert (lines["alloc3"], lines["alloc2"]) == ("ok", "OutOfMemoryError")


# ---------------------------------------------------------------- PyTorch shares and weighted sharing


@pytest.fixture(scope="module")
def matmul_alone(tmp_path_factory: pytest.TempPathFactory) -> tuple[float, float]:
    """The matmul loop's rate without the shim, and the SM clock it ran at."""
    if not Path(sharegpu.TORCH_PYTHON).exists():
        pytest.skip("no PyTorch interpreter")
    return sharegpu.timed_with_clock("matmul", sharegpu.shim_env(None), 4, tmp_path_factory.mktemp("alone") / "go")


@pytest.fixture(scope="module")
def native_matmul(matmul_alone: tuple[float, float]) -> float:
    return matmul_alone[0]


@pytest.mark.parametrize("percent", [25, 50, 75])
def test_pytorch_matmul_cap_within_three_points_at_its_clock(matmul_alone, tmp_path, percent):
    """The bf16 8192² matmul loop (~1.6 ms cuBLAS kernels, fewer blocks than SMs) at a cap: at least the
    cap less 3 points, and at most the cap plus 3 points, scaled by the SM clock it gained. The
    measured limit of a wall-time share: alone, the matmul draws the GPU's power limit and the SM clock
    drops; capped, it draws less and runs at a higher clock, so more work fits in its share of the time
    (H100, 2026-11-24: 1377 MHz alone, 1964 / 1816 / 1663 MHz capped at 25 / 50 / 75 %, which gave
    29.4 / 57.2 / 81.9 % of the rate alone; native/README.md). The 3 points hold at any clock: a bound
    of the cap times the gain alone left none (H200: 84.0 % at 75, x1.113, a share of its time of 75.5 %).
    Where the clock holds, this is the cap within 3 points."""
    rate_alone, clock_alone = matmul_alone
    env = sharegpu.shim_env(sharegpu.limits_dir(tmp_path, {"NVC_SHARE_COMPUTE": str(percent)}))
    rate, clock = sharegpu.timed_with_clock("matmul", env, 4, tmp_path / "go")
    achieved, gain = 100 * rate / rate_alone, clock / clock_alone
    print(
        f"matmul {percent}%: {achieved:.1f}% of native; SM clock {clock:.0f} MHz against {clock_alone:.0f} "
        f"alone (x{gain:.3f}); {achieved / gain:.1f}% at the clock alone"
    )
    assert percent - 3 <= achieved <= (percent + 3) * max(1.0, gain)


def test_weighted_tenants_share_by_weight_and_alone_take_the_gpu(native_matmul, tmp_path):
    """Two matmul processes in different tenants, weights 1 and 3, started together: each one's part of
    their summed throughput (each as a share of one alone) is its weight's (±5 points), and together
    they keep at least 90 % of one alone (the GPU's switching between the two contexts costs some:
    measured 93 % on the H100); the weight-3 one stops half way and the other then gets >= 90 %."""
    procs = []
    (tmp_path / "sched").mkdir()
    for name, weight, seconds in (("a", 1, 8), ("b", 3, 4)):
        env = sharegpu.shim_env(
            sharegpu.limits_dir(tmp_path / name, {"NVC_SHARE_WEIGHT": str(weight)}),
            NVC_SHARE_SCHED_DIR=str(tmp_path / "sched"),
            NVC_SHARE_TENANT=name,
        )
        procs.append(sharegpu.torch_run("matmul", env, seconds, tmp_path / "go"))
    sharegpu.go_together(procs, tmp_path / "go")
    (_, a), (_, b) = (sharegpu.torch_result(p) for p in procs)
    shares = (
        100 * sum(a[:4]) / 4 / native_matmul,
        100 * sum(b) / 4 / native_matmul,
        100 * sum(a[5:]) / 3 / native_matmul,
    )
    print(f"weights 1:3: {shares[0]:.1f}% and {shares[1]:.1f}%; then alone {shares[2]:.1f}%")
    part = 100 * shares[0] / (shares[0] + shares[1])
    assert abs(part - 25) <= 5 and shares[0] + shares[1] >= 90
    assert shares[2] >= 90


def _scrape_while_busy(barrier: Path, url: str) -> list[str]:
    """The exporter's sharing series, scraped once both containers have been busy for two seconds."""
    import urllib.request

    deadline = time.monotonic() + 120
    while len(list(barrier.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(2)
    with urllib.request.urlopen(url, timeout=30) as answer:
        text = answer.read().decode()
    return [line for line in text.splitlines() if line.startswith("nvc_py_share_") and "container_id" in line]


def test_two_weighted_containers_share_the_gpu_by_weight(runtime, make_rootfs, program, native_rate, tmp_path):
    """Two containers started through nvc-py-hook on the same GPU, weights 1 and 3 in their env (and
    each its own 4 GiB budget), busy with the FMA kernel at the same time: each one's part of their
    summed throughput (each as a share of one alone) is its weight's (±5 points), together at least 90 %
    of one alone (measured 93 % on the H100: the GPU's switching between contexts). Neither can write the scheduler's files of the two nor its own limits file."""
    import json

    barrier = tmp_path / "barrier"
    barrier.mkdir()
    # Both containers up (each one's scheduler file made by its hook) before either starts timing;
    # the first, untimed, second of work absorbs the skew of the two processes' CUDA start.
    script = (
        "touch /barrier/$HOSTNAME; while [ $(ls /barrier | wc -l) -lt 2 ]; do sleep 0.01; done; "
        "for f in /var/run/nvc-share-peers/*; do (printf x >> $f) 2>&1 | grep -o 'Read-only file system'; "
        "done; (echo compute_weight=1000 >> /var/run/nvc-share/limits) 2>&1 | grep -o 'Read-only file system'; "
        f"share_gpu compute 1 {sharegpu.COMPUTE_ITERS} compute 4 {sharegpu.COMPUTE_ITERS}"
    )
    bundles = {}
    for weight in (1, 3):
        rootfs = make_rootfs(name=f"rootfs-weight{weight}")
        (rootfs / "usr/local/bin").mkdir(parents=True, exist_ok=True)
        shutil.copy2(program, rootfs / "usr/local/bin/share_gpu")
        (rootfs / "barrier").mkdir(exist_ok=True)
        (tmp_path / f"log{weight}").mkdir()
        env = {"NVIDIA_VISIBLE_DEVICES": "0", "NVC_SHARE_WEIGHT": str(weight), "NVC_SHARE_MEMORY_LIMIT": "4Gi"}
        bundle = make_bundle(
            tmp_path / f"bundle{weight}",
            rootfs,
            ["sh", "-c", script],
            env=env,
            hooks=hook_with_log(tmp_path / f"log{weight}"),
        )
        config = json.loads((bundle / "config.json").read_text())
        config["hostname"] = f"weight{weight}"
        config["mounts"].append(
            {"destination": "/barrier", "type": "bind", "source": str(barrier), "options": ["rbind", "rw"]}
        )
        (bundle / "config.json").write_text(json.dumps(config))
        bundles[weight] = bundle
    exporter = subprocess.Popen(
        [
            str(SCRIPTS / "nvc-py"),
            "exporter",
            "--listen",
            "127.0.0.1:9499",
            "--hook-log",
            str(tmp_path / "log1" / "hook.log"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with started_together(runtime, bundles, timeout=120) as results:
            series = _scrape_while_busy(barrier, "http://127.0.0.1:9499/metrics")
    finally:
        exporter.terminate()
        exporter.wait(timeout=30)
    print(f"nvc-py exporter's series while both ran ({Path(runtime.binary).name}):\n" + "\n".join(series))
    assert (
        len(
            {
                line.split('container_id="')[1].split('"')[0]
                for line in series
                if line.startswith("nvc_py_share_weight{")
            }
        )
        == 2
    ), series
    assert sum(line.startswith("nvc_py_share_measured_ratio{") for line in series) == 2, series
    shares = {}
    for weight, result in sorted(results.items()):
        print(f"--- {Path(runtime.binary).name}, weight {weight}:\n{result.stdout}{result.stderr}")
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[:3] == ["Read-only file system"] * 3, lines  # both scheduler files, the limits file
        shares[weight] = 100 * float(lines[4].split()[1]) / native_rate
    print(f"{Path(runtime.binary).name} containers, weights 1:3: {shares[1]:.1f}% and {shares[3]:.1f}% of native")
    assert set(shares) == {1, 3}
    assert abs(100 * shares[1] / (shares[1] + shares[3]) - 25) <= 5 and shares[1] + shares[3] >= 90
