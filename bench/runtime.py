#!/usr/bin/env python3
"""What nvc-py-runtime costs an engine's calls, beside the runtime it wraps.

An engine calls its runtime several times for every container; where nvc-py-runtime is the runtime,
most of those calls only pass through. Rows, interleaved in each round (each round starting one row
later, each after SETTLE seconds idle) after one warm-up round, each a runtime as an engine would call
it (its own ``--root`` state directory):

  RUNTIME alone                 runc (or crun): the baseline
  nvc-py-runtime                the installed one (/usr/lib/nvc-py/nvc-py-runtime: the native front)
  the Python program alone      /usr/lib/nvc-py/nvc-py-runtime-python: every call through Python
  NVIDIA's runtime              --nvidia PATH, where one was built (its own configuration)

Columns: one call (``list``), ``--version`` (which nvc-py-runtime answers first, then the runtime), and
containerd's four calls for one container that asks for no GPU
(``create``, ``start``, ``state``, ``delete`` of a busybox ``true``). Medians of the rounds in ms,
with each row's ratio to the baseline of the same run. Run it as root with the installed nvc-py's
interpreter: ``/usr/lib/nvc-py/venv/bin/python bench/runtime.py``.

``--gpu-start``: instead, containerd's four calls for a container that asks for GPU 0 (the wrapper
rewrites its spec, its prestart hook configures it) and for one that asks for none, through RUNTIME
alone (a GPU asked is not given: the baseline) and through nvc-py-runtime with a hook server running,
as a host with nvc-py's server has them (crun by default, as issue 53's H100 rows). The bench runs in
a private mount namespace of its own with a tmpfs on /run/nvc-py, where its server listens on the
default socket the injected hook uses: the host's own server, if any, is neither used nor touched.
The hook's log says whether each call was served; a last table gives each call's median. With
``--cold`` every row is also run right after the page cache was dropped (as the first start after boot
finds it), each against the runtime alone's cold row.

``--gpu-create``: instead, what nvc-py-runtime itself costs a ``create`` whose spec asks for GPU 0 (its
spec rewritten: the hook, the device nodes), with ``true`` as the runtime it then executes: with a hook
server running (its worker rewrites the spec, the front executes the runtime) and with none (the Python
program does both), rows interleaved, the spec restored before each call. On a host without an NVIDIA
driver it uses the test suite's fake driver (a test double: not GPU results).
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
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from harness.bundle import make_bundle  # noqa: E402
from harness.hookserver import hook_server  # noqa: E402
from harness.rootfs import RootfsCache  # noqa: E402
from harness.timing import BenchDriver, drop_page_cache, median_row  # noqa: E402
from nvc.system.programs import DEFAULT_SOCKET  # noqa: E402

LIBDIR = Path("/usr/lib/nvc-py")
T = TypeVar("T")
SETTLE = 0.2  # seconds before each row's calls (--settle)


def timed(argv: list[str]) -> float:
    """Milliseconds one call took; a failing call ends the benchmark with its error. Its output goes to
    files, as an engine's does: the container's process inherits them, and a pipe would stay open."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        result = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        took = (time.perf_counter() - start) * 1e3
        if result.returncode != 0:
            err.seek(0)
            sys.exit(f"bench/runtime: {' '.join(argv)}: exit {result.returncode}: {err.read().decode().strip()}")
    return took


def rotated(rows: dict[str, T], round_no: int, settle: float = SETTLE) -> Iterator[tuple[int, tuple[str, T]]]:
    """The rows numbered, in the order of round ``round_no``: each round starts one row later, so that
    no row always follows the same one, and each after SETTLE seconds (a row right after a served GPU
    start or the Python program's calls was measured up to 2x slower on the H100: the machine still
    busy with the one before)."""
    items = list(enumerate(rows.items()))
    shift = round_no % len(items)
    for item in items[shift:] + items[:shift]:
        time.sleep(settle)
        yield item


CALLS = ("create", "start", "state", "delete")


def container_calls(program: str, state: Path, bundle: Path, name: str) -> list[float]:
    """containerd's calls for one container (CALLS), ms each."""
    base = [program, "--root", str(state)]
    took = [timed([*base, "create", "--bundle", str(bundle), name]), timed([*base, "start", name])]
    deadline = time.monotonic() + 10
    while "stopped" not in subprocess.run([*base, "state", name], capture_output=True, text=True).stdout:
        if time.monotonic() > deadline:
            sys.exit(f"bench/runtime: {name} did not stop")
    return [*took, timed([*base, "state", name]), timed([*base, "delete", name])]


def gpu_create(runs: int) -> int:
    """--gpu-create: nvc-py-runtime's own cost of a GPU create, served and with no server."""
    with tempfile.TemporaryDirectory(prefix="nvc-bench-runtime-") as tmp:
        work = Path(tmp)
        driver = BenchDriver(work)
        described = "the REAL NVIDIA driver" if driver.real else "the FAKE driver (a test double: NOT GPU results)"
        root = driver.root
        config = work / "config.yaml"
        config.write_text(f"root: {root}\nruntimes: [{shutil.which('true')}]\n")
        (work / "rootfs").mkdir()
        spec_path = make_bundle(work / "bundle", work / "rootfs", ["/bin/true"], env={"NVIDIA_VISIBLE_DEVICES": "0"})
        spec = (spec_path / "config.json").read_bytes()
        sock = work / "run" / "hook.sock"
        base = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NVC_PY_CONFIG": str(config)}
        rows = {"served (a hook server's worker)": str(sock), "no server (the Python program)": "none"}
        times: dict[str, list[float]] = {label: [] for label in rows}
        argv = [str(LIBDIR / "nvc-py-runtime"), "create", "--bundle", str(spec_path), "c1"]
        with driver.activation, hook_server(LIBDIR / "nvc-py-hook", sock):
            for round_no in range(runs + 1):
                for label, socket_path in rows.items():
                    (spec_path / "config.json").write_bytes(spec)
                    env = {**base, "NVC_PY_HOOK_SOCKET": socket_path}
                    start = time.perf_counter()
                    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
                    took = (time.perf_counter() - start) * 1e3
                    if result.returncode != 0 or b"nvidia0" not in (spec_path / "config.json").read_bytes():
                        sys.exit(f"bench/runtime: {label}: exit {result.returncode}: {result.stderr.strip()}")
                    if round_no:
                        times[label].append(took)
    print(f"== bench/runtime --gpu-create: {described}; {runs} rounds, medians in ms; the runtime is `true` ==")
    for label, got in times.items():
        print(f"{label:<34} {statistics.median(got):8.1f}  (min {min(got):.1f}, max {max(got):.1f})")
    return 0


PRIVATE_ENV = "NVC_BENCH_RUNTIME_PRIVATE"  # set once the bench runs in its own mount namespace


def in_private_run_dir() -> None:
    """Re-run this bench in a private mount namespace with a tmpfs on /run/nvc-py (see the module's
    docstring), unless it runs there already."""
    if os.environ.get(PRIVATE_ENV) == "1":
        return
    run_dir = Path(DEFAULT_SOCKET).parent
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    mount = f'mount -t tmpfs -o mode=0700 tmpfs {run_dir} && exec "$@"'
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh", sys.executable, *sys.argv]
    os.execvpe("unshare", argv, {**os.environ, PRIVATE_ENV: "1"})


def gpu_starts(runs: int, runtime_name: str, cold: bool, settle: float) -> int:
    """--gpu-start: containerd's calls for a GPU container and a plain one, RUNTIME alone and wrapped;
    with ``cold`` each row also right after the page cache was dropped."""
    in_private_run_dir()
    runtime = shutil.which(runtime_name) or sys.exit(f"bench/runtime: {runtime_name} not found")
    with tempfile.TemporaryDirectory(prefix="nvc-bench-runtime-") as tmp:
        work = Path(tmp)
        driver = BenchDriver(work)
        described = "the REAL NVIDIA driver" if driver.real else "the FAKE driver (a test double: NOT GPU results)"
        config, log = work / "config.yaml", work / "hook.log"
        config.write_text(f"root: {driver.root}\nruntimes: [{runtime}]\nlog: {{file: {log}}}\n")
        os.environ["NVC_PY_CONFIG"] = str(config)
        rootfs = RootfsCache(work / "cache").get("debian")
        gpu = make_bundle(work / "gpu", rootfs, ["/bin/true"], env={"NVIDIA_VISIBLE_DEVICES": "0"})
        plain = make_bundle(work / "plain", rootfs, ["/bin/true"])
        specs = {bundle: (bundle / "config.json").read_bytes() for bundle in (gpu, plain)}
        wrapper = str(LIBDIR / "nvc-py-runtime")
        kinds = {
            f"{runtime_name} alone, GPU 0 asked (not given)": (runtime, gpu),
            "nvc-py-runtime, GPU 0, served": (wrapper, gpu),
            f"{runtime_name} alone, no GPU asked": (runtime, plain),
            "nvc-py-runtime, no GPU asked": (wrapper, plain),
        }
        rows = {
            f"{label}{suffix}": (program, bundle, bool(suffix))
            for label, (program, bundle) in kinds.items()
            for suffix in ((", cold", "") if cold else ("",))
        }
        times: dict[str, list[float]] = {label: [] for label in rows}
        calls: dict[str, list[list[float]]] = {label: [] for label in rows}
        with driver.activation, hook_server(LIBDIR / "nvc-py-hook", Path(DEFAULT_SOCKET)):
            for round_no in range(runs + 1):
                for n, (label, (program, bundle, row_cold)) in rotated(rows, round_no, settle):
                    (bundle / "config.json").write_bytes(specs[bundle])
                    if row_cold:
                        drop_page_cache()
                    took = container_calls(program, work / f"state-{n}", bundle, f"nvc-bench-{n}-{round_no}")
                    if program == wrapper and bundle == gpu and b"nvidia0" not in (bundle / "config.json").read_bytes():
                        sys.exit(f"bench/runtime: {label}: the spec was not given GPU 0")
                    if round_no:
                        times[label].append(sum(took))
                        calls[label].append(took)
        lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    configured = [line for line in lines if line.get("outcome") == "configured"]
    served = sum(line.get("via") == "server" for line in configured)
    print(
        f"== bench/runtime --gpu-start: {described}; {runtime} wrapped; {runs} rounds, each row after {settle} s idle, "
        "medians in ms =="
    )
    print(f"{'create+start+state+delete':<44} {'median':>9} {'min':>7} {'max':>7}  vs {runtime_name} alone")
    for label, got in times.items():
        kind = "GPU 0 asked (not given)" if "GPU 0" in label else "no GPU asked"
        base = times[f"{runtime_name} alone, {kind}{', cold' if label.endswith(', cold') else ''}"]
        print(f"{median_row(label, got)}{statistics.median(got) / statistics.median(base):.2f}x")
    print(f"the prestart hooks: {len(configured)} configured GPU 0, {served} of them served")
    print(f"{'each call, median ms':<44} " + " ".join(f"{call:>7}" for call in CALLS))
    for label, rounds in calls.items():
        print(f"{label:<44} " + " ".join(f"{statistics.median(each):7.1f}" for each in zip(*rounds, strict=True)))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="rounds after the warm-up (default 20)")
    parser.add_argument("--runtime", help="the wrapped runtime (default runc; crun with --gpu-start)")
    parser.add_argument("--nvidia", help="NVIDIA's nvidia-container-runtime, to measure beside")
    parser.add_argument("--gpu-create", action="store_true", help="a GPU create, served and with no server")
    parser.add_argument("--gpu-start", action="store_true", help="a GPU container's calls (default runtime crun)")
    parser.add_argument("--cold", action="store_true", help="with --gpu-start: each row also after dropping caches")
    parser.add_argument("--settle", type=float, default=SETTLE, help=f"idle seconds before each row (default {SETTLE})")
    args = parser.parse_args()
    if args.gpu_create:
        return gpu_create(args.runs)
    if args.gpu_start:
        return gpu_starts(args.runs, args.runtime or "crun", args.cold, args.settle)
    args.runtime = args.runtime or "runc"
    runtime = shutil.which(args.runtime) or sys.exit(f"bench/runtime: {args.runtime} not found")
    rows = {
        f"{args.runtime} alone": runtime,
        "nvc-py-runtime": str(LIBDIR / "nvc-py-runtime"),
        "the Python program alone": str(LIBDIR / "nvc-py-runtime-python"),
    }
    if args.nvidia:
        rows["NVIDIA's runtime"] = args.nvidia
    times: dict[str, dict[str, list[float]]] = {label: {"one": [], "version": [], "four": []} for label in rows}
    with tempfile.TemporaryDirectory(prefix="nvc-bench-runtime-") as tmp:
        work = Path(tmp)
        config = work / "config.yaml"  # the wrapper wraps the baseline's runtime
        config.write_text(f"runtimes: [{runtime}]\n")
        os.environ["NVC_PY_CONFIG"] = str(config)
        rootfs = RootfsCache(work / "cache").get("debian")
        bundle = make_bundle(work / "bundle", rootfs, ["/bin/true"])
        for round_no in range(args.runs + 1):
            for n, (label, program) in rotated(rows, round_no, args.settle):
                state = work / f"state-{n}"
                one = timed([program, "--root", str(state), "list"])
                version = timed([program, "--version"])
                four = sum(container_calls(program, state, bundle, f"nvc-bench-{n}-{round_no}"))
                if round_no:
                    times[label]["one"].append(one)
                    times[label]["version"].append(version)
                    times[label]["four"].append(four)
    base = times[f"{args.runtime} alone"]
    print(f"== bench/runtime: {runtime} wrapped; {args.runs} rounds, medians in ms (ratio to {args.runtime} alone) ==")
    print(f"{'':<28} {'one call (list)':>20} {'--version':>20} {'create+start+state+delete':>28}")
    for label, got in times.items():
        cells = []
        for column, width in (("one", 11), ("version", 11), ("four", 19)):
            value = statistics.median(got[column])
            cells.append(f"{value:>{width}.1f} ({value / statistics.median(base[column]):4.2f}x)")
        print(f"{label:<28} " + " ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
