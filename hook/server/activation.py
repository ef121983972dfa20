"""How ``nvc-py-hook serve`` was started: by systemd's socket unit, or on demand by a hook client.

Socket activation (``nvc-py-hook.socket``): systemd binds /run/nvc-py/hook.sock itself and hands
the listening socket over as fd 3 (the sd_listen_fds protocol: ``LISTEN_PID`` is this process,
``LISTEN_FDS=1``). The server then serves that socket as it is, never unlinking or binding the
path: systemd owns it, and a connection that arrives while no server runs waits in its queue.

On demand (native/client/server_start.c): the first hook client that finds no server starts one and
passes it the start lock (``NVC_PY_SERVE_LOCK_FD``), held until the server listens, so clients
of a start storm wait for this server instead of starting their own, and an idle time
(``NVC_PY_SERVE_IDLE_EXIT``, seconds) after which the server unlinks its socket, serves what was
queued and exits. Started to stay (``nvc-py-hook start-server``, what setup runs where systemd does
not): no idle time, and ``NVC_PY_SERVE_STAYS=1``, so that after an upgrade it starts its successor
(nvc.hook.server.loop); a server started any other way (by hand, by another supervisor) does not.
"""

from __future__ import annotations

import os
import socket

from nvc.errors import InputError

LISTEN_FD = 3  # SD_LISTEN_FDS_START
LOCK_FD_ENV = "NVC_PY_SERVE_LOCK_FD"
IDLE_EXIT_ENV = "NVC_PY_SERVE_IDLE_EXIT"
STAYS_ENV = "NVC_PY_SERVE_STAYS"
ACTIVATION_ENV = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


def inherited_socket() -> socket.socket | None:
    """The listening socket systemd passed to this process, or None where it passed none.

    Variables meant for another process (``LISTEN_PID`` not ours) are ignored, as sd_listen_fds
    does; one socket is expected, an AF_UNIX SOCK_SEQPACKET one that listens: anything else is
    refused (a unit that passes a stream socket or several is misconfigured, and a worker would
    read its calls wrongly). The variables are removed so that nothing the server starts sees them.
    """
    pid, count = os.environ.get("LISTEN_PID"), os.environ.get("LISTEN_FDS")
    for name in ACTIVATION_ENV:
        os.environ.pop(name, None)
    if pid is None or pid != str(os.getpid()):
        return None
    if count != "1":
        raise InputError(f"LISTEN_FDS={count}: expected one socket from systemd (ListenSequentialPacket=)")
    try:
        sock = socket.socket(fileno=LISTEN_FD)
    except OSError as err:
        raise InputError(f"fd {LISTEN_FD} from systemd: not a socket ({err.strerror})") from None
    kind = (sock.family, sock.type, sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
    if kind != (socket.AF_UNIX, socket.SOCK_SEQPACKET, 1):
        sock.detach()
        raise InputError(f"fd {LISTEN_FD} from systemd: not a listening AF_UNIX SOCK_SEQPACKET socket")
    os.set_inheritable(LISTEN_FD, False)
    return sock


def release_start_lock() -> None:
    """Let the clients waiting for this server in (on-demand start): the server listens now."""
    fd = os.environ.pop(LOCK_FD_ENV, None)
    if fd is not None and fd.isdigit():
        try:
            os.close(int(fd))
        except OSError:
            pass


def stays() -> bool:
    """Whether ``nvc-py-hook start-server`` started this server, to stay (its successor its own job)."""
    return os.environ.pop(STAYS_ENV, "") == "1"


def idle_exit() -> float | None:
    """Seconds without a call after which an on-demand server stops (None: never). Its client sets
    it; a socket unit does not: systemd keeps that server's socket, and its restart is its job."""
    value = os.environ.pop(IDLE_EXIT_ENV, "")
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds > 0 else None
