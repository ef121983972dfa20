"""Container stand-ins where no runtime is needed: a process in a mount namespace of its own (its
mounts private or shared), or one that runs as uid 1000."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def _target(propagation: str) -> Iterator[int]:
    """A process in a mount namespace of its own: the container stand-in where no runtime is needed."""
    proc = subprocess.Popen(["unshare", "-m", "--propagation", propagation, "sleep", "300"])
    try:
        for _ in range(200):  # until unshare has exec'd sleep in the new namespace
            if os.readlink(f"/proc/{proc.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt"):
                break
            subprocess.run(["sleep", "0.01"])
        yield proc.pid
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


@pytest.fixture
def target_process() -> Iterator[int]:
    yield from _target("private")


@pytest.fixture
def shared_target_process() -> Iterator[int]:
    yield from _target("shared")


@pytest.fixture
def user_process() -> Iterator[int]:
    """A container stand-in (own mount namespace) whose process runs as uid 1000: configure runs
    ldconfig as that user, and a uid switch clears PDEATHSIG."""
    proc = subprocess.Popen(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "setpriv",
            "--reuid=1000",
            "--regid=1000",
            "--clear-groups",
            "sleep",
            "300",
        ]
    )
    try:
        deadline = time.monotonic() + 5
        while Path(f"/proc/{proc.pid}/status").read_text().split("Uid:")[1].split()[0] != "1000":
            assert time.monotonic() < deadline, "the stand-in never became uid 1000"
            time.sleep(0.01)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()
