"""The hook's log (one JSON line per call, :mod:`nvc.hook.oci.log`) read as it grows: how many container
starts ended how, and how long they took.

The exporter keeps the log open and reads on from where the last scrape stopped, at most
:data:`MAX_READ` bytes a scrape (a long log is caught up over several scrapes), so a scrape costs
what was appended since the one before. A rotated log (another file at the path) is read to its end
through the descriptor still open, then the new file from its start; a truncated one (copytruncate)
is read again from its start. Lines that are not the hook's (junk, a line longer than
:data:`MAX_LINE`) are counted and skipped. Counts start at the log's beginning, so an exporter
restarted on the same log reports the same totals.
"""

from __future__ import annotations

import json
import math
import os
import stat

from nvc.records import NamedTuple

OUTCOMES = ("configured", "no-gpu", "refused", "failed")
VIA = ("server", "direct")  # run by the hook server's worker, or by a hook process of its own
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)  # seconds
# Error kinds (nvc/errors.py, the log's "error" starts with "<kind> error: ") that refuse what the
# container asked for; every other error, and a crash, is the hook failing.
REFUSALS = ("input", "requirement", "device")
MAX_LINE = 64 * 1024  # the hook's lines are a few hundred bytes, bounded by nvc.hook.oci.log
MAX_READ = 2 << 20  # bytes read at one scrape
_CHUNK = 256 * 1024


class NotHookLine(ValueError):
    """A line that is not one of the hook's JSON lines."""


class Start(NamedTuple):
    outcome: str  # one of OUTCOMES
    via: str  # one of VIA
    seconds: float | None  # None: the line has no usable duration


def parse_line(line: bytes) -> Start | None:
    """The container start a log line records; None for a line of another stage (CDI hooks);
    NotHookLine for anything that is not a hook line."""
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError):
        raise NotHookLine("not JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("stage"), str):
        raise NotHookLine("no stage")
    if doc["stage"] != "prestart":
        return None
    outcome = doc.get("outcome")
    if outcome == "error":
        error = doc.get("error")
        kind = error.partition(" error: ")[0] if isinstance(error, str) else ""
        outcome = "refused" if kind in REFUSALS else "failed"
    elif outcome == "crashed":
        outcome = "failed"
    if outcome not in OUTCOMES:
        raise NotHookLine("unknown outcome")
    duration = doc.get("duration_ms")
    seconds = None
    if (
        isinstance(duration, (int, float))
        and not isinstance(duration, bool)
        and math.isfinite(duration)
        and 0 <= duration < 1e9
    ):
        seconds = duration / 1000
    return Start(outcome, "server" if doc.get("via") == "server" else "direct", seconds)


class Tally:
    """Starts counted so far: by (outcome, via), and a histogram of their durations by via."""

    def __init__(self) -> None:
        self.starts = {(outcome, via): 0 for outcome in OUTCOMES for via in VIA}
        self.buckets = {via: [0] * len(BUCKETS) for via in VIA}  # non-cumulative: per bucket
        self.over = dict.fromkeys(VIA, 0)  # durations above the last bucket
        self.seconds = dict.fromkeys(VIA, 0.0)
        self.junk = 0

    def add(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            start = parse_line(line)
        except NotHookLine:
            self.junk += 1
            return
        if start is None:
            return
        self.starts[(start.outcome, start.via)] += 1
        if start.seconds is None:
            return
        self.seconds[start.via] += start.seconds
        counts = self.buckets[start.via]
        for i, bound in enumerate(BUCKETS):
            if start.seconds <= bound:
                counts[i] += 1
                return
        self.over[start.via] += 1


class LogTail:
    """The log at ``path``, read on at each :meth:`read`; ``tally`` holds what was read so far."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.fd = -1
        self.ident: tuple[int, int] | None = None  # (device, inode) of the file open on fd
        self.partial = b""  # the start of a line whose end is not written yet
        self.skipping = False  # inside a line longer than MAX_LINE: dropped up to its newline
        self.tally = Tally()

    @property
    def open(self) -> bool:
        return self.fd >= 0

    def read(self) -> None:
        """Read what was appended since the last call (bounded), following a rotation or truncation."""
        if self.path is None:
            return
        budget = MAX_READ - self._drain(MAX_READ)
        try:
            st = os.stat(self.path)
        except OSError:
            return  # not there (yet, or between a rotation's rename and the new file): the old one was read
        if (st.st_dev, st.st_ino) != self.ident:
            if self.fd >= 0 and budget <= 0:
                return  # the rotated file's rest first, at the next scrape
            self._open()
        elif os.fstat(self.fd).st_size < os.lseek(self.fd, 0, os.SEEK_CUR):
            os.lseek(self.fd, 0, os.SEEK_SET)  # truncated in place
            self.partial, self.skipping = b"", False
        self._drain(budget)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        self.fd, self.ident = -1, None

    def _open(self) -> None:
        """Switch to the file now at the path (only a regular file: a FIFO there would never end)."""
        self.close()
        self.partial, self.skipping = b"", False
        try:
            fd = os.open(self.path or "", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError:
            return
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return
        self.fd, self.ident = fd, (st.st_dev, st.st_ino)

    def _drain(self, budget: int) -> int:
        """Read and count up to ``budget`` bytes of the open file; how many were read."""
        done = 0
        while self.fd >= 0 and done < budget:
            try:
                chunk = os.read(self.fd, min(_CHUNK, budget - done))
            except OSError:
                self.close()
                break
            if not chunk:
                break
            done += len(chunk)
            self._feed(chunk)
        return done

    def _feed(self, chunk: bytes) -> None:
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            if self.skipping:
                self.skipping = False  # the end of the overlong line
                continue
            self.tally.add(line)
        if len(self.partial) > MAX_LINE:
            if not self.skipping:
                self.tally.junk += 1
            self.partial, self.skipping = b"", True
