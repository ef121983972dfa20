"""systemd's watchdog for the hook server: ``WATCHDOG=1`` over ``$NOTIFY_SOCKET`` (the sd_notify
protocol: one datagram to an AF_UNIX socket, an abstract one where the path begins with ``@``).

The server's unit sets ``WatchdogSec=`` (:func:`nvc.hook.setup.engines.server_unit`); systemd passes
``WATCHDOG_USEC`` (and ``WATCHDOG_PID``, the process meant) and kills and restarts a server that
sends nothing for that long. The server sends from its accept loop, every half of the period, and
only while calls are taken (:meth:`Watchdog.tick`): a server whose loop runs but whose workers take
no call (hung, stopped) stays silent, and systemd replaces it. A plain socket, no new dependency.
"""

from __future__ import annotations

import os
import socket
import time

ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class Watchdog:
    """The keep-alive of one server process: its address and period, when it last sent."""

    def __init__(self, address: str, period: float) -> None:
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.interval = period / 2  # as sd_watchdog_enabled(3) recommends
        self.sent = time.monotonic() - self.interval  # of the last keep-alive: the first is due at once
        self.taken = True  # whether a call was taken since the last keep-alive

    def due_in(self) -> float:
        """Seconds until the next keep-alive is due (0: now)."""
        return max(0.0, self.sent + self.interval - time.monotonic())

    def tick(self, queued: bool) -> None:
        """Send the keep-alive when due, unless a call waits in the socket's queue (``queued``) while
        none was taken since the last one: the workers are wedged, and systemd should act."""
        if self.due_in() > 0:
            return
        if self.taken or not queued:
            notify(self.address, b"WATCHDOG=1")
        self.sent, self.taken = time.monotonic(), False


def from_environment() -> Watchdog | None:
    """The watchdog systemd asked of this process, or None; its variables are removed either way,
    so that nothing the server starts sees them (sd_watchdog_enabled with unset_environment)."""
    address, usec, pid = (os.environ.pop(name, "") for name in ENV)
    if not address or not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
        return None
    return Watchdog(address, int(usec) / 1e6)


def notify(address: str, message: bytes) -> None:
    """One sd_notify datagram to ``address``; best effort (a manager gone or busy is not the server's failure)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(message, address)
    except OSError:
        pass
