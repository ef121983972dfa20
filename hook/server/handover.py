"""Handing one ``nvc-py`` or ``nvc-py-hook`` call to a running hook server (:mod:`nvc.hook.server`).

The wire format the server reads, and its Python client. The console scripts call
:func:`hand_over` first thing: where root's server answers, the call runs in one of its warm
workers and this interpreter exits with the worker's status, having imported nothing else (an
interpreter start costs ~15 ms, nvc-py's imports ~100 ms more); anywhere else it returns and
the call runs here. ``native/client/hook_client.c`` is the same client without the interpreter.

A call is SOCK_SEQPACKET messages. The caller's first: MAGIC, argc, envc, then argv and
``NAME=VALUE`` strings, each NUL-terminated, with its working directory attached (SCM_RIGHTS).
The server answers ``ready PID FD`` with the worker's pidfd attached (the call is accepted;
PID is the worker's, FD the number of its end of the connection), ``fall back`` (the caller must
run the program itself: nothing was done) or ``refused N``, a newline and a line for the
caller's stderr (N: the caller's status). Any other answer before ``ready PID FD`` (an older
server's) means nothing was done either: the caller runs the program itself, and so does a
caller that cannot open ``/proc/PID/fd/FD`` (O_PATH): a Landlocked one (nvc.hook.server.peer). After
``ready`` the caller sends ``go`` with its stdin, stdout, stderr and that descriptor attached,
and the server answers ``exit N`` when the call is done, or ``fall back`` when the descriptor
is not the worker's connection (nothing was run). The message is unchanged from the exchange
before the Landlock proof, so that a server of that exchange still running after an upgrade
answers ``fall back`` (its code changed) rather than refusing the message as malformed; the two
differ from ``ready`` on, where each side takes the other's answer for a refusal.
The last environment entry a client sends is ``CONNECTED_ENV``, its
CLOCK_MONOTONIC as it connects, in nanoseconds (20 digits, written just before connecting),
which the server takes out of the environment to tell how long the call waited for a worker.
An environment entry without ``=`` or with an empty name is ignored, as the program's own
interpreter would ignore it, and of a name given twice the first counts (as for
the interpreter's ``os.environ``).

Before it sends anything, a client makes sure root answers: the socket's directory is root's,
not a symlink and not writable by group or others, the socket is root's, and the listening
peer's credentials (SO_PEERCRED) are uid 0; otherwise it runs the program itself, saying so in
one line. It waits at most ``$NVC_PY_HOOK_TIMEOUT`` seconds (:func:`timeout_us`; default 60) for
each answer, and at most ACK_TIMEOUT for ``ready``: without it the caller runs the program itself
(no worker ran or will run anything: a worker runs only after ``go``, and holds none of the
caller's streams before it); once it sent ``go`` it kills the worker and fails with one line
instead (the call may have done part of its work). A wedged server costs that wait once, not at
every call: a stopped listener is seen at once, and a call that timed out leaves a marker that
keeps the next calls from waiting (:mod:`nvc.hook.server.wedge`). ``NVC_PY_HOOK_SOCKET=none`` hands
nothing over.
"""

from __future__ import annotations

import os
import sys

from nvc.system.programs import DEFAULT_SOCKET, SOCKET_ENV

NO_SERVER = "none"  # $NVC_PY_HOOK_SOCKET's value for "hand nothing over" (as native/client/hook_client.c)
TIMEOUT_ENV = "NVC_PY_HOOK_TIMEOUT"
DEFAULT_TIMEOUT = 60.0  # seconds for a served call's status (as native/client/hook_client.c)
MAX_TIMEOUT_CHARS = 32  # the longest $NVC_PY_HOOK_TIMEOUT read (timeout_us)
ACK_TIMEOUT = 2.0  # seconds at most for the server's ``ready`` (as native/client/hook_client.c)
MAGIC = b"nvc-py-hook/2"
MAX_MESSAGE = 64 * 1024  # as native/client/hook_client.c
PROGRAMS = ("nvc-py-hook", "nvc-py", "nvc-py-runtime")  # what a call may run: the basename of its argv[0]
FALL_BACK = b"fall back"
READY = b"ready"
REFUSED = b"refused"
GO = b"go"
CONNECTED_ENV = "NVC_PY_HOOK_CONNECTED"  # as native/client/hook_client.c's
STAMP_DIGITS = 20


class CallError(ValueError):
    """A message that is not a hook call."""


def encode_call(argv: list[str], env: dict[str, str]) -> bytes:
    """The message for ``argv`` and ``env`` (plain types: typing and collections.abc cost
    milliseconds to import on this path)."""
    fields = [
        MAGIC,
        str(len(argv)).encode(),
        str(len(env)).encode(),
        *map(os.fsencode, argv),
        *(os.fsencode(f"{name}={value}") for name, value in env.items()),
    ]
    return b"".join(field + b"\0" for field in fields)


def parse_call(message: bytes) -> tuple[list[str], dict[str, str]]:
    """(argv, env) of a message; loader variables are dropped from env (see nvc.system.loaderenv)."""
    from nvc.system.loaderenv import is_unsafe

    if not message.endswith(b"\0"):
        raise CallError("message not NUL-terminated")
    fields = [os.fsdecode(f) for f in message[:-1].split(b"\0")]
    if len(fields) < 3 or fields[0] != MAGIC.decode():
        raise CallError("not an nvc-py-hook call")
    try:
        argc, envc = int(fields[1]), int(fields[2])
    except ValueError:
        raise CallError("bad counts") from None
    if argc < 1 or envc < 0 or len(fields) != 3 + argc + envc:
        raise CallError("counts do not match the strings")
    argv = fields[3 : 3 + argc]
    env = {}
    for entry in fields[3 + argc :]:
        name, sep, value = entry.partition("=")
        if sep and name and not is_unsafe(name):
            env.setdefault(name, value)
    return argv, env


def timeout_us(text: str) -> int | None:
    """$NVC_PY_HOOK_TIMEOUT's value in microseconds, None where it is not one (the default then).

    The grammar, which native/client/hook_client.c follows too: decimal seconds, ASCII digits with
    at most one point (``60``, ``0.5``, ``.5``, ``5.``), no sign, exponent or space, at most
    MAX_TIMEOUT_CHARS characters; above zero and below 10^9 seconds. It is rounded up to whole
    microseconds, so any positive value waits at least 1 µs: never 0, which a socket's timeout
    (SO_RCVTIMEO) would read as "wait for ever"."""
    whole, _, fraction = text.partition(".")
    digits = whole + fraction
    if len(text) > MAX_TIMEOUT_CHARS or not digits.isascii() or not digits.isdigit():
        return None
    if int(whole or "0") >= 10**9:
        return None
    micro = int(whole or "0") * 10**6 + int(fraction[:6].ljust(6, "0")) + (fraction[6:].strip("0") != "")
    return micro or None


def call_timeout() -> float:
    """Seconds to wait for a served call's status: $NVC_PY_HOOK_TIMEOUT (:func:`timeout_us`), else
    DEFAULT_TIMEOUT."""
    micro = timeout_us(os.environ.get(TIMEOUT_ENV, ""))
    return micro / 1e6 if micro else DEFAULT_TIMEOUT


def not_roots(path: str) -> tuple[str | None, int]:
    """(Why the socket at ``path`` may not be root's server's, the socket's directory as an O_PATH
    descriptor): (None, fd) where it is root's, so far as the files tell (the peer's credentials are
    checked once connected); else the descriptor is -1. A socket absent reads as (None, -1):
    connecting fails and the caller runs the program itself."""
    import stat

    directory, name = os.path.split(path)
    try:
        dirfd = os.open(directory or ".", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # absent, a symlink, or not a directory: a socket there is none of root's server's
        return (
            None if not os.path.lexists(path) else f"{directory}: not a directory of root's that only root can write"
        ), -1
    try:
        st = os.fstat(dirfd)
        sock = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        os.close(dirfd)
        return None, -1
    except OSError as err:
        os.close(dirfd)
        return f"{path}: {err.strerror}", -1
    why = None
    if st.st_uid != 0 or st.st_mode & 0o022:
        why = f"{directory}: not a directory of root's that only root can write"
    elif not stat.S_ISSOCK(sock.st_mode) or sock.st_uid != 0:
        why = f"{path}: not a socket of root's"
    if why is not None:
        os.close(dirfd)
        return why, -1
    return None, dirfd


def hand_over(argv: list[str]) -> None:
    """Run ``argv`` in a worker of root's running server and exit with its status.

    Returns, having done nothing, where that cannot be: not root, no server, a server that is not
    root's (one line says so), a program the server does not run (``python -m nvc``), ``serve``
    itself (``nvc-py-hook serve``, ``nvc-py hook serve``), no answer in time, the server's word
    to fall back, or a worker this process may not reach (its Landlock proof).
    """
    if os.geteuid() != 0 or os.path.basename(argv[0]) not in PROGRAMS or "serve" in argv[1:]:
        return
    env = dict(os.environ)
    env.pop(CONNECTED_ENV, None)  # one the caller inherited would stand first, for the server
    env[CONNECTED_ENV] = "0" * STAMP_DIGITS
    message = encode_call(argv, env)
    if len(message) > MAX_MESSAGE:
        return
    path = os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET
    if path == NO_SERVER:
        return
    prog = os.path.basename(argv[0])
    why, dirfd = not_roots(path)
    if why is not None:
        os.write(2, f"{prog}: not handing over to the hook server ({why}); running here\n".encode())
        return
    from nvc.hook.server import wedge

    found, held = wedge.marker(dirfd) if dirfd >= 0 else (wedge.NONE, -1)
    try:
        if found == wedge.FRESH:
            os.write(
                2,
                f"{prog}: the hook server left a call unanswered less than {wedge.RETRY} s ago; running "
                "here\n".encode(),
            )
            return
        _hand_over(prog, message, path, dirfd, held if found == wedge.PROBE else None)
    finally:
        if held >= 0:
            os.close(held)
        if dirfd >= 0:
            os.close(dirfd)


class _Unanswered(Exception):
    """The server gave no ``ready`` (nothing was done); the one argument says why, for the caller's line."""


def _hand_over(prog: str, message: bytes, path: str, dirfd: int, held: int | None) -> None:
    """hand_over() once the socket's directory ``dirfd`` is checked and no fresh marker stands there;
    ``held``: the marker this call holds to try a server marked wedged again (None: there was no
    marker, so one that appears while this call waits means another call timed out)."""
    import _socket  # not socket: its imports cost more than the rest of this path
    import time

    from nvc.hook.server import wedge

    timeout = call_timeout()
    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC)
    except OSError:
        return
    worker = proof = -1
    try:
        try:
            sock.settimeout(min(ACK_TIMEOUT, timeout))
            message = message[: -STAMP_DIGITS - 1] + b"%0*d\0" % (STAMP_DIGITS, time.monotonic_ns())
            sock.connect(path)  # after the stamp: a spare may accept before connect returns
            creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
            peer_uid = int.from_bytes(creds[4:8], sys.byteorder)
            if peer_uid != 0:
                os.write(
                    2,
                    f"{prog}: not handing over to the hook server ({path}: served by uid {peer_uid}, "
                    "not root); running here\n".encode(),
                )
                return
            listener = int.from_bytes(creds[0:4], sys.byteorder, signed=True)
            if wedge.stopped(listener):
                raise _Unanswered(f"the hook server (pid {listener}) is stopped")
            cwd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                _send_fds(sock, message, (cwd,))
            finally:
                os.close(cwd)
            reply, worker = _first_answer(sock, listener, dirfd, held is None, min(ACK_TIMEOUT, timeout))
            if held is not None:  # a server answered: the mark goes
                wedge.clear(dirfd)
            proof = _worker_connection(reply)
            if proof >= 0:
                try:
                    _send_fds(sock, GO, (0, 1, 2, proof))
                finally:
                    os.close(proof)
        except _Unanswered as silent:
            os.write(2, f"{prog}: {silent.args[0]}; running here\n".encode())
            return
        except TimeoutError:  # connecting or sending: a server that takes no more calls
            os.write(
                2, f"{prog}: the hook server did not answer in {min(ACK_TIMEOUT, timeout):g} s; running here\n".encode()
            )
            return
        except OSError:
            return  # no worker runs the call (none before ``go``): run here
        if proof < 0:  # a refusal, the server's word or silence, or no proof: nothing was done
            status, _, line = reply.partition(b"\n")
            word, _, code = status.partition(b" ")
            if word == REFUSED and code.isdigit():
                os.write(2, line)
                os._exit(int(code))
            return
        sock.settimeout(timeout)
        try:
            reply = sock.recv(64)
        except TimeoutError:
            import signal

            if worker >= 0:
                signal.pidfd_send_signal(worker, signal.SIGKILL)
            os.write(2, f"{prog}: the hook server's worker gave no status in {timeout:g} s (killed)\n".encode())
            os._exit(1)
        except OSError:
            reply = b""
    finally:
        sock.close()
        if worker >= 0:
            os.close(worker)
    if reply.startswith(b"exit ") and reply[5:].isdigit():
        os._exit(int(reply[5:]))
    if reply == FALL_BACK:  # the worker found no proof in ``go``, and ran nothing
        return
    os.write(2, f"{prog}: the hook server's worker ended without a status\n".encode())
    os._exit(1)


def _first_answer(
    sock,
    listener: int,
    dirfd: int,
    watch: bool,  # noqa: ANN001 - a _socket.socket
    wait: float,
) -> tuple[bytes, int]:
    """The server's first answer (as :func:`_receive`) within ``wait`` seconds, looking every
    wedge.SLICE whether the listener (its pid) stopped or, with ``watch``, another call marked the
    server wedged meanwhile (:mod:`nvc.hook.server.wedge`); _Unanswered otherwise (the server marked
    wedged where this call timed out)."""
    import time

    from nvc.hook.server import wedge

    deadline = time.monotonic() + wait
    while not wedge.stopped(listener):
        left = deadline - time.monotonic()
        if left <= 0:
            if dirfd >= 0:
                wedge.mark(dirfd)
            raise _Unanswered(f"the hook server did not answer in {wait:g} s")
        sock.settimeout(min(left, wedge.SLICE))
        try:
            return _receive(sock)
        except TimeoutError:
            pass
        if watch and dirfd >= 0 and wedge.fresh(dirfd):
            raise _Unanswered("the hook server left another call unanswered")
    raise _Unanswered(f"the hook server (pid {listener}) is stopped")


def _worker_connection(reply: bytes) -> int:
    """For ``ready PID FD``: /proc/PID/fd/FD opened with O_PATH, the proof ``go`` carries that this
    process is confined no more than the worker (nvc.hook.server.peer); -1 for any other answer, or where
    it cannot be opened (Landlock refuses it)."""
    fields = reply.split(b" ")
    if len(fields) != 3 or fields[0] != READY or not (fields[1].isdigit() and fields[2].isdigit()):
        return -1
    pid, fd = fields[1:]
    try:
        return os.open(f"/proc/{int(pid)}/fd/{int(fd)}", os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return -1


def _send_fds(sock, data: bytes, fds: tuple[int, ...]) -> None:  # noqa: ANN001 - a _socket.socket
    """Send ``data`` with ``fds`` attached (SCM_RIGHTS)."""
    import _socket

    raw = b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in fds)
    sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, raw)])


def _receive(sock) -> tuple[bytes, int]:  # noqa: ANN001 - a _socket.socket
    """One answer and the descriptor attached to it (-1: none; any further one is closed)."""
    import _socket

    data, ancillary, _, _ = sock.recvmsg(1024, _socket.CMSG_SPACE(4 * 4), _socket.MSG_CMSG_CLOEXEC)
    fds = [
        int.from_bytes(cmsg[2][i : i + 4], sys.byteorder, signed=True)
        for cmsg in ancillary
        if cmsg[:2] == (_socket.SOL_SOCKET, _socket.SCM_RIGHTS)
        for i in range(0, len(cmsg[2]) - 3, 4)
    ]
    for fd in fds[1:]:
        os.close(fd)
    return data, fds[0] if fds else -1
