#!/usr/bin/env python3
"""Container start overhead of the hook an installed nvc-py registered where podman reads hooks.

For a host where nvc-py is installed (the Debian package, or make install and `nvc-py setup podman`)
and no podman runs (the GPU machine): the prestart entry of the hooks.d file found where podman would
read it (containers.conf's hooks_dir, resolved as podman resolves it) is given to crun as podman
would pass it on, unchanged: its program (the native front), its fixed environment (the default
configuration), so a call is served by the installed server (systemd's socket, or one the hook
starts on demand). Rows, interleaved in each round after one warm-up round, same runtime and
command (``true``), each container on an overlay of one rootfs (an engine's snapshot) mounted before the
clock starts, all on a tmpfs of the bench's own (harness.timing.bench_workdir):

  no hook                       the baseline
  hooks.d entry, GPU 0          NVIDIA_VISIBLE_DEVICES=0
  hooks.d entry, no GPU         nothing asked: what the hook costs every other container

Medians of the rounds, each as its overhead over the no-hook start of the same run. Run it with the
interpreter of the installed nvc-py (``/usr/lib/nvc-py/venv/bin/python bench/hooksd_start.py``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from harness.bundle import make_bundle  # noqa: E402
from harness.rootfs import RootfsCache, overlay_rootfs  # noqa: E402
from harness.timing import bench_workdir, median_row, start_container  # noqa: E402

ROWS = (("no hook", None), ("hooks.d entry, GPU 0", {"NVIDIA_VISIBLE_DEVICES": "0"}), ("hooks.d entry, no GPU", {}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="rounds after the warm-up (default 15)")
    parser.add_argument("--runtime", default="crun", help="the OCI runtime (default crun)")
    args = parser.parse_args()
    from nvc.hook.setup import hooksdirs

    runtime = shutil.which(args.runtime) or sys.exit(f"bench/hooksd_start.py: {args.runtime} not found")
    resolved = hooksdirs.resolve(hooksdirs.PODMAN)
    entry_file = Path(resolved.target) / "oci-nvc-py-hook.json"
    if not entry_file.is_file():
        sys.exit(f"bench/hooksd_start.py: no {entry_file}: install the package, or run `nvc-py setup podman`")
    hook = json.loads(entry_file.read_text())["hook"]
    print(
        f"== bench/hooksd_start.py: {hooksdirs.described(hooksdirs.PODMAN, resolved)}; entry {entry_file}: "
        f"{hook['path']} {' '.join(hook['args'][1:])}; runtime {runtime}; {args.runs} rounds ==",
        flush=True,
    )
    times: dict[str, list[float]] = {label: [] for label, _ in ROWS}
    failures = []
    with bench_workdir("nvc-bench-hooksd-") as work:
        base = RootfsCache(work / "cache").get("debian")
        for round_no in range(args.runs + 1):
            for row_no, (label, env) in enumerate(ROWS):
                bundle = work / f"b{round_no}-{row_no}"
                bundle.mkdir()
                with overlay_rootfs(base, bundle) as rootfs:
                    hooks = None if env is None else {"prestart": [hook]}
                    make_bundle(bundle, rootfs, ["true"], env=env or {}, hooks=hooks)
                    elapsed, error = start_container(runtime, work / "state", bundle, f"nvc-hooksd-{round_no}-{row_no}")
                shutil.rmtree(bundle, ignore_errors=True)
                if error:
                    failures.append(f"{label}: {error}")
                elif round_no:
                    times[label].append(elapsed)
    for message in failures[:5]:
        print(f"FAILED {message}")
    if failures:
        return 1
    header = f"{'container start (start to exit of `true`)':<44} {'median ms':>9} {'min':>7} {'max':>7}  vs no hook"
    print(f"\n{header}\n{'-' * len(header)}")
    baseline = statistics.median(times[ROWS[0][0]])
    for label, _ in ROWS:
        m = statistics.median(times[label])
        note = "1.00 (baseline)" if label == ROWS[0][0] else f"{m / baseline:.2f}  (+{m - baseline:.1f} ms overhead)"
        print(median_row(label, times[label], note))
    return 0


if __name__ == "__main__":
    sys.exit(main())
