"""Opening a file that a less trusted party (an image, a container) may have replaced.

Such a file is first opened with O_PATH (which opens no FIFO or device: no driver open, no
blocking), checked from its fstat (type, owner, size) and only then reopened for reading through
/proc/self/fd, which names the very inode checked, so nothing can be swapped in between.
"""

from __future__ import annotations

import os
import stat

_KINDS = {stat.S_IFLNK: "a symbolic link (not followed)", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}


def file_problem(st: os.stat_result, *, max_size: int, size: int | None = None, owner: int | None = None) -> str | None:
    """Why ``st`` is not a regular file as expected (phrased to follow the file's name), or None.

    ``size``: the exact size wanted; ``owner``: the uid that must own it.
    """
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


def reopen(path_fd: int, flags: int = os.O_RDONLY) -> int:
    """Open for I/O the inode an O_PATH fd names (checked by the caller); never blocks."""
    return os.open(f"/proc/self/fd/{path_fd}", flags | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)


def read_at_most(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes from ``fd`` (a file that may have grown since its size was checked)."""
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
