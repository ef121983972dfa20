#!/usr/bin/env python3
"""bench/share.py: libnvc-share's overhead and compute share on a real GPU, native baseline measured
in the same run. Prints two tables:

* cudaMalloc+cudaFree (1 MiB) pair and empty-kernel launch medians, native vs the shim with a memory
  limit and no compute limit (targets: pair <= native + 2 us, launch <= native + 0.2 us), a launch's
  median, 10th percentile and mean under a weight alone on the GPU (where no one holds it, its launches
  run free, native/shim/accounting/freerun.c, while its looks find no work queued: 256 empty kernels
  between syncs outrun the H100, so about half did; the row says what part), and the
  shim's cost on the driver's alloc+free pair measured inside one process (wrapper and driver
  alternating pair by pair, which the process-to-process spread cannot blur);
* compute-bound kernel throughput at a requested share vs native (achieved share), for the FMA
  microbenchmark and PyTorch workloads (tests/gpu/torch_load.py: bf16 matmul, convolution, a small
  training step);
* real workloads (tests/gpu/torch_models.py: a transformer training step, ResNet-50 training and
  inference): each capped at 25/50/75 % against itself alone; weighted pairs and a triple started
  together, each one's part of the GPU's useful work against its weight's and their sum against the
  same tenants with no shim;
* weighted sharing: two or three PyTorch matmul processes in different share directories (tenants)
  with weights, started together; each one's throughput as a share of one alone, against its
  weight's share; one going idle half way; one alone;
* a launch-bound pair (issue 48): a batch-1 decode service (tests/gpu/torch_decode.py: requests at a
  fixed rate, NVC_BENCH_SERVE_LOAD of its own capacity, 0.7 by default: of its capacity alone, or with
  NVC_BENCH_SERVE_BASIS=beside of its capacity beside the trainer with no control, a load the no-control
  pair keeps up with, so that its p50 and p99 are latencies and not a queue grown over the run; latency
  from arrival) beside a
  ResNet-50 training loop, for no control, weights 9:1 favouring the service, a cap of 50 on the
  trainer, latency classes (the service latency-critical, the trainer batch), and the two as clients of
  one CUDA MPS control daemon: plain (the driver's MPS as it is), as nvc-py's MPS backend serves them
  (the shim with the limits file the hook writes: the latency classes, with and without a compute share
  of 50 for the trainer; weights 9:1) and with MPS's own client variables set by hand: the service's
  p50 / p99 and the trainer's throughput as % of alone (the trainer alone run once in each round), with
  where its rate went: the time its launches waited for queue room and for the service's share, and its
  launches per pair of CUDA events that measured them (its shim's NVC_SHARE_LOG=2 line);
* backends (issue 42): two transformer training steps (NVC_BENCH_PAIR: another workload of
  tests/gpu/torch_models.py) started together, with no control and weighted 1:3, under time slices and
  under MPS (plain, nvc-py's backend, MPS's client variables by hand), and under time slices the lighter
  capped at 50 % (a duty cycle: a cap's slices, 25 ms of every 50) beside the heavier without the shim: their
  sum as % of one alone, the heavier one's part of it, and what a 1:3 split made in time keeps of the
  no-control pair's overlap and of plain MPS's.
NVC_BENCH_ROWS=WORD,... keeps the launch-bound and backends rows whose label has one of the words (a comma
followed by a space is part of a word: "MPS, plain"); the launch-bound rows labelled "diagnostic:" (one
tenant under the shim, the other without it: whose shim costs the trainer what) run only when named so.

Each figure is the median over RUNS runs of each run's median (and 10th percentile) of SAMPLES
samples, native and shim runs interleaved in pairs so clock drift hits both; the overhead is the
median of the pairs' differences (a 1 MiB cudaMalloc+cudaFree varies by +-20 us from one process
to the next, far more than the shim costs, so unpaired medians of a few runs mostly measure that).
Every process runs on one CPU (this process's last allowed one).
The PyTorch runs of a pair, a triple or a launch-bound row begin their timed parts together once every one
of them is warmed up (sharegpu.go_together), however long one's warm-up took; a run alone begins right after its own.
Usage: bench/share.py [RUNS] [SAMPLES] [PARTS]   (PARTS: comma-separated of overhead,fma,duty,torch,weights,real,
launch-bound,backends;
default all; torch:WORKLOAD runs one PyTorch workload's rows; duty, the host's own speed under a duty cycle,
comes with the training step's rows; real: caps and weighted tenants on real workloads (tests/gpu/torch_models.py),
real-caps, real-weights: only their caps, only their weighted tenants; each of them as NAME:K takes medians
of K runs, 3 by default: real-weights:1 fits in ten minutes on an H100; launch-bound:K and backends:K likewise,
3 by default: launch-bound:3 with four rows (NVC_BENCH_ROWS) about seven minutes on an H100, backends:2
about five minutes)
"""

import contextlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "gpu"))
sys.path.append(str(Path(__file__).resolve().parent.parent))  # nvc, where it is not installed: the shim's counters
import sharegpu  # noqa: E402

TORCH_SECONDS = 4


def region_waits(share_dir: Path, seconds: float) -> str:
    """What the shim recorded for the run: the share of the wall time its launches waited (for the
    slice, the turn or room in the queue)."""
    from nvc.share.region import parse_region

    dev = parse_region((share_dir / "shared" / "region").read_bytes()).devices[0]
    return f"waited {100 * dev.throttled_ns / 1e9 / seconds:5.1f}% of the time"


def torch_shares(tmp_path: Path, native_env: dict[str, str], workloads: tuple[str, ...]) -> dict[str, float]:
    """The PyTorch rows of the compute-share table; returns the native rate of each workload. Each row
    also shows the process's CPU time per iteration (near 1e6 / rate: the loop is host bound) and,
    under the shim, how long its launches waited."""
    natives = {}
    print(f"\ncompute share, PyTorch (tests/gpu/torch_load.py), {TORCH_SECONDS} s each, throughput vs native")
    print(f"{'workload':>10}{'requested':>10}{'iter/s':>10}{'achieved':>10}{'error':>8}{'CPU us/it':>11}")
    for workload in workloads:
        natives[workload], _, cpu_us = sharegpu.torch_output(sharegpu.torch_run(workload, native_env, TORCH_SECONDS))
        print(f"{workload:>10}{'native':>10}{natives[workload]:10.1f}{100.0:9.1f}%{'':>8}{cpu_us:11.0f}")
        for percent in (25, 50, 75):
            share_dir = sharegpu.limits_dir(tmp_path / f"t-{workload}-{percent}", {"NVC_SHARE_COMPUTE": str(percent)})
            env = sharegpu.shim_env(share_dir, NVC_SHARE_LOG="2")  # its waits, logged at exit
            rate, _, cpu_us = sharegpu.torch_output(sharegpu.torch_run(workload, env, TORCH_SECONDS))
            achieved = 100 * rate / natives[workload]
            print(
                f"{'':>10}{percent:9d}%{rate:10.1f}{achieved:9.1f}%{achieved - percent:+8.1f}{cpu_us:11.0f}   "
                f"{region_waits(share_dir, TORCH_SECONDS)}"
            )
        # every launch through the throttled path (events, queue bound) but no cap: what that path costs
        sched = tmp_path / f"s-{workload}"
        sched.mkdir()
        share_dir = sharegpu.limits_dir(tmp_path / f"t-{workload}-w", {"NVC_SHARE_WEIGHT": "1"})
        env = sharegpu.shim_env(share_dir, NVC_SHARE_SCHED_DIR=str(sched), NVC_SHARE_TENANT="alone", NVC_SHARE_LOG="2")
        rate, _, cpu_us = sharegpu.torch_output(sharegpu.torch_run(workload, env, TORCH_SECONDS))
        print(
            f"{'':>10}{'w1 alone':>10}{rate:10.1f}{100 * rate / natives[workload]:9.1f}%{'':>8}{cpu_us:11.0f}   "
            f"{region_waits(share_dir, TORCH_SECONDS)} (no cap; every launch measured)"
        )
    return natives


def weighted(tmp_path: Path, native_rate: float) -> None:
    """Concurrent matmul tenants with weights (and caps), each in its own share directory, all in one
    scheduler directory."""
    cases = (
        ("1:1", [(1, 100, 1.0), (1, 100, 1.0)]),
        ("1:3", [(1, 100, 1.0), (3, 100, 1.0)]),
        ("1:1:2", [(1, 100, 1.0), (1, 100, 1.0), (2, 100, 1.0)]),
        ("1:3, the 3 idle half way", [(1, 100, 1.0), (3, 100, 0.5)]),
        ("1 capped 25% : 1", [(1, 25, 1.0), (1, 100, 1.0)]),
        ("1 alone", [(1, 100, 1.0)]),
    )
    seconds = 6
    print(
        f"\nweighted sharing, PyTorch bf16 matmul, {seconds} s, tenants started together; share = "
        f"throughput / one alone natively ({native_rate:.1f}/s)"
    )
    print(f"{'case':>26}{'tenant':>8}{'weight':>8}{'cap':>6}{'want':>8}{'got':>8}{'error':>8}   (2nd half)")
    for n, (label, tenants) in enumerate(cases):
        sched = tmp_path / f"sched{n}"
        sched.mkdir()
        procs = []
        for i, (weight, cap, busy) in enumerate(tenants):
            limits = {"NVC_SHARE_WEIGHT": str(weight)} | ({"NVC_SHARE_COMPUTE": str(cap)} if cap < 100 else {})
            env = sharegpu.shim_env(
                sharegpu.limits_dir(tmp_path / f"w{n}-{i}", limits),
                NVC_SHARE_SCHED_DIR=str(sched),
                NVC_SHARE_TENANT=f"t{i}",
            )
            procs.append(sharegpu.torch_run("matmul", env, seconds * busy, sched / "go"))
        sharegpu.go_together(procs, sched / "go")
        results = [sharegpu.torch_result(p) for p in procs]
        # wanted shares while all are busy: weights, capped ones at their cap, the rest shared by weight
        capped = {i: cap / 100 for i, (_, cap, _) in enumerate(tenants) if cap < 100}
        free_weight = sum(w for i, (w, _, _) in enumerate(tenants) if i not in capped)
        rest = 1 - sum(capped.values())
        for i, ((weight, cap, busy), (rate, per_second)) in enumerate(zip(tenants, results, strict=True)):
            half = len(per_second) // 2 if busy == 1.0 else len(per_second)
            first = sum(per_second[:half]) / max(half, 1) if busy == 1.0 else rate
            want = capped.get(i, rest * weight / free_weight)
            got = 100 * first / native_rate
            second = (
                f"{100 * sum(per_second[half:]) / max(len(per_second) - half, 1) / native_rate:8.1f}%"
                if busy == 1.0 and len(tenants) > 1
                else ""
            )
            print(
                f"{label if i == 0 else '':>26}{i:>8}{weight:>8}{cap:>5}%{100 * want:7.1f}%{got:7.1f}%"
                f"{got - 100 * want:+8.1f}   {second}"
            )


REAL = ("transformer", "resnet-train", "resnet-infer")
REAL_SECONDS = 6
# (label, [(workload, weight)]): tenants started together, each in its own container-like share directory
TENANT_SETS = (
    ("transformer w1 + transformer w3", [("transformer", 1), ("transformer", 3)]),
    ("transformer w1 + resnet-train w3", [("transformer", 1), ("resnet-train", 3)]),
    ("resnet-train w1 + resnet-train w1", [("resnet-train", 1), ("resnet-train", 1)]),
    ("resnet-infer w1 + resnet-infer w3", [("resnet-infer", 1), ("resnet-infer", 3)]),
    (
        "transformer w1 + resnet-train w1 + resnet-infer w2",
        [("transformer", 1), ("resnet-train", 1), ("resnet-infer", 2)],
    ),
    ("resnet-train w1 alone (the weight's own cost)", [("resnet-train", 1)]),
)


def real_caps(
    tmp_path: Path,
    shim: Path | None = None,
    alone: dict[str, float] | None = None,
    caps: tuple[int, ...] = (25, 50, 75),
    runs: int = 3,
) -> dict[str, float]:
    """Per real workload: alone without the shim (unless given), then capped at 25/50/75 %: throughput as
    a share of alone (the contract: the cap +-5), medians of `runs` runs and their range. Returns the
    rates alone."""
    alone = dict(alone or {})
    label = f" (shim {shim.name})" if shim else ""
    print(
        f"\ncaps on real workloads{label}, {REAL_SECONDS} s each, medians of {runs} runs; achieved = throughput / "
        f"alone without the shim"
    )
    print(f"{'workload':>14}{'cap':>8}{'iter/s':>10}{'achieved':>10}{'error':>8}{'range':>14}")
    for workload in REAL:
        if workload not in alone:
            alone[workload] = statistics.median(
                sharegpu.torch_output(sharegpu.torch_run(workload, sharegpu.shim_env(None), REAL_SECONDS))[0]
                for _ in range(runs)
            )
        print(f"{workload:>14}{'alone':>8}{alone[workload]:10.2f}{100.0:9.1f}%")
        for percent in caps:
            rates = []
            for k in range(runs):
                share_dir = sharegpu.limits_dir(
                    tmp_path / f"cap-{workload}-{percent}-{label.strip()}-{k}", {"NVC_SHARE_COMPUTE": str(percent)}
                )
                env = sharegpu.shim_env(share_dir)
                if shim:
                    env["LD_PRELOAD"] = str(shim)
                rates.append(sharegpu.torch_output(sharegpu.torch_run(workload, env, REAL_SECONDS))[0])
            rate = statistics.median(rates)
            achieved = 100 * rate / alone[workload]
            print(
                f"{'':>14}{percent:7d}%{rate:10.2f}{achieved:9.1f}%{achieved - percent:+8.1f}"
                f"{_range(100 * r / alone[workload] for r in rates):>14}"
            )
    return alone


def _range(values: Iterable[float]) -> str:
    """min-max of a row's runs, as printed."""
    values = list(values)
    return f"{min(values):.1f}-{max(values):.1f}" if len(values) > 1 else ""


def real_weights(tmp_path: Path, alone: dict[str, float], runs: int = 3) -> None:
    """Weighted tenants on real workloads against the same tenants with no shim, in the same run: each
    one's throughput after the first second (tenants_together) as % of itself alone; its part of the sum against its weight's (the contract: +-5
    points) and the sum against the no-shim sum (the contract: >= 95 %); its part of the GPU time charged
    to them all (what the weights divide). Medians of `runs` runs (the no-shim and the weighted runs
    alternate), and the range of each part."""
    print(
        f"\nweighted tenants, real workloads, {REAL_SECONDS} s, started together; rates after the first second "
        f"(sharegpu.steady_rate) as % of each alone; medians of {runs} runs"
    )
    print(
        f"{'tenants':>52}{'tenant':>14}{'w':>3}{'no shim':>9}{'nvc':>7}{'part':>7}{'want':>7}{'error':>7}"
        f"{'range':>12}{'GPU time':>10}"
    )
    for n, (label, tenants) in enumerate(TENANT_SETS):
        native_runs, shared_runs, gpu_runs = [], [], []
        for k in range(runs):
            native = sharegpu.tenants_together(tmp_path / f"n{n}-{k}", tenants, False, REAL_SECONDS)
            shared = sharegpu.tenants_together(tmp_path / f"w{n}-{k}", tenants, True, REAL_SECONDS)
            native_runs.append([100 * r / alone[w] for r, (w, _) in zip(native.rates, tenants, strict=True)])
            shared_runs.append([100 * r / alone[w] for r, (w, _) in zip(shared.rates, tenants, strict=True)])
            gpu_runs.append(shared.gpu_parts or [0.0] * len(tenants))
        parts = [[100 * b / sum(run) for b in run] for run in shared_runs]
        total_weight = sum(w for _, w in tenants)
        for i, (workload, weight) in enumerate(tenants):
            a = statistics.median(run[i] for run in native_runs)
            b = statistics.median(run[i] for run in shared_runs)
            part, want = statistics.median(p[i] for p in parts), 100 * weight / total_weight
            print(
                f"{label if i == 0 else '':>52}{workload:>14}{weight:>3}{a:8.1f}%{b:6.1f}%{part:6.1f}%{want:6.1f}%"
                f"{part - want:+7.1f}{_range(p[i] for p in parts):>12}"
                f"{statistics.median(g[i] for g in gpu_runs):9.1f}%"
            )
        sums = [100 * sum(b) / sum(a) for a, b in zip(native_runs, shared_runs, strict=True)]
        print(
            f"{'':>52}{'sum':>14}{'':>3}{statistics.median(sum(a) for a in native_runs):8.1f}%"
            f"{statistics.median(sum(b) for b in shared_runs):6.1f}%   nvc / no shim: {statistics.median(sums):.1f}% "
            f"{_range(sums)} (contract >= 95 %)"
        )


SERVE_SECONDS = 6
DIAGNOSTIC = "diagnostic:"
# (label, the service's limits, the trainer's limits); None: no shim. Weighted tenants share a scheduler directory.
# The diagnostic rows put the shim in one tenant only, to tell whose shim costs the trainer its rate.
LAUNCH_BOUND_CONTROLS = (
    ("no control", None, None),
    ("weights 9:1, the service heavier", {"NVC_SHARE_WEIGHT": "9"}, {"NVC_SHARE_WEIGHT": "1"}),
    ("cap 50 on the trainer", None, {"NVC_SHARE_COMPUTE": "50"}),
    (
        "latency classes: service urgent",
        {"NVC_SHARE_PRIORITY": "latency-critical"},
        {"NVC_SHARE_PRIORITY": "batch"},
    ),
    (f"{DIAGNOSTIC} the service's shim only, weight 9", {"NVC_SHARE_WEIGHT": "9"}, None),
    (f"{DIAGNOSTIC} the trainer's shim only, weight 1", None, {"NVC_SHARE_WEIGHT": "1"}),
    (f"{DIAGNOSTIC} the trainer's shim only, a memory limit", None, {"NVC_SHARE_MEMORY_LIMIT": "64Gi"}),
)


# (label, the service's limits, the trainer's) as clients of one MPS control daemon
# (sharegpu.mps_client_env): None, the driver's MPS as it is; NVC_SHARE_* variables, as nvc-py's MPS
# backend serves a container with them (nvc.plan.mps: their shares as MPS's client variables, the shim's
# memory accounting on top); CUDA_MPS_* variables, the driver's MPS tuned by hand (no shim).
THREADS, PRIORITY = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_CLIENT_PRIORITY"
MPS_CONTROLS = (
    ("MPS, plain", None, None),
    (
        "nvc MPS: service urgent, trainer batch 50 %",
        {"NVC_SHARE_PRIORITY": "latency-critical"},
        {"NVC_SHARE_PRIORITY": "batch", "NVC_SHARE_COMPUTE": "50"},
    ),
    ("MPS by hand: trainer threads 50 %, priority 1", None, {THREADS: "50", PRIORITY: "1"}),
    (
        "nvc MPS: service urgent, trainer batch",
        {"NVC_SHARE_PRIORITY": "latency-critical"},
        {"NVC_SHARE_PRIORITY": "batch"},
    ),
    ("nvc MPS: weights 9:1", {"NVC_SHARE_WEIGHT": "9"}, {"NVC_SHARE_WEIGHT": "1"}),
)


def wanted(labels: Iterable[str]) -> list[str]:
    """The rows to run: those whose label has one of NVC_BENCH_ROWS's words (unset: all but the diagnostic
    ones), separated by commas that no space follows: a label's own ", " stays in its word ("no control,MPS,
    plain")."""
    words = [w for w in re.split(r",(?! )", os.environ.get("NVC_BENCH_ROWS", "")) if w]
    if not words:
        return [label for label in labels if not label.startswith(DIAGNOSTIC)]
    return [label for label in labels if any(w in label for w in words)]


def weights_of(*limits: dict[str, str] | None) -> list[int]:
    """Each tenant's weight (0: none)."""
    return [int((given or {}).get("NVC_SHARE_WEIGHT", 0)) for given in limits]


def tenant_env(sched: Path, name: str, limits: dict[str, str] | None) -> dict[str, str]:
    """A tenant's environment: no shim (limits None), or the shim with these limits, its scheduler file
    `name` in sched."""
    if limits is None:
        return sharegpu.shim_env(None)
    return sharegpu.shim_env(
        sharegpu.limits_dir(sched / f"{name}-dir", limits), NVC_SHARE_SCHED_DIR=str(sched), NVC_SHARE_TENANT=name
    )


def serve_basis() -> str:
    """NVC_BENCH_SERVE_BASIS: what the service's load is a part of: its capacity alone (`alone`, the
    default) or beside the trainer with no control (`beside`)."""
    basis = os.environ.get("NVC_BENCH_SERVE_BASIS", "alone")
    if basis not in ("alone", "beside"):
        sys.exit(f"bench/share.py: NVC_BENCH_SERVE_BASIS={basis!r}: give alone or beside")
    return basis


def started_alone(workload: str, seconds: float, go: Path) -> subprocess.Popen:
    """A torch_load run with no shim, its timed part begun as a pair's is: right after its warm-up."""
    proc = sharegpu.torch_run(workload, sharegpu.shim_env(None), seconds, go)
    sharegpu.go_together([proc], go)
    return proc


def capacity_beside_trainer(go: Path) -> float:
    """The service's requests a second back to back beside the trainer, neither under a shim: what the GPU's
    own time slices leave it, the most a load can be for the no-control pair to keep up. The two begin
    together once both are warmed up (sharegpu.go_together, through the file `go`)."""
    native = sharegpu.shim_env(None)
    trainer = sharegpu.torch_run("resnet-train", native, SERVE_SECONDS, go)
    service = sharegpu.serve_run(native, SERVE_SECONDS, 0, go)
    sharegpu.go_together([trainer, service], go)
    sharegpu.torch_printed(trainer)
    return sharegpu.serve_result(service).per_second


def launch_bound(tmp_path: Path, runs: int = 3) -> None:
    """The launch-bound pair: the decode service at a fixed arrival rate beside ResNet-50 training, each
    control's rows medians of `runs` runs (controls interleaved run by run, and the trainer alone in each
    round: one alone ran 32-44 it/s within a call on the H100, so a baseline taken once, before the pairs,
    moved whole rows by 10 points). Issue 48's contract: the favoured service's p50 and p99 at most 1.1x the
    no-control pair's, the trainer at least 90 % of its rate alone under weights. Requests arrive at a part
    of the service's capacity alone, or beside the trainer (serve_basis): at 70 % of its capacity alone the
    service's queue grew for the whole run on most H100 leases with no control too, so p50 and p99 there
    measure its throughput beside the trainer."""
    load, beside_trainer = float(os.environ.get("NVC_BENCH_SERVE_LOAD", "0.7")), serve_basis() == "beside"
    native = sharegpu.shim_env(None)
    capacity = statistics.median(
        sharegpu.serve_result(sharegpu.serve_run(native, 4, 0)).per_second for _ in range(runs)
    )
    beside = (
        statistics.median(capacity_beside_trainer(tmp_path / f"go-beside-{k}") for k in range(runs))
        if beside_trainer
        else None
    )
    rate = load * (beside or capacity)
    alone = [sharegpu.serve_result(sharegpu.serve_run(native, SERVE_SECONDS, rate)) for _ in range(runs)]
    through_mps = {label for label, _, _ in MPS_CONTROLS}
    chosen = wanted(label for label, _, _ in (*LAUNCH_BOUND_CONTROLS, *MPS_CONTROLS))
    controls = [
        (label, service, trainer, label in through_mps)
        for label, service, trainer in (*LAUNCH_BOUND_CONTROLS, *MPS_CONTROLS)
        if label in chosen
    ]
    trainer_alone: list[float] = []
    rows: dict[str, list[LaunchBoundRun]] = {label: [] for label, *_ in controls}
    for k in range(runs):
        trainer_alone.append(
            sharegpu.torch_output(started_alone("resnet-train", SERVE_SECONDS, tmp_path / f"go-trainer-alone-{k}"))[0]
        )
        print(f"  run {k + 1}: the trainer alone: {trainer_alone[-1]:.2f} it/s")
        for n, (label, service_limits, trainer_limits, mps_row) in enumerate(controls):
            sched = tmp_path / f"lb-{n}-{k}"
            sched.mkdir()
            with sharegpu.mps_daemon(sched / "mps") if mps_row else contextlib.nullcontext({}) as mps_env:
                if mps_row:
                    w_service, w_trainer = weights_of(service_limits, trainer_limits)
                    service_env = sharegpu.mps_client_env(sched / "service", service_limits, [w_trainer], mps_env)
                    trainer_env = sharegpu.mps_client_env(sched / "trainer", trainer_limits, [w_service], mps_env)
                else:
                    service_env = tenant_env(sched, "service", service_limits)
                    trainer_env = tenant_env(sched, "trainer", trainer_limits)
                go, log, service_log = sched / "go", sched / "trainer.log", sched / "service.log"
                logged = {"NVC_SHARE_LOG": "2"}  # only the shims' exit lines: where their launches went
                trainer = sharegpu.torch_run("resnet-train", {**trainer_env, **logged}, SERVE_SECONDS, go, log)
                service = sharegpu.serve_run({**service_env, **logged}, SERVE_SECONDS, rate, go, service_log)
                sharegpu.go_together([trainer, service], go)  # however long either one's warm-up
                served = sharegpu.serve_result(service)
                rows[label].append(
                    LaunchBoundRun(
                        served,
                        sharegpu.torch_output(trainer)[0],
                        sharegpu.shim_exit(log),
                        sharegpu.shim_exit(service_log),
                    )
                )
                print(f"  run {k + 1}: {label}: {rows[label][-1]}")
    baseline = statistics.median(trainer_alone)
    print(
        f"\nlaunch-bound pair: batch-1 decode service ({capacity:.1f} requests/s back to back alone"
        + (f", {beside:.1f} beside the trainer with no control" if beside else "")
        + f", arriving at {rate:.1f}/s, {100 * load:.0f} % of the {'latter' if beside else 'former'}) beside resnet-train ({baseline:.2f} it/s alone: {_range(trainer_alone)}, "
        f"one alone run in each round), {SERVE_SECONDS} s, medians of {runs} runs; latency from arrival; the "
        "trainer as % of the alone runs' median, and how long its launches waited for queue room and for the "
        "service's share"
    )
    print(
        f"{'control':>34}{'p50 ms':>9}{'p99 ms':>9}{'p99 all':>9}{'trainer':>9}{'against no control':>22}"
        f"{'p50 range':>16}{'trainer range':>16}{'queue ms':>10}{'held ms':>9}"
    )
    figures = {label: launch_bound_row(results, baseline) for label, results in rows.items()}
    print(
        f"{'service alone':>34}{statistics.median(s.p50_ms for s in alone):9.1f}"
        f"{statistics.median(s.p99_ms for s in alone):9.1f}"
        f"{sharegpu.percentile([ms for s in alone for ms in s.latencies_ms], 99):9.1f}"
    )
    none = figures.get("no control")
    for label, results in rows.items():
        row = figures[label]
        shims = [r.shim for r in results if r.shim is not None]
        queued, held = (
            (
                f"{statistics.median(s.queue_ms for s in shims):.1f}",
                f"{statistics.median(s.held_ms for s in shims):.1f}",
            )
            if shims
            else ("-", "-")
        )
        print(
            f"{label:>34}{row.p50_ms:9.1f}{row.p99_ms:9.1f}{row.pooled_p99_ms:9.1f}{row.trainer:8.1f}%"
            f"{row.against(none) if none and label != 'no control' else '':>22}"
            f"{_range(r.served.p50_ms for r in results):>16}{_range(100 * r.trained / baseline for r in results):>16}"
            f"{queued:>10}{held:>9}"
        )
    print(
        "p99 all: the p99 of every request of the row's runs together (a run at a few requests a second has some "
        "dozens, so its own p99 is its slowest); against no control: p50, p99 and p99 all over the no-control row's"
    )


class LaunchBoundRun(NamedTuple):
    """One run of a launch-bound row: the service's latencies, the trainer's rate (it/s), and what each one's
    shim said of its launches (sharegpu.ShimExit; None: no shim logged it): the trainer's waits for queue
    room and for the service's share, and for both how many launches were measured, ran free, and what
    their looks at their backlog found."""

    served: sharegpu.Served
    trained: float
    shim: sharegpu.ShimExit | None
    service_shim: sharegpu.ShimExit | None = None

    def __str__(self) -> str:
        shim = "" if self.shim is None else f", {self.shim}"
        service = "" if self.service_shim is None else f"\n      the service's shim: {self.service_shim}"
        return f"{self.served.p50_ms:.1f} / {self.served.p99_ms:.1f} ms, trainer {self.trained:.2f} it/s{shim}{service}"


class LaunchBoundRow(NamedTuple):
    """A launch-bound row over its runs: the medians of each run's p50 and p99, the p99 of all its runs'
    requests together, and the trainer's rate as % of its rate alone (the median of its runs)."""

    p50_ms: float
    p99_ms: float
    pooled_p99_ms: float
    trainer: float

    def against(self, other: "LaunchBoundRow") -> str:
        """Issue 48's contract for a control that favours the service: each at most 1.1x the no-control row's."""
        return (
            f"{self.p50_ms / other.p50_ms:.2f}x {self.p99_ms / other.p99_ms:.2f}x "
            f"{self.pooled_p99_ms / other.pooled_p99_ms:.2f}x"
        )


def launch_bound_row(results: list[LaunchBoundRun], baseline: float) -> LaunchBoundRow:
    """A row's figures from its runs, the trainer's rates against `baseline` (it/s alone)."""
    return LaunchBoundRow(
        statistics.median(r.served.p50_ms for r in results),
        statistics.median(r.served.p99_ms for r in results),
        sharegpu.percentile([ms for r in results for ms in r.served.latencies_ms], 99),
        statistics.median(100 * r.trained / baseline for r in results),
    )


# Issue 42's throughput pair for each backend: two transformer trainers weighted 1:3, as (label, through MPS,
# the first's limits, the second's): None, no limits; under MPS, what sharegpu.mps_client_env takes. Through
# MPS as SHIM_ON_MPS: clients of the daemon that keep the shim's own limits (its time slices: a cap is a
# duty cycle), which nvc-py's MPS backend does not give a container.
SHIM_ON_MPS = "the shim's own limits"
BACKEND_PAIRS = (
    ("no control (time slices)", False, None, None),
    ("time slices, weights 1:3", False, {"NVC_SHARE_WEIGHT": "1"}, {"NVC_SHARE_WEIGHT": "3"}),
    ("time slices: the lighter capped 50 %, the heavier without the shim", False, {"NVC_SHARE_COMPUTE": "50"}, None),
    ("MPS, plain", True, None, None),
    ("nvc MPS: weights 1:3", True, {"NVC_SHARE_WEIGHT": "1"}, {"NVC_SHARE_WEIGHT": "3"}),
    (
        "nvc MPS: weights 1:3, the lighter batch",
        True,
        {"NVC_SHARE_WEIGHT": "1", "NVC_SHARE_PRIORITY": "batch"},
        {"NVC_SHARE_WEIGHT": "3"},
    ),
    ("MPS by hand: the lighter at client priority 1 alone", True, {PRIORITY: "1"}, {}),
    ("MPS by hand: threads 34/100 (a part of the heaviest)", True, {THREADS: "34"}, {}),
    ("MPS by hand: threads 60/100, priority 1/0", True, {THREADS: "60", PRIORITY: "1"}, {}),
    ("MPS by hand: threads 25/100, priority 1/0", True, {THREADS: "25", PRIORITY: "1"}, {}),
    ("MPS by hand: the lighter capped 33 % in time by the shim", SHIM_ON_MPS, {"NVC_SHARE_COMPUTE": "33"}, None),
    ("MPS by hand: the lighter capped 40 % in time by the shim", SHIM_ON_MPS, {"NVC_SHARE_COMPUTE": "40"}, None),
)


def split_in_time(overlap: float, ratio: float = 3.0) -> float:
    """The pair's sum (% of one alone) where a 1:ratio split is made in time: both run part of the time at
    their 50/50 overlap (`overlap`: that pair's sum, each at half of it), the heavier alone the rest. At a
    fraction f both run: the lighter does overlap/2 x f, the heavier that plus 100 (1 - f), ratio times the
    lighter's; the sum is 100 + f (overlap - 100). A split by holds, or a lighter that is idle part of the
    time, gets at most this; a lighter under a thread ceiling runs beside the heavier all the time and came
    within 3 points of it either way on the H100 (docs/performance.md)."""
    f = 100 / (100 + (ratio - 1) * overlap / 2)
    return 100 + f * (overlap - 100)


def backend_pairs(tmp_path: Path, runs: int = 3, workload: str = "transformer") -> None:
    """Two training steps of workload started together under each backend: their sum as % of one alone and
    the second's part of the sum (its weight's: 75 %); medians of `runs` runs, rows interleaved run by run,
    each run with one alone before its pairs and one after, started as a pair's are (measured right after
    its warm-up). The alone runs swing most: ResNet-50 training alone ran 31-43 it/s in one call on the H100
    while every pair's rates held within 2 %, so the sums are over the median of twice as many of them."""
    pairs = [row for row in BACKEND_PAIRS if row[0] in wanted(label for label, *_ in BACKEND_PAIRS)]
    rows: dict[str, list[list[float]]] = {label: [] for label, *_ in pairs}
    alone_runs: list[float] = []

    def one_alone(go: Path) -> float:
        return sharegpu.torch_output(started_alone(workload, REAL_SECONDS, go))[0]

    for k in range(runs):
        alone_runs.append(one_alone(tmp_path / f"go-alone-{k}"))
        for n, (label, through_mps, first, second) in enumerate(pairs):
            path = tmp_path / f"pair-{n}-{k}"
            path.mkdir()
            with sharegpu.mps_daemon(path / "mps") if through_mps else contextlib.nullcontext({}) as mps_env:
                w_first, w_second = weights_of(first, second)
                envs = (
                    [
                        sharegpu.mps_client_env(path / "a", first, [w_second], mps_env),
                        sharegpu.mps_client_env(path / "b", second, [w_first], mps_env),
                    ]
                    if through_mps is True
                    else [{**tenant_env(path, "a", first), **mps_env}, {**tenant_env(path, "b", second), **mps_env}]
                )
                procs = [sharegpu.torch_run(workload, env, REAL_SECONDS, path / "go") for env in envs]
                sharegpu.go_together(procs, path / "go")
                rates = [sharegpu.torch_output(p)[0] for p in procs]
            rows[label].append(rates)
            print(f"  run {k + 1}: {label}: {rates[0]:.2f} + {rates[1]:.2f} it/s (alone before {alone_runs[-1]:.2f})")
        alone_runs.append(one_alone(tmp_path / f"go-after-{k}"))
        print(f"  run {k + 1}: alone after the pairs: {alone_runs[-1]:.2f} it/s")
    alone = statistics.median(alone_runs)
    rows = {label: [[100 * r / alone for r in rates] for rates in got] for label, got in rows.items()}
    print(
        f"\ntwo {workload} trainers by backend ({alone:.2f} it/s alone, the median of {len(alone_runs)}: "
        f"{_range(alone_runs)}), {REAL_SECONDS} s, "
        f"started together; medians of {runs} runs"
    )
    print(f"{'pair':>30}{'sum':>8}{'second part':>13}{'want':>6}{'sum range':>16}{'part range':>16}")
    for label, _, first, _second in pairs:
        sums = [sum(r) for r in rows[label]]
        parts = [100 * r[1] / sum(r) for r in rows[label]]
        want = "75 %" if first else ""
        print(
            f"{label:>30}{statistics.median(sums):7.1f}%{statistics.median(parts):12.1f}%{want:>6}"
            f"{_range(sums):>16}{_range(parts):>16}"
        )
    for basis in ("no control (time slices)", "MPS, plain"):
        if sums := [sum(r) for r in rows.get(basis, [])]:
            print(f"a 1:3 split made in time from {basis}'s overlap: {split_in_time(statistics.median(sums)):.1f}%")


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 25
    samples = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    parts = (
        set(sys.argv[3].split(","))
        if len(sys.argv) > 3
        else {"overhead", "fma", "duty", "torch", "weights", "real", "launch-bound", "backends"}
    )
    real_runs = max((int(p.split(":", 1)[1]) for p in parts if p.startswith("real") and ":" in p), default=3)
    launch_bound_runs = max((int(p.split(":", 1)[1]) for p in parts if p.startswith("launch-bound:")), default=3)
    backend_runs = max((int(p.split(":", 1)[1]) for p in parts if p.startswith("backends:")), default=3)
    parts = {p.split(":", 1)[0] if p.startswith(("real", "launch-bound", "backends")) else p for p in parts}
    cpu = max(os.sched_getaffinity(0))
    if busy := sharegpu.gpu_users():
        sys.exit(f"bench/share.py: GPU 0 runs other CUDA processes (pids {busy}): their work would be in every figure")
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        program = sharegpu.build(tmp_path)
        if "overhead" in parts:
            os.sched_setaffinity(0, {cpu})  # inherited by the overhead programs started below
            overhead(tmp_path, program, runs, samples)
            os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
        if "fma" in parts:
            fma(tmp_path, program)
        if "duty" in parts or "torch" in parts or "torch:train" in parts:
            duty_cycle()
        workloads = (
            ("matmul", "conv", "train")
            if "torch" in parts
            else tuple(p.split(":", 1)[1] for p in parts if p.startswith("torch:"))
        )
        if parts & {"real", "real-caps", "real-weights"}:
            alone = real_caps(tmp_path, caps=() if "real-weights" in parts else (25, 50, 75), runs=real_runs)
            for extra in os.environ.get("NVC_BENCH_SHIMS", "").split(":"):
                if extra:
                    real_caps(tmp_path / extra.replace("/", "_"), Path(extra), alone, runs=real_runs)
            if parts & {"real", "real-weights"}:
                real_weights(tmp_path, alone, real_runs)
        if "launch-bound" in parts:
            launch_bound(tmp_path, launch_bound_runs)
        if "backends" in parts:
            backend_pairs(tmp_path, backend_runs, os.environ.get("NVC_BENCH_PAIR", "transformer"))
        if workloads or "weights" in parts:
            natives = torch_shares(tmp_path, sharegpu.shim_env(None), workloads) if workloads else {}
            if "weights" in parts:
                native = (
                    natives.get("matmul")
                    or sharegpu.torch_result(sharegpu.torch_run("matmul", sharegpu.shim_env(None), TORCH_SECONDS))[0]
                )
                weighted(tmp_path, native)


def overhead(tmp_path: Path, program: Path, runs: int, samples: int) -> None:
    cpu = max(os.sched_getaffinity(0))
    (tmp_path / "alone").mkdir()
    envs = {
        "native": sharegpu.shim_env(None),
        "shim": sharegpu.shim_env(sharegpu.limits_dir(tmp_path / "mem", {"NVC_SHARE_MEMORY_LIMIT": "64Gi"})),
        # a weight that no one can hold: every decision `free`, nothing waits, launches run free between looks
        "weight": {**tenant_env(tmp_path / "alone", "alone", {"NVC_SHARE_WEIGHT": "1"}), "NVC_SHARE_LOG": "2"},
    }
    # figures[side][op] = per run (median, 10th percentile[, mean]) of that run's samples
    figures: dict[str, dict[str, list[tuple[float, ...]]]] = {side: {} for side in envs}
    ran_free: list[float] = []  # per run, the part of the weight's launches that went straight to the driver
    paths: list[tuple[float, float]] = []  # per run, its throttled path's own time a call and the driver's in it
    # in_process[side] = per run, median of (through dlsym - through glibc's dlsym) pair times
    in_process: dict[str, list[float]] = {"native": [], "shim": []}
    for _ in range(runs):
        for name, env in envs.items():
            out, err = sharegpu.run_logged([program, "bench", samples], env)
            if name == "weight" and (shim := sharegpu.shim_exit_of(err)):
                ran_free.append(100 * shim.free / (shim.free + shim.launches))
                paths.append((shim.path_us, shim.driver_us))
            for key in ("pair_us", "launch_us"):
                figures[name].setdefault(key, []).append(tuple(float(v) for v in out[key]))
            if name in in_process:
                in_process[name].append(float(sharegpu.run([program, "pairab", samples], env)["pairab"][2]))
    print(
        f"overhead, {runs} pairs of runs x {samples} samples each, pinned to CPU {cpu} (us); delta: median"
        " of the pairs' differences"
    )
    print(f"{'':36}{'native':>10}{'shim':>10}{'delta':>10}{'target':>10}    pair deltas")
    for key, label, budget, side in (
        ("pair_us", "cudaMalloc+cudaFree 1 MiB", 2.0, "shim"),
        ("launch_us", "empty kernel launch", 0.2, "shim"),
        ("launch_us", "launch, weight 1 alone", None, "weight"),
    ):
        for stat, stat_label in ((0, "median"), (1, "p10"), (2, "mean")):
            if stat >= len(figures[side][key][0]):
                continue  # the alloc+free pair has no mean
            natives = [run[stat] for run in figures["native"][key]]
            shims = [run[stat] for run in figures[side][key]]
            deltas = [s - n for n, s in zip(natives, shims, strict=True)]
            delta = statistics.median(deltas)
            verdict = (
                f"{'<= +' + str(budget):>10}  {'ok' if delta <= budget else 'OVER'}" if budget else f"{'':>10}    "
            )
            print(
                f"{label + ', ' + stat_label:36}{statistics.median(natives):10.2f}"
                f"{statistics.median(shims):10.2f}{delta:+10.2f}{verdict}  " + " ".join(f"{d:+.1f}" for d in deltas)
            )
    if ran_free:
        print(f"weight 1 alone: {statistics.median(ran_free):.1f} % of its launches ran free {_range(ran_free)}")
        own, driver = ([p[k] for p in paths] for k in (0, 1))
        print(
            f"  the others through the throttled path: {statistics.median(own):.2f} us a call of its own {_range(own)}, "
            f"the driver's launch in it {statistics.median(driver):.2f} us"
        )
    control, wrapped = statistics.median(in_process["native"]), statistics.median(in_process["shim"])
    print(
        f"\nthe same in one process: cuMemAlloc_v2+cuMemFree_v2 1 MiB through dlsym's pointer (the shim's"
        f" wrapper when preloaded)\nminus through the driver's own pointer, pair by pair ({samples} pairs a run,"
        f" median of the runs' medians; us)"
    )
    print(
        f"{'native (control: both the driver)':36}{control:+10.2f}   runs "
        + " ".join(f"{d:+.2f}" for d in in_process["native"])
    )
    print(
        f"{'shim (wrapper minus driver)':36}{wrapped:+10.2f}   runs "
        + " ".join(f"{d:+.2f}" for d in in_process["shim"])
    )
    print(
        f"{'shim overhead (shim - control)':36}{wrapped - control:+10.2f}{'<= +2.0':>10}"
        f"  {'ok' if wrapped - control <= 2.0 else 'OVER'}"
    )


def duty_cycle(seconds: float = 2.0) -> None:
    """The host side of a cap, without a GPU: the same Python work run for a duty cycle of every period
    and slept through the rest, as a host-bound loop (the training step) runs under a cap (50 ms
    periods; 200 ms to tell a cost per wake-up from a slower CPU). A CPU that does the work slower
    after sleeping (clocks, caches, a VM's idle vCPU) makes such a loop fall short of its cap by as
    much, whatever the shim does."""

    def unit() -> None:
        sum(i * i for i in range(500))

    print("\nhost work under a duty cycle (no GPU): CPU per unit of Python work")
    print(f"{'duty':>10}{'period':>8}{'units/s':>12}{'CPU us/unit':>13}{'vs 100%':>9}")
    continuous = None
    for duty, period in ((100, 0.05), (75, 0.05), (50, 0.05), (25, 0.05), (50, 0.2), (25, 0.2)):
        units, cpu0, start = 0, time.process_time(), time.monotonic()
        while time.monotonic() - start < seconds:
            period_end = time.monotonic() + period
            busy_end = time.monotonic() + period * duty / 100
            while time.monotonic() < busy_end:
                unit()
                units += 1
            if duty < 100:
                time.sleep(max(0.0, period_end - time.monotonic()))
        cpu_us = (time.process_time() - cpu0) * 1e6 / units
        continuous = continuous or cpu_us
        print(f"{duty:9d}%{period * 1000:6.0f}ms{units / seconds:12.0f}{cpu_us:13.1f}{100 * cpu_us / continuous:8.0f}%")


def fma(tmp_path: Path, program: Path) -> None:
    native = sharegpu.shim_env(None)
    seconds, iters = 3, sharegpu.COMPUTE_ITERS
    rates = {}
    for percent in (100, 25, 50, 75):
        env = (
            native
            if percent == 100
            else sharegpu.shim_env(sharegpu.limits_dir(tmp_path / f"c{percent}", {"NVC_SHARE_COMPUTE": str(percent)}))
        )
        rates[percent] = float(sharegpu.run([program, "compute", seconds, iters], env)["compute"][0])
    print(f"\ncompute share, {seconds} s of fma_loop<<<1056,256>>> x {iters} iterations")
    print(f"{'requested':>10}{'kernels/s':>12}{'achieved':>10}{'error':>8}")
    print(f"{'native':>10}{rates[100]:12.1f}{100.0:9.1f}%")
    for percent in (25, 50, 75):
        achieved = 100 * rates[percent] / rates[100]
        print(f"{percent:9d}%{rates[percent]:12.1f}{achieved:9.1f}%{achieved - percent:+8.1f}")


if __name__ == "__main__":
    main()
