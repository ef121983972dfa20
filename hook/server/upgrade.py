"""New code takes effect when the server restarts: the installed code's stamp, taken as the server
starts and compared by each worker before it runs a call."""

from __future__ import annotations

import os
import signal

_started_code: tuple[tuple[int, int], ...] = ()  # code_stamp() when the server started


def code_stamp() -> tuple[tuple[int, int], ...]:
    """Inode and modification time of each installed package directory (nvc, nvc.hook, nvc.rpc).

    An upgrade (pip, make install) replaces the files there, which changes the directories; a
    server running the code it imported before would serve stale code. Three stats per call."""
    import nvc
    import nvc.hook
    import nvc.rpc

    stamps = []
    for package in (nvc, nvc.hook, nvc.rpc):
        st = os.stat(os.path.dirname(package.__file__ or "."))
        stamps.append((st.st_ino, st.st_mtime_ns))
    return tuple(stamps)


def note_start() -> None:
    """Take the stamp the server's workers compare with (:func:`stale`): before the first fork."""
    global _started_code
    _started_code = code_stamp()


def changed() -> bool:
    """Whether nvc-py's installed code changed since the server started (or cannot be read)."""
    try:
        return code_stamp() != _started_code
    except OSError:
        return True


def stale() -> bool:
    """:func:`changed`, in a worker; if so the server is told to stop (SIGTERM): an on-demand one
    unlinks its socket and the next hook call starts a server of the new code, a socket-activated one
    is started again by systemd at the next connection, and one that stays starts its successor."""
    if changed():
        os.kill(os.getppid(), signal.SIGTERM)
        return True
    return False
