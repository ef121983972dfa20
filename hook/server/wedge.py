"""Telling a wedged hook server from a busy one (the Python client's side; native/client/wedge.c is the
native client's, and the two follow the same rules).

A call waits at most :data:`nvc.hook.server.handover.ACK_TIMEOUT` for the server's ``ready``, then runs the
program itself. Without more, a wedged server would cost every container start that timeout, until
someone noticed. Two things let a call learn it at once:

- The listening process's own state: the server is the process that called listen(), which
  SO_PEERCRED names on every connection. One that is stopped (SIGSTOP, a tracer's stop) answers
  nothing; a call sees it as it connects, and again every :data:`SLICE` while it waits. (A dead
  one is no wedge: its idle workers die with it, and the kernel resets the calls it left queued.)
- For a server wedged otherwise (its workers hung while the listener runs): the first call that
  times out leaves a marker, :data:`MARKER` beside the socket. Calls that find it fresh (less than
  :data:`RETRY` seconds old) run the program at once, and so do calls already waiting when it
  appears; once it is older, one call (the one that takes the marker's lock) tries the server again,
  and the marker goes when a server answers it. A server removes it as it starts listening.

The marker is trusted under the socket directory's rules (the client checked the directory first):
a regular file of root's that group and others cannot write, opened without following a link or
blocking. Anything else there is ignored, never written through. Only os, time and (to take the
lock) fcntl are imported: this runs before every handed-over call.
"""

from __future__ import annotations

import os
import time

MARKER = "server.wedged"  # as native/client/wedge.h's WEDGED_NAME
RETRY = 10  # seconds a marker keeps calls away before one call tries the server again
SLICE = 0.02  # seconds between two looks of a call waiting for ``ready``
NONE, FRESH, PROBE = "none", "fresh", "probe"  # what marker() finds
STOPPED_STATES = b"Tt"  # /proc/PID/stat states of a stopped process: by a signal, by its tracer


def stopped(pid: int) -> bool:
    """Whether process ``pid`` (a listener's, from SO_PEERCRED; 0: unknown) is stopped; False where
    that cannot be told (another pid namespace's /proc, say)."""
    if pid <= 0:
        return False
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        line = os.read(fd, 512)
    except OSError:
        return False
    finally:
        os.close(fd)
    state = line.rpartition(b") ")[2][:1]  # the name may hold anything, ")" too
    return bool(state) and state in STOPPED_STATES


def _trusted(st: os.stat_result) -> bool:
    import stat

    return stat.S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022


def _fresh(st: os.stat_result) -> bool:
    now = time.time()
    return st.st_mtime <= now < st.st_mtime + RETRY


def marker(dirfd: int) -> tuple[str, int]:
    """(NONE, FRESH or PROBE, the marker's descriptor for PROBE, else -1) in the checked socket
    directory ``dirfd``. With PROBE this call holds the marker (locked, its time set to now, so other
    calls keep away while it tries the server): :func:`clear` it once a server answered; close it."""
    try:
        fd = os.open(MARKER, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dirfd)
    except OSError:
        return NONE, -1
    st = os.fstat(fd)
    if not _trusted(st):
        os.close(fd)
        return NONE, -1
    if not _fresh(st):
        import fcntl

        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another call is trying the server
            pass
        else:
            os.utime(fd)
            return PROBE, fd
    os.close(fd)
    return FRESH, -1


def fresh(dirfd: int) -> bool:
    """Whether a fresh marker stands in ``dirfd`` now (another call timed out meanwhile)."""
    try:
        st = os.stat(MARKER, dir_fd=dirfd, follow_symlinks=False)
    except OSError:
        return False
    return _trusted(st) and _fresh(st)


def mark(dirfd: int) -> None:
    """Mark the server wedged: a call got no ``ready`` in time."""
    try:
        fd = os.open(
            MARKER, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=dirfd
        )
    except OSError:
        return
    try:
        if _trusted(os.fstat(fd)):
            os.utime(fd)  # one that was there already is fresh again
    finally:
        os.close(fd)


def clear(dirfd: int) -> None:
    """A server answered the call that held the marker: the mark goes."""
    try:
        os.unlink(MARKER, dir_fd=dirfd)
    except OSError:
        pass
