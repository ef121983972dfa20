"""The processes a test started, as /proc shows them."""

from __future__ import annotations

import os
from pathlib import Path


def children() -> set[int]:
    """Pids whose parent is this test process (running or zombie)."""
    me, found = os.getpid(), set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                found.add(int(entry.name))
    return found


def status(pid: int) -> dict[str, str]:
    """Process ``pid``'s /proc status, by field."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, value in (line.split(":", 1) for line in lines)}
