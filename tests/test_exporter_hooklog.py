"""``nvc-py exporter`` (nvc/exporter/): the hook log's reader (starts by outcome, junk, partial lines,
rotation, truncation, a bounded read, a FIFO at its path).

Test double only: no figure here is a GPU result.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nvc.exporter import hooklog


def _line(**fields: object) -> bytes:
    return json.dumps({"time": "2025-01-01T00:00:00Z", "stage": "prestart", "container": "c", **fields}).encode()


# ---------------------------------------------------------------- the hook's log


@pytest.mark.parametrize(
    ("fields", "start"),
    [
        (
            {"outcome": "configured", "duration_ms": 42.5, "via": "server"},
            hooklog.Start("configured", "server", 0.0425),
        ),
        ({"outcome": "no-gpu", "duration_ms": 3}, hooklog.Start("no-gpu", "direct", 0.003)),
        (
            {"outcome": "error", "error": "input error: NVC_SHARE_MEMORY_LIMIT='lots': not a size", "duration_ms": 9},
            hooklog.Start("refused", "direct", 0.009),
        ),
        (
            {"outcome": "error", "error": "requirement error: cuda>=99 not satisfied"},
            hooklog.Start("refused", "direct", None),
        ),
        (
            {"outcome": "error", "error": "driver error: nvml error: unknown", "duration_ms": "9"},
            hooklog.Start("failed", "direct", None),
        ),
        ({"outcome": "crashed", "duration_ms": float("inf")}, hooklog.Start("failed", "direct", None)),
        (
            {"outcome": "error", "error": ["input error: not a string"], "duration_ms": -1},
            hooklog.Start("failed", "direct", None),
        ),
        ({"stage": "create-symlinks", "outcome": "done"}, None),
    ],
)
def test_a_log_line_is_a_start_by_outcome(fields: dict, start: hooklog.Start | None) -> None:
    assert hooklog.parse_line(_line(**fields)) == start


@pytest.mark.parametrize(
    "line",
    [
        b"not json",
        b"[1, 2]",
        b'{"outcome": "configured"}',
        _line(outcome="sideways"),
        b"\xff\xfe\x1b[2J",
        b"[" * 100000,
    ],
)
def test_junk_is_not_a_start(line: bytes) -> None:
    with pytest.raises(hooklog.NotHookLine):
        hooklog.parse_line(line)


def _starts(tally: hooklog.Tally) -> dict[tuple[str, str], int]:
    return {k: n for k, n in tally.starts.items() if n}


def test_the_log_is_read_on_across_partial_lines_rotation_truncation_and_junk(tmp_path: Path) -> None:
    log = tmp_path / "hook.log"
    tail = hooklog.LogTail(str(log))
    tail.read()  # no log yet
    assert not tail.open and _starts(tail.tally) == {}
    ok = _line(outcome="configured", duration_ms=20) + b"\n"
    log.write_bytes(ok + b"junk\x1b[2J\n" + ok[:30])  # the last line still being written
    tail.read()
    assert _starts(tail.tally) == {("configured", "direct"): 1} and tail.tally.junk == 1
    with log.open("ab") as f:
        f.write(ok[30:] + b"x" * (hooklog.MAX_LINE + 10))  # the line's end, then an overlong line's start
    tail.read()
    assert _starts(tail.tally) == {("configured", "direct"): 2} and tail.tally.junk == 2
    with log.open("ab") as f:
        f.write(b"y" * 100 + b"\n" + _line(outcome="no-gpu") + b"\n")  # the overlong line ends: skipped
    tail.read()
    assert _starts(tail.tally) == {("configured", "direct"): 2, ("no-gpu", "direct"): 1} and tail.tally.junk == 2
    with log.open("ab") as f:  # logrotate: the old file gets a last line after the rename, then a new file
        os.rename(log, tmp_path / "hook.log.1")
        f.write(_line(outcome="crashed") + b"\n")
    log.write_bytes(_line(outcome="configured", via="server", duration_ms=50000) + b"\n")
    tail.read()
    assert _starts(tail.tally) == {
        ("configured", "direct"): 2,
        ("no-gpu", "direct"): 1,
        ("failed", "direct"): 1,
        ("configured", "server"): 1,
    }
    assert tail.tally.over["server"] == 1 and tail.tally.seconds["server"] == 50.0
    os.truncate(log, 0)  # copytruncate
    log.write_bytes(_line(outcome="no-gpu", via="server", duration_ms=1) + b"\n")
    tail.read()
    assert _starts(tail.tally)[("no-gpu", "server")] == 1 and tail.tally.buckets["server"][0] == 1
    tail.close()


def test_a_scrape_reads_a_bounded_part_of_a_long_log(tmp_path: Path) -> None:
    line = _line(outcome="configured", duration_ms=20) + b"\n"
    lines = 2 * hooklog.MAX_READ // len(line) + 1
    log = tmp_path / "hook.log"
    log.write_bytes(line * lines)
    tail = hooklog.LogTail(str(log))
    tail.read()
    first = tail.tally.starts[("configured", "direct")]
    assert 0 < first <= hooklog.MAX_READ // len(line)
    for _ in range(3):
        tail.read()
    assert tail.tally.starts[("configured", "direct")] == lines and tail.tally.junk == 0
    tail.close()


def test_a_fifo_at_the_log_path_is_not_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "hook.log")
    tail = hooklog.LogTail(str(tmp_path / "hook.log"))
    tail.read()  # would block on open or read
    assert not tail.open
