"""The standard streams of nvc-py's programs: output that cannot be written is one line and a stable status.

A caller may start a program with stdout closed (``>&-``), on /dev/full or on a pipe whose reader
is gone. Python then leaves ``sys.stdout`` None (click prints nothing, and the first file the
program opens becomes descriptor 1: the output would land in it), or raises OSError from
whichever print meets the failure: a traceback, or status 120 from the interpreter's exit.
:func:`guarded` runs a program's main with:

- descriptors 0, 1 and 2 that were closed opened on /dev/null (stdin readable, empty; stdout and
  stderr read-only, so a write fails as on the closed descriptor), so nothing the program opens
  takes their place (:func:`reopen_closed`, which the programs also call first thing);
- stdout writing through :class:`_Sink`: its first failed write raises
  :class:`~nvc.errors.OutputError` (the caller did not get the result: the command failed, with
  that status, 12), later ones are dropped; stderr the same, except that its failures are only
  dropped (there is nowhere left to tell). Text that the locale cannot encode (a path's
  undecodable bytes) is written escaped, never refused;
- at the end stdout flushed (its failure is the command's), and output lost elsewhere (the
  debug log: :func:`lost`) turning a success into OutputError's status, told in one line.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable  # loaded already by the launchers' code cache: typing is not

from nvc.errors import NvcError, OutputError

_LOST: list[str] = []  # what could not be written besides stdout, one line each


class _Sink(io.RawIOBase):
    """Descriptor ``fd`` as the raw stream under ``sys.stdout`` or ``sys.stderr``. ``what`` names
    it in the error its first failed write raises; None: failures are dropped silently."""

    def __init__(self, fd: int, what: str | None) -> None:
        super().__init__()
        self.fd, self.what, self.failed = fd, what, False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def isatty(self) -> bool:
        return os.isatty(self.fd)

    def write(self, data: bytes) -> int:  # type: ignore[override]
        if self.failed:
            return len(data)  # told once already
        try:
            return os.write(self.fd, data)
        except OSError as err:
            self.failed = True
            if self.what is None:
                return len(data)
            raise OutputError(f"cannot write {self.what}: {err.strerror}") from None


def _on_descriptor(stream: object, fd: int) -> bool:
    """Whether ``stream`` is None or writes to descriptor ``fd`` (not a test's capture)."""
    if stream is None:
        return True
    try:
        return stream.fileno() == fd  # type: ignore[attr-defined]
    except (OSError, ValueError, AttributeError):
        return False


def reopen_closed() -> None:
    """Descriptors 0 to 2 that are closed opened on /dev/null (see the module); called first thing
    by each program, before anything it opens (a helper's socket) could take their place."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:  # the lowest free descriptor, since those below it are open: ``fd`` itself
            os.set_inheritable(os.open(os.devnull, os.O_RDONLY), True)  # what the program runs gets it
    if sys.stdin is None:
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))


def _wrap(name: str, fd: int, what: str | None) -> None:
    old = getattr(sys, name)
    if not _on_descriptor(old, fd) or isinstance(getattr(getattr(old, "buffer", None), "raw", None), _Sink):
        return
    encoding = getattr(old, "encoding", None) or "utf-8"
    line_buffering = bool(getattr(old, "line_buffering", True))
    if old is not None:
        try:
            old.flush()
        except (OSError, ValueError):
            pass
    stream = io.TextIOWrapper(
        io.BufferedWriter(_Sink(fd, what)), encoding=encoding, errors="backslashreplace", line_buffering=line_buffering
    )
    setattr(sys, name, stream)


def lost(line: str) -> None:
    """Note output that could not be written (the debug log): a command that otherwise succeeds
    fails with OutputError's status, this line telling why (the first such line only)."""
    _LOST.append(line)


def guarded(prog: str, main: Callable[[], int]) -> int:
    """``main()``'s status, the streams set up as the module says; ``prog`` names the program in
    the line an output failure prints."""
    reopen_closed()
    _wrap("stdout", 1, "standard output")
    _wrap("stderr", 2, None)
    try:
        code = main()
        sys.stdout.flush()
    except OutputError as err:
        return _fail(prog, err)
    if code == 0 and _LOST:
        return _fail(prog, OutputError(_LOST[0]))
    return code


def _fail(prog: str, err: NvcError) -> int:
    print(f"{prog}: {err}", file=sys.stderr, flush=True)
    return err.exit_code
