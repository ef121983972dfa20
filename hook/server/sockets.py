"""The hook server's listening socket: the directory it must sit in, its bind, a connection's peer."""

from __future__ import annotations

import errno
import os
import socket
import struct

from nvc.errors import InputError
from nvc.hook.server.peer import SO_PEERPIDFD
from nvc.system.untrusted import directory_problem


def peer_credentials(conn: socket.socket) -> tuple[int, int]:
    """The connecting process's (pid, uid), as the kernel saw them at connect time."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    return pid, uid


def peer_pidfd(conn: socket.socket) -> int | None:
    """A pidfd of the connecting process (Linux 6.5+), None where the kernel has none."""
    try:
        return conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError:
        return None


def socket_directory(directory: str) -> int:
    """A descriptor of ``directory``, created 0700 if absent; InputError unless it is a real
    directory (not a symlink) of this process's uid with no access for group or others: whoever
    else could write there could answer root's hook calls in the server's place."""
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise InputError(f"{directory}: cannot create the socket directory: {err.strerror}") from None
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        what = "a symlink" if err.errno == errno.ELOOP else err.strerror
        raise InputError(f"{directory}: socket directory is {what}; refusing to serve there") from None
    problem = directory_problem(fd, 0o077)
    if problem:
        os.close(fd)
        raise InputError(
            f"{directory}: socket directory must belong to uid {os.geteuid()} with mode 0700 "
            f"({problem}); refusing to serve there"
        )
    return fd


def listen(directory_fd: int, name: str, path: str) -> socket.socket:
    """A SOCK_SEQPACKET socket named ``name`` in the directory ``directory_fd`` (checked by
    :func:`socket_directory`, and bound through its descriptor, so the directory checked is the
    one used), reachable by root only; a stale socket is replaced. ``path``: its name for messages."""
    try:
        try:
            os.unlink(name, dir_fd=directory_fd)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)
        try:
            sock.bind(f"/proc/self/fd/{directory_fd}/{name}")
        finally:
            os.umask(old)
    except OSError as err:
        raise InputError(f"{path}: cannot listen there: {err.strerror}") from None
    sock.listen(128)
    return sock
