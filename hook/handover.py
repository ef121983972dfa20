"""Handing one ``nvc-py`` or ``nvc-py-hook`` call to a running hook server (:mod:`nvc.hook.server`).

The wire format the server reads, and its Python client. The console scripts call
:func:`hand_over` first thing: where root's server answers, the call runs in one of its warm
workers and this interpreter exits with the worker's status, having imported nothing else (an
interpreter start costs ~15 ms, nvc-py's imports ~100 ms more); anywhere else it returns and
the call runs here. ``native/hook_client.c`` is the same client without the interpreter.

A message is SOCK_SEQPACKET, one datagram: MAGIC, argc, envc, then argv and ``NAME=VALUE``
strings, each NUL-terminated, with the caller's stdin, stdout, stderr and working directory
attached (SCM_RIGHTS). The answer is ``exit N``, or ``fall back`` when the caller must run the
program itself (nothing was done).
"""

from __future__ import annotations

import os
import sys

DEFAULT_SOCKET = "/run/nvc-py/hook.sock"
SOCKET_ENV = "NVC_PY_HOOK_SOCKET"
MAGIC = b"nvc-py-hook/1"
MAX_MESSAGE = 64 * 1024  # as native/hook_client.c
PROGRAMS = ("nvc-py-hook", "nvc-py")  # what a call may run: the basename of its argv[0]
FALL_BACK = b"fall back"


class CallError(ValueError):
    """A message that is not a hook call."""


def encode_call(argv: list[str], env: dict[str, str]) -> bytes:
    """The message for ``argv`` and ``env`` (plain types: typing and collections.abc cost
    milliseconds to import on this path)."""
    fields = [MAGIC, str(len(argv)).encode(), str(len(env)).encode(), *map(os.fsencode, argv),
              *(os.fsencode(f"{name}={value}") for name, value in env.items())]
    return b"".join(field + b"\0" for field in fields)


def parse_call(message: bytes) -> tuple[list[str], dict[str, str]]:
    """(argv, env) of a message; loader variables are dropped from env (see nvc.loaderenv)."""
    from nvc.loaderenv import is_unsafe

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
    argv = fields[3:3 + argc]
    env = {}
    for entry in fields[3 + argc:]:
        name, sep, value = entry.partition("=")
        if sep and not is_unsafe(name):
            env[name] = value
    return argv, env


def hand_over(argv: list[str]) -> None:
    """Run ``argv`` in a worker of root's running server and exit with its status.

    Returns, having done nothing, where that cannot be: not root, no server, a program the
    server does not run (``python -m nvc``), ``serve`` itself (``nvc-py-hook serve``, ``nvc-py
    hook serve``), or the server's word to fall back.
    """
    if os.geteuid() != 0 or os.path.basename(argv[0]) not in PROGRAMS or "serve" in argv[1:]:
        return
    message = encode_call(argv, dict(os.environ))
    if len(message) > MAX_MESSAGE:
        return
    import _socket  # not socket: its imports cost more than the rest of this path

    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC)
    except OSError:
        return
    try:
        try:
            sock.connect(os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET)
            cwd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                fds = b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in (0, 1, 2, cwd))
                sock.sendmsg([message], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
            finally:
                os.close(cwd)
        except OSError:
            return  # nothing was handed over: run here
        try:
            reply = sock.recv(64)
        except ConnectionResetError:
            return  # queued, never read by a worker (the server went): nothing was done
        except OSError:
            reply = b""
    finally:
        sock.close()
    if reply == FALL_BACK:
        return
    if reply.startswith(b"exit ") and reply[5:].isdigit():
        os._exit(int(reply[5:]))
    os.write(2, f"{os.path.basename(argv[0])}: the hook server's worker ended without a status\n".encode())
    os._exit(1)
