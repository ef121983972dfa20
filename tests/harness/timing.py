"""Timing container starts for the benchmarks under bench/ (medians printed as table rows)."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
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


@contextmanager
def bench_workdir(prefix: str) -> Iterator[Path]:
    """A fresh directory on a tmpfs of its own for a bench's bundles and rootfs. Creating a file is not the
    same cost on every file system: ext4 without a journal (the H100 machine's root) looks past every inode
    freed in the last 30 s for each one it gives out (docs/performance.md), so with the bundles there each row
    of a bench would pay for the files the rows before it deleted. A journaled ext4 or XFS, where engines keep
    containers, has no such search; a tmpfs neither, and it is the same for every row."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        work = Path(tmp)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "nvc-bench", str(work)], check=True)
        try:
            yield work
        finally:
            subprocess.run(["umount", "--lazy", str(work)], check=True)


def hybrid_cgroups(mountinfo: str) -> bool:
    """Whether a host mounts v1 cgroup hierarchies beside the v2 one (systemd's hybrid layout), which crun
    1.8 refuses to run a container on ("cgroups in hybrid mode not supported")."""
    from nvc.apply.cgroups import parse_mountinfo

    kinds = {mount.fstype for mount in parse_mountinfo(mountinfo)}
    return kinds == {"cgroup", "cgroup2"}


def bench_runtime(asked: str | None) -> tuple[str, str]:
    """The runtime a bench starts its containers with (its path) and why: the one asked for; else crun where
    it is installed, as the reference's measurements, but for a host with hybrid cgroups (crun refuses it);
    else runc. SystemExit where it is not installed."""
    if asked:
        name, why = asked, "asked for"
    elif not shutil.which("crun"):
        name, why = "runc", "crun is not installed"
    elif hybrid_cgroups(Path("/proc/self/mountinfo").read_text()):
        name, why = "runc", "crun refuses this host's hybrid cgroups (v1 and v2 mounted side by side)"
    else:
        name, why = "crun", "the default"
    path = shutil.which(name)
    if path is None:
        raise SystemExit(f"{name} is not installed (--runtime names another)")
    return path, why


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
