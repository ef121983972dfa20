"""``--debug FILE``: append a glog-style log of what nvc-py decided and why.

Lines read ``I1122 08:56:01.123456 4242 driver.py:97] message`` (level letter, month
and day, time with microseconds, process id, source location), the reference tool's
format, so existing log tooling can read both. A message is one line, escaped and bounded.
"""

from __future__ import annotations

import logging
import time

from nvc.errors import InputError, one_line

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


def enable(path: str) -> logging.Handler:
    """Send the ``nvc`` loggers' records, debug level and up, to ``path`` (appended)."""
    try:
        handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    except OSError as err:
        raise InputError(f"{path}: cannot open debug log: {err.strerror}") from None
    handler.setFormatter(GlogFormatter())
    logger = logging.getLogger("nvc")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    return handler
