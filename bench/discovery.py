#!/usr/bin/env python3
"""Time ``nvc-py info`` and ``nvc-py list`` end to end, with and without the /proc fast path.

Each command runs as the user runs it (the installed ``nvc-py``: after ``make install`` the native
front, which runs the Python program when no server answers; a fresh process per run; no global
option: the driver root is the configuration's, which the bench writes for a root other than /); runs are
interleaved round-robin so that drift hits every row alike. Ratios are against the interpreter
floor of the Python program's interpreter, measured in the same run: ``python -S -c pass`` (no
site) and ``python -c pass`` (with site), so numbers from machines of different speed can be
compared.

Rows:
  import pynvml   what the driver helper imports (nvc.rpc.driver_service, then pynvml as its
                  import_pynvml imports it)
  helper alone    the driver helper's own set-up and snapshot (nvc.rpc.driver_service.serve_driver:
                  confined, NVML started while pynvml imports, every GPU's handle) in a fresh
                  interpreter of its own (started as the installed program starts), without the
                  CLI, a fork or the protocol: the least an ``info`` whose NVML half is Python can
                  take, were its helper started at once
  info            NVML through a driver helper (info always needs NVML: CUDA version, brand): with no
                  global option and no server, the native one the front starts (native/driver), where the
                  driver root is /; else the native one the program starts once it read its options
                  (nvc.rpc.native_snapshot)
  info, Python    the Python program alone (LIBDIR/nvc-py-python, the front's fallback), which starts
                  the native helper itself once it read its options, as ``info`` after a global option does
  list            default selection; /proc fast path unless MIG devices exist
  list --nvml     the same listing with NVML forced (its output must equal the fast path's)
  ... (server)    the same command while ``nvc-py-hook serve`` runs (started by the bench): it
                  hands the call to a worker forked ahead, whose NVML helper was started (NVML
                  loaded, GPUs attached) while it was idle, and which answers before it waits for
                  that helper to exit; each such run comes 1 s after the one before (as typed
                  commands do)
The other rows are pointed at a socket where no server listens, so a server of the host's own
never answers them. With ``--reference PATH``, NVIDIA's ``nvidia-container-cli info`` and ``list`` (the one
at PATH, bench/reference.py) are timed in the same rounds, and every ``info`` and ``list`` row is also
given as a multiple of the reference's.

On a host with an NVIDIA driver (/proc/driver/nvidia/version) it times the real driver.
Otherwise, or with --fake, it builds the test suite's FAKE driver (a test double with one
fake H100 under /usr/local/nvidia), shows it at the real /proc and /dev paths in a private
mount namespace (needs root) and says so: fake numbers are never GPU results.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))  # reference.py, also where the module is loaded by path

import reference  # noqa: E402

FAKE_MACHINE = REPO / "tests" / "fakedriver" / "machines" / "local-nvidia.yaml"


# Seconds before each run of a served row: a spare loads NVML once idle for half a second
# (hook/server/worker.py), and typed commands come further apart.
SERVED_PAUSE = 1.0


@dataclass(frozen=True)
class Case:
    label: str
    source: str  # what answers: interpreter, NVML or /proc
    argv: tuple[str, ...]
    socket: str  # NVC_PY_HOOK_SOCKET for the run
    served: bool = False
    env: tuple[tuple[str, str], ...] = ()  # added to the environment of its runs
    compare: str = ""  # the reference's command it is given as a multiple of (nvc-py's rows: their own)


def default_nvc_py() -> str:
    """The nvc-py of the running interpreter's environment, else the one on PATH."""
    beside = Path(sys.executable).with_name("nvc-py")
    if beside.is_file():
        return str(beside)
    found = shutil.which("nvc-py")
    if found is None:
        sys.exit("bench/discovery.py: nvc-py not found (install it, or pass --nvc-py)")
    return found


def cases(nvc_py: str, python: str, root: str, sock: str, no_server: str) -> list[Case]:
    """nvc-py's rows, as a user types them: the driver root is the configuration's (main writes one
    naming any root but /)."""
    base = (nvc_py,)
    return [
        Case("python -S -c pass", "interpreter floor (baseline)", (python, "-S", "-c", "pass"), no_server),
        Case("python -c pass", "interpreter with site", (python, "-c", "pass"), no_server),
        Case("  import pynvml", "what the driver helper imports", (python, "-P", "-c", _IMPORT_PYNVML), no_server),
        Case(
            "  helper alone", "its set-up and snapshot", helper_alone(nvc_py, python, root), no_server, compare="info"
        ),
        Case("nvc-py info", "NVML (front's driver helper)", (*base, "info"), no_server),
        *python_program_info(nvc_py, no_server),
        Case("nvc-py list", "/proc fast path", (*base, "list"), no_server),
        Case("nvc-py list --nvml", "NVML (driver helper)", (*base, "list", "--nvml"), no_server),
        Case("nvc-py info (server)", "server worker, NVML ready", (*base, "info"), sock, True),
        Case("nvc-py list (server)", "server worker, /proc", (*base, "list"), sock, True),
    ]


# What the driver helper imports: pynvml, as the helper imports it.
_IMPORT_PYNVML = "from nvc.rpc.driver_service import import_pynvml; pynvml = import_pynvml()"
# The helper's set-up and snapshot by themselves. Its confinement re-arms the parent-death signal for
# the parent a forked helper records (nvc.rpc.helper._parent_pid), here the bench.
_HELPER_ALONE = (
    "import os, sys; from nvc.rpc import helper; helper._parent_pid = os.getppid(); "
    "from nvc.rpc.driver_service import serve_driver; from nvc.rpc.driver_wire import overflow_ids; "
    "serve_driver(sys.argv[1], *overflow_ids())['snapshot']()"
)


def python_program(nvc_py: str) -> Path | None:
    """The Python program's launcher the installed front runs where no server answers (make install's)."""
    from harness.hookserver import LIBDIR

    launcher = LIBDIR / f"{Path(nvc_py).name}-python"
    return launcher if launcher.is_file() else None


def python_program_info(nvc_py: str, no_server: str) -> list[Case]:
    """``info`` run by the Python program itself, where there is one."""
    launcher = python_program(nvc_py)
    if launcher is None:
        return []
    return [
        Case("  info, Python", "NVML (program's native helper)", (str(launcher), "info"), no_server, compare="info")
    ]


def helper_alone(nvc_py: str, python: str, root: str) -> tuple[str, ...]:
    """The helper-alone row's command: :data:`_HELPER_ALONE` started as the installed program starts
    (its launcher's interpreter flags, sys.path and code cache) where a launcher runs it, else by
    ``python`` with site."""
    launcher = python_program(nvc_py)
    lines = launcher.read_text().splitlines() if launcher is not None else []
    if len(lines) < 3 or lines[-2:] != ["from nvc.__main__ import run", "run()"]:
        return (python, "-P", "-c", _HELPER_ALONE, root)
    return (*lines[0].removeprefix("#!").split(), "-c", "\n".join([*lines[1:-2], _HELPER_ALONE]), root)


def reference_cases(cli: Path, root: str, no_server: str) -> list[Case]:
    """NVIDIA's CLI answering the same questions (its own driver helper and NVML, every run)."""
    env = tuple(reference.environment(cli).items())
    return [
        Case(f"reference {command}", "nvidia-container-cli", (str(cli), "--root", root, command), no_server, env=env)
        for command in ("info", "list")
    ]


def run_once(
    argv: tuple[str, ...], sock: str | None = None, extra: tuple[tuple[str, str], ...] = ()
) -> tuple[float, str]:
    """Wall time in ms of one run and its output; a failing run ends the benchmark."""
    env = {**os.environ, **dict(extra), **({} if sock is None else {"NVC_PY_HOOK_SOCKET": sock})}
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    elapsed = (time.perf_counter() - start) * 1000
    if done.returncode != 0:
        sys.exit(f"bench/discovery.py: {' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return elapsed, done.stdout


def measure(all_cases: list[Case], runs: int) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Times per case label (one warm-up run each, not counted) and each case's last output."""
    times: dict[str, list[float]] = {c.label: [] for c in all_cases}
    outputs: dict[str, str] = {}
    for c in all_cases:
        run_once(c.argv, c.socket, c.env)
    for _ in range(runs):
        for c in all_cases:
            if c.served:
                time.sleep(SERVED_PAUSE)
            elapsed, outputs[c.label] = run_once(c.argv, c.socket, c.env)
            times[c.label].append(elapsed)
    return times, outputs


# One ``nvc-py info`` done by hand, as nvc/commands/cli.py does it, in a fresh interpreter, each stage timed.
_PHASES_CODE = """
import json, os, sys, time
t = [time.perf_counter()]
from nvc.rpc import driver_service
driver_service.prefork(["info"])
t.append(time.perf_counter())
import click, nvc.commands.cli
t.append(time.perf_counter())
from nvc.config.options import parse_user
cm = driver_service.open_driver(root=sys.argv[1], user=parse_user(None), wait=False)
drv = cm.__enter__()
t.append(time.perf_counter())
from nvc.commands import infoformat
from nvc.discover import inventory
t.append(time.perf_counter())
inv = inventory.from_snapshot(drv.snapshot())
t.append(time.perf_counter())
cm.__exit__(None, None, None)
t.append(time.perf_counter())
infoformat.text(inv, inv.cuda_version)
t.append(time.perf_counter())
print(json.dumps([(b - a) * 1000 for a, b in zip(t, t[1:])]), flush=True)
os._exit(0)
"""
PHASES = (
    "import helper client, start the helper",
    "import click + nvc.commands.cli (overlaps)",
    "take the helper (the root, user guessed?)",
    "import infoformat, inventory (overlaps)",
    "wait for NVML load + snapshot",
    "helper shutdown and reap",
    "format",
)


def phases(python: str, root: str, runs: int) -> str:
    """Medians of each stage of ``info``; the remainder of the wall time is interpreter start and exit."""
    per_phase: list[list[float]] = [[] for _ in PHASES]
    walls: list[float] = []
    for _ in range(runs + 1):
        elapsed, out = run_once((python, "-P", "-c", _PHASES_CODE, root), "/nonexistent/hook.sock")
        for i, value in enumerate(json.loads(out)):
            per_phase[i].append(value)
        walls.append(elapsed)
    per_phase = [p[1:] for p in per_phase]  # the first run warms caches
    wall = statistics.median(walls[1:])
    lines = [f"{'info, stage by stage (in-process)':<42} {'median ms':>9}", "-" * 52]
    lines += [f"{name:<42} {statistics.median(p):>9.1f}" for name, p in zip(PHASES, per_phase, strict=True)]
    rest = wall - sum(statistics.median(p) for p in per_phase)
    lines += [f"{'interpreter start, exit (rest of wall)':<42} {rest:>9.1f}", f"{'wall':<42} {wall:>9.1f}"]
    return "\n".join(lines)


def table(all_cases: list[Case], times: dict[str, list[float]]) -> str:
    floor = statistics.median(times[all_cases[0].label])
    header = f"{'command':<22} {'answered by':<30} {'median ms':>9} {'min':>7} {'max':>7} {'x floor':>8} {'x ref':>7}"
    lines = [header, "-" * len(header)]
    for c in all_cases:
        t = times[c.label]
        median = statistics.median(t)
        command = c.compare or (c.label.split()[1] if c.label.startswith("nvc-py ") else "")
        against = times.get(f"reference {command}")
        versus = reference.ratio(median, statistics.median(against) if against else None)
        lines.append(
            f"{c.label:<22} {c.source:<30} {median:>9.1f} {min(t):>7.1f} {max(t):>7.1f} {median / floor:>8.2f} "
            f"{versus:>7}"
        )
    return "\n".join(lines)


@contextmanager
def fake_driver() -> Iterator[str]:
    """Build and activate the fake driver (test double); yield its driver root."""
    if os.geteuid() != 0:
        sys.exit("bench/discovery.py: the fake driver needs root (a private mount namespace over /proc and /dev)")
    from fakedriver.activate import activate
    from fakedriver.build import build

    with tempfile.TemporaryDirectory(prefix="nvc-bench-") as tmp:
        fake = build(FAKE_MACHINE, Path(tmp))
        with activate(fake):
            yield str(fake.root)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="timed runs per command (default 10, at least 10)")
    parser.add_argument("--nvc-py", help="the nvc-py to time (default: the installed one)")
    parser.add_argument("--root", default="/", help="driver root on a real driver (default /)")
    parser.add_argument("--fake", action="store_true", help="time the fake driver even where a real one exists")
    parser.add_argument("--phases", action="store_true", help="also time info's stages in-process")
    parser.add_argument("--reference", type=Path, help="nvidia-container-cli to time beside")
    args = parser.parse_args()
    if args.runs < 10:
        parser.error("--runs must be at least 10 (medians of fewer runs are noise)")
    sys.path.insert(0, str(REPO / "tests"))
    from harness.hookserver import hook_server, program_interpreter

    nvc_py = args.nvc_py or default_nvc_py()
    python = program_interpreter(nvc_py)
    if python is None:
        sys.exit(f"bench/discovery.py: no Python program behind {nvc_py}; pass --nvc-py")
    real = Path("/proc/driver/nvidia/version").exists() and not args.fake

    work = Path(tempfile.mkdtemp(prefix="nvc-bench-discovery-"))
    sock, no_server = work / "hook.sock", str(work / "no-server.sock")
    with ExitStack() as stack:
        root = args.root if real else stack.enter_context(fake_driver())
        if root != "/":  # the server warms up for the driver root its configuration names, as a host's would
            (work / "config.yaml").write_text(f"root: {root}\n")
            os.environ["NVC_PY_CONFIG"] = str(work / "config.yaml")
        stack.enter_context(hook_server(Path(nvc_py).with_name("nvc-py-hook"), sock))
        if real:
            driver = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
            print(f"== bench/discovery.py: REAL NVIDIA driver ({driver.strip()}) ==")
        else:
            print("== bench/discovery.py: FAKE driver (test double, one fake H100): NOT GPU results ==")
        print(
            f"host: {os.uname().nodename} {os.uname().release}, {os.cpu_count()} CPUs; nvc-py: {nvc_py}; "
            f"python: {python}; {args.runs} timed runs each after one warm-up, interleaved"
        )
        all_cases = cases(nvc_py, python, root, str(sock), no_server)
        if args.reference:
            all_cases += reference_cases(args.reference, root, no_server)
        times, outputs = measure(all_cases, args.runs)
        stages = phases(python, root, args.runs) if args.phases else None
    shutil.rmtree(work, ignore_errors=True)
    print(table(all_cases, times))
    if stages:
        print(stages)
    agree = outputs["nvc-py list"] == outputs["nvc-py list --nvml"]
    served_same = all(outputs[f"nvc-py {c} (server)"] == outputs[f"nvc-py {c}"] for c in ("info", "list"))
    print(
        f"fast path and NVML listings identical: {'yes' if agree else 'NO'}; served outputs identical to "
        f"direct: {'yes' if served_same else 'NO'}"
    )
    agree = agree and served_same
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
