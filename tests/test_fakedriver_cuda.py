"""The fake libcuda (test double): devices, memory capacity, entry-point lookup and simulated time.

A small machine (1 GiB GPU at minor 0, 2 GiB at minor 1, a GPU at minor 9 without a node) is compiled
into libcuda/; cuda_probe drives it through dlopen like an application. Device nodes come from the
``active_2gpu`` fixture (/dev/nvidiactl, nvidia0, nvidia1), so only the machine table differs from
production builds. Needs root (mount namespaces).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from fakedriver.libraries import INCLUDES, library_sources

SRC = Path(__file__).resolve().parent / "fakedriver" / "src"
MIB = 1 << 20
GIB = 1 << 30
CONTEXT = GIB // 16  # default context reservation: min(512 MiB, capacity / 16)

MACHINE = """\
driver_version: "580.95.05"
cuda_version: 13000
layout: distro
gpus:
  - {minor: 0, name: Small GPU, uuid: GPU-11111111-2222-3333-4444-555555555555, pci_bus_id: "00000000:3B:00.0",
     pci_device_id: 0x233010DE, brand: Nvidia, compute_capability: "9.0", memory: 1Gi, sm_count: 132}
  - {minor: 1, name: Medium GPU, uuid: GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee, pci_bus_id: "00000000:86:00.0",
     pci_device_id: 0x20B010DE, brand: Nvidia, compute_capability: "8.6", memory: 2Gi, sm_count: 84}
  - {minor: 9, name: Absent GPU, uuid: GPU-99999999-9999-9999-9999-999999999999, pci_bus_id: "00000000:AF:00.0",
     pci_device_id: 0x20B010DE, brand: Nvidia, compute_capability: "8.0", memory: 4Gi, sm_count: 108}
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for mount namespaces")


def compile_libcuda(machine_yaml: Path, out: Path) -> Path:
    """Compile the fake libcuda for ``machine_yaml`` into ``out``; returns the dir holding libcuda.so.1."""
    from fakedriver.machine import load_machine, machine_header

    out.mkdir(parents=True, exist_ok=True)
    (out / "fake_machine.h").write_text(machine_header(load_machine(machine_yaml), machine_yaml.name))
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-O2",
            "-Wall",
            "-Werror",
            f"-I{out}",
            *INCLUDES,
            "-Wl,-soname,libcuda.so.1",
            "-o",
            str(out / "libcuda.so.1"),
            *map(str, library_sources("libcuda.so")),
            "-lpthread",
        ],
        check=True,
    )
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(directory with libcuda.so.1, cuda_probe binary)."""
    tmp = tmp_path_factory.mktemp("fakecuda")
    (tmp / "machine.yaml").write_text(MACHINE)
    lib_dir = compile_libcuda(tmp / "machine.yaml", tmp / "lib")
    probe = tmp / "cuda_probe"
    subprocess.run(
        ["gcc", "-O1", "-Wall", "-Werror", *INCLUDES, "-o", str(probe), str(SRC / "cuda_probe.c"), "-ldl"], check=True
    )
    return lib_dir, probe


def probe(
    built: tuple[Path, Path], *ops: object, env: dict[str, str] | None = None, prefix: list[str] | None = None
) -> list[list[str]]:
    """Run cuda_probe with ops; returns each output line split on whitespace."""
    lib_dir, binary = built
    full_env = {"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": str(lib_dir), **(env or {})}
    result = subprocess.run(
        [*(prefix or []), str(binary), *map(str, ops)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return [line.split() for line in result.stdout.splitlines()]


def test_without_nvidiactl_there_is_no_device(built):
    # An empty /dev in a private mount namespace: no /dev/nvidiactl.
    empty_dev = ["unshare", "--mount", "sh", "-c", 'mount -t tmpfs none /dev && exec "$0" "$@"']
    out = probe(built, "init", "count", prefix=empty_dev)
    assert out == [["init", "CUDA_ERROR_NO_DEVICE"], ["count", "CUDA_ERROR_NO_DEVICE", "0"]]


def test_calls_before_init_fail(built, active_2gpu):
    assert probe(built, "count", "meminfo") == [
        ["count", "CUDA_ERROR_NOT_INITIALIZED", "0"],
        ["meminfo", "CUDA_ERROR_NOT_INITIALIZED", "0", "0"],
    ]


def test_devices_are_the_gpus_with_nodes(built, active_2gpu):
    out = probe(built, "init", "count", "dev", 0, "dev", 1, "dev", 2)
    assert out[:2] == [["init", "CUDA_SUCCESS"], ["count", "CUDA_SUCCESS", "2"]]
    assert out[2] == [
        "dev",
        "CUDA_SUCCESS",
        "uuid=11111111222233334444555555555555",
        "pci=0000:3B:00.0",
        f"total={GIB}",
        "cc=9.0",
        "sms=132",
        "name=Small",
        "GPU",
    ]
    assert out[3][1:3] == ["CUDA_SUCCESS", "uuid=aaaaaaaabbbbccccddddeeeeeeeeeeee"]
    assert out[4][1] == "CUDA_ERROR_INVALID_DEVICE"


@pytest.mark.parametrize(
    "visible, names",
    [
        ("1", ["Medium"]),
        ("GPU-aaaa,0", ["Medium", "Small"]),
        ("0,7,1", ["Small"]),  # parsing stops at the first invalid entry
        ("", []),
    ],
)
def test_cuda_visible_devices(built, active_2gpu, visible, names):
    out = probe(built, "init", "dev", 0, "dev", 1, env={"CUDA_VISIBLE_DEVICES": visible})
    assert out[0] == ["init", "CUDA_SUCCESS" if names else "CUDA_ERROR_NO_DEVICE"]
    shown = [line[-2].removeprefix("name=") for line in out[1:] if line[1] == "CUDA_SUCCESS"]
    assert shown == names


def test_alloc_fails_exactly_at_capacity(built, active_2gpu):
    mib300 = 300 * MIB
    out = probe(built, "init", "ctx", 0, *["alloc", mib300] * 4, "meminfo", "free", 0, "alloc", mib300, "free", 99)
    assert [line[1] for line in out[2:6]] == ["CUDA_SUCCESS"] * 3 + ["CUDA_ERROR_OUT_OF_MEMORY"]
    assert out[6] == ["meminfo", "CUDA_SUCCESS", str(GIB - CONTEXT - 3 * mib300), str(GIB)]
    assert out[7] == ["free", "CUDA_SUCCESS"]
    assert out[8][1] == "CUDA_SUCCESS"
    assert out[9] == ["free", "CUDA_ERROR_INVALID_VALUE"]  # never allocated


def test_memory_needs_a_context_and_contexts_reserve_memory(built, active_2gpu):
    out = probe(
        built,
        "init",
        "alloc",
        MIB,
        "meminfo",
        "ctx",
        0,
        "meminfo",
        "ctxcreate",
        0,
        "meminfo",
        "alloc",
        100 * MIB,
        "ctxdestroy",
        "meminfo",
    )
    assert out[1] == ["alloc", "CUDA_ERROR_INVALID_CONTEXT", "-1"]
    assert out[2][1] == "CUDA_ERROR_INVALID_CONTEXT"
    assert out[4][2] == str(GIB - CONTEXT)
    assert out[6][2] == str(GIB - 2 * CONTEXT)
    assert out[7][1] == "CUDA_SUCCESS"
    # Destroying the created context frees its reservation and what was allocated in it.
    assert out[9][2] == str(GIB - CONTEXT)
    unreserved = probe(built, "init", "ctx", 0, "meminfo", env={"FAKE_CUDA_CONTEXT_MIB": "0"})
    assert unreserved[2] == ["meminfo", "CUDA_SUCCESS", str(GIB), str(GIB)]


def test_primary_release_frees_its_allocations(built, active_2gpu):
    out = probe(built, "init", "ctx", 0, "alloc", 500 * MIB, "release", 0, "ctx", 0, "meminfo")
    assert out[3] == ["release", "CUDA_SUCCESS"]
    assert out[5][2] == str(GIB - CONTEXT)


def test_pitch_charges_rounded_rows(built, active_2gpu):
    out = probe(
        built, "init", "ctx", 0, "pitch", 1000, 1000, 4, "meminfo", "pitch", 1000, 10, 3, "pitch", 1 << 20, 2000, 16
    )
    assert out[2] == ["pitch", "CUDA_SUCCESS", "1024", "0"]
    assert out[3][2] == str(GIB - CONTEXT - 1024 * 1000)
    assert out[4][1] == "CUDA_ERROR_INVALID_VALUE"  # element size must be 4, 8 or 16
    assert out[5][1] == "CUDA_ERROR_OUT_OF_MEMORY"  # 2000 rows of 1 MiB


def test_vmm_handles_are_charged_until_released_and_unmapped(built, active_2gpu):
    mib300 = 300 * MIB
    out = probe(built, "init", "ctx", 0, *["vmm", mib300] * 4, "vmmfree", 0, "vmm", mib300, "meminfo")
    assert [line[1] for line in out[2:6]] == ["CUDA_SUCCESS"] * 3 + ["CUDA_ERROR_OUT_OF_MEMORY"]
    assert out[6] == ["vmmfree", "CUDA_SUCCESS"]
    assert out[7][1] == "CUDA_SUCCESS"
    assert out[8][2] == str(GIB - CONTEXT - 3 * mib300)


def test_async_pool_keeps_freed_memory_until_synchronize(built, active_2gpu):
    mib600 = 600 * MIB
    out = probe(
        built,
        "init",
        "ctx",
        0,
        "async",
        mib600,
        "async",
        mib600,
        "freeasync",
        0,
        "meminfo",
        "pool",
        "sync",
        "meminfo",
        "pool",
        "threshold",
        GIB,
        "async",
        100 * MIB,
        "freeasync",
        1,
        "sync",
        "pool",
    )
    assert out[2][1] == "CUDA_SUCCESS"
    assert out[3][1] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert out[5][2] == str(GIB - CONTEXT - mib600)  # freed, but still reserved by the pool
    assert out[6] == ["pool", "CUDA_SUCCESS", f"reserved={mib600}", "used=0", f"reserved_high={mib600}"]
    assert out[8][2] == str(GIB - CONTEXT)  # synchronize trimmed the pool
    assert out[9][2:4] == ["reserved=0", "used=0"]
    # With a release threshold above the pool size the reserve survives synchronization.
    assert out[-1][2:4] == [f"reserved={100 * MIB}", "used=0"]


def test_arrays_are_charged_by_extent_format_and_channels(built, active_2gpu):
    float4 = ["32", "4"]  # CU_AD_FORMAT_FLOAT (0x20), 4 channels
    out = probe(
        built,
        "init",
        "ctx",
        0,
        "array",
        1024,
        1024,
        *float4,
        "meminfo",
        "array3d",
        64,
        64,
        64,
        32,
        1,
        "mipmap",
        256,
        256,
        0,
        *float4,
        3,
        "meminfo",
        "arrayfree",
        0,
        "arrayfree",
        1,
        "arrayfree",
        2,
        "meminfo",
        "array",
        16,
        16,
        7,
        1,
        "array",
        1 << 20,
        1 << 10,
        *float4,
    )
    assert out[2] == ["array", "CUDA_SUCCESS", "0"]
    assert out[3][2] == str(GIB - CONTEXT - 16 * MIB)
    mip = 16 * (256 * 256 + 128 * 128 + 64 * 64)
    assert out[6][2] == str(GIB - CONTEXT - 16 * MIB - 64**3 * 4 - mip)
    assert out[10][2] == str(GIB - CONTEXT)
    assert out[11][1] == "CUDA_ERROR_INVALID_VALUE"  # unknown format
    assert out[12][1] == "CUDA_ERROR_OUT_OF_MEMORY"  # 16 GiB


@pytest.mark.parametrize(
    "name, version, flags, expected",
    [
        ("cuMemAlloc", 12000, 0, "cuMemAlloc_v2"),
        ("cuMemAlloc", 3010, 0, "VERSION_NOT_SUFFICIENT"),
        ("cuMemAlloc_v2", 12000, 0, "SYMBOL_NOT_FOUND"),  # lookups are by base name
        ("cuLaunchKernel", 12000, 0, "cuLaunchKernel"),
        ("cuLaunchKernel", 12000, 2, "cuLaunchKernel_ptsz"),
        ("cuMemAllocAsync", 12000, 2, "cuMemAllocAsync_ptsz"),
        ("cuGraphLaunch", 12000, 2, "cuGraphLaunch_ptsz"),
        ("cuMemAlloc", 12000, 2, "cuMemAlloc_v2"),  # no per-thread variant
        ("cuGraphInstantiate", 11000, 0, "cuGraphInstantiate_v2"),
        ("cuGraphInstantiate", 12000, 0, "cuGraphInstantiateWithFlags"),
        ("cuCtxCreate", 11040, 0, "cuCtxCreate_v3"),
        ("cuDevicePrimaryCtxRelease", 10000, 0, "cuDevicePrimaryCtxRelease"),
        ("cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2"),
        ("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"),
        ("cuNoSuchFunction", 12000, 0, "SYMBOL_NOT_FOUND"),
    ],
)
def test_get_proc_address(built, name, version, flags, expected):
    # Works before cuInit and without devices, as the real driver's does.
    [line] = probe(built, "procaddr", name, version, flags)
    if expected.endswith("_FOUND") or expected.endswith("_SUFFICIENT"):
        status = {"SYMBOL_NOT_FOUND": "1", "VERSION_NOT_SUFFICIENT": "2"}[expected]
        assert line == ["procaddr", "CUDA_ERROR_NOT_FOUND", status, "-"]
    else:
        assert line == ["procaddr", "CUDA_SUCCESS", "0", expected]


def test_kernels_take_simulated_time(built, active_2gpu):
    # 2000 kernels of 200 us: at most 1024 queue, so launching blocks and sync waits for the rest.
    out = probe(
        built,
        "init",
        "ctx",
        0,
        "launch",
        2000,
        4,
        128,
        "sync",
        "events",
        50,
        "graph",
        3,
        10,
        "sync",
        "coop",
        100000,
        256,
        "coop",
        132,
        1024,
        "stats",
        0,
        env={"FAKE_CUDA_KERNEL_US": "200"},
    )
    launch_us, sync_us = int(out[2][2]), int(out[3][2])
    assert out[2][1] == out[3][1] == "CUDA_SUCCESS"
    assert 400_000 * 0.95 <= launch_us + sync_us < 400_000 * 1.5
    assert launch_us >= (2000 - 1024) * 200 * 0.95
    assert out[4][1] == "CUDA_SUCCESS" and abs(float(out[4][2]) - 10.0) < 0.5  # 50 x 200 us
    assert out[5] == ["graph", "CUDA_SUCCESS"]
    assert out[7][1] == "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"
    assert out[8][1] == "CUDA_SUCCESS"
    assert out[9][:3] == ["stats", "0", f"launches={2000 + 50 + 30 + 1}"]
    assert out[9][3] == f"busy_ns={(2000 + 50 + 30 + 1) * 200_000}"


def test_a_stream_wait_on_a_host_word_holds_the_work_behind_it_not_the_caller(built, active_2gpu):
    """cuStreamWaitValue32 on the NULL stream, then 3 kernels of 2 ms and an event: as on a GPU, the call
    returns at once and the event is not ready while the word is short of the value; written 20 ms
    later, the held kernels run from then on (the event 6 ms after the write, not at once and not
    26 ms after the wait)."""
    line = probe(built, "init", "ctx", 0, "gatewait", 3, 20000, env={"FAKE_CUDA_KERNEL_US": "2000"})[2]
    assert line[:2] == ["gatewait", "CUDA_SUCCESS"] and line[3] == "CUDA_ERROR_NOT_READY", line
    assert float(line[2]) < 5000 and 5900 <= float(line[4]) <= 9000, line


def test_bad_kernel_time_fails_init(built, active_2gpu):
    assert probe(built, "init", env={"FAKE_CUDA_KERNEL_US": "-5"}) == [["init", "CUDA_ERROR_INVALID_VALUE"]]


def _busy_beside(built, env: dict[str, str], kill: bool = False) -> tuple[float, float | None]:
    """A process queueing 500 kernels of 1 ms on GPU 0 (launch, then synchronise) and, once they are
    queued, another timing 50 kernels between two events; with kill the first is SIGKILLed (and reaped)
    before the second starts. Returns the second's elapsed milliseconds and the first's seconds (None
    when killed)."""
    lib_dir, binary = built
    full_env = {"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": str(lib_dir), "FAKE_CUDA_KERNEL_US": "1000", **env}
    first = subprocess.Popen(
        ["stdbuf", "-oL", str(binary), "init", "ctx", "0", "launch", "500", "4", "128", "sync"],
        env=full_env,
        stdout=subprocess.PIPE,
        text=True,
    )
    out = "".join(first.stdout.readline() for _ in range(3))  # init, ctx, and all launched
    if kill:
        first.kill()
        first.wait(timeout=30)
    events = probe(built, "init", "ctx", 0, "events", 50, env=full_env)[2]
    out += first.communicate(timeout=30)[0]
    assert events[:2] == ["events", "CUDA_SUCCESS"], events
    if kill:
        return float(events[2]), None
    lines = [line.split() for line in out.splitlines()]
    return float(events[2]), (int(lines[2][2]) + int(lines[3][2])) / 1e6


def test_processes_naming_one_shared_gpu_file_share_its_time(built, active_2gpu, tmp_path):
    """FAKE_CUDA_SHARED_GPU=FILE: processes naming one file share their GPUs as a real GPU's contexts
    do, each one with work served at 1/n of the speed: 50 kernels of 1 ms take 100 ms between two
    events while another process keeps the GPU busy, and that one's 500 kernels take 50 ms longer
    (together as busy as one process). Without it each process has its own GPU (50 ms, 0.5 s); a
    process killed with work queued leaves none behind (its context gone)."""
    private_ms, private_s = _busy_beside(built, {})
    assert 49 <= private_ms <= 52 and 0.49 <= private_s <= 0.54, (private_ms, private_s)
    shared = {"FAKE_CUDA_SHARED_GPU": str(tmp_path / "gpu")}
    shared_ms, shared_s = _busy_beside(built, shared)
    assert 98 <= shared_ms <= 102 and 0.54 <= shared_s <= 0.6, (shared_ms, shared_s)
    after_kill_ms, _ = _busy_beside(built, shared, kill=True)
    assert 49 <= after_kill_ms <= 52, after_kill_ms


def test_concurrent_streams_run_created_streams_side_by_side(built, active_2gpu):
    """FAKE_CUDA_CONCURRENT_STREAMS=1: a created stream's kernels run beside another stream's, so 20 rounds of
    four 1 ms kernels on one stream and one on another take the busier stream's 80 ms, not the 100 ms of one
    in-order timeline, and the second stream's kernel ends before the first's last."""

    def wall_ms(env: dict[str, str]) -> float:
        line = probe(built, "init", "ctx", 0, "sburst", 20, 5, 0, env={"FAKE_CUDA_KERNEL_US": "1000", **env})[2]
        assert line[:2] == ["sburst", "CUDA_SUCCESS"], line
        return int(line[2]) / 1000

    in_order, side_by_side = wall_ms({}), wall_ms({"FAKE_CUDA_CONCURRENT_STREAMS": "1"})
    # each at least its kernels' time; a busy host's launch delays add to both alike
    assert in_order >= 99 and 79 <= side_by_side <= in_order - 12, (in_order, side_by_side)
