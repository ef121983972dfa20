"""``--debug FILE``: append a glog-style log of what nvc-py decided and why.

Lines read ``I1122 08:56:01.123456 4242 driver.py:97] message`` (level letter, month
and day, time with microseconds, process id, source location), the reference tool's
format, so existing log tooling can read both. A message is one line, escaped and bounded.

The file is opened without blocking (a FIFO without a reader is refused at once:
:func:`nvc.system.untrusted.open_append`). A log that cannot be written (a full disk, /dev/full) loses its
lines, not the command's work: the handler leaves at its first failure, and the program's
guarded streams (:func:`nvc.system.stdio.lost`) tell it once the command is done.
"""

from __future__ import annotations

import logging
import os
import time

from nvc.errors import InputError, one_line
from nvc.system.untrusted import open_append

MAX_MESSAGE = 4000  # characters of one message: messages quote what images asked for


class GlogFormatter(logging.Formatter):
    """Formats records in glog's layout."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(record.created))
        usec = int((record.created % 1) * 1_000_000)
        line = (
            f"{record.levelname[0]}{stamp}.{usec:06d} {record.process} "
            f"{record.filename}:{record.lineno}] {one_line(record.getMessage(), MAX_MESSAGE)}"
        )
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _Handler(logging.Handler):
    """Appends each record to the debug log with one ``write`` (no buffer left to fail again later);
    at its first failure it leaves, the loss noted (see the module)."""

    def __init__(self, path: str, fd: int) -> None:
        super().__init__()
        self.path, self.fd = path, fd

    def emit(self, record: logging.LogRecord) -> None:
        line = self.format(record) + "\n"
        try:
            os.write(self.fd, line.encode("utf-8", "backslashreplace"))
        except OSError as err:
            from nvc.system import stdio

            logging.getLogger("nvc").removeHandler(self)
            stdio.lost(f"{self.path}: debug log not written: {err.strerror}")


def enable(path: str) -> logging.Handler:
    """Send the ``nvc`` loggers' records, debug level and up, to ``path`` (appended)."""
    try:
        fd = open_append(path)
    except OSError as err:
        raise InputError(f"{path}: cannot open debug log: {err.strerror}") from None
    handler = _Handler(path, fd)
    handler.setFormatter(GlogFormatter())
    logger = logging.getLogger("nvc")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    return handler
