"""Building and running the real-GPU programs of libnvc-share, for tests/test_share_gpu.py,
tests/test_share_pairs_gpu.py and bench/share. Plain standard library plus nvc's sharing modules (the
hook's own limits writer, the scheduler files' reader) and NVML's bindings (nvidia-ml-py, for the SM
clock), so it runs on the GPU machine with PYTHONPATH pointing at the source tree.

Programs run with LD_PRELOAD=native/libnvc-share.so and NVC_SHARE_DIR=<a directory whose limits
file nvc.plan.share wrote>, the same file the hook mounts read-only in containers.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple, TypeVar

GPU_DIR = Path(__file__).resolve().parent
REPO = GPU_DIR.parent.parent
SHIM = REPO / "native" / "libnvc-share.so"
COMPUTE_ITERS = 20000  # fma_loop iterations: ~200 µs per kernel on an H100
# PyTorch lives in the machine's big venv, not in the clean one bench/gpu-env.sh makes for nvc-py.
TORCH_PYTHON = os.environ.get(
    "NVC_TORCH_PYTHON",
    "/opt/torch/.venv/bin/python3" if os.path.exists("/opt/torch/.venv/bin/python3") else sys.executable,
)


def build(out: Path) -> Path:
    """The shim (its Makefile) and share_gpu (nvcc, static cudart) built into out."""
    subprocess.run(["make", "-s", "-C", str(REPO / "native")], check=True)
    program = out / "share_gpu"
    # libstdc++ and libgcc linked in too: the program also runs in minimal container images.
    subprocess.run(
        [
            "nvcc",
            "-O2",
            "-arch=native",
            "-Xcompiler",
            "-static-libstdc++,-static-libgcc",
            "-o",
            str(program),
            str(GPU_DIR / "share_gpu.cu"),
        ],
        check=True,
    )
    return program


def _with_nvc() -> None:
    """nvc importable: the installed package where there is one (what the tests and the hook run), else this
    tree's; put first, the tree would shadow the installed package for the rest of the process."""
    if str(REPO) not in sys.path:
        sys.path.append(str(REPO))


def limits_dir(path: Path, env: dict[str, str]) -> Path:
    """A share directory prepared as the hook prepares it from a container env (e.g. NVC_SHARE_MEMORY_LIMIT)."""
    _with_nvc()
    from nvc.apply import sharefiles
    from nvc.plan import fromenv, share

    request = fromenv.parse_share_env(env)
    assert request is not None, env
    path.mkdir(parents=True, exist_ok=True)
    sharefiles.write_share_dir(path, share.limits_text(request))
    return path


def shim_env(share_dir: Path | None, **extra: str) -> dict[str, str]:
    """Environment of a process under the shim (share_dir None: no shim at all, the native run)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVC_SHARE", "CUDA_DEVICE_", "LD_PRELOAD"))}
    env.update(extra)
    if share_dir is not None:
        env.update(LD_PRELOAD=str(SHIM), NVC_SHARE_DIR=str(share_dir / "shared"))
    return env


@contextlib.contextmanager
def mps_daemon(path: Path) -> Iterator[dict[str, str]]:
    """The driver's MPS control daemon for GPU 0, its pipe and log directories under path (as nvc-py's MPS
    backend runs it: nvc.plan.mps.daemon_env); yields what its clients' environment needs."""
    _with_nvc()
    from nvc.plan import mps

    control = shutil.which(mps.CONTROL) or f"/usr/local/nvidia/bin/{mps.CONTROL}"
    pipe, log = path / "pipe", path / "log"
    pipe.mkdir(parents=True)
    log.mkdir()
    env = mps.daemon_env("0", str(pipe), str(log))
    env["PATH"] = f"{os.path.dirname(control)}:{env['PATH']}"  # the server beside the control daemon
    subprocess.run([control, "-d"], env=env, check=True, timeout=30)
    try:
        yield {mps.PIPE: str(pipe)}
    finally:
        subprocess.run([control], input="quit\n", env=env, text=True, timeout=30, check=False)


def mps_client_env(
    path: Path, limits: dict[str, str] | None, other_weights: list[int], daemon: dict[str, str]
) -> dict[str, str]:
    """A client of an MPS daemon (daemon: what mps_daemon yields). limits: None, the driver's MPS as it is
    (no shim); CUDA_MPS_* variables, the driver's MPS tuned by hand (no shim); NVC_SHARE_* variables, as
    nvc-py's MPS backend serves a container with them (nvc.plan.mps.client_lines, the hook's limits file in
    path: no time slices, its memory counted; with a weight, its scheduler file in mps-sched beside path, as
    the hook gives one), the device's other clients having other_weights."""
    if limits is None or all(name.startswith("CUDA_MPS_") for name in limits):
        return shim_env(None, **daemon, **(limits or {}))
    _with_nvc()
    from nvc.apply import sharefiles
    from nvc.plan import fromenv, mps, share

    request = fromenv.parse_share_env({**limits, "NVC_SHARE_BACKEND": "mps"})
    assert request is not None, limits
    binaries = [f"/driver/{mps.CONTROL}", f"/driver/{mps.SERVER}"]
    client = mps.client(request._asdict(), ("GPU-bench",), binaries, path.name, os.getuid())
    assert client is not None
    # the daemon's own pipe directory instead of the container's (the shim sets it: it must fit the limits
    # file's 63 characters); an MPS line is also what makes the shim a client of the MPS backend
    container_pipe = mps.limits_lines({mps.PIPE: mps.CONTAINER_PIPE_DIR})
    own_pipe = mps.limits_lines({mps.PIPE: daemon[mps.PIPE]})
    assert len(daemon[mps.PIPE]) <= 63, daemon
    path.mkdir(parents=True)
    sharefiles.write_share_dir(
        path, share.mps_limits_text(request) + mps.client_lines(client, other_weights).replace(container_pipe, own_pipe)
    )
    if not request.weight:
        return shim_env(path, **daemon)
    sched = path.parent / "mps-sched"
    sched.mkdir(exist_ok=True)
    return shim_env(path, NVC_SHARE_SCHED_DIR=str(sched), NVC_SHARE_TENANT=path.name, **daemon)


def run(argv: list[str], env: dict[str, str], timeout: float = 120) -> dict[str, list[str]]:
    """Runs a program printing "op value..." lines; returns {op: values} (the last line of each op)."""
    return run_logged(argv, env, timeout)[0]


def run_logged(argv: list[str], env: dict[str, str], timeout: float = 120) -> tuple[dict[str, list[str]], str]:
    """:func:`run`'s figures, and what the program wrote to its stderr (its shim's exit lines, say)."""
    result = subprocess.run([str(a) for a in argv], env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"{argv} exited {result.returncode}: {result.stderr.strip()}")
    return {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines() if line.strip()}, result.stderr


def holder(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    """A program that allocates, prints "holding" and waits to be killed."""
    proc = subprocess.Popen([str(a) for a in argv], env=env, stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("holding"):
            return proc
    proc.wait()
    raise AssertionError(f"{argv} exited {proc.returncode} before holding")


GO_LEAD = 0.5  # seconds from the go file's writing to the start it gives


def go_together(procs: list[subprocess.Popen], go: Path) -> float:
    """Start runs given the go file `go` as their START_AT (torch_start.py) together: once each printed "ready"
    (its warm-up done; read a byte at a time, so that nothing after it is taken from the pipe), write the start
    time, GO_LEAD from now, to it, and return it. A run that exits or prints anything else first fails the
    call."""
    for proc in procs:
        line = b""
        while not line.endswith(b"\n"):
            byte = os.read(proc.stdout.fileno(), 1)
            if not byte:
                break
            line += byte
        if line != b"ready\n":
            for other in procs:
                other.kill()
            raise AssertionError(f"{proc.args} printed {line!r} before it was ready (exit {proc.wait()})")
    start = round(time.time() + GO_LEAD, 6)
    written = go.with_name(go.name + ".new")
    written.write_text(f"{start:.6f}")
    written.rename(go)  # whole: a run reads it as soon as it exists
    return start


TORCH_LOAD = GPU_DIR / "torch_load.py"


def torch_run(
    workload: str, env: dict[str, str], seconds: float, start_at: float | Path = 0.0, log: Path | None = None
) -> subprocess.Popen:
    """torch_load.py WORKLOAD SECONDS START_AT, started (several run together with one START_AT, or one go
    file: go_together); its stderr (what its shim logs) into log where given."""
    return started([TORCH_PYTHON, str(TORCH_LOAD), workload, str(seconds), str(start_at)], env, log)


def started(argv: list[str], env: dict[str, str], log: Path | None) -> subprocess.Popen:
    """argv started, its stdout read as text, its stderr into log where given."""
    with open(log, "w") if log else contextlib.nullcontext(None) as stderr:
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)


# The shim's exit line (NVC_SHARE_LOG=2): launches, event pairs, ms waited for the slice, for queue room and for
# other containers' shares, slices started. The fake-driver tests read it too (tests/harness/shim.py).
SHIM_EXIT = re.compile(
    r"compute: (\d+) throttled launches, (\d+) event pairs; waited ([\d.]+) ms for the slice, "
    r"([\d.]+) ms for queue room, ([\d.]+) ms for other containers' shares; (\d+) slices started"
)


class ShimExit(NamedTuple):
    """What a process's shim says at exit (NVC_SHARE_LOG=2) of where its launches went: how many were
    throttled, the CUDA event pairs that measured them (a pair brackets one launch, or a group of short
    ones: the driver calls measurement costs), how long they waited for room in the queue its share bounds
    (work queued ahead of measurement) and for other containers' shares, how many went straight to the
    driver instead (they ran free: native/shim/accounting/freerun.c), and its looks at its backlog: how
    many, how many found earlier work still queued, how many more than a millisecond queued at once (after
    either, its launches take the queue's path: what keeps a weight that no one holds measured)."""

    launches: int
    pairs: int
    queue_ms: float
    held_ms: float
    free: int = 0
    looks: int = 0
    found_queued: int = 0
    found_deep: int = 0
    duties: int = 0  # how many times a duty cycle beside a steady heavier tenant came into force
    path_us: float = 0.0  # the throttled path's own host time a call (beyond the driver's launch and waits)
    driver_us: float = 0.0  # the driver's launch within it, a call

    def __str__(self) -> str:
        shared = f", {self.launches / self.pairs:.1f} a pair of events" if self.pairs else ""
        ran_free = f", {self.free} more ran free" if self.free else ""
        looked = (
            f"; {self.looks} looks, {self.found_queued} found its work queued, {self.found_deep} over 1 ms at once"
            if self.looks
            else ""
        )
        duty = f"; a duty cycle came into force {self.duties} times" if self.duties else ""
        path = f"; the path {self.path_us:.2f} us a launch, the driver's {self.driver_us:.2f}" if self.path_us else ""
        return (
            f"held {self.held_ms:.1f} ms, queue room {self.queue_ms:.1f} ms, {self.launches} launches{shared}"
            f"{ran_free}{looked}{duty}{path}"
        )


# The shim's scheduler line at exit: how many launches ran free, and what its looks at its backlog found.
SHIM_SCHEDULER = re.compile(
    r"\((\d+) launches ran free after them\); (\d+) looks at the backlog, (\d+) found earlier work queued, "
    r"(\d+) more than"
)
SHIM_DUTY = re.compile(r"a duty cycle beside a steady heavier tenant came into force (\d+) times")
SHIM_PATH = re.compile(r"the throttled path's own time ([\d.]+) us a call, the driver's launch in it ([\d.]+) us")


def shim_exit_of(text: str) -> ShimExit | None:
    """A process's :class:`ShimExit`, from its shim's exit lines in ``text`` (None where no shim logged one)."""
    found, scheduler, duty = SHIM_EXIT.search(text), SHIM_SCHEDULER.search(text), SHIM_DUTY.search(text)
    path = SHIM_PATH.search(text)
    if not found:
        return None
    return ShimExit(
        int(found.group(1)),
        int(found.group(2)),
        float(found.group(4)),
        float(found.group(5)),
        *((int(scheduler.group(k)) for k in range(1, 5)) if scheduler else (0, 0, 0, 0)),
        int(duty.group(1)) if duty else 0,
        *((float(path.group(1)), float(path.group(2))) if path else ()),
    )


def shim_exit(log: Path) -> ShimExit | None:
    """:func:`shim_exit_of` what the process wrote to ``log`` (None where it wrote none)."""
    return shim_exit_of(log.read_text()) if log.exists() else None


def torch_printed(proc: subprocess.Popen) -> str:
    """What a torch_load run printed, once it has ended well."""
    out = proc.communicate(timeout=300)[0]
    if proc.returncode != 0:
        raise AssertionError(f"torch_load exited {proc.returncode}")
    return out


def torch_output(proc: subprocess.Popen) -> tuple[float, list[int], float]:
    """(iterations per second, iterations in each second, process CPU µs per iteration) of a finished
    torch_load run."""
    return torch_output_of(torch_printed(proc))


def torch_output_of(out: str) -> tuple[float, list[int], float]:
    """torch_output's figures from torch_load's printed lines (a run in a container, say)."""
    lines = [line.split() for line in out.splitlines()]
    value = {line[0]: float(line[1]) for line in lines if line[0] in ("rate", "cpu_us")}
    return value["rate"], [int(row[2]) for row in lines if row[0] == "sec"], value["cpu_us"]


def steady_rate(per_second: list[int]) -> float:
    """Iterations per second after the first second of a run started together with others: in the first the
    weighted scheduler knows nothing yet (shares start from none and decay over ~200 ms) and the tenants'
    first steps race for the GPU (on the H100 that second alone put a 1:3 pair's light part at 38 % in one
    run and 18 % in the next, where the seconds after it held 25-30 %)."""
    if len(per_second) < 2:
        raise ValueError(f"a steady rate needs two seconds or more, not {len(per_second)}")
    return sum(per_second[1:]) / (len(per_second) - 1)


def torch_result(proc: subprocess.Popen) -> tuple[float, list[int]]:
    """(iterations per second, iterations in each second) of a finished torch_load run."""
    rate, per_second, _ = torch_output(proc)
    return rate, per_second


DECODE = GPU_DIR / "torch_decode.py"


def serve_run(
    env: dict[str, str], seconds: float, rate: float, start_at: float | Path = 0.0, log: Path | None = None
) -> subprocess.Popen:
    """torch_decode.py SECONDS RATE START_AT, started: the launch-bound service (RATE 0: back to back); its
    stderr (what its shim logs) into log where given."""
    return started([TORCH_PYTHON, str(DECODE), str(seconds), str(rate), str(start_at)], env, log)


class Served(NamedTuple):
    p50_ms: float  # request latency from arrival
    p99_ms: float
    per_second: float  # requests served per second of the run
    latencies_ms: tuple[float, ...] = ()  # every request's, for a percentile over several runs


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank: a latency some request really had."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    return ordered[max(0, min(len(ordered) - 1, math.ceil(len(ordered) * q / 100) - 1))]


def serve_latencies(out: str) -> Served:
    """A torch_decode run's figures from its "req ARRIVAL DONE" lines: each request's latency is from its
    arrival (a request that waited for the one before it waited as a user would), not from when it began."""
    lines = (line.split() for line in out.splitlines())
    requests = [(float(f[1]), float(f[2])) for f in lines if f[:1] == ["req"]]
    if not requests:
        raise ValueError("no requests served")
    latencies = [1000 * (done - arrival) for arrival, done in requests]
    span = max(done for _, done in requests) - min(arrival for arrival, _ in requests)
    return Served(
        percentile(latencies, 50),
        percentile(latencies, 99),
        len(requests) / span if span > 0 else 0.0,
        tuple(latencies),
    )


def serve_result(proc: subprocess.Popen) -> Served:
    out = proc.communicate(timeout=300)[0]
    if proc.returncode != 0:
        raise AssertionError(f"torch_decode exited {proc.returncode}")
    return serve_latencies(out)


def timed_with_clock(workload: str, env: dict[str, str], seconds: float, go: Path) -> tuple[float, float]:
    """(iterations per second, median SM clock in MHz) of a torch_load run begun through the go file `go`
    once warmed up, the clock of GPU 0 sampled through NVML every 20 ms while it runs: a GPU at its power
    limit lowers its clock, so a workload that draws that limit runs faster whenever it is kept off part of
    the time."""
    import statistics

    import pynvml

    proc = torch_run(workload, env, seconds, go)
    start_at = go_together([proc], go)
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        time.sleep(max(0.0, start_at + 0.3 - time.time()))
        clocks = []
        while time.time() < start_at + seconds - 0.3:
            clocks.append(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
            time.sleep(0.02)
    finally:
        pynvml.nvmlShutdown()
    return torch_result(proc)[0], statistics.median(clocks)


def gpu_users() -> list[int]:
    """The pids of the processes with a CUDA context on GPU 0 (NVML): a bench's figures are its own only
    on a GPU no one else uses (a test run killed by a timeout leaves its PyTorch processes behind)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return [process.pid for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    finally:
        pynvml.nvmlShutdown()


class Together(NamedTuple):
    rates: list[float]  # iterations per second after the first second (steady_rate), tenant by tenant
    gpu_parts: list[float]  # % of the GPU time charged to them all (weighted tenants; else empty)
    charged: float  # the GPU time charged to them all, % of the wall time (weighted tenants; else 0)


def tenants_together(path: Path, tenants: list[tuple[str, int]], weighted: bool, seconds: float) -> Together:
    """torch_load workloads started together, (workload, weight) each: under the shim with their weights,
    each its own tenant in one scheduler directory, or with no shim at all (the GPU's own time-slicing
    between them), their timed parts begun together once all are warmed up (go_together). Their rates and
    the GPU time charged are both taken after the first second (steady_rate), the GPU time until half a
    second before the last second ends."""
    sched = path / "sched"
    sched.mkdir(parents=True)
    go = path / "go"
    procs = []
    for i, (workload, weight) in enumerate(tenants):
        env = shim_env(None)
        if weighted:
            env = shim_env(
                limits_dir(path / f"t{i}", {"NVC_SHARE_WEIGHT": str(weight)}),
                NVC_SHARE_SCHED_DIR=str(sched),
                NVC_SHARE_TENANT=f"t{i}",
            )
        procs.append(torch_run(workload, env, seconds, go))
    start_at = go_together(procs, go)
    charged = charged_between(sched, start_at + 1, start_at + seconds - 0.5) if weighted else {}
    total = sum(c for _, c in charged.values())
    return Together(
        [steady_rate(torch_output(p)[1]) for p in procs],
        [100 * charged.get(f"t{i}", (0, 0))[1] / total for i in range(len(tenants))] if total else [],
        100 * total / ((seconds - 1.5) * 1e9),
    )


def mean_together(runs: list[Together]) -> Together:
    """The mean of runs of the same tenants: each tenant's rate and GPU part, and the charged time."""
    return Together(
        [sum(r.rates[i] for r in runs) / len(runs) for i in range(len(runs[0].rates))],
        [sum(r.gpu_parts[i] for r in runs) / len(runs) for i in range(len(runs[0].gpu_parts))],
        sum(r.charged for r in runs) / len(runs),
    )


Run = TypeVar("Run")


def interleaved(baseline: Callable[[int], Run], trial: Callable[[int], Run]) -> tuple[list[Run], list[Run]]:
    """Two runs of each, in the order baseline, trial, trial, baseline (each given its round, 0 or 1): a drift
    of the GPU's clocks or of the host's load over the four falls on both alike, and a comparison of their
    means is not one run's against one other's (on the H100, 2026-11-27, a transformer pair with no shim ran
    96.9 % of one alone in one test and 105.2 % in the next)."""
    base, tried = [baseline(0)], [trial(0)]
    tried.append(trial(1))
    base.append(baseline(1))
    return base, tried


def split_by_weight(
    charged: dict[str, tuple[int, int]], weights: list[int], seconds: float
) -> tuple[list[float], float]:
    """From charged_between's figures: each weight's % of the GPU time charged to them all (tenants of one
    weight together), and that time as % of the `seconds` it was charged over."""
    by_weight = {weight: sum(ns for w, ns in charged.values() if w == weight) for weight in weights}
    total = sum(by_weight.values())
    return [100 * by_weight[w] / max(total, 1) for w in weights], 100 * total / (seconds * 1e9)


def charged_between(sched: Path, start: float, end: float) -> dict[str, tuple[int, int]]:
    """Each tenant's (weight, GPU time charged to it between the wall times start and end, in ns) from
    the scheduler files in sched, by file name, read while the tenants run: what the weights divide.
    Sleeps until end."""
    import time

    from nvc.share.sched import SchedFormatError, parse_sched

    def snapshot() -> dict[str, tuple[int, int]]:
        seen = {}
        for entry in sched.iterdir():
            try:
                devices = parse_sched(entry.read_bytes())
            except (OSError, SchedFormatError):
                continue
            if devices:
                seen[entry.name] = (devices[0].weight, sum(d.charged_ns for d in devices))
        return seen

    time.sleep(max(0.0, start - time.time()))
    first = snapshot()
    time.sleep(max(0.0, end - time.time()))
    return {name: (weight, ns - first[name][1]) for name, (weight, ns) in snapshot().items() if name in first}
