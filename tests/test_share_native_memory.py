"""libnvc-share (native/) against the fake driver, its memory limit: accounting of every allocation
path (pools, arrays, context overhead; graph memory in test_share_native_graphmem.py), one budget
per container across processes, dead-process reclaim, lock robustness, stale regions and hook regions of the wrong size,
cuGetProcAddress interception and NVML virtualisation.

Programs run with LD_PRELOAD=native/libnvc-share.so and the fake driver's libraries
(tests/harness/shim.py); the fake libcuda charges every path against its own capacity, so the shim's
numbers are checked against an independent implementation. Test double only: nothing here is a GPU
result.
"""

from __future__ import annotations

import os
import re
import signal
import struct
import subprocess
import time
from pathlib import Path

import pytest

from harness.shim import GIB, MIB, REPO, meminfo, share  # noqa: F401  (fixtures)
from nvc.share.region import SIZE as REGION_SIZE

# ---------------------------------------------------------------- accounting

ANCHOR = 100 * MIB
# native/README.md's table of allocation entry points -> (program, its flags, operations allocating,
# bytes the shim must charge, operations freeing SLOT). Slots count successful allocations.
SLOT = "{slot}"
ENTRY_POINTS: dict[str, tuple[str, tuple[str, ...], list[object], int, list[object]]] = {
    "cuMemAlloc_v2": ("cuda_probe", (), ["alloc", 600 * MIB], 600 * MIB, ["free", SLOT]),
    "cuMemAllocManaged": ("cuda_probe", (), ["managed", 600 * MIB], 600 * MIB, ["free", SLOT]),
    "cuMemAllocPitch_v2": ("cuda_probe", (), ["pitch", 513, 512 * 1024, 4], 512 * MIB, ["free", SLOT]),  # pitch 1024
    "cuMemCreate": ("cuda_probe", (), ["vmm", 600 * MIB], 600 * MIB, ["vmmfree", SLOT]),
    "cuMemAllocAsync": ("cuda_probe", (), ["async", 600 * MIB], 600 * MIB, ["freeasync", SLOT, "threshold", 0, "sync"]),
    "cuMemAllocAsync_ptsz": (
        "share_app",
        ("--ptds",),
        ["async", 600 * MIB],
        600 * MIB,
        ["freeasync", SLOT, "defaulttrim"],
    ),
    "cuMemAllocFromPoolAsync": ("share_app", (), ["frompool", 600 * MIB], 600 * MIB, ["freeasync", SLOT, "trim", 0]),
    "cuMemAllocFromPoolAsync_ptsz": (
        "share_app",
        ("--ptds",),
        ["frompool", 600 * MIB],
        600 * MIB,
        ["freeasync", SLOT, "trim", 0],
    ),
    "cuArrayCreate_v2": ("cuda_probe", (), ["array", 8192, 8192, 0x20, 2], 8192 * 8192 * 8, ["arrayfree", SLOT]),
    "cuArray3DCreate_v2": (
        "cuda_probe",
        (),
        ["array3d", 1024, 1024, 100, 0x10, 4],
        1024 * 1024 * 100 * 8,
        ["arrayfree", SLOT],
    ),
    "cuMipmappedArrayCreate": (
        "cuda_probe",
        (),
        ["mipmap", 8192, 8192, 0, 0x03, 1, 3],
        4 * (8192**2 + 4096**2 + 2048**2),
        ["arrayfree", SLOT],
    ),
    "cuGraphAddMemAllocNode": ("cuda_probe", (), ["gnode", "memalloc", 600 * MIB], 600 * MIB, ["gdestroy", SLOT]),
    "cuGraphAddNode": ("cuda_probe", (), ["gnode", "addnode", 600 * MIB], 600 * MIB, ["gdestroy", SLOT]),
    "cuGraphAddNode_v2": ("cuda_probe", (), ["gnode", "addnode2", 600 * MIB], 600 * MIB, ["gdestroy", SLOT]),
    "cuMemAllocAsync under stream capture": (
        "cuda_probe",
        (),
        ["gnode", "capture", 600 * MIB],
        600 * MIB,
        ["gdestroy", SLOT],
    ),
}


def readme_entry_points() -> list[str]:
    """The first column of native/README.md's allocation table: entry points, with their qualifier."""
    text = (REPO / "native" / "README.md").read_text()
    table = text.split("| Allocated by |", 1)[1].split("\n\n", 1)[0]
    names = []
    for row in table.splitlines()[2:]:
        for cell in row.split("|")[1].split(", "):
            match = re.fullmatch(r"`(\w+)`( under stream capture)?( \(.*\))?", cell.strip())
            assert match, cell
            names.append(match[1] + (match[2] or ""))
    return names


def test_every_listed_entry_point_is_tested():
    assert sorted(readme_entry_points()) == sorted(ENTRY_POINTS)


def codes(line: list[str]) -> list[str]:
    """A result line with share_app's numeric results named as cuda_probe names them."""
    names = {"0": "CUDA_SUCCESS", "2": "CUDA_ERROR_OUT_OF_MEMORY"}
    return [line[0], names.get(line[1], line[1]), *line[2:]]


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_entry_point_is_charged_before_granted_and_released_once(share, entry):
    """Refused when it does not fit (nothing granted), charged exactly its size when it does, refunded
    exactly once when released (a second release refunds nothing: the anchor's charge stays)."""
    program, flags, alloc, charged, release = ENTRY_POINTS[entry]
    release = [str(2) if op == SLOT else op for op in release]
    ops = [
        "alloc",
        GIB - charged + MIB,
        *alloc,
        "free",
        0,
        "alloc",
        ANCHOR,
        *alloc,
        "meminfo",
        "alloc",
        GIB - ANCHOR - charged + MIB,
        *release,
        "meminfo",
        *release,
        "meminfo",
    ]
    if program == "cuda_probe":
        out = [codes(line) for line in share.probe(*ops, limits={"NVC_SHARE_MEMORY_LIMIT": "1Gi"})]
    else:
        out = [
            codes(line)
            for line in share.run(program, *flags, "init", *ops, limits={"NVC_SHARE_MEMORY_LIMIT": "1Gi"})[0][1:]
        ]
        out = [["meminfo", "CUDA_SUCCESS", *line[2:]] if line[0] == "meminfo" else line for line in out]
    assert out[0][1] == "CUDA_SUCCESS"
    assert out[1][1] == "CUDA_ERROR_OUT_OF_MEMORY", out  # refused: it does not fit
    assert out[4][1] == "CUDA_SUCCESS", out
    assert meminfo(out[5]) == (GIB - ANCHOR - charged, GIB)
    assert out[6][1] == "CUDA_ERROR_OUT_OF_MEMORY"  # one MiB more than what is left
    rest = out[7:]
    first = next(i for i, line in enumerate(rest) if line[0] == "meminfo")
    assert all(line[1] == "CUDA_SUCCESS" for line in rest[:first]), rest
    assert meminfo(rest[first]) == (GIB - ANCHOR, GIB)  # refunded
    assert meminfo(rest[-1]) == (GIB - ANCHOR, GIB)  # and only once


def test_pitch_is_refused_by_real_pitch_times_height(share):
    # width x height = 513 MiB fits a 600 MiB budget, pitch (1024) x height = 1 GiB does not.
    out = share.probe("pitch", 513, MIB, 4, "meminfo", limits={"NVC_SHARE_MEMORY_LIMIT": "600Mi"})
    assert out[0][:2] == ["pitch", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert meminfo(out[1])[0] == 600 * MIB


def test_async_pool_reuse_and_trim(share):
    limits = {"NVC_SHARE_MEMORY_LIMIT": "1Gi"}
    out, _ = share.run(
        "share_app",
        "init",
        "frompool",
        512 * MIB,
        "freeasync",
        0,
        "meminfo",
        "frompool",
        512 * MIB,
        "frompool",
        600 * MIB,
        "freeasync",
        1,
        "trim",
        0,
        "meminfo",
        limits=limits,
    )
    assert out[1] == ["frompool", "0", "0"]
    assert out[3] == ["meminfo", "0", str(GIB - 512 * MIB), str(GIB)]  # the pool keeps its reserve
    assert out[4] == ["frompool", "0", "1"]  # reused: no new charge
    assert out[5] == ["frompool", "2", "-1"]  # CUDA_ERROR_OUT_OF_MEMORY
    assert out[8] == ["meminfo", "0", str(GIB), str(GIB)]  # trimmed: refunded


def test_context_overhead_is_charged_once_per_device(share):
    limits = {"NVC_SHARE_MEMORY_LIMIT": "1Gi", "NVC_SHARE_CONTEXT_OVERHEAD": "256Mi"}
    out = share.probe("meminfo", "alloc", 800 * MIB, "ctx", 0, "meminfo", limits=limits)
    assert meminfo(out[0])[0] == 768 * MIB
    assert out[1] == ["alloc", "CUDA_ERROR_OUT_OF_MEMORY", "-1"]
    assert meminfo(out[3])[0] == 768 * MIB


# ---------------------------------------------------------------- one budget per container


def test_two_processes_share_one_budget(share):
    limits = {"NVC_SHARE_MEMORY_LIMIT": "1Gi"}
    holder = share.holder("alloc", 600 * MIB, limits=limits)
    try:
        out = share.probe("meminfo", "alloc", 600 * MIB, "alloc", 400 * MIB, limits=limits)
        assert meminfo(out[0]) == (GIB - 600 * MIB, GIB)
        assert out[1] == ["alloc", "CUDA_ERROR_OUT_OF_MEMORY", "-1"]
        assert out[2] == ["alloc", "CUDA_SUCCESS", "0"]
    finally:
        holder.kill()
        holder.wait()


def test_a_forked_child_charges_its_own_allocations_only(share):
    """Across fork (the shim's fork handlers): the child holds none of its parent's allocations, so
    freeing one refunds nothing, and charges its own in a slot of its own, released when it exits;
    the parent's charge stays."""
    limits = {"NVC_SHARE_MEMORY_LIMIT": "1Gi"}
    out, _ = share.run(
        "share_app",
        "init",
        "alloc",
        600 * MIB,
        "fork",
        "free",
        0,
        "meminfo",
        "alloc",
        600 * MIB,
        "alloc",
        300 * MIB,
        "meminfo",
        "end",
        "meminfo",
        limits=limits,
    )
    assert out[2:] == [
        ["free", "0"],
        ["meminfo", "0", str(GIB - 600 * MIB), str(GIB)],
        ["alloc", "2", "-1"],
        ["alloc", "0", "1"],
        ["meminfo", "0", str(GIB - 900 * MIB), str(GIB)],
        ["forked", "0"],
        ["meminfo", "0", str(GIB - 600 * MIB), str(GIB)],
    ]


def test_sigkilled_process_memory_is_reclaimed_within_a_second(share):
    limits = {"NVC_SHARE_MEMORY_LIMIT": "1Gi"}
    holder = share.holder("alloc", 600 * MIB, limits=limits)
    assert share.probe("alloc", 600 * MIB, limits=limits) == [["alloc", "CUDA_ERROR_OUT_OF_MEMORY", "-1"]]
    start = time.monotonic()
    holder.kill()  # not waited for yet: a zombie must not keep its charge either
    while Path(f"/proc/{holder.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
        time.sleep(0.001)  # SIGKILL is delivered asynchronously: probe once it is dead
    out = share.probe("alloc", 600 * MIB, limits=limits)
    elapsed = time.monotonic() - start
    holder.wait()
    assert out == [["alloc", "CUDA_SUCCESS", "0"]]
    assert elapsed < 1.0


def test_lock_holder_killed_does_not_wedge(share, programs):
    limits = {"NVC_SHARE_MEMORY_LIMIT": "1Gi"}
    share.probe("alloc", MIB, limits=limits)  # creates the region
    locker = subprocess.Popen(
        [str(programs["hold_lock"]), str(share.dir / "region")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert locker.stdout.readline().strip() == "locked"
        waiter = subprocess.Popen(
            [str(programs["cuda_probe"]), "init", "ctx", "0", "alloc", str(MIB)],
            env=share.env(limits),
            stdout=subprocess.PIPE,
            text=True,
        )
        with pytest.raises(subprocess.TimeoutExpired):
            waiter.wait(timeout=0.5)  # the allocation really waits for the region lock
        start = time.monotonic()
        locker.send_signal(signal.SIGKILL)
        waiter.wait(timeout=5)
        assert time.monotonic() - start < 5
        assert waiter.stdout.read().split("\n")[2] == "alloc CUDA_SUCCESS 0"
    finally:
        locker.kill()
        locker.wait()


def region_header(path: Path) -> tuple[bytes, int, int, int]:
    """(magic, version, config hash, memory default) from the documented layout."""
    data = path.read_bytes()[:48]
    magic, version, _size, config_hash = struct.unpack_from("<8sIIQ", data, 0)
    (memory_default,) = struct.unpack_from("<Q", data, 40)
    return magic, version, config_hash, memory_default


def test_stale_region_with_other_limits_is_reinitialised(share):
    big = {"NVC_SHARE_MEMORY_LIMIT": "8Gi"}
    holder = share.holder("alloc", 6 * GIB, limits=big)
    holder.kill()
    holder.wait()
    magic, version, old_hash, default = region_header(share.dir / "region")
    assert (magic, version, default) == (b"NVCSHRG\0", 1, 8 * GIB)
    out, err = share.run(
        "cuda_probe",
        "init",
        "ctx",
        0,
        "meminfo",
        "alloc",
        900 * MIB,
        "alloc",
        200 * MIB,
        limits={"NVC_SHARE_MEMORY_LIMIT": "1Gi"},
    )
    assert "re-initialising stale shared region" in err
    assert meminfo(out[2]) == (GIB, GIB)
    assert out[3] == ["alloc", "CUDA_SUCCESS", "0"]
    assert out[4] == ["alloc", "CUDA_ERROR_OUT_OF_MEMORY", "-1"]
    _, _, new_hash, default = region_header(share.dir / "region")
    assert new_hash != old_hash and default == GIB


def test_region_in_use_under_other_limits_keeps_ours(share):
    holder = share.holder("alloc", MIB, limits={"NVC_SHARE_MEMORY_LIMIT": "8Gi"})
    try:
        out, err = share.run("cuda_probe", "init", "ctx", 0, "alloc", 2 * GIB, limits={"NVC_SHARE_MEMORY_LIMIT": "1Gi"})
        assert "in use under other limits" in err
        assert out[2] == ["alloc", "CUDA_ERROR_OUT_OF_MEMORY", "-1"]
    finally:
        holder.kill()
        holder.wait()


def in_hook_dir(shared: Path, argv: list[str]) -> list[str]:
    """``argv`` run with ``shared`` at /var/run/nvc-share, where the hook mounts a container's shared
    directory (the fixed path: its limits file is the authority), in a mount namespace of its own."""
    script = (
        'mount -t tmpfs -o size=1m tmpfs /run && mkdir /run/nvc-share && mount --bind "$0" /run/nvc-share && exec "$@"'
    )
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, str(shared), *argv]


@pytest.mark.parametrize("size", [0, REGION_SIZE - 8, REGION_SIZE, REGION_SIZE + 4096])
def test_hook_region_of_a_wrong_size_is_never_resized(share, programs, tmp_path, size):
    """nvc-py makes the hook's region at its final size in a tmpfs of fixed size. One the container
    truncated or grew is neither resized nor shared: the process enforces its own limits alone, and
    says so; one of the right size is used as is."""
    shared = tmp_path / "hook"
    shared.mkdir()
    (shared / "limits").write_text("version=1\nmemory_limit=1Gi\n")
    region = shared / "region"
    region.write_bytes(b"")
    os.truncate(region, size)
    argv = [str(programs["cuda_probe"]), "init", "ctx", "0", "meminfo", "alloc", str(GIB + MIB)]
    result = subprocess.run(
        in_hook_dir(shared, argv),
        env=share.env({"NVC_SHARE_MEMORY_LIMIT": "60G"}),
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert result.returncode == 0, result.stderr
    out = [line.split() for line in result.stdout.splitlines()]
    assert meminfo(out[2])[1] == GIB
    assert out[3] == ["alloc", "CUDA_ERROR_OUT_OF_MEMORY", "-1"]
    assert region.stat().st_size == size
    alone = f"is {size} bytes, not {REGION_SIZE}: this process enforces its own limits alone"
    if size == REGION_SIZE:
        assert "alone" not in result.stderr and region_header(region)[0] == b"NVCSHRG\0"
    else:
        assert alone in result.stderr


# ---------------------------------------------------------------- interception


def test_cuGetProcAddress_hands_out_the_wrappers(share):
    out, _ = share.run(
        "share_app",
        "which",
        "cuMemAlloc",
        "which",
        "cuCtxSetCurrent",
        "--ptds",
        "which",
        "cuLaunchKernel",
        "which",
        "cuMemAllocAsync",
        "which",
        "cuGetProcAddress",
        limits={"NVC_SHARE_MEMORY_LIMIT": "1Gi"},
    )
    where = {(line[1], line[3]): Path(line[2]).name for line in out}
    assert where[("cuMemAlloc", "cuMemAlloc_v2")] == "libnvc-share.so"
    assert Path(out[1][2]).name.startswith("libcuda.so")  # not wrapped: the real one
    assert where[("cuLaunchKernel", "cuLaunchKernel_ptsz")] == "libnvc-share.so"
    assert where[("cuMemAllocAsync", "cuMemAllocAsync_ptsz")] == "libnvc-share.so"
    assert where[("cuGetProcAddress", "cuGetProcAddress_v2")] == "libnvc-share.so"


def test_cuGetProcAddress_allocations_are_limited(share):
    out, _ = share.run(
        "share_app", "init", "alloc", 700 * MIB, "alloc", 700 * MIB, "meminfo", limits={"NVC_SHARE_MEMORY_LIMIT": "1Gi"}
    )
    assert out[1] == ["alloc", "0", "0"]
    assert out[2] == ["alloc", "2", "-1"]  # exactly CUDA_ERROR_OUT_OF_MEMORY
    assert out[3] == ["meminfo", "0", str(GIB - 700 * MIB), str(GIB)]


def test_nvidia_smi_reports_the_limit_as_total(share):
    holder = share.holder("alloc", GIB, limits={"NVC_SHARE_MEMORY_LIMIT": "4Gi"})
    try:
        result = subprocess.run(
            [
                str(share.root / "usr" / "bin" / "nvidia-smi"),
                "--query-gpu=memory.total,memory.used,memory.free",
                "--format=csv,noheader",
            ],
            env=share.env({"NVC_SHARE_MEMORY_LIMIT": "4Gi"}),
            capture_output=True,
            text=True,
            timeout=20,
        )
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "4096 MiB, 1024 MiB, 3072 MiB"
    assert lines[1] == "4096 MiB, 0 MiB, 4096 MiB"


def test_nvidia_smi_keeps_working_with_a_broken_configuration(share):
    result = subprocess.run(
        [str(share.root / "usr" / "bin" / "nvidia-smi"), "-L"],
        env=share.env({"NVC_SHARE_MEMORY_LIMIT": "junk"}),
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert result.returncode == 0 and "GPU 0" in result.stdout
