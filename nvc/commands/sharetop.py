"""`nvc-py share top`: every shared GPU live, per container: memory used and its limit, the compute it
used since the last reading against its cap or weight, its latency class, backend and throttled time.

What `share status` reads (:mod:`nvc.commands.sharestatus`), read twice: :func:`frame` turns two
successive readings into a frame's rows (pure, so the tests need no terminal), :func:`text` prints a
frame as plain text (``--once``, and each screen of the live view), and :func:`live` is the thin
curses layer that redraws it in place until ``q``. Every string from a container's files is escaped
(``one_line``) before it reaches the terminal.
"""

from __future__ import annotations

import curses
import time
from collections.abc import Callable
from dataclasses import dataclass

from nvc.commands.sharestatus import ContainerShare, size_text
from nvc.errors import one_line


@dataclass(frozen=True)
class Reading:
    """One `share status` reading and when it was taken (CLOCK_MONOTONIC seconds)."""

    at: float
    containers: list[ContainerShare]


@dataclass(frozen=True)
class Row:
    """One container on one GPU (device ``-``: a container whose region holds nothing yet)."""

    container: str
    device: str
    memory_used: int
    memory_limit: int  # 0: unlimited
    compute_percent: float | None  # of the GPU since the previous reading; None: no previous reading
    cap: int  # percent, 100: none
    weight: int | None
    latency_class: str | None
    backend: str
    throttled_s: float  # cumulative
    processes: int  # the container's processes the shim registered
    note: str = ""  # why a container has no device rows


@dataclass(frozen=True)
class Frame:
    """What one screen shows: the rows by GPU, then by container, over ``seconds`` of measurement."""

    seconds: float
    rows: tuple[Row, ...]


def frame(before: Reading | None, after: Reading) -> Frame:
    """The rows of ``after``, with each device's compute over the time since ``before`` (a container
    or device absent before, or a counter that went back, as a process restarted it, counts from 0)."""
    seconds = after.at - before.at if before else 0.0
    earlier = {(c.id, d.key): d.busy_s for c in before.containers for d in c.devices} if before else {}
    rows: list[Row] = []
    for c in after.containers:
        if not c.devices:
            note = "no CUDA process yet" if c.region.startswith("not initialised") else c.region
            rows.append(Row(c.id, "-", 0, 0, None, 100, None, None, "-", 0.0, len(c.processes), note))
        for d in c.devices:
            busy = d.busy_s  # SM-weighted GPU seconds of its measured launches (a cap's or a weight's)
            used = busy - earlier.get((c.id, d.key), 0.0)
            # launches settle at their end: one that ran across the last reading counts here whole,
            # so a device kept busy can sum past the interval; the GPU gave at most all of it
            compute = min(100.0, 100 * max(used if used >= 0 else busy, 0.0) / seconds) if seconds > 0 else None
            rows.append(
                Row(
                    c.id,
                    d.key,
                    d.memory_used,
                    d.memory_limit,
                    compute,
                    d.compute_percent,
                    d.weight,
                    d.latency_class,
                    d.backend,
                    d.throttled_s,
                    len(c.processes),
                )
            )
    rows.sort(key=lambda r: (r.device == "-", r.device, r.container))
    return Frame(seconds, tuple(rows))


_COLUMNS = f"{'CONTAINER':<20} {'MEMORY':>9} {'LIMIT':>9} {'COMPUTE':>8} {'CAP/WEIGHT':>10} {'LATENCY':<8} {'BACKEND':<9} {'THROTTLED':>9} {'PROCS':>5}"


def _against(row: Row) -> str:
    """The bound the compute is measured against: its cap, its weight, or none."""
    parts = ([f"cap {row.cap}%"] if 0 < row.cap < 100 else []) + ([f"w {row.weight}"] if row.weight else [])
    return " ".join(parts) or "-"


def _line(row: Row) -> str:
    compute = "-" if row.compute_percent is None else f"{row.compute_percent:.1f}%"
    limit = size_text(row.memory_limit) if row.memory_limit else "none"
    return (
        f"{one_line(row.container, 20):<20} {size_text(row.memory_used):>9} {limit:>9} {compute:>8} "
        f"{_against(row):>10} {one_line(row.latency_class or '-', 8):<8} {one_line(row.backend, 9):<9} "
        f"{row.throttled_s:>8.1f}s {row.processes:>5}"
    )


def text(f: Frame, title: str = "") -> str:
    """A frame as plain text: a header, then per GPU its line and one line per container on it."""
    measured = f"compute over the last {f.seconds:.1f} s" if f.seconds > 0 else "compute: one reading, no interval yet"
    lines = [f"nvc-py share top{title}: {len({r.container for r in f.rows})} containers, {measured}"]
    if not f.rows:
        return lines[0] + "\nno container shares a GPU on this host\n"
    device = None
    for row in f.rows:
        if row.device != device:
            device = row.device
            on = [r for r in f.rows if r.device == device]
            if device == "-":
                lines.append("\nnot yet on a GPU")
            else:
                total = sum(r.compute_percent or 0.0 for r in on)
                memory = size_text(sum(r.memory_used for r in on))
                lines.append(f"\nGPU {one_line(device, 64)}: {len(on)} containers, {memory} used, compute {total:.1f}%")
            lines.append(_COLUMNS)
        lines.append(f"{one_line(row.container, 20):<20} {one_line(row.note)}" if row.device == "-" else _line(row))
    return "\n".join(lines) + "\n"


def once(read: Callable[[], list[ContainerShare]], interval: float) -> str:
    """One frame measured over ``interval`` seconds, as text (``--once``)."""
    before = Reading(time.monotonic(), read())
    time.sleep(interval)
    return text(frame(before, Reading(time.monotonic(), read())))


def live(read: Callable[[], list[ContainerShare]], interval: float) -> None:
    """Redraws the frame in place every ``interval`` seconds until ``q`` (or Ctrl-C)."""
    try:
        curses.wrapper(_loop, read, interval)
    except KeyboardInterrupt:
        pass  # Ctrl-C quits as q does; the wrapper has restored the terminal


def _loop(screen: curses.window, read: Callable[[], list[ContainerShare]], interval: float) -> None:
    try:
        curses.curs_set(0)
    except curses.error:
        pass  # a terminal that cannot hide its cursor shows it
    screen.timeout(int(interval * 1000))
    before: Reading | None = None
    while True:
        now = Reading(time.monotonic(), read())
        _draw(screen, text(frame(before, now), f" (every {interval:g} s, q quits)"))
        before = now
        if screen.getch() in (ord("q"), ord("Q")):
            return


def _draw(screen: curses.window, shown: str) -> None:
    """The frame's lines, cut to the window (curses refuses to write past its edge)."""
    height, width = screen.getmaxyx()
    screen.erase()
    for y, line in enumerate(shown.splitlines()[:height]):
        screen.addnstr(y, 0, line, width - 1)
    screen.refresh()
