"""Reading a file that a less trusted party (an image, a container) may have replaced.

Such a file is first opened with O_PATH (which opens no FIFO or device: no driver open, no
blocking), checked from its fstat (type, owner, size) and only then reopened for reading through
/proc/self/fd, which names the very inode checked, so nothing can be swapped in between.
"""

from __future__ import annotations

import os
import stat

_KINDS = {stat.S_IFLNK: "a symbolic link (not followed)", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}


class UnexpectedFile(Exception):
    """The file is not what the caller expects; the message says what it is, phrased to follow the
    file's name ("is a FIFO, not a regular file"). Callers turn it into their own error or report."""


def file_problem(st: os.stat_result, *, max_size: int, size: int | None = None, owner: int | None = None) -> str | None:
    """Why ``st`` is not a regular file as expected, or None. ``size``: the exact size wanted;
    ``owner``: the uid that must own it."""
    kind = stat.S_IFMT(st.st_mode)
    if kind != stat.S_IFREG:
        return f"is {_KINDS.get(kind, 'of an unknown type')}, not a regular file"
    if owner is not None and st.st_uid != owner:
        return f"is owned by uid {st.st_uid}, not {owner}"
    if size is not None and st.st_size != size:
        return f"is {st.st_size} bytes, not {size} (not read)"
    if st.st_size > max_size:
        return f"is {st.st_size} bytes, over {max_size} (not read)"
    return None


def read_checked(path_fd: int, *, max_size: int, size: int | None = None, owner: int | None = None) -> bytes:
    """The content (at most ``max_size`` bytes) of the file an O_PATH fd names, once ``file_problem``
    finds nothing wrong with it; raises UnexpectedFile otherwise. Never blocks."""
    problem = file_problem(os.fstat(path_fd), max_size=max_size, size=size, owner=owner)
    if problem:
        raise UnexpectedFile(problem)
    fd = os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    chunks: list[bytes] = []
    left = max_size
    try:
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)
