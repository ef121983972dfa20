"""One call's exchange with its caller, on a worker's side, and the call run.

A call is a short exchange, so that a caller can give up on a wedged server without the call
running twice, and without its streams held by a worker that never ran it: the caller sends its
message with its working directory; the worker checks the caller and the message and answers
``ready PID FD`` with its own pidfd (or a refusal: ``fall back``, or ``refused N`` and one line
the caller writes on its stderr); the caller answers ``go`` with its stdin, stdout and stderr
and /proc/PID/fd/FD opened (:mod:`.peer`: a Landlocked caller cannot open it); only
then, if that last descriptor is its connection, does the worker run the call, and it answers
``exit N`` (else ``fall back``, having run nothing). A malformed message (bad counts,
missing or extra descriptors, a truncated message, a working-directory descriptor that is not a
directory, an unknown program) is refused so, with status 2. A caller that gets no status in
time kills the worker through its pidfd, as a runtime kills a hook past its timeout (so that
the caller's streams, which the runtime may wait on, are closed).
"""

from __future__ import annotations

import os
import socket
import stat
import sys
from collections.abc import Callable

from nvc.errors import InputError
from nvc.hook.server import scope
from nvc.hook.server.handover import (
    CONNECTED_ENV,
    FALL_BACK,
    GO,
    MAX_MESSAGE,
    PROGRAMS,
    READY,
    REFUSED,
    STAMP_DIGITS,
    CallError,
    parse_call,
)
from nvc.hook.server.peer import Standing, caller_shortfall, reaches_worker
from nvc.hook.server.sockets import peer_credentials, peer_pidfd
from nvc.hook.server.upgrade import stale
from nvc.system.untrusted import decimal

GO_TIMEOUT = 10.0  # seconds a worker waits for the caller's ``go`` after ``ready``

Programs = dict[str, Callable[[list[str]], int]]


class _Refused(Exception):
    """A call not run; ``answer`` is what the caller is told (None: nothing, it is gone)."""

    def __init__(self, answer: bytes | None) -> None:
        super().__init__(answer)
        self.answer = answer


def _malformed(what: str) -> _Refused:
    """The refusal of a malformed call: status 2 and the line the client writes on its stderr."""
    return _Refused(
        f"{REFUSED.decode()} {InputError.exit_code}\nnvc-py-hook serve: refused a call: {what[:200]}\n".encode()
    )


def _received(conn: socket.socket, size: int, count: int) -> tuple[bytes, list[int]]:
    """One message of at most ``size`` bytes with exactly ``count`` descriptors, or a _Refused
    naming what is wrong (the descriptors that came are closed); _Refused(None) at end of file
    (the caller is gone)."""
    data, fds, flags, _ = socket.recv_fds(conn, size, count + 1)
    if not data and not fds:
        raise _Refused(None)
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != count:
        for fd in fds:
            os.close(fd)
        raise _malformed(f"truncated message or not {count} descriptor{'s' if count > 1 else ''}")
    return data, fds


def _checked_call(conn: socket.socket, ours: Standing) -> tuple[list[str], dict[str, str], int]:
    """(argv, env, working directory's descriptor) of the call on ``conn``, or _Refused: a caller
    that must run the program itself (weaker than the server, or elsewhere: see nvc.hook.server.peer),
    another user, or a malformed call. The message is read first: a connection closed on unread
    data would reach the caller as a reset, not as the answer."""
    message, (cwd,) = _received(conn, MAX_MESSAGE, 1)
    try:
        pid, uid = peer_credentials(conn)
        if uid != os.geteuid():
            raise _Refused(REFUSED + b" 126\n")
        pidfd = peer_pidfd(conn)
        try:
            if caller_shortfall(pid, pidfd, ours) is not None:
                raise _Refused(FALL_BACK)
        finally:
            if pidfd is not None:
                os.close(pidfd)
        argv, env = parse_call(message)
        if not stat.S_ISDIR(os.fstat(cwd).st_mode):
            raise CallError("the working directory's descriptor is not a directory")
        if os.path.basename(argv[0]) not in PROGRAMS:
            raise CallError(f"{argv[0]}: not one of {', '.join(PROGRAMS)}")
    except CallError as err:
        os.close(cwd)
        raise _malformed(str(err)) from None
    except _Refused:
        os.close(cwd)
        raise
    return argv, env, cwd


def _streams_on_go(conn: socket.socket) -> list[int]:
    """After ``ready PID FD`` (this worker's pid and its connection's descriptor, which the caller
    opens as the Landlock proof of nvc.hook.server.peer; with this worker's pidfd, so that a caller that
    gets no status in time can end it; none where the kernel has no pidfd_open): the caller's
    ``go`` with its stdin, stdout, stderr and that proof, or _Refused (``fall back`` where the proof
    is not this worker's connection)."""
    try:
        pidfd = [os.pidfd_open(os.getpid())]
    except OSError:
        pidfd = []
    try:
        socket.send_fds(conn, [b"%s %d %d" % (READY, os.getpid(), conn.fileno())], pidfd)
    finally:
        for fd in pidfd:
            os.close(fd)
    conn.settimeout(GO_TIMEOUT)
    try:
        go, fds = _received(conn, 64, 4)
    except OSError:  # the caller gave up, and runs the program itself: nothing was done
        raise _Refused(None) from None
    *streams, proof = fds
    reached = reaches_worker(proof, conn.fileno())
    os.close(proof)
    if go != GO or not reached:
        for fd in streams:
            os.close(fd)
        raise _malformed("no go") if go != GO else _Refused(FALL_BACK)
    conn.settimeout(None)
    return streams


def queue_wait_ms(env: dict[str, str], accepted_ns: int) -> float | None:
    """How long a call waited for a worker: from the client's connect (its CLOCK_MONOTONIC stamp,
    which is removed from ``env``: the program never sees it) to ``accepted_ns``; None without a
    stamp, or with one that cannot be a wait (another clock: a caller in a time namespace)."""
    stamp = decimal(env.pop(CONNECTED_ENV, ""), STAMP_DIGITS)  # any caller's text: no "²", no 5000 digits
    if stamp is None:
        return None
    wait = (accepted_ns - stamp) / 1e6
    return wait if 0 <= wait < 3_600_000 else None


def run_call(
    conn: socket.socket, programs: Programs, ours: Standing, accepted_ns: int, figures: dict[str, float | None]
) -> bytes | None:
    """Worker side: check the caller and its call, take over the caller's streams, directory and
    environment once the caller says ``go``, run the call; the answer (None: none, the caller is
    gone; it runs the program itself). ``figures`` gets the call's queue wait."""
    try:
        argv, env, cwd = _checked_call(conn, ours)
    except _Refused as refused:
        return refused.answer
    figures["queue_ms"] = queue_wait_ms(env, accepted_ns)
    if not scope.served(argv) or stale():  # not the server's business, or new code: the caller runs it
        os.close(cwd)
        return FALL_BACK
    try:
        streams = _streams_on_go(conn)
    except _Refused as refused:
        os.close(cwd)
        return refused.answer
    for target, fd in enumerate(streams):
        os.dup2(fd, target)
        os.close(fd)
    os.fchdir(cwd)
    os.close(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = argv
    try:
        code = programs[os.path.basename(argv[0])](argv[1:])
    except SystemExit as done:  # sys.exit() as the console script would end (``nvc-py hook``)
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if not isinstance(done.code, (int, type(None))):
            say(str(done.code))
    except BaseException as err:  # noqa: BLE001 - the caller must get a status, whatever happened
        say(f"nvc-py-hook: internal error: {type(err).__name__}: {err}")
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:
            code = code or 1
    return f"exit {code & 0xFF}".encode()  # as the process's status would be


def say(line: str) -> None:
    """One line on the caller's stderr, if it takes one (a closed or read-only stderr does not)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
