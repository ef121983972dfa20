"""Reading what others wrote: bounded files and ASCII decimal numbers.

A container image's environment, an OCI state or spec and the configuration file reach nvc-py
as text it does not control. ``str.isdigit()`` accepts ``²`` and other Unicode digits that
``int()`` refuses, and ``int()`` refuses more than 4300 digits; a FIFO or a device where a
file is expected blocks a reader or never ends. These helpers turn each case into either a
value or an :class:`~nvc.errors.InputError` with one line.
"""

from __future__ import annotations

import os
import stat

from nvc.errors import InputError


def decimal(text: str, max_digits: int = 18) -> int | None:
    """The value of ``text`` when it is 1 to ``max_digits`` ASCII digits, else None."""
    if 0 < len(text) <= max_digits and text.isascii() and text.isdigit():
        return int(text)
    return None


def read_file(path: str, limit: int, *, follow: bool = True) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file at ``path`` (at most ``limit``) and its status.

    Opened non-blocking (a FIFO does not hang the open) and checked to be a regular file before
    anything is read. ``follow=False`` refuses a symlink as the last component. OSError from the
    open goes to the caller, which knows whether a missing file is an error.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{path}: not a regular file")
        if st.st_size > limit:
            raise InputError(f"{path}: larger than {limit} bytes")
        chunks = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:  # grew while read
        raise InputError(f"{path}: larger than {limit} bytes")
    return data, st
