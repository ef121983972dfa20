"""Timing container starts for the benchmarks under bench/ (medians printed as table rows)."""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path


def start_container(runtime: str, state: Path, bundle: Path, cid: str) -> tuple[float, str | None]:
    """Start-to-exit time in ms of ``RUNTIME run``, and an error message if it failed."""
    argv = [runtime, "--root", str(state), "run", "--bundle", str(bundle), cid]
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    elapsed = (time.perf_counter() - t0) * 1e3
    subprocess.run([runtime, "--root", str(state), "delete", "-f", cid], capture_output=True)
    return elapsed, None if r.returncode == 0 else f"rc {r.returncode}: {r.stderr.strip()[-400:]}"


def median_row(label: str, values: list[float], note: str = "") -> str:
    return f"{label:<44} {statistics.median(values):>9.1f} {min(values):>7.1f} {max(values):>7.1f}  {note}"
