"""libnvc-share (native/) against the fake driver, its compute share: caps as a share of the workload's
own throughput, and the weighted scheduler between real tenants (on a fake clock: test_share_sched_sim.py;
what a hostile tenant can do with its own scheduler file: test_share_native_sched_file.py).

Programs run with LD_PRELOAD=native/libnvc-share.so and the fake driver's libraries
(tests/harness/shim.py); the fake libcuda charges every path against its own capacity, so the shim's
numbers are checked against an independent implementation. Test double only: nothing here is a GPU
result.
"""

from __future__ import annotations

import re
import time

import pytest
import sharegpu  # tests/gpu: on the path once conftest imported harness.shim

from harness.shim import WAITS_LOG, launches_logged, share, tenant, wall_and_log, wall_s  # noqa: F401  (fixtures)
from nvc.share.sched import parse_sched

# ---------------------------------------------------------------- compute share


def busy_fraction(share, percent: int, grid: int, launches: int = 60, kernel_us: int = 3000) -> float:
    out, _ = share.run(
        "cuda_probe",
        "init",
        "ctx",
        0,
        "launch",
        launches,
        grid,
        128,
        "sync",
        limits={"NVC_SHARE_COMPUTE": str(percent), "FAKE_CUDA_KERNEL_US": str(kernel_us)},
    )
    wall_us = int(out[2][2]) + int(out[3][2])
    return launches * kernel_us / wall_us


def test_compute_share_throttles_full_grids(share):
    assert busy_fraction(share, 100, 264) > 0.9
    assert 0.4 <= busy_fraction(share, 50, 264) <= 0.6


def test_compute_share_holds_for_microsecond_kernels(share):
    """20 us kernels, thousands queued: each launch still settles in one event query (the harvest stops
    at the first kernel still running), so the share is the requested one, not the launch cost's."""
    # 0.4 s of GPU work: the 10 ms of credit a bucket may bank at the start moves it by ~1 point
    assert 0.47 <= busy_fraction(share, 50, 264, launches=20000, kernel_us=20) <= 0.53
    assert 0.72 <= busy_fraction(share, 75, 264, launches=20000, kernel_us=20) <= 0.78


def steps_per_second(share, percent: int, grid: int, host_us: int, kernel_us: int = 1000) -> float:
    """Rate of a loop of about 0.4 s uncapped: 8 of the cap's 50 ms periods, so the part slice at its
    end moves a ratio by about a point."""
    steps = 400_000 // (kernel_us + host_us)
    out, _ = share.run(
        "cuda_probe",
        "init",
        "ctx",
        0,
        "steps",
        steps,
        grid,
        128,
        host_us,
        limits={"NVC_SHARE_COMPUTE": str(percent), "FAKE_CUDA_KERNEL_US": str(kernel_us)},
    )
    assert out[2][:2] == ["steps", "CUDA_SUCCESS"], out
    return steps / int(out[2][2]) * 1e6


@pytest.mark.parametrize(("grid", "host_us"), [(1, 0), (264, 1000), (1, 500)])
def test_a_cap_is_a_share_of_the_workloads_own_throughput(share, grid, host_us):
    """A cap is a share of wall time: a one-block grid, or a loop that waits for each kernel and then
    works on the host (a training step), runs at the cap's fraction of its own uncapped rate, not
    faster because its kernels keep the GPU busy for less than all of the time. (Launches are where
    the shim can hold a process: host work after a slice's last launch runs on, which adds up to one
    host segment per 50 ms period; here at most 1 ms, 2 points.)"""
    # each rate the best of two runs taken in turn: a run that a burst of the machine's other load slowed
    # says nothing of the cap
    rates = [[steps_per_second(share, percent, grid, host_us) for percent in (100, 50, 25)] for _ in range(2)]
    native, half, quarter = (max(run[i] for run in rates) for i in range(3))
    assert 0.45 <= half / native <= 0.55 and 0.2 <= quarter / native <= 0.3, (native, half, quarter)


def test_a_capped_process_logs_where_its_launches_waited(share):
    """NVC_SHARE_LOG=2: at exit the shim says how long the process's launches waited for the cap's
    slice, for room in the queue and for other containers' shares, and how many slices it started;
    a loop of 1 ms kernels capped at 50 % for about 0.4 s waits for the slice about half of it (on a
    driver without stream memory operations: with them, outside the slice it queues behind a gate,
    tests/test_share_gate.py)."""
    start = time.monotonic()
    out, err = share.run(
        "cuda_probe",
        "init",
        "ctx",
        0,
        "steps",
        200,
        264,
        128,
        0,
        limits={
            "NVC_SHARE_COMPUTE": "50",
            "FAKE_CUDA_KERNEL_US": "1000",
            "NVC_SHARE_LOG": "2",
            "FAKE_CUDA_NO_STREAM_MEMOPS": "1",
        },
    )
    wall_ms = (time.monotonic() - start) * 1000
    assert out[2][:2] == ["steps", "CUDA_SUCCESS"], out
    logged = WAITS_LOG.search(err)
    assert logged, err
    launches, pairs, slice_ms, _, turn_ms, slices = (float(v) for v in logged.groups())
    assert launches == 200 and 1 <= pairs <= 200
    assert 0.3 * wall_ms <= slice_ms <= 0.7 * wall_ms, (slice_ms, wall_ms)
    assert turn_ms == 0 and slices >= 5
    # without a cap nothing is throttled, and nothing is logged
    _, err = share.run(
        "cuda_probe",
        "init",
        "ctx",
        0,
        "steps",
        20,
        264,
        128,
        0,
        limits={"FAKE_CUDA_KERNEL_US": "1000", "NVC_SHARE_LOG": "2"},
    )
    assert "throttled launches" not in err


def test_a_cap_holds_for_streams_whose_kernels_finish_out_of_order(share):
    """Two streams that run side by side (FAKE_CUDA_CONCURRENT_STREAMS, as an MPS client's do): each round four
    1 ms kernels on one and one on the other, which ends before the first's last. Capped at 50 %, the loop runs at
    about half its uncapped speed. Each such end once pushed the shim's estimate of its work's end a kernel further
    ahead of the clock, and the cap charged all the time up to it: on the H100 a capped MPS client stopped for good
    (native/shim/accounting/launchend.c)."""

    def wall_us(percent: int) -> int:
        out, _ = share.run(
            "cuda_probe",
            "init",
            "ctx",
            0,
            "sburst",
            100,
            5,
            0,
            limits={
                "NVC_SHARE_COMPUTE": str(percent),
                "FAKE_CUDA_KERNEL_US": "1000",
                "FAKE_CUDA_CONCURRENT_STREAMS": "1",
            },
            timeout=30,
        )
        assert out[2][:2] == ["sburst", "CUDA_SUCCESS"], out
        return int(out[2][2])

    native, capped = min(wall_us(100) for _ in range(2)), wall_us(50)
    assert 0.4e6 <= native <= 0.6e6, native  # 100 rounds of 4 ms on the busier stream
    assert 0.33 <= native / capped <= 0.6, (native, capped)  # 0.42 here; stalled 0.12


def test_a_weight_alone_measures_its_launches_in_long_groups(share, programs, tmp_path):
    """A weighted tenant with no other tenant active measures its short kernels in groups of up to 1 ms
    (recording and settling events for each short group cost a host-bound loop its rate): 100 µs
    kernels, about ten to a pair of events. With a peer busy on the GPU its groups are 100 µs again (a
    group's time is divided by who shared the GPU during it): one pair each."""
    sched = tmp_path / "sched"
    sched.mkdir()

    def launches_and_pairs() -> tuple[int, int, int]:
        _, err = share.run(
            "cuda_probe",
            "init",
            "ctx",
            0,
            "burst",
            20,
            40,
            20,
            limits={
                "NVC_SHARE_WEIGHT": "1",
                "FAKE_CUDA_KERNEL_US": "100",
                "NVC_SHARE_LOG": "2",
                "NVC_SHARE_SCHED_DIR": str(sched),
                "NVC_SHARE_TENANT": "measured",
            },
        )
        logged = WAITS_LOG.search(err)
        assert logged, err
        return (*launches_logged(err), int(logged.group(2)))

    # the steps queue 4 ms of work each: a few launches may run free before a look finds it backlogged
    launches, free, pairs = launches_and_pairs()
    assert launches + free == 800 and pairs <= launches / 5, (launches, free, pairs)
    peer = tenant(share, programs, sched, "peer", 1, 3000)
    try:
        time.sleep(0.3)
        launches, free, pairs = launches_and_pairs()
        assert peer.poll() is None, "the peer must stay busy throughout"
    finally:
        peer.kill()
        peer.wait()
    assert launches + free == 800 and pairs >= launches / 2, (launches, free, pairs)


def test_a_launch_bound_loop_asks_the_driver_about_its_work_far_less_than_once_a_launch(share, tmp_path):
    """A weighted tenant launching 5 µs kernels back to back (a training step's loop, bound by what each
    launch costs its host) looks for completed work at the first look of a launch at most every 50 µs, and
    afresh only where the queue's bound would hold the launch: each look is a driver call (an event query),
    and most would find its oldest group still running. All its work is still measured and done."""
    sched = tmp_path / "sched"
    sched.mkdir()
    out, err = share.run(
        "cuda_probe",
        "init",
        "ctx",
        0,
        "launch",
        20000,
        264,
        128,
        "sync",
        "queries",
        limits={
            "NVC_SHARE_WEIGHT": "1",
            "FAKE_CUDA_KERNEL_US": "5",
            "NVC_SHARE_LOG": "2",
            "NVC_SHARE_SCHED_DIR": str(sched),
            "NVC_SHARE_TENANT": "loop",
        },
    )
    assert out[-2][:2] == ["sync", "CUDA_SUCCESS"], (out, err)
    (launches, free), queries = launches_logged(err), int(out[-1][1])
    assert launches + free == 20000 and queries <= launches / 4, (launches, free, queries)


# (weight, cap or None, 1 ms kernels, host µs after each or None: back to back) per tenant -> (lowest,
# highest) wall time in seconds of each
TENANT_CASES = {
    # the light one's wall spreads 0.40-0.87 s over about 40 runs, before and after the gate-drain fix
    # alike: the heavy one publishes itself busy until twice its queued estimate from its launch, into its
    # host gap, and how much of each gap the light one is held in depends on their phases (alone: 0.3 s)
    "1:3, the 3 under its share": ([(1, None, 300, None), (3, None, 400, 1000)], [(0.35, 0.95), (0.75, 1.0)]),
    "1:3, the 3 done early": ([(1, None, 600, None), (3, None, 100, 1000)], [(0.6, 0.9), (0.18, 0.35)]),
    "1 capped at 25 % : 1": ([(1, 25, 250, None), (1, None, 750, None)], [(0.9, 1.25), (0.7, 1.25)]),
    "1:1": ([(1, None, 500, None), (1, None, 500, None)], [(0.45, 0.7), (0.45, 0.7)]),
}


@pytest.mark.parametrize("case", TENANT_CASES)
def test_a_tenant_over_its_share_is_held_while_the_others_run_free(share, programs, tmp_path, case):
    """Tenants (each its own share directory, one scheduler directory) busy with 1 ms kernels at once.
    Each process's fake GPU is its own, so nothing slows a tenant but the scheduler, and each is charged
    its kernels' work. 1:3 where the weight-3 tenant waits 1 ms on its host after each kernel (busy half
    the time, under its three quarters): the weight-1 tenant, over its quarter, is held while the other
    has work (300 kernels in ~0.6 s, not 0.3; up to 0.87 s measured, its peer's published busy time
    running into its host gaps), the other runs free (400 in ~0.8 s); when the weight-3
    one is done early (~0.2 s) the other runs free from then on (600 kernels in ~0.7 s); one capped at
    25 % holds the other back at most during its own slices, 25 % of the time (250 kernels in ~1 s, the
    other's 750 in 0.75 to 1 s); 1:1, both within their half, run free. A case whose walls fall outside
    runs once more: what else the 2-CPU test host runs stretches the host gaps of a run (the weight-3
    tenant's 400 kernels and gaps took 1.03 s once in a full suite), and both runs must miss to fail."""
    tenants, want = TENANT_CASES[case]
    walls: list[float] = []
    for attempt in range(2):
        sched = tmp_path / f"sched-{attempt}"
        sched.mkdir()
        names = [f"t{i}-{attempt}" for i in range(len(tenants))]  # each run's share directories its own
        procs = [
            tenant(share, programs, sched, name, weight, launches, cap, host_us)
            for name, (weight, cap, launches, host_us) in zip(names, tenants, strict=True)
        ]
        walls = [wall_s(proc, timeout=30) for proc in procs]
        print(f"{case}: walls {walls}")
        assert sorted(p.name for p in sched.iterdir()) == names
        if all(low <= wall <= high for wall, (low, high) in zip(walls, want, strict=True)):
            break
    assert all(low <= wall <= high for wall, (low, high) in zip(walls, want, strict=True)), walls


def test_a_heavier_tenant_that_waits_for_each_small_kernel_holds_no_one(share, programs, tmp_path):
    """Work-conserving weights (issue #48): beside a decode loop weighted 9 (a 20 us kernel, waited for, then
    200 us on its host: never a millisecond of work queued), a tenant weighted 1 launching 300 kernels of 1 ms
    is not held (the GPU would idle in the loop's host gaps): as if alone (0.3 s), never waiting for a share."""
    (tmp_path / "sched").mkdir()
    decode = tenant(share, programs, tmp_path / "sched", "decode", 9, 4000, host_us=200, kernel_us=20)
    time.sleep(0.2)  # the decode loop busy: it publishes its work, its share and its backlog
    wall, log = wall_and_log(tenant(share, programs, tmp_path / "sched", "batch", 1, 300, log=True), timeout=30)
    running = decode.poll() is None
    decode.kill()
    decode.wait()
    logged = WAITS_LOG.search(log)
    assert running and logged and float(logged.group(5)) <= 5 and wall <= 0.4, (running, wall, log)


def test_a_heavier_tenant_whose_kernels_the_others_slow_holds_no_one(share, programs, tmp_path):
    """The same where the GPU time-slices (FAKE_CUDA_SHARED_GPU): steps of 25 kernels of 30 us (0.75 ms of
    work, under the millisecond queued that counts as a backlog) queued at once and waited for, weighted 9.
    Beside the busy tenant weighted 1 each kernel takes twice as long; counted at that length a step would be
    1.5 ms queued and the loop would hold the other. Its backlog counts its kernels as they take alone."""
    (tmp_path / "sched").mkdir()
    gpu = tmp_path / "gpu"
    steps = tenant(share, programs, tmp_path / "sched", "steps", 9, 100000, host_us=10, burst=25, kernel_us=30, gpu=gpu)
    time.sleep(0.2)  # its kernels measured alone first, as a service warms up
    batch = tenant(share, programs, tmp_path / "sched", "batch", 1, 300, gpu=gpu, log=True)
    wall, log = wall_and_log(batch, timeout=30)
    running = steps.poll() is None
    steps.kill()
    steps.wait()
    logged = WAITS_LOG.search(log)
    assert running and logged and float(logged.group(5)) <= 5, (running, wall, log)


# kernel µs, kernels per step and host µs after each (0: back to back, one wait at the end), the light
# and the heavy tenant's steps to time (about a second at their shares), and how much less work than with
# no shim the pair may do
TIME_SLICED = {
    "1 ms kernels back to back": (1000, 0, None, (240, 720), 0.95),
    "a framework's steps: 40 kernels of 100 us, 20 us of host work after each, one wait": (
        100,
        40,
        20,
        (60, 180),
        0.85,
    ),
}


@pytest.mark.parametrize("case", TIME_SLICED)
def test_weighted_tenants_on_one_time_sliced_gpu_share_it_by_weight_and_keep_it_busy(share, programs, tmp_path, case):
    """Two tenants on one fake GPU that time-slices between processes (FAKE_CUDA_SHARED_GPU: each
    kernel slowed by the other's work, as on a real GPU), weights 1 and 3, each timed while the other
    keeps running: the weight-3 one gets 75 % of the work done (±5), and together they do as much as
    with no shim (where each gets half): within 5 % with kernels of 1 ms back to back; with a
    framework's steps of 100 µs kernels the GPU idles a little more (94 % of no shim on this double, 90 %
    with both CPUs saturated: the host work is real), held to 85 % here (issue #27's contract is 95 %)."""
    kernel_us, burst, host_us, counts, least = TIME_SLICED[case]

    def rates(name: str, weights: tuple[int, int]) -> list[float]:
        timed = []
        for which in (0, 1):
            sched = tmp_path / f"{name}{which}"
            sched.mkdir()
            procs = [
                tenant(
                    share,
                    programs,
                    sched,
                    f"{name}{which}-{i}",
                    weight,
                    n if i == which else 8 * n,
                    host_us=host_us,
                    burst=burst,
                    kernel_us=kernel_us,
                    gpu=tmp_path / f"{name}{which}.gpu",
                )
                for i, (weight, n) in enumerate(zip(weights, counts, strict=True))
            ]
            timed.append(counts[which] / wall_s(procs[which], timeout=30))
            procs[1 - which].kill()
            procs[1 - which].communicate()
        return timed

    native, weighted = rates("native", (0, 0)), rates("weighted", (1, 3))
    part = 100 * weighted[0] / sum(weighted)
    print(
        f"{case}: steps/s no shim {native[0]:.0f} + {native[1]:.0f}, weights 1:3 {weighted[0]:.0f} + "
        f"{weighted[1]:.0f} (the light one's part {part:.1f} %, {100 * sum(weighted) / sum(native):.1f} % of no shim)"
    )
    assert abs(part - 25) <= 5, (part, weighted)
    assert sum(weighted) >= least * sum(native), (weighted, native)


def test_a_latency_critical_tenant_keeps_its_latency_beside_a_busy_batch_tenant(share, programs, tmp_path):
    """On one fake GPU that time-slices between processes: a latency-critical tenant doing 200 steps (a 500 us
    kernel, waited for, then 500 us on its host) beside a batch tenant keeping the GPU busy with 1 ms
    kernels. With no control the GPU's time-slicing slows every step of the first; with them the batch
    tenant holds while the other serves and its steps take about what they take alone; the batch tenant
    still gets its work done, in the other's idle time (work-conserving). Each case runs twice and its
    faster run counts: the steps are half host time, and what else the test host runs only slows a run."""
    gpu = tmp_path / "gpu"

    def pair(name: str, classes: tuple[str, str | None] | None, trainer: bool = True) -> tuple[float, float]:
        """The service's wall and the trainer's (0: none); classes None: neither under the shim."""
        sched = tmp_path / f"sched-{name}"
        sched.mkdir()
        weight = 1 if classes else 0
        urgent, batch = classes or (None, None)
        steps = {"host_us": 500, "gpu": gpu, "kernel_us": 500, "klass": urgent}
        procs = [tenant(share, programs, sched, f"service-{name}", weight, 200, **steps)]
        if trainer:
            procs.append(tenant(share, programs, sched, f"trainer-{name}", weight, 1200, gpu=gpu, klass=batch))
        walls = [wall_s(proc, timeout=60) for proc in procs]
        return walls[0], walls[1] if trainer else 0.0

    def best(name: str, classes: tuple[str, str | None] | None, trainer: bool = True) -> tuple[float, float]:
        """pair() twice: the run whose service was faster, with its trainer's wall."""
        return min(pair(f"{name}-1", classes, trainer), pair(f"{name}-2", classes, trainer))

    alone, _ = best("alone", None, trainer=False)
    plain, _ = best("no-control", None)
    urgent, batch = best("classes", ("latency-critical", "batch"))
    unclassed, _ = best("unclassed", ("latency-critical", None))  # no class beside a latency-critical one holds too
    print(
        f"service steps alone {alone:.3f} s, beside the trainer {plain:.3f} s, as latency-critical "
        f"{urgent:.3f} / {unclassed:.3f} s; trainer {batch:.3f} s"
    )
    assert plain >= 1.3 * alone
    assert urgent <= 1.15 * alone and unclassed <= 1.15 * alone
    assert batch <= 1.2 + urgent + 0.5


DUTY_LOG = re.compile(r"a duty cycle beside a steady heavier tenant came into force (\d+) times")
SLICES_LOG = re.compile(r"(\d+) slices started")


@pytest.mark.parametrize("heavier_host_us", [None, 1000], ids=["back to back", "1 ms host gaps"])
def test_a_lighter_weight_takes_a_duty_only_beside_a_steadily_busy_heavier_tenant(
    share, programs, tmp_path, heavier_host_us
):
    """1:3 on one time-slicing fake GPU (schedpolicy.h nvc_sched_duty). Beside a weight-3 tenant launching 1 ms
    kernels back to back (its looks find the previous look's work still queued), the weight-1 tenant's work
    goes in a duty cycle's slices: its shim logs the duty coming into force and slices started. Beside one
    that waits for each kernel and then spends 1 ms on its host, it takes none: those gaps are its to fill."""
    sched, gpu = tmp_path / "sched", tmp_path / "gpu"
    sched.mkdir()
    heavier = tenant(share, programs, sched, "heavier", 3, 100000, host_us=heavier_host_us, gpu=gpu)
    time.sleep(0.2)  # the heavier busy: its looks at its backlog published
    _, log = wall_and_log(tenant(share, programs, sched, "lighter", 1, 300, gpu=gpu, log=True), timeout=30)
    running = heavier.poll() is None
    heavier.kill()
    heavier.wait()
    duties, slices = DUTY_LOG.search(log), SLICES_LOG.search(log)
    assert running and slices, (running, log)
    assert sharegpu.shim_exit_of(log).duties == (int(duties.group(1)) if duties else 0)  # what bench/share.py reads
    (published,) = (entry.duty_percent for entry in parse_sched((sched / "lighter").read_bytes()))
    (steady,) = (entry.steady_permille for entry in parse_sched((sched / "heavier").read_bytes()))
    print(
        f"heavier {heavier_host_us} us on its host (steady {steady} ‰): duty {duties and duties.group(1)} times, "
        f"last {published} %, {slices.group(1)} slices"
    )
    if heavier_host_us is None:  # its last look published the duty, for `nvc-py share status`
        assert duties and int(duties.group(1)) >= 1 and int(slices.group(1)) >= 3 and published >= 50, log
        assert steady >= 900  # and the heavier's steadiness that gave it, which `share status` shows too
    else:
        assert not duties and int(slices.group(1)) == 0 and published == 0, log
        assert steady < 900
