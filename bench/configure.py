#!/usr/bin/env python3
"""Time ``nvc-py configure`` inside a prestart hook, stage by stage, and the container start overhead.

Each round starts one container per row, interleaved so that drift hits every row alike; same
runtime (crun by default, as the reference measurement; runc where crun refuses the host's cgroups),
same command (``true``), each container on an overlay of one rootfs (an engine's snapshot) mounted
before the clock starts, all on a tmpfs of the bench's own (harness.timing.bench_workdir), no NVIDIA
device in the spec, cgroups on. The rows use nvc-py's DEFAULT configuration (only the log file's
place is set; ``load-kmods: true``), which is what a user gets; two rows labelled TUNED follow
(``load-kmods: false``, debug log for the stage tables):

  no hook                          the baseline
  nvc-py-hook, GPU 0 / no GPU, served     the OCI hook (NVIDIA_VISIBLE_DEVICES=0, or nothing asked:
                                   what hooks.d costs other containers) through nvc-py-hook-client
                                   and a running ``nvc-py-hook serve`` (started before the rounds)
  nvc-py-hook, GPU 0 / no GPU, no server  the same hook where no server can answer
                                   (NVC_PY_HOOK_SOCKET=none): the Python program itself
  sh + nvc-py configure            a bash prestart hook reading the pid from the OCI state and running
                                   ``nvc-py --debug LOG configure --pid PID --device=0 --compute --utility``
                                   (the reference's shape: wrapper + CLI), with no server, then
                                   handed to the server (sh + client + server)

Every row is also given as a ratio to the no-hook start of the same run, so it can be set beside
the reference's figures (measured the same way, in other runs: see ../shared/reference).

``--userns``: the hook's cost with a user namespace beside without (#51: within 10 %). The same
container, GPU 0, with and without uid/gid maps 0 -> 100000 (65536; its rootfs copy chowned to that
range before the clock starts), rows interleaved: no hook, the hook served and with no server, each
in both. Every row, mapped or not, has /proc and /sys as binds of the bench's (the fake driver's
mounts over /proc keep a user namespace from a fresh proc), so the maps are the only difference. A
hook's cost is its start minus the no-hook start of the same kind; the table gives it with and
without the maps, their ratio, and the same for the hook's own ``duration_ms`` (its log).

``--reference PATH``: NVIDIA's ``nvidia-container-cli`` at PATH in a bash prestart hook, a row of its own
in the same rounds (bench/reference.py), and every hook row's overhead as a multiple of its overhead.

``--cold``: every row also started right after the page cache was dropped (``sync``, then
``/proc/sys/vm/drop_caches``), as the first container start after boot finds it, in the same round
just before the row's warm start; each against the no-hook start of its kind. The pages a running
process maps stay (a running server's interpreter and modules): what a server gains cold is in its row.

``--spacing SECONDS``: each start that long after the last one ended (default 0: back to back). On an
H200 the reference's hook took 18 ms longer in rounds spaced by 0.3 s than back to back, and the no-hook
start no longer (docs/performance.md): what a start costs depends on what ran just before it.

Every counted start follows a SPACER: a start with no hook, not counted, so that no row pays for what the
row before it left behind. On an H200 a start with no hook right after the reference's took 13-15 ms more
than one after another start with no hook (docs/performance.md, Session 62), and the row after the
reference's had paid that; nvc-py's rows left the next start less than 1 ms.

Stages of configure come from the CLI's own ``--debug`` log (its ``timing`` lines: discovery and
plan, apply setup, mounts, the mounts beside ldconfig, ldconfig, cgroup; glog time stamps) and the
hook's wall clock (bash's $EPOCHREALTIME around the nvc-py call): what comes before the first stage is interpreter start,
imports and argument parsing, what comes after the last is the exit. The interpreter floor
(``python -I -S -c pass`` of nvc-py's interpreter) is timed in the same run to split the first.

On a host with an NVIDIA driver it uses the real one; otherwise (or with --fake) the test suite's
FAKE driver (a test double: one fake H100 under /usr/local/nvidia) and says so: fake numbers are
never GPU results.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
from contextlib import ExitStack
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))  # reference.py, also where the module is loaded by path (its tests)
sys.path.append(str(REPO))  # nvc, where the interpreter has none installed (harness.timing reads mountinfo with it)

import reference  # noqa: E402

from harness.bundle import make_bundle, reachable_from_userns  # noqa: E402
from harness.hookserver import client_hook, client_path, hook_server, program_interpreter  # noqa: E402
from harness.rootfs import RootfsCache, copy_rootfs, overlay_rootfs  # noqa: E402
from harness.timing import BenchDriver, bench_runtime, bench_workdir, drop_page_cache, median_row, start_container  # noqa: E402

HOOK_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# bash, for $EPOCHREALTIME and a pid read without forking sed: the wrapper costs one bash start.
WRAPPER = """#!/bin/bash
read -r -d '' state
[[ $state =~ \\"pid\\":\\ *([0-9]+) ]] || exit 1
t0=$EPOCHREALTIME
{nvc} --root {root} --debug {work}/debug-$1.log configure --pid "${{BASH_REMATCH[1]}}" {args} "$2" 2>>{work}/hook.err
rc=$?
echo "$t0 $EPOCHREALTIME" > {work}/wall-$1
exit $rc
"""
CONFIGURE_ARGS = "--device=0 --compute --utility"


class Row(NamedTuple):
    label: str
    kind: str  # "none" (no hook), "hook" (nvc-py-hook prestart), "cli" (the wrapper running nvc-py configure),
    # "reference" (the wrapper running nvidia-container-cli configure)
    served: bool = False
    gpu: bool = True
    tuned: bool = False
    userns: bool = False  # uid/gid maps ID_MAP, the rootfs chowned to them (--userns)
    cold: bool = False  # started right after the page cache was dropped (--cold)


ROWS = (
    Row("no hook", "none"),
    Row("nvc-py-hook, GPU 0, served", "hook", served=True),
    Row("nvc-py-hook, GPU 0, no server", "hook"),
    Row("nvc-py-hook, no GPU, served", "hook", served=True, gpu=False),
    Row("nvc-py-hook, no GPU, no server", "hook", gpu=False),
    Row("sh + nvc-py configure, no server", "cli"),
    Row("sh + client + server configure", "cli", served=True),
    Row("TUNED nvc-py-hook, GPU 0, served", "hook", served=True, tuned=True),
    Row("TUNED nvc-py-hook, GPU 0, no server", "hook", tuned=True),
)
USERNS = ", userns"  # a row with the maps
# --userns: each row without the maps, then with them.
USERNS_ROWS = tuple(
    variant
    for row in (
        Row("no hook", "none"),
        Row("nvc-py-hook, GPU 0, served", "hook", served=True),
        Row("nvc-py-hook, GPU 0, no server", "hook"),
    )
    for variant in (row, row._replace(label=row.label + USERNS, userns=True))
)
COLD = ", cold"  # a row started right after dropping the page cache


def cold_rows(rows: tuple[Row, ...]) -> tuple[Row, ...]:
    """--cold: each row's cold start, then the same row warm, in every round."""
    return tuple(variant for row in rows for variant in (row._replace(label=row.label + COLD, cold=True), row))


def with_reference(rows: tuple[Row, ...]) -> tuple[Row, ...]:
    """The rows with the reference's right after the baseline."""
    return (rows[0], Row(reference.LABEL, "reference"), *rows[1:])


ID_MAP = (100000, 65536)  # host id of uid and gid 0 inside, size
STAGES = ("discovery+plan", "setup", "mounts", "mounts-beside-ldconfig", "ldconfig", "cgroup", "finish")
STAGE_LABELS = {
    "setup": "apply setup (ldconfig fork, helper imports)",
    "mounts": "mounts ldconfig reads",
    "mounts-beside-ldconfig": "the other mounts, ldconfig beside",
    "ldconfig": "ldconfig (the rest of its run)",
    "finish": "finish (helpers exit)",
    "between": "between stages (lazy imports, helper fork)",
    "exit": "exit",
}
TIMING = re.compile(r"^[DI](\d{4} \d\d:\d\d:\d\d\.\d{6}) (\d+) \S+\] timing (\S+) ([\d.]+) ms")


def default_script(name: str) -> str:
    """An nvc-py command of the running interpreter's environment (the native front after make install),
    else the one on PATH."""
    beside = Path(sysconfig.get_path("scripts")) / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        sys.exit(f"bench/configure.py: {name} not found (install nvc-py)")
    return found


def glog_epoch(stamp: str) -> float:
    """Seconds since the epoch of a glog stamp ``MMDD HH:MM:SS.micros`` (local time, this year)."""
    whole, micros = stamp.split(".")
    parsed = time.strptime(f"{time.localtime().tm_year}{whole}", "%Y%m%d %H:%M:%S")
    return time.mktime(parsed) + int(micros) / 1e6


def configure_stages(work: Path, tag: str) -> dict[str, float]:
    """One wrapper run's stages in ms, from its wall-clock file and the CLI's debug log."""
    t0, t1 = (float(v) for v in (work / f"wall-{tag}").read_text().split())
    stages: dict[str, float] = {}
    first = last = None
    log = (work / f"debug-{tag}.log").read_text()
    for line in log.splitlines():
        m = TIMING.match(line)
        if not m:
            continue
        at, name, ms = glog_epoch(m[1]), m[3], float(m[4])
        stages[name] = ms
        first = at - ms / 1e3 if first is None else first
        last = at
    if first is None or last is None:
        raise RuntimeError(f"no timing lines in the debug log of run {tag}:\n{log[-3000:]}")
    stages["between"] = (last - first) * 1e3 - sum(stages.values())
    stages["start"] = (first - t0) * 1e3
    stages["exit"] = (t1 - last) * 1e3
    stages["wall"] = (t1 - t0) * 1e3
    return stages


def row_of(record: dict[str, object], rows: tuple[Row, ...]) -> tuple[int, Row] | None:
    """The round and the row of a hook log line's container (``nvc-bench-ROUND-ROW``); None for another's."""
    round_no, _, row_no = str(record.get("container", "")).removeprefix("nvc-bench-").partition("-")
    if not (round_no.isdigit() and row_no.isdigit() and int(row_no) < len(rows)):
        return None
    return int(round_no), rows[int(row_no)]


def hook_stages(
    log: str, via: str | None, cold: bool | None = None, rows: tuple[Row, ...] = ()
) -> list[dict[str, float]]:
    """Per configured nvc-py-hook run (GPU 0) run directly (``via`` None) or by a server's worker:
    its timing lines (by pid) and its JSON line's duration_ms; with ``cold`` given, only the runs of
    ``rows`` of that kind (the container id names the row: ``nvc-bench-ROUND-ROW``)."""
    by_pid: dict[str, dict[str, float]] = {}
    runs = []
    for line in log.splitlines():
        m = TIMING.match(line)
        if m:
            by_pid.setdefault(m[2], {})[m[3]] = float(m[4])
        elif line.startswith("{"):
            record = json.loads(line)
            where = row_of(record, rows)
            if cold is not None and (where is None or where[1].cold != cold):
                continue
            if record.get("devices") == ["0"] and record.get("outcome") == "configured" and record.get("via") == via:
                runs.append({**by_pid.get(str(record["pid"]), {}), "duration_ms": record["duration_ms"]})
    return runs[1:]  # the first run warms caches


def userns_costs(rows: tuple[Row, ...], times: dict[str, list[float]]) -> list[tuple[str, float, float]]:
    """Per hook row without the maps: (its label, its median start over the median no-hook start
    without the maps, the same with them), in ms."""
    baseline = {row.userns: statistics.median(times[row.label]) for row in rows if row.kind == "none"}
    median = {row.label: statistics.median(times[row.label]) for row in rows}
    return [
        (row.label, median[row.label] - baseline[False], median[row.label + USERNS] - baseline[True])
        for row in rows
        if row.kind != "none" and not row.userns
    ]


def hook_durations(log: str, rows: tuple[Row, ...]) -> dict[str, list[float]]:
    """Each row's configured GPU 0 hook runs' ``duration_ms`` from the hook's log (its container id
    names the round and the row: ``nvc-bench-ROUND-ROW``), round 0's left out."""
    found: dict[str, list[float]] = {row.label: [] for row in rows}
    for line in log.splitlines():
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        where = row_of(record, rows)
        if record.get("outcome") == "configured" and where and where[0]:
            found[where[1].label].append(record["duration_ms"])
    return found


def print_userns_table(rows: tuple[Row, ...], times: dict[str, list[float]], durations: dict[str, list[float]]) -> None:
    """The hook's cost with the maps beside without, and their ratio (#51: within 10 %)."""
    header = f"{'hook cost, medians (ms)':<50} {'no maps':>9} {'maps':>9}  maps / no maps"
    print(f"\n{header}\n{'-' * len(header)}")
    for label, plain, mapped in userns_costs(rows, times):
        print(f"{label + ': start - no-hook start':<50} {plain:>9.1f} {mapped:>9.1f}  {mapped / plain:.2f}")
        if durations.get(label) and durations.get(label + USERNS):
            own, own_mapped = statistics.median(durations[label]), statistics.median(durations[label + USERNS])
            print(f"{label + ': duration_ms':<50} {own:>9.1f} {own_mapped:>9.1f}  {own_mapped / own:.2f}")


def container_root(base: Path, bundle: Path, roots: ExitStack, *, userns_run: bool, mapped: bool) -> Path:
    """A container's rootfs in ``bundle``: an overlay of ``base`` (harness.rootfs.overlay_rootfs), unmounted
    when ``roots`` closes. A --userns run copies it for every row and chowns the mapped rows' copies: a chown
    through an overlay would copy every file up, and the maps must be the rows' only difference."""
    if not userns_run:
        return roots.enter_context(overlay_rootfs(base, bundle))
    rootfs = copy_rootfs(base, bundle / "rootfs")
    if mapped:
        subprocess.run(["chown", "-R", "-h", f"{ID_MAP[0]}:{ID_MAP[0]}", str(rootfs)], check=True)
        reachable_from_userns(rootfs)
    return rootfs


def floor(python: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([python, "-I", "-S", "-c", "pass"], check=True)
    return (time.perf_counter() - t0) * 1e3


def print_cli_stages(title: str, stages: list[dict[str, float]], floors: list[float] | None, baseline: float) -> None:
    """The wrapper's nvc-py configure by stage; ``floors``: the interpreter floor, where a Python starts."""
    wall = statistics.median([s["wall"] for s in stages])
    header = f"{title:<44} {'median ms':>9} {'min':>7} {'max':>7}  share of wall"
    print(f"\n{header}\n{'-' * len(header)}")
    starts = [s["start"] for s in stages]
    if floors is not None:
        interp = statistics.median(floors)
        print(
            median_row(
                "interpreter floor (python -I -S -c pass)",
                floors,
                f"{interp / wall:.0%} (separate runs, same interpreter)",
            )
        )
        print(
            median_row(
                "imports, arguments (start - floor)",
                [s - interp for s in starts],
                f"{(statistics.median(starts) - interp) / wall:.0%}",
            )
        )
    else:
        print(median_row("client, hand-over, arguments (start)", starts, f"{statistics.median(starts) / wall:.0%}"))
    for name in (*STAGES, "between", "exit"):
        values = [s.get(name, 0.0) for s in stages]
        print(median_row(STAGE_LABELS.get(name, name), values, f"{statistics.median(values) / wall:.0%}"))
    print(
        median_row(
            "configure wall (in the hook)",
            [s["wall"] for s in stages],
            f"{wall / baseline:.2f} x the no-hook container start",
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="rounds (default 15, at least 10)")
    parser.add_argument("--runtime", default=None, help="crun or runc (default: crun, else runc; harness.timing)")
    parser.add_argument("--fake", action="store_true", help="use the fake driver even on a GPU host")
    parser.add_argument("--userns", action="store_true", help="the hook with uid/gid maps beside without")
    parser.add_argument("--cold", action="store_true", help="each row also right after dropping the page cache")
    parser.add_argument("--reference", type=Path, help="nvidia-container-cli to time beside, in a bash hook")
    parser.add_argument("--spacing", type=float, default=0.0, help="seconds before each start (default 0)")
    args = parser.parse_args()
    if args.runs < 10:
        parser.error("--runs must be at least 10")
    if not 0 <= args.spacing <= 10:
        parser.error("--spacing is 0 to 10 seconds")
    if args.userns and (args.cold or args.reference):
        parser.error("--userns is a run of its own (no --cold, no --reference)")
    runtime, runtime_why = bench_runtime(args.runtime)
    nvc, hook_script = default_script("nvc-py"), default_script("nvc-py-hook")
    python = program_interpreter(nvc) or sys.executable
    rows = with_reference(ROWS) if args.reference else ROWS
    rows = USERNS_ROWS if args.userns else cold_rows(rows) if args.cold else rows
    cli_rows = tuple(i for i, row in enumerate(rows) if row.kind == "cli")
    with bench_workdir("nvc-bench-configure-") as work:
        driver = BenchDriver(work, args.fake)
        if driver.real:
            print(f"== bench/configure.py: REAL NVIDIA driver ({driver.version}) ==")
        else:
            print("== bench/configure.py: FAKE driver (test double, one fake H100): NOT GPU results ==")
        root, activation = driver.root, driver.activation
        if args.reference and not driver.real:
            sys.exit(f"bench/configure.py: --reference needs the real driver ({reference.NEEDS_REAL})")
        version = subprocess.run([runtime, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
        print(
            f"host: {os.uname().nodename} {os.uname().release}, {os.cpu_count()} CPUs; runtime: {version} "
            f"({runtime_why}); "
            f"nvc-py: {nvc}; python: {python}; {args.runs} rounds after one warm-up, rows interleaved"
            + (f", each start {args.spacing:g} s after the last" if args.spacing else ""),
            flush=True,
        )
        sock = work / "run" / "hook.sock"
        wrappers = {}
        for row_no in cli_rows:
            command = (
                f"NVC_PY_HOOK_SOCKET={sock} {client_path()} {nvc}"
                if rows[row_no].served
                else f"NVC_PY_HOOK_SOCKET=none {nvc}"
            )
            wrappers[row_no] = work / f"configure-hook-{row_no}.sh"
            wrappers[row_no].write_text(WRAPPER.format(nvc=command, root=root, work=work, args=CONFIGURE_ARGS))
            wrappers[row_no].chmod(0o755)
        hooks_by_config = {}
        for tuned, settings in (
            (False, f"log: {{file: {work / 'hook.log'}}}"),
            (True, f"load-kmods: false\nlog: {{file: {work / 'tuned.log'}, level: debug}}"),
        ):
            config = work / f"config-{'tuned' if tuned else 'default'}.yaml"
            config.write_text(f"root: {root}\n{settings}\n")
            hook_env = [HOOK_PATH, f"NVC_PY_CONFIG={config}"]
            # The direct rows forbid a hand-over (no server of the host's own answers them).
            hooks_by_config[tuned, False] = {
                "path": hook_script,
                "args": ["nvc-py-hook", "prestart"],
                "env": [*hook_env, "NVC_PY_HOOK_SOCKET=none"],
            }
            hooks_by_config[tuned, True] = client_hook(hook_script, sock, hook_env)
        reference_hook = (
            reference.write_hook(args.reference, root, work / "reference-hook.sh") if args.reference else {}
        )
        base = RootfsCache(work / "cache").get("debian")
        state = work / "state"
        times: dict[str, list[float]] = {row.label: [] for row in rows}
        floors: list[float] = []
        stages: dict[int, list[dict[str, float]]] = {row_no: [] for row_no in cli_rows}
        failures: list[str] = []
        with activation, hook_server(hook_script, sock), ExitStack() as spacer_root:
            spacer = work / "spacer"
            make_bundle(
                spacer,
                container_root(base, spacer, spacer_root, userns_run=args.userns, mapped=False),
                ["true"],
                host_proc_sys=args.userns,
            )
            for round_no in range(args.runs + 1):
                for row_no, row in enumerate(rows):
                    tag = f"{round_no}-{row_no}"
                    bundle = work / f"b{tag}"
                    bundle.mkdir()
                    with ExitStack() as roots:
                        rootfs = container_root(base, bundle, roots, userns_run=args.userns, mapped=row.userns)
                        hooks, env = None, {}
                        if row.kind == "cli":
                            wrapper = wrappers[row_no]
                            hooks = {
                                "prestart": [
                                    {"path": str(wrapper), "args": [wrapper.name, tag, str(rootfs)], "env": [HOOK_PATH]}
                                ]
                            }
                        elif row.kind == "reference":
                            hooks = {"prestart": [reference_hook]}
                        elif row.kind == "hook":
                            hooks = {"prestart": [hooks_by_config[row.tuned, row.served]]}
                            env = {"NVIDIA_VISIBLE_DEVICES": "0"} if row.gpu else {}
                        make_bundle(
                            bundle,
                            rootfs,
                            ["true"],
                            env=env,
                            hooks=hooks,
                            id_map=ID_MAP if row.userns else None,
                            host_proc_sys=args.userns,
                        )
                        _, error = start_container(runtime, state, spacer, "nvc-bench-spacer")
                        if error:
                            failures.append(f"the spacer before {row.label}: {error}")
                        time.sleep(args.spacing)
                        if row.cold:
                            drop_page_cache()
                        elapsed, error = start_container(runtime, state, bundle, f"nvc-bench-{tag}")
                    shutil.rmtree(bundle, ignore_errors=True)
                    if error:
                        failures.append(f"{row.label}: {error}")
                    elif round_no:  # round 0 warms caches
                        times[row.label].append(elapsed)
                        if row_no in cli_rows:
                            stages[row_no].append(configure_stages(work, tag))
                if round_no:
                    floors.append(floor(python))
        hook_err = (work / "hook.err").read_text() if (work / "hook.err").exists() else ""
        hook_log = (work / "hook.log").read_text() if (work / "hook.log").exists() else ""
        tuned_log = (work / "tuned.log").read_text() if (work / "tuned.log").exists() else ""
        kinds = (True, False) if args.cold else (None,)
        durations = {
            f"{via}{COLD if cold else ''}": [r["duration_ms"] for r in hook_stages(hook_log, by, cold, rows)]
            for cold in kinds
            for via, by in (("served", "server"), ("no server", None))
        }
        hook_runs = {
            f"TUNED nvc-py-hook, GPU 0, {via}{COLD if cold else ''}": hook_stages(tuned_log, by, cold, rows)
            for cold in kinds
            for via, by in (("no server", None), ("served", "server"))
        }
    for message in failures[:5]:
        print(f"FAILED {message}")
    if hook_err.strip():
        print(f"configure stderr:\n{hook_err.strip()[-2000:]}")
    if failures or not all(stages.values()):
        return 1

    header = f"{'container start (start to exit of `true`)':<44} {'median ms':>9} {'min':>7} {'max':>7}  vs no hook"
    print(f"\n{header}\n{'-' * len(header)}")
    # each row against the no-hook start of its kind (cold or warm)
    baselines = {row.cold: statistics.median(times[row.label]) for row in rows if row.kind == "none"}
    # and each hook's overhead against the reference's of its kind, where the run has one
    references = {
        row.cold: statistics.median(times[row.label]) - baselines[row.cold] for row in rows if row.kind == "reference"
    }
    for row in rows:
        m, baseline = statistics.median(times[row.label]), baselines[row.cold]
        note = "1.00 (baseline)" if row.kind == "none" else f"{m / baseline:.2f}  (+{m - baseline:.1f} ms overhead)"
        if row.kind not in ("none", "reference") and references:
            note += f", {reference.ratio(m - baseline, references.get(row.cold))} the reference's"
        print(median_row(row.label, times[row.label], note))
    if args.userns:
        print_userns_table(rows, times, hook_durations(hook_log, rows))
        return 0
    for via, values in durations.items():
        if values:
            print(median_row(f"default nvc-py-hook, GPU 0, {via}: duration_ms", values, "the hook's own log"))

    for row_no in cli_rows:
        row = rows[row_no]
        print_cli_stages(f"{row.label}, by stage", stages[row_no], None if row.served else floors, baselines[row.cold])
    for title, runs in hook_runs.items():
        if not runs:
            continue
        header = f"{title + ', by stage (its debug log)':<44} {'median ms':>9} {'min':>7} {'max':>7}"
        print(f"\n{header}\n{'-' * len(header)}")
        for name in STAGES:
            print(median_row(STAGE_LABELS.get(name, name), [r.get(name, 0.0) for r in runs]))
        print(
            median_row(
                "hook duration_ms (after its own imports)",
                [r["duration_ms"] for r in runs],
                "the rest of its start overhead: interpreter, imports, runtime",
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
