"""Ending a one-shot program (``nvc-py``, ``nvc-py-hook``) without the interpreter's teardown.

Tearing down the interpreter (every imported module) costs about as much as a whole
``nvc-py list`` on the fast path, at every container start, and there is nothing left to
clean up: helpers were reaped (a
preforked one never used dies with this process, by its parent-death signal), the hook
log is written with one ``write`` and closed, the debug log is flushed per record, and
the kernel closes the rest.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Exit with ``code`` once stdout and stderr are flushed; a failed flush (a closed pipe:
    the output is lost) turns a success into status 1."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:
            code = code or 1
    os._exit(code)
