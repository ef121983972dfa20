"""libnvc-share (native/) against the fake driver: launches that run free (native/shim/accounting/freerun.c).

A weight within its share, or that no one can hold, waits for nothing, and the launch queue's path cost a
host-bound training step 10 % of its rate on the H100 (bench/share.py's overhead rows): between two looks at its
backlog its launches go straight to the driver. These tests check when they may (alone, or within its share
beside a busy tenant, its work never more than a look can see queued; charged all the same) and when they may
not (a loop that keeps the GPU busy, a latency-critical peer, a process on two devices), from what the shim logs
at exit (NVC_SHARE_LOG=2), its scheduler file and the fake driver's count of event queries. Test double only:
nothing here is a GPU result.
"""

from __future__ import annotations

import time

from harness.shim import launches_logged, share, tenant  # noqa: F401  (fixtures)
from nvc.share.sched import parse_sched


def weighted(sched, name: str, kernel_us: int) -> dict[str, str]:
    return {
        "NVC_SHARE_WEIGHT": "1",
        "FAKE_CUDA_KERNEL_US": str(kernel_us),
        "NVC_SHARE_LOG": "2",
        "NVC_SHARE_SCHED_DIR": str(sched),
        "NVC_SHARE_TENANT": name,
    }


def host_bound(share, sched, devices: tuple[int, ...] = (0,), steps: int = 100) -> tuple[int, int, int]:
    """A framework's steps on each device in turn (20 kernels of 5 µs, 20 µs of host work after each, then a
    wait: its host the bottleneck): its throttled launches, those that ran free, and the driver's event queries."""
    ops: list[object] = ["init"]
    for device in devices:
        ops += ["ctx", device, "burst", steps, 20, 20]
    out, err = share.run("cuda_probe", *ops, "queries", limits=weighted(sched, "loop", 5))
    assert all(line[1] == "CUDA_SUCCESS" for line in out[:-1]), out
    return (*launches_logged(err), int(out[-1][1]))


def test_a_host_bound_loop_alone_goes_straight_to_the_driver_between_looks(share, tmp_path):
    """Alone, every decision is `free` and no look finds a millisecond of its work queued: all but about one
    launch a millisecond (the one that looks and asks) run free, and the driver is asked about its events
    about as rarely."""
    (tmp_path / "sched").mkdir()
    throttled, free, queries = host_bound(share, tmp_path / "sched")
    assert throttled + free == 2000 and free >= 0.9 * 2000 and queries <= 2000 / 10, (throttled, free, queries)


def test_a_loop_that_keeps_the_gpu_busy_is_measured(share, tmp_path):
    """200 µs kernels launched back to back: the first look finds them queued, so at most a window's work (10 ms
    of the kernels' least times, about 50 of them) runs free before they are measured, and the queue's bound
    holds the rest."""
    (tmp_path / "sched").mkdir()
    out, err = share.run(
        "cuda_probe",
        "init",
        "ctx",
        0,
        "launch",
        2000,
        264,
        128,
        "sync",
        limits=weighted(tmp_path / "sched", "busy", 200),
    )
    assert out[-1][:2] == ["sync", "CUDA_SUCCESS"], out
    throttled, free = launches_logged(err)
    assert throttled + free == 2000 and free <= 100, (throttled, free)


def test_what_runs_free_beside_a_busy_tenant_is_charged_to_its_share(share, programs, tmp_path):
    """Beside a heavier tenant that keeps the GPU busy, a loop within its share waits for nothing either: most of
    its launches run free, and each look charges its share what ran free since the last one, at its kernels'
    least times (5 µs each here), as its measured launches are charged."""
    sched = tmp_path / "sched"
    sched.mkdir()
    peer = tenant(share, programs, sched, "heavier", 3, 3000)
    try:
        time.sleep(0.3)  # the peer busy: it publishes its work and its backlog
        throttled, free, _ = host_bound(share, sched)
        assert peer.poll() is None, "the peer must stay busy throughout"
    finally:
        peer.kill()
        peer.wait()
    (charged,) = (entry.charged_ns for entry in parse_sched((sched / "loop").read_bytes()))
    assert free >= 0.8 * 2000 and 0.8 * 2000 * 5000 <= charged <= 2 * 2000 * 5000, (throttled, free, charged)


def test_nothing_runs_free_beside_a_latency_critical_tenant(share, programs, tmp_path):
    """A latency-critical tenant (a request every 5 ms: the loop runs between them) holds the others whenever it
    has work: every launch of theirs takes the queue's path, where it may be held."""
    sched = tmp_path / "sched"
    sched.mkdir()
    peer = tenant(share, programs, sched, "urgent", 1, 3000, host_us=5000, kernel_us=20, klass="latency-critical")
    try:
        time.sleep(0.3)
        throttled, free, _ = host_bound(share, sched, steps=50)
        assert peer.poll() is None, "the peer must stay busy throughout"
    finally:
        peer.kill()
        peer.wait()
    assert throttled == 1000 and free == 0, (throttled, free)


def test_a_process_that_launches_on_a_second_device_is_measured_from_then_on(share, tmp_path):
    """Which device a launch is on takes the driver's lookup, which a free launch skips: once the process has
    launched on two devices, none of its launches runs free (the second device's first look comes within a
    window, a millisecond)."""
    (tmp_path / "sched").mkdir()
    throttled, free, _ = host_bound(share, tmp_path / "sched", (0, 1), steps=50)
    assert throttled + free == 2000 and free >= 800 and throttled >= 950, (throttled, free)
