"""Module loggers that leave :mod:`logging` unimported until a record can go somewhere.

Importing logging (with traceback, threading, string...) costs milliseconds at every hook
start, and without ``--debug`` no debug record goes anywhere: a debug record is handed to
logging only once it is imported (by :mod:`nvc.debuglog`'s set-up, or by a host program
that may have configured handlers), so nothing changes for those. Errors always go through
logging, whose last-resort handler prints them when nothing was set up.
"""

from __future__ import annotations

import sys


class Logger:
    """The ``debug``/``warning``/``error`` part of ``logging.getLogger(name)``, as the modules use it."""

    def __init__(self, name: str) -> None:
        self.name = name

    def debug(self, msg: str, *args: object) -> None:
        logging = sys.modules.get("logging")
        if logging is not None:  # stacklevel 2: the record names the caller's file and line
            logging.getLogger(self.name).debug(msg, *args, stacklevel=2)

    def warning(self, msg: str, *args: object) -> None:
        """Something left out that the user should hear about; printed like an error."""
        import logging

        logging.getLogger(self.name).warning(msg, *args, stacklevel=2)

    def error(self, msg: str, *args: object) -> None:
        import logging

        logging.getLogger(self.name).error(msg, *args, stacklevel=2)
