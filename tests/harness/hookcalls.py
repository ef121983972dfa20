"""Calls to ``nvc-py-hook serve`` made by hand, as the clients make them but without their checks,
and what a caller that is told to fall back runs: a program that does not exist."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

from nvc.hook.server import handover

MISSING = "/nonexistent/nvc-py"  # a fallback target that says so: exit 127, "cannot execute"
CANNOT_EXECUTE = f"nvc-py-hook-client: cannot execute {MISSING}: No such file or directory\n"
SERVED_HELP = ["info", "--help"]  # a command the server runs (nvc.hook.server.scope) that needs no driver


def message(argv: list[str], env: list[str], argc: int | None = None) -> bytes:
    fields = [handover.MAGIC.decode(), str(len(argv) if argc is None else argc), str(len(env)), *argv, *env]
    return "".join(f"{f}\0" for f in fields).encode()


def worker_connection(pid: int, fd: int, conn: socket.socket) -> int:
    """The proof a client sends with ``go``: the worker's end of the connection, through /proc."""
    return os.open(f"/proc/{pid}/fd/{fd}", os.O_PATH)


def call_raw(
    sock: Path,
    data: bytes,
    fds: list[int],
    go: bytes = handover.GO,
    go_fds: list[int] | None = None,
    proof: Callable[[int, int, socket.socket], int] = worker_connection,
) -> list[bytes]:
    """Send ``data`` with ``fds`` to the server, as the clients do but without their checks, and
    answer ``ready PID FD`` with ``go``, ``go_fds`` and the descriptor ``proof(PID, FD, connection)``
    opens (as the clients do by default): the server's answers, ``ready PID FD`` as ``ready``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
        conn.settimeout(30)
        conn.connect(str(sock))
        socket.send_fds(conn, [data], fds)
        answers = []
        for _ in range(2):
            answer, worker, _, _ = socket.recv_fds(conn, 1024, 1)
            word, *numbers = answer.split(b" ")
            answers.append(word if word == handover.READY else answer)
            for fd in worker:
                os.close(fd)
            if word != handover.READY:
                break
            reach = proof(*map(int, numbers), conn)
            try:
                socket.send_fds(conn, [go], [*(go_fds or []), reach])
            finally:
                os.close(reach)
    return answers


def call_directly(sock: Path, argv: list[str], env: list[str] | None = None) -> tuple[list[bytes], str]:
    """Hand ``argv`` to the server with /dev/null as stdin and stdout: (answers, stderr)."""
    err_r, err_w = os.pipe()
    null, cwd = os.open(os.devnull, os.O_RDWR), os.open("/", os.O_PATH)
    try:
        answers = call_raw(sock, message(argv, env or []), [cwd], go_fds=[null, null, err_w])
    finally:
        for fd in (null, err_w, cwd):
            os.close(fd)
    with os.fdopen(err_r) as err:
        return answers, err.read()
