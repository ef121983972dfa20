#!/usr/bin/env python3
"""bench/exporter.py: what one scrape of ``nvc-py exporter`` costs over N sharing containers (default 200).

The containers are made as the hook makes them (nvc.plan.share.files, nvc.apply.sharefiles.make: each its own tmpfs,
limits, owner record and scheduler file), then given what their shim would have written: a region
with one device and four processes (one of them running in this process's pid namespace, so the
host-pid lookup is paid) and a scheduler entry with a launch just now. Prints, for RUNS scrapes each
(default 15), the median, minimum and maximum in ms of:

* ``share status``'s reading alone (nvc.commands.sharestatus.status: the directories and one pass over /proc);
* the collector: that reading, the hook log's new lines, the hook socket and the families, rendered;
* a whole scrape over HTTP of the installed ``nvc-py exporter`` (without NVML: its reads are
  at most one per interval, whatever the scrape rate), as Prometheus gets it.

Run as root with nvc-py's interpreter: /usr/lib/nvc-py/venv/bin/python bench/exporter.py [N] [RUNS]
It runs itself again in a private mount namespace (unshare -m), so its tmpfs mounts go with it.
"""

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # harness.shareregion: what a shim writes


def timed(action, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        times.append((time.perf_counter() - start) * 1000)
    return times


def make_containers(state: Path, count: int) -> None:
    from harness.shareregion import Device, Entry, Slot, region_bytes, sched_bytes
    from nvc.apply import sharefiles
    from nvc.apply.container import ContainerHandle
    from nvc.plan import fromenv, share

    key = "4f6a2c1e-8b3d-5e7f-9a1b-2c3d4e5f6a7b"
    own = Slot(
        os.getpid(),
        int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]),
        os.stat("/proc/self/ns/pid").st_ino,
        [512 << 20],
    )
    region = region_bytes(
        [Device(key, 4 << 30, 50, 10**10, 10**9, 12345)], [own] + [Slot(100 + i, 1, 1, [256 << 20]) for i in range(3)]
    )
    request = fromenv.parse_share_env(
        {"NVC_SHARE_MEMORY_LIMIT": "4Gi", "NVC_SHARE_COMPUTE": "50", "NVC_SHARE_WEIGHT": "2"}
    )
    sched_dir = Path(share.sched_dir_for(str(state)))
    for i in range(count):
        cid = f"bench{i:04d}"
        files = share.files(request, cid, "", state_dir=str(state))  # an image without an ld.so.preload
        with ContainerHandle.open(os.getpid()) as handle:
            sharefiles.make(files, handle)
        with open(state / cid / "shared" / "region", "r+b") as f:
            f.write(region)
        with open(sched_dir / cid, "r+b") as f:
            f.write(sched_bytes([Entry(key, 2, 400)]))


def row(name: str, times: list[float]) -> str:
    return f"{name:<44} {statistics.median(times):>9.2f} {min(times):>8.2f} {max(times):>8.2f}"


def main(count: int, runs: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="nvc-bench-exporter-"))
    state = work / "state"
    log = work / "hook.log"
    log.write_text(
        "".join('{"stage":"prestart","outcome":"configured","via":"server","duration_ms":31.5}\n' for _ in range(1000))
    )
    try:
        make_containers(state, count)
        measure(work, state, log, count, runs)
    finally:
        from nvc.apply import sharefiles
        from nvc.plan import share

        for cid in os.listdir(state) if state.exists() else ():
            sharefiles.remove(cid, str(state))
        sched_dir = share.sched_dir_for(str(state))
        if os.path.ismount(sched_dir):
            subprocess.run(["umount", sched_dir], check=True)
        shutil.rmtree(work)


def measure(work: Path, state: Path, log: Path, count: int, runs: int) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from nvc.commands import sharestatus
    from nvc.exporter.collector import Collector, Sources

    sources = Sources(str(state), str(log), str(work / "hook.sock"), str(work / "device-plugin.json"))
    registry = CollectorRegistry()
    registry.register(Collector(sources, None))
    assert len(sharestatus.status(str(state))) == count
    status_times = timed(lambda: sharestatus.status(str(state)), runs)
    collector_times = timed(lambda: generate_latest(registry), runs)
    exporter = subprocess.Popen(
        [
            "nvc-py",
            "exporter",
            "--listen",
            "127.0.0.1:0",
            "--no-nvml",
            "--state-dir",
            str(state),
            "--hook-log",
            str(log),
            "--hook-socket",
            str(work / "hook.sock"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = exporter.stderr.readline().split()[-1]
        size = len(urllib.request.urlopen(url).read())
        http_times = timed(lambda: urllib.request.urlopen(url).read(), runs)
    finally:
        exporter.terminate()
        exporter.wait()
    processes = sum(name.isdigit() for name in os.listdir("/proc"))
    print(f"== bench/exporter.py: {count} sharing containers (fake regions: no GPU), {runs} scrapes each ==")
    print(
        f"host: {os.uname().nodename} {os.uname().release}, {os.cpu_count()} CPUs, {processes} processes; "
        f"python {sys.version.split()[0]}; a scrape is {size} bytes"
    )
    print(f"{'':<44} {'median ms':>9} {'min':>8} {'max':>8}")
    print("-" * 72)
    print(row("share status reading (nvc.commands.sharestatus)", status_times))
    print(row("collector: reading + families, rendered", collector_times))
    print(row("HTTP scrape of `nvc-py exporter`", http_times))


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:3]]
    if os.environ.get("NVC_BENCH_UNSHARED") != "1":
        os.execvpe(
            "unshare",
            ["unshare", "--mount", "--propagation", "private", sys.executable, *sys.argv],
            {**os.environ, "NVC_BENCH_UNSHARED": "1"},
        )
    main(*(args + [200, 15][len(args) :]))
