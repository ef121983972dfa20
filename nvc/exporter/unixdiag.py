"""Whether a unix socket bound to a file listens, asked of the kernel (sock_diag, as ``ss -xl``).

The hook server is up when its socket listens (served by the server, or held by systemd's socket
unit, which starts the server at the next call). Connecting to find out would hand a worker a call
that never comes, and keep an on-demand server from its idle exit; the kernel's socket diagnostics
list the listening unix sockets with the inode of the file each is bound to, which is matched to
the file's. They list this network namespace's sockets: the exporter runs in the host's (the
hook server does).
"""

from __future__ import annotations

import os
import socket
import stat
import struct

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCP_LISTEN = 10
_UDIAG_SHOW_VFS = 0x2
_UNIX_DIAG_VFS = 1
_HEADER = struct.Struct("=IHHII")  # nlmsghdr
_REQUEST = struct.Struct("=BBHIII2I")  # unix_diag_req
_MESSAGE = struct.Struct("=BBBBI2I")  # unix_diag_msg
_ATTR = struct.Struct("=HH")  # rtattr
_VFS = struct.Struct("=II")  # unix_diag_vfs: inode, device (the kernel's dev_t: major << 20 | minor)
_TIMEOUT = 2.0


def _kernel_dev(st_dev: int) -> int:
    return os.major(st_dev) << 20 | os.minor(st_dev)


def listening(path: str) -> bool:
    """Whether a socket bound to the file at ``path`` listens; False when there is no such socket
    file, or the kernel does not answer (no sock_diag for unix sockets)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    if not stat.S_ISSOCK(st.st_mode):
        return False
    try:
        return (st.st_ino, _kernel_dev(st.st_dev)) in _listening_files()
    except OSError:
        return False


def _listening_files() -> set[tuple[int, int]]:
    """(inode, kernel device) of the file of every listening unix socket bound to one."""
    request = _REQUEST.pack(socket.AF_UNIX, 0, 0, 1 << _TCP_LISTEN, 0, _UDIAG_SHOW_VFS, 0xFFFFFFFF, 0xFFFFFFFF)
    header = _HEADER.pack(_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0)
    found: set[tuple[int, int]] = set()
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, _NETLINK_SOCK_DIAG) as sock:
        sock.settimeout(_TIMEOUT)
        sock.sendto(header + request, (0, 0))
        while True:
            data = sock.recv(1 << 16)
            offset = 0
            while offset + _HEADER.size <= len(data):
                length, kind, _flags, _seq, _pid = _HEADER.unpack_from(data, offset)
                if kind == _NLMSG_DONE:
                    return found
                if kind == _NLMSG_ERROR or length < _HEADER.size:
                    raise OSError("sock_diag refused the unix socket dump")
                found |= _vfs(data[offset + _HEADER.size : offset + length])
                offset += (length + 3) & ~3
            if not data:
                return found


def _vfs(message: bytes) -> set[tuple[int, int]]:
    """The UNIX_DIAG_VFS attribute of one unix_diag_msg, as a set of none or one (inode, device)."""
    offset = _MESSAGE.size
    while offset + _ATTR.size <= len(message):
        length, kind = _ATTR.unpack_from(message, offset)
        if length < _ATTR.size:
            break
        if kind == _UNIX_DIAG_VFS and length >= _ATTR.size + _VFS.size:
            return {_VFS.unpack_from(message, offset + _ATTR.size)}
        offset += (length + 3) & ~3
    return set()
