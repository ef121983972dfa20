"""Timing container starts for the benchmarks under bench/ (medians printed as table rows)."""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

FAKE_MACHINE = Path(__file__).resolve().parent.parent / "fakedriver" / "machines" / "local-nvidia.yaml"


class BenchDriver:
    """The driver a benchmark runs on: the real one where the host has one (and ``fake`` is not asked),
    else the test suite's fake driver (one fake H100, a test double), built in ``work``. ``root`` is the
    driver root for nvc-py's configuration; ``activation`` shows a fake one at the real paths while it is
    entered (a no-op for the real one); ``real`` says which, so a table can say that fake figures are not
    GPU results."""

    def __init__(self, work: Path, fake: bool = False) -> None:
        version = Path("/proc/driver/nvidia/version")
        self.real = version.exists() and not fake
        self.activation: AbstractContextManager[Any]
        if self.real:
            self.root, self.activation = "/", nullcontext()
            self.version = version.read_text().splitlines()[0].strip()
        else:
            from fakedriver.activate import activate
            from fakedriver.build import build

            built = build(FAKE_MACHINE, work / "fake")
            self.root, self.activation, self.version = str(built.root), activate(built), ""


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


def drop_page_cache() -> None:
    """What a first start after boot finds: nothing of the runtime's, the package's or the image's files in
    the page cache (written back first; pages mapped by running processes, a server's, stay)."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
