"""The spare workers a hook server forks ahead of its next calls: found once it forked them all, and
stopped (SIGSTOP) to stand for a wedged server."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def stop(pids: list[int]) -> None:
    """SIGSTOP to each of ``pids``, and back once each is stopped (signals are asynchronous: a spare
    still running in accept() could take a call made right after the kill)."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    for pid in pids:
        while Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2][:1] != "T" and time.monotonic() < deadline:
            time.sleep(0.005)


def spare_pids(server: subprocess.Popen[str]) -> list[int]:
    """The spare workers of a server with no call running, once it forked them all (and a worker
    that served a call before is gone)."""
    from nvc.hook.server.loop import SPARES

    children = Path(f"/proc/{server.pid}/task/{server.pid}/children")
    deadline = time.monotonic() + 10
    while len(children.read_text().split()) != SPARES and time.monotonic() < deadline:
        time.sleep(0.05)
    return [int(pid) for pid in children.read_text().split()]
