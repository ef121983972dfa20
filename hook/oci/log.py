"""One structured line per hook invocation, appended to the configured log file.

A JSON object per line (time, container id, stage, devices, capabilities, duration in ms,
outcome, error) so that start storms can be audited with ``jq`` and nothing has to parse
free text. Each line goes out in a single ``write`` to an ``O_APPEND`` descriptor, so
concurrent hooks (32 containers starting at once) never interleave their lines.

Fields carry what images asked for (devices, errors quoting env values), so a line is bounded:
strings are cut at :data:`MAX_STRING` characters and arrays at :data:`MAX_ITEMS` entries, each
with a marker, and their unprintable characters escaped (JSON alone would let ``jq -r`` print an
image's terminal escapes raw).
"""

from __future__ import annotations

import json
import os
import time

from nvc.errors import one_line
from nvc.system.untrusted import open_append

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}  # logging's numbers, without importing it
MAX_STRING = 1000  # characters of one string field (an error message is cut at as many)
MAX_ITEMS = 16  # entries of one array or object field


def bounded(value: Any) -> Any:
    """``value`` with long strings, arrays and objects cut, the cuts marked."""
    if isinstance(value, str):
        return one_line(value, MAX_STRING)
    if isinstance(value, (list, tuple)):
        more = [f"... (+{len(value) - MAX_ITEMS} more)"] if len(value) > MAX_ITEMS else []
        return [bounded(v) for v in value[:MAX_ITEMS]] + more
    if isinstance(value, dict):
        items = list(value.items())
        kept = {bounded(str(k)): bounded(v) for k, v in items[:MAX_ITEMS]}
        if len(items) > MAX_ITEMS:
            kept["..."] = f"+{len(items) - MAX_ITEMS} more"
        return kept
    return value


def line(**fields: Any) -> str:
    """The JSON line for ``fields``, with the current UTC time first."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    return (
        json.dumps(
            {"time": f"{stamp}Z", **{k: bounded(v) for k, v in fields.items()}}, separators=(",", ":"), sort_keys=False
        )
        + "\n"
    )


def write(path: str | None, level: str, failed: bool, **fields: Any) -> None:
    """Append the invocation's line to ``path`` when ``level`` lets it through (failures always do).

    A log that cannot be written must not fail the container: the line is dropped and the
    reason goes to stderr, which the engine shows. The file is opened without blocking (a FIFO
    without a reader is such a log, not a wait: :func:`nvc.system.untrusted.open_append`).
    """
    if path is None or (not failed and LEVELS[level] > LEVELS["info"]):
        return
    data = line(**fields).encode()
    try:
        fd = open_append(path)
    except OSError as err:
        _warn(f"warning: cannot open log {path}: {err.strerror}")
        return
    try:
        os.write(fd, data)
    except OSError as err:
        _warn(f"warning: cannot write log {path}: {err.strerror}")
    finally:
        os.close(fd)


def _warn(text: str) -> None:
    """One line on stderr, unless stderr cannot take it either (closed, full): then it is lost."""
    try:
        os.write(2, f"nvc-py-hook: {one_line(text)}\n".encode(errors="backslashreplace"))
    except OSError:
        pass
