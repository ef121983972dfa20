"""bench/hook_load.py's choice of rows (``--row``), without running a storm."""

from __future__ import annotations

import subprocess
import sys

from harness.benchscript import REPO, load


def test_chosen_rows_keep_the_baseline_and_a_fault_rows_healthy_storm_in_order() -> None:
    bench = load("hook_load")
    labels = [row.label for row in bench.chosen(bench.ROWS, {"server, GPU 0, killed", "installed, setup's server"})]
    assert labels == ["no hook", "installed, setup's server", "server, GPU 0", "server, GPU 0, killed"]
    assert bench.chosen(bench.ROWS, set()) == bench.ROWS


def test_an_unknown_row_is_refused_before_anything_runs() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "hook_load.py"), "--row", "server, GPU 9"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--row: no such row: server, GPU 9" in done.stderr, done.stderr
