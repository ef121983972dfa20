"""bench/share.py's parts that need no GPU: the launch-bound pair's latency figures, read from what
tests/gpu/torch_decode.py prints (latency from each request's arrival, not from when it was served), and
the bench and its PyTorch workloads at least loading (the GPU machine runs them; this one has no torch), and
the trainer's wait for shares read from the line the real shim logs at exit (on the fake driver).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from harness import benchscript
from harness.shim import WAITS_LOG, share, tenant  # noqa: F401  (fixtures)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "gpu"))
import sharegpu  # noqa: E402


def _bench() -> ModuleType:
    return benchscript.load("share")


def test_latency_runs_from_arrival_not_from_service():
    # requests every 10 ms; the second took 25 ms, so the third, arriving at 20 ms, began at 35 ms and
    # waited 15 ms for it before its own 5 ms
    out = "req 0.000000 0.005000\nreq 0.010000 0.035000\nreq 0.020000 0.040000\ncpu_us 1234.5\n"
    served = sharegpu.serve_latencies(out)
    assert served.p50_ms == pytest.approx(20.0)
    assert served.p99_ms == pytest.approx(25.0)
    assert served.per_second == pytest.approx(3 / 0.040)


def test_percentiles_are_latencies_some_request_had():
    values = [float(v) for v in range(1, 101)]
    assert sharegpu.percentile(values, 50) == 50.0
    assert sharegpu.percentile(values, 99) == 99.0
    assert sharegpu.percentile(values, 100) == 100.0
    assert sharegpu.percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        sharegpu.percentile([], 50)


def test_a_run_that_served_nothing_is_an_error_not_a_zero():
    with pytest.raises(ValueError, match="no requests"):
        sharegpu.serve_latencies("cpu_us 0.0\n")


def test_the_bench_loads_and_its_workloads_parse(tmp_path):
    bench = _bench()
    labels = [label for label, _, _ in bench.LAUNCH_BOUND_CONTROLS]
    assert labels[0] == "no control" and any("9:1" in label for label in labels)
    assert any("latency classes" in label for label in labels)
    assert "LD_PRELOAD" not in bench.tenant_env(tmp_path, "service", None)
    env = bench.tenant_env(tmp_path, "service", {"NVC_SHARE_WEIGHT": "9"})
    assert env["NVC_SHARE_TENANT"] == "service" and env["NVC_SHARE_SCHED_DIR"] == str(tmp_path)


def test_a_split_in_time_keeps_what_the_overlap_allows():
    """A pair that does not overlap keeps one alone's worth whatever the split; an even split keeps the
    whole overlap; 1:3 keeps 107.7 % of a 116.8 % overlap (the H100's ResNet-50 pair) and needs 150 % for
    issue 42's 120 %."""
    bench = _bench()
    assert bench.split_in_time(100.0) == pytest.approx(100.0)
    assert bench.split_in_time(116.8, ratio=1.0) == pytest.approx(116.8)
    assert bench.split_in_time(116.8) == pytest.approx(107.7, abs=0.1)
    assert bench.split_in_time(150.0) == pytest.approx(120.0)


def test_the_time_slice_duty_row_caps_the_lighter_and_leaves_the_heavier_without_the_shim(tmp_path, monkeypatch):
    """The backends' duty-cycle row under time slices: the lighter trainer under the shim with a cap of 50
    (the part of the time a 1:3 split takes where the pair does not overlap, as split_in_time's fraction
    gives), the heavier one with no shim at all; NVC_BENCH_ROWS="time slices" (docs/performance.md's
    command) runs it with the no-control and weighted time-slice rows and no MPS row."""
    bench = _bench()
    monkeypatch.setenv("NVC_BENCH_ROWS", "time slices")
    assert bench.wanted(label for label, *_ in bench.BACKEND_PAIRS) == [
        label for label, through_mps, *_ in bench.BACKEND_PAIRS if not through_mps
    ]
    [(label, through_mps, light, heavy)] = [row for row in bench.BACKEND_PAIRS if "capped 50" in row[0]]
    assert not through_mps and heavy is None and "LD_PRELOAD" not in bench.tenant_env(tmp_path, "b", heavy)
    env = bench.tenant_env(tmp_path, "a", light)
    lines = (Path(env["NVC_SHARE_DIR"]) / "limits").read_text().splitlines()
    assert env["LD_PRELOAD"] and [line for line in lines if not line.startswith("#")] == [
        "version=1",
        "compute_percent=50",
    ], label


def test_the_bench_runs_mps_tenants_as_nvc_py_s_backend_plans_them(tmp_path, monkeypatch):
    """A tenant of an nvc-py MPS row gets the limits file the hook writes for an MPS client: its class and
    cap as MPS's client variables (a lighter weight as the shim's duty cycle), its weight, no other time-slice
    lines, the bench daemon's pipe where the container's would be."""
    bench = _bench()
    pipe = {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/bench-mps/pipe"}
    assert sharegpu.mps_client_env(tmp_path / "plain", None, [], pipe) == {**sharegpu.shim_env(None), **pipe}
    trainer = {"NVC_SHARE_PRIORITY": "batch", "NVC_SHARE_COMPUTE": "50", "NVC_SHARE_MEMORY_LIMIT": "4g"}
    env = sharegpu.mps_client_env(tmp_path / "trainer", trainer, [], pipe)
    assert env["LD_PRELOAD"] and env["CUDA_MPS_PIPE_DIRECTORY"] == pipe["CUDA_MPS_PIPE_DIRECTORY"]
    lines = (Path(env["NVC_SHARE_DIR"]) / "limits").read_text().splitlines()
    assert [line for line in lines if not line.startswith("#")] == [
        "version=1",
        "memory_limit=4294967296",
        "mps.CUDA_MPS_PIPE_DIRECTORY=/tmp/bench-mps/pipe",  # the bench daemon's: the shim sets it
        "mps.CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
        "mps.CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=5120M",
        "mps.CUDA_MPS_CLIENT_PRIORITY=1",
    ]
    light, heavy = ({"NVC_SHARE_WEIGHT": "1"}, {"NVC_SHARE_WEIGHT": "3"})
    assert bench.weights_of(light, heavy, None) == [1, 3, 0]
    env = sharegpu.mps_client_env(tmp_path / "light", light, [3], pipe)
    lines = (Path(env["NVC_SHARE_DIR"]) / "limits").read_text().splitlines()
    assert [line for line in lines if not line.startswith("#")] == [
        "version=1",
        "compute_weight=1",
        "compute_percent=40",
        "mps.CUDA_MPS_PIPE_DIRECTORY=/tmp/bench-mps/pipe",
    ]
    # a weight's scheduler file beside its directory, as the hook gives an MPS client one
    assert (env["NVC_SHARE_SCHED_DIR"], env["NVC_SHARE_TENANT"]) == (str(tmp_path / "mps-sched"), "light")
    assert [row[0] for row in bench.BACKEND_PAIRS if row[1]][:2] == ["MPS, plain", "nvc MPS: weights 1:3"]
    by_hand = sharegpu.mps_client_env(tmp_path / "hand", {bench.THREADS: "25", bench.PRIORITY: "1"}, [], pipe)
    assert "LD_PRELOAD" not in by_hand and not (tmp_path / "hand").exists()
    assert (by_hand[bench.THREADS], by_hand[bench.PRIORITY]) == ("25", "1")
    monkeypatch.setenv("NVC_BENCH_ROWS", "plain,by hand")
    assert bench.wanted(label for label, *_ in bench.BACKEND_PAIRS) == [
        label for label, *_ in bench.BACKEND_PAIRS if label == "MPS, plain" or label.startswith("MPS by hand")
    ]
    monkeypatch.delenv("NVC_BENCH_ROWS")
    controls = [label for label, *_ in bench.LAUNCH_BOUND_CONTROLS]
    diagnostic = [label for label in controls if label.startswith(bench.DIAGNOSTIC)]
    assert len(diagnostic) == 3 and bench.wanted(controls) == [c for c in controls if c not in diagnostic]
    monkeypatch.setenv("NVC_BENCH_ROWS", "no control,diagnostic")
    assert bench.wanted(controls) == ["no control", *diagnostic]
    monkeypatch.setenv("NVC_BENCH_ROWS", "no control,MPS, plain")  # a label's own ", " is not a separator
    assert bench.wanted(label for label, *_ in bench.BACKEND_PAIRS) == ["no control (time slices)", "MPS, plain"]
    for script in ("torch_decode.py", "torch_load.py", "torch_models.py", "torch_start.py"):
        ast.parse((REPO / "tests" / "gpu" / script).read_text())


def test_the_trainers_wait_and_launches_are_read_from_its_shims_exit_line(share, programs, tmp_path):  # noqa: F811
    """The launch-bound rows' "held ms" and "queue ms": what a weighted process's shim (the fake driver's) says it
    waited for other containers' shares and for queue room, its launches and their event pairs, and those that
    went straight to the driver; nothing for a process without the shim."""
    (tmp_path / "sched").mkdir()
    _, err = tenant(share, programs, tmp_path / "sched", "trainer", 1, 20, log=True).communicate(timeout=30)
    logged, unshimmed = tmp_path / "trainer.log", tmp_path / "plain.log"
    logged.write_text(err)
    unshimmed.write_text("rate 12.5\n")
    waits = WAITS_LOG.search(err)
    shim = sharegpu.shim_exit(logged)
    assert shim is not None and (shim.queue_ms, shim.held_ms) == (float(waits.group(4)), float(waits.group(5)))
    assert sharegpu.shim_exit(unshimmed) is None and sharegpu.shim_exit(tmp_path / "absent.log") is None
    assert (shim.launches, shim.pairs) == (int(waits.group(1)), int(waits.group(2)))
    assert shim.launches >= shim.pairs > 0
    assert f", {shim.launches} launches, " in str(shim)
    # launches that ran free between its looks (a weight alone): the scheduler's exit line counts them
    ran_free = re.search(r"\((\d+) launches ran free after them\)", err)
    assert ran_free and shim.free == int(ran_free.group(1)) and sharegpu.shim_exit_of(err) == shim
    # and what its looks at its backlog found (what sends a weight no one holds through the queue's path)
    looked = re.search(r"(\d+) looks at the backlog, (\d+) found earlier work queued, (\d+) more than", err)
    assert looked and (shim.looks, shim.found_queued, shim.found_deep) == tuple(int(g) for g in looked.groups())
    assert shim.looks > 0 and f"; {shim.looks} looks, {shim.found_queued} found its work queued" in str(shim)
    # and the throttled path's own host time a call, apart from the driver's launch in it (launchlog.c)
    path = re.search(r"own time ([\d.]+) us a call, the driver's launch in it ([\d.]+) us \((\d+) calls\)", err)
    assert path and (shim.path_us, shim.driver_us) == (float(path.group(1)), float(path.group(2))), err
    assert int(path.group(3)) >= shim.launches and shim.path_us > 0 and "; the path " in str(shim)


def test_a_launch_bound_run_line_gives_each_shims_exit_where_it_logged_one():
    """Both tenants log their shims' exit lines: the run line shows the trainer's on the line and the service's
    below it (what showed, on the H100, that the service's launches run free and the trainer is never held)."""
    bench = _bench()
    served = sharegpu.Served(2862.7, 4321.6, 21.0)
    trainer = sharegpu.ShimExit(145726, 8512, 97.8, 0.0, 71395, 6296, 3040, 3791)
    service = sharegpu.ShimExit(5330, 5137, 0.0, 0.0, 229358, 5077, 9, 7)
    line = str(bench.LaunchBoundRun(served, 36.39, trainer, service))
    first, second = line.split("\n")
    assert first.startswith("2862.7 / 4321.6 ms, trainer 36.39 it/s, held 0.0 ms, queue room 97.8 ms, 145726 launches")
    assert first.endswith("71395 more ran free; 6296 looks, 3040 found its work queued, 3791 over 1 ms at once")
    assert second == (
        "      the service's shim: held 0.0 ms, queue room 0.0 ms, 5330 launches, 1.0 a pair of events, 229358 more "
        "ran free; 5077 looks, 9 found its work queued, 7 over 1 ms at once"
    )
    assert str(bench.LaunchBoundRun(served, 36.39, None)) == "2862.7 / 4321.6 ms, trainer 36.39 it/s"
    ducked = sharegpu.ShimExit(145726, 8512, 97.8, 0.0, 71395, 6296, 3040, 3791, 4)
    assert str(bench.LaunchBoundRun(served, 36.39, ducked)).endswith(
        "over 1 ms at once; a duty cycle came into force 4 times"
    )


def test_a_launch_bound_row_pools_its_runs_requests_for_one_p99_and_is_set_against_no_control():
    """A run at a few requests a second has some dozens: its p99 is its slowest, and the median of three such
    moves with one slow request. The row also gives the p99 of all its runs' requests together, and each row's
    p50, p99 and that p99 over the no-control row's."""
    bench = _bench()

    def run(latencies: list[float], trained: float) -> tuple:
        served = sharegpu.Served(
            sharegpu.percentile(latencies, 50), sharegpu.percentile(latencies, 99), 5.0, tuple(latencies)
        )
        return bench.LaunchBoundRun(served, trained, None)

    # three runs of 50 requests: each run's slowest is an outlier of its own, 20 ms to 300 ms
    runs = [
        run([10.0 + i % 7 for i in range(49)] + [slowest], rate)
        for slowest, rate in ((300, 36.0), (20, 40.0), (250, 38.0))
    ]
    row = bench.launch_bound_row(runs, 40.0)
    assert (row.p50_ms, row.p99_ms, row.trainer) == (13.0, 250.0, 95.0)
    # 150 requests: the p99 is the second slowest of them, not the median of three maxima
    assert row.pooled_p99_ms == 250.0
    # a fourth run: 200 requests, the two outliers are its slowest 1 %, while the median of maxima halves
    runs.append(run([10.0 + i % 7 for i in range(49)] + [20.0], 40.0))
    assert bench.launch_bound_row(runs, 40.0)[:3] == (13.0, 135.0, 20.0)
    none = bench.LaunchBoundRow(20.0, 200.0, 100.0, 97.0)
    assert row.against(none) == "0.65x 1.25x 2.50x"


def _warming(seconds: float, *lines: str) -> Callable[..., subprocess.Popen]:
    """A run as torch_load and torch_decode start, under go_together: a warm-up of `seconds`, then
    torch_start.wait_for_start on its go file (argv[1], given by sharegpu.torch_run and serve_run), then its
    lines and the time it began."""
    program = (
        "import sys, time; time.sleep(float(sys.argv[2])); import torch_start; torch_start.wait_for_start(sys.argv[1]); "
        "print(f'began {time.time():.6f}'); print(*sys.argv[3:], sep=chr(10))"
    )
    gpu = str(REPO / "tests" / "gpu")
    return lambda *args, **kwargs: sharegpu.started(
        [sys.executable, "-c", program, str(args[3]), str(seconds), *lines], {**os.environ, "PYTHONPATH": gpu}, None
    )


def test_the_pair_begins_together_however_long_one_warm_up_takes(monkeypatch, tmp_path):
    """The trainer and the service of the capacity measurement (and of each launch-bound row) begin their timed
    parts together once both are warmed up: one that took 1.5 s longer is not late, and the service's rate is
    read from what it printed after the go."""
    bench = _bench()
    requests = [f"req {k / 20:.6f} {(k + 1) / 20:.6f}" for k in range(40)]  # 20/s
    monkeypatch.setattr(sharegpu, "torch_run", _warming(1.5, "sec 1 40", "rate 40.0"))
    monkeypatch.setattr(sharegpu, "serve_run", _warming(0.0, *requests))
    began: list[float] = []
    reading = sharegpu.torch_printed
    monkeypatch.setattr(sharegpu, "torch_printed", lambda proc: _began(reading(proc), began))
    serving = sharegpu.serve_latencies
    monkeypatch.setattr(sharegpu, "serve_latencies", lambda out: serving(_began(out, began)))
    assert bench.capacity_beside_trainer(tmp_path / "go") == pytest.approx(20.0)
    start = float((tmp_path / "go").read_text())
    assert len(began) == 2 and all(start <= t < start + 0.25 for t in began), (start, began)


def test_weighted_tenants_begin_together_and_their_gpu_time_is_taken_from_that_start(monkeypatch, tmp_path):
    """tenants_together (the weighted pairs of the GPU tests and of bench/share) begins its tenants' timed
    parts together once each is warmed up, however long one's warm-up took, and reads the GPU time charged to
    them over the seconds after that common start: not after a fixed wait that a slow warm-up outlasts."""
    lines = ("sec 1 40", "sec 2 41", "sec 3 43", "rate 41.0", "cpu_us 120")
    warmups = iter((1.5, 0.0))
    monkeypatch.setattr(sharegpu, "torch_run", lambda *args, **kwargs: _warming(next(warmups), *lines)(*args))
    began: list[float] = []
    reading = sharegpu.torch_printed
    monkeypatch.setattr(sharegpu, "torch_printed", lambda proc: _began(reading(proc), began))
    windows: list[tuple[float, float]] = []
    monkeypatch.setattr(sharegpu, "charged_between", lambda sched, start, end: windows.append((start, end)) or {})
    together = sharegpu.tenants_together(tmp_path / "pair", [("transformer", 1), ("transformer", 3)], True, 3.0)
    start = float((tmp_path / "pair" / "go").read_text())
    assert len(began) == 2 and all(start <= t < start + 0.25 for t in began), (start, began)
    assert windows == [(start + 1, start + 2.5)]
    assert together.rates == [42.0, 42.0] and together.gpu_parts == []


def _began(out: str, began: list[float]) -> str:
    """`out`, the time its run began (its "began T" line) noted in `began`."""
    began += [float(line.split()[1]) for line in out.splitlines() if line.startswith("began ")]
    return out


def test_a_run_that_ends_before_it_is_ready_stops_the_group(tmp_path):
    """A run that exits during its warm-up fails go_together, saying what it printed, and its partner waiting
    for the go is killed, not left waiting for a file that never comes."""
    go = tmp_path / "go"
    waiting = _warming(0.0, "never")(None, None, None, go)
    failed = sharegpu.started([sys.executable, "-c", "print('Traceback: CUDA out of memory')"], dict(os.environ), None)
    with pytest.raises(AssertionError, match=r"printed b'Traceback: CUDA out of memory\\n' before it was ready"):
        sharegpu.go_together([waiting, failed], go)
    assert waiting.wait(timeout=10) < 0 and not go.exists()


def test_a_start_time_in_the_past_is_late(tmp_path):
    """START_AT as a time.time() value, as the other runs of bench/share.py give it: a warm-up that ended after
    it says by how much, and the run begins at once."""
    gpu = str(REPO / "tests" / "gpu")
    program = "import sys, torch_start; torch_start.wait_for_start(sys.argv[1])"
    out = subprocess.run(
        [sys.executable, "-c", program, "1.0"], env={**os.environ, "PYTHONPATH": gpu}, capture_output=True, text=True
    ).stdout
    assert re.fullmatch(r"late \d+\.\d\d\n", out), out


def test_the_services_load_is_a_part_of_its_capacity_alone_or_beside_the_trainer(monkeypatch):
    """Alone by default (the load issue 48 defines); beside the trainer where asked; any other word stops the
    bench before it runs anything, naming the variable."""
    bench = _bench()
    monkeypatch.delenv("NVC_BENCH_SERVE_BASIS", raising=False)
    assert bench.serve_basis() == "alone"
    monkeypatch.setenv("NVC_BENCH_SERVE_BASIS", "beside")
    assert bench.serve_basis() == "beside"
    monkeypatch.setenv("NVC_BENCH_SERVE_BASIS", "besides")
    with pytest.raises(SystemExit, match="NVC_BENCH_SERVE_BASIS='besides'"):
        bench.serve_basis()


def test_a_steady_rate_leaves_out_the_first_second():
    """The weighted pairs' throughput is counted after the first second, where the scheduler starts with no
    shares and the tenants' first steps race; one second is not a rate after it."""
    assert sharegpu.steady_rate([18, 14, 15, 15, 14, 15]) == pytest.approx(14.6)
    assert sharegpu.steady_rate([4, 6]) == 6.0
    with pytest.raises(ValueError, match="two seconds or more"):
        sharegpu.steady_rate([23])


def test_the_pairs_are_compared_in_interleaved_runs():
    """Baseline, trial, trial, baseline, each run told its round; and the pair's figures are the runs' means."""
    order: list[str] = []

    def run(kind: str):
        return lambda k: order.append(f"{kind}{k}") or f"{kind}{k}"

    assert sharegpu.interleaved(run("no shim "), run("nvc ")) == (["no shim 0", "no shim 1"], ["nvc 0", "nvc 1"])
    assert order == ["no shim 0", "nvc 0", "nvc 1", "no shim 1"]
    mean = sharegpu.mean_together(
        [sharegpu.Together([6.0, 16.0], [26.0, 74.0], 78.0), sharegpu.Together([5.0, 15.0], [28.0, 72.0], 80.0)]
    )
    assert mean == sharegpu.Together([5.5, 15.5], [27.0, 73.0], 79.0)
    assert sharegpu.mean_together([sharegpu.Together([9.0, 9.0], [], 0.0)] * 2).gpu_parts == []
