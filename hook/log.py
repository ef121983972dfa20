"""One structured line per hook invocation, appended to the configured log file.

A JSON object per line (time, container id, stage, devices, capabilities, duration in ms,
outcome, error) so that start storms can be audited with ``jq`` and nothing has to parse
free text. Each line goes out in a single ``write`` to an ``O_APPEND`` descriptor, so
concurrent hooks (32 containers starting at once) never interleave their lines.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}  # logging's numbers, without importing it


def line(**fields: Any) -> str:
    """The JSON line for ``fields``, with the current UTC time first."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    return json.dumps({"time": f"{stamp}Z", **fields}, separators=(",", ":"), sort_keys=False) + "\n"


def write(path: str | None, level: str, failed: bool, **fields: Any) -> None:
    """Append the invocation's line to ``path`` when ``level`` lets it through (failures always do).

    A log that cannot be written must not fail the container: the line is dropped and the
    reason goes to stderr, which the engine shows.
    """
    if path is None or (not failed and LEVELS[level] > LEVELS["info"]):
        return
    data = line(**fields).encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
    except OSError as err:
        os.write(2, f"nvc-py-hook: cannot open log {path}: {err.strerror}\n".encode())
        return
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
