"""Reading what others wrote: bounded files, files they may have replaced, ASCII decimal numbers,
paths a user named for a log or a directory.

A container image's environment, an OCI state or spec and the configuration file reach nvc-py
as text it does not control. ``str.isdigit()`` accepts ``²`` and other Unicode digits that
``int()`` refuses, and ``int()`` refuses more than 4300 digits; a FIFO or a device where a
file is expected blocks a reader or never ends. These helpers turn each case into either a
value or an :class:`~nvc.errors.InputError` with one line.

A file that an image or a container may have replaced is first opened with O_PATH (which
opens no FIFO or device: no driver open, no blocking), checked from its fstat (type, owner,
size) and only then reopened for reading through /proc/self/fd, which names the very inode
checked, so nothing can be swapped in between (:func:`read_checked`).

A path named for a log (``--debug``, the configuration's ``log.file``, a runtime's ``--log``) is
opened non-blocking (:func:`open_append`): a FIFO without a reader is an error at once, not a wait
for one; a pipe with a reader, a terminal or /dev/stderr are what the user chose.
"""

from __future__ import annotations

import errno
import os
import stat

from nvc.errors import InputError, cut

MAX_DIGITS = 18  # of a number read from text: any such value fits in 64 bits
PATH_MAX = 4096  # bytes of a path the kernel takes, its terminating NUL included (limits.h)


def decimal(text: str, max_digits: int = MAX_DIGITS) -> int | None:
    """The value of ``text`` when it is 1 to ``max_digits`` ASCII digits, else None."""
    if 0 < len(text) <= max_digits and text.isascii() and text.isdigit():
        return int(text)
    return None


_KINDS = {
    stat.S_IFLNK: "a symbolic link (not followed)",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}


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


def directory_problem(fd: int, forbidden: int) -> str | None:
    """Why the directory open on ``fd`` is not this process's uid's alone (none of the ``forbidden``
    mode bits set), or None: whoever else could write there could plant what root then uses."""
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & forbidden:
        return f"it is uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}"
    return None


def _read_up_to(fd: int, limit: int) -> bytes:
    chunks = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_checked(path_fd: int, *, max_size: int, size: int | None = None, owner: int | None = None) -> bytes:
    """The content (at most ``max_size`` bytes) of the file an O_PATH fd names, once ``file_problem``
    finds nothing wrong with it; raises UnexpectedFile otherwise. Never blocks."""
    problem = file_problem(os.fstat(path_fd), max_size=max_size, size=size, owner=owner)
    if problem:
        raise UnexpectedFile(problem)
    fd = os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        return _read_up_to(fd, max_size)
    finally:
        os.close(fd)


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
        data = _read_up_to(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:  # grew while read
        raise InputError(f"{path}: larger than {limit} bytes")
    return data, st


def open_append(path: str, mode: int = 0o640) -> int:
    """A blocking descriptor appending to ``path`` (created with ``mode`` where missing), opened
    without blocking (see the module's docstring); OSError goes to the caller."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, mode)
    os.set_blocking(fd, True)
    return fd


def make_directory(path: str, purpose: str = "") -> None:
    """The directory ``path``, created where missing; an InputError naming what is there instead
    (``purpose`` added: what the directory was for), or why it cannot be made (a component too
    long, a file on the way, a read-only file system). Its missing parents are made one by one from
    the top (os.makedirs recurses once a component, and a path may have thousands)."""
    if os.path.isdir(path):
        return
    if os.path.lexists(path):
        raise InputError(f"{path}: not a directory{purpose}")
    missing = []
    head = os.path.abspath(path)
    try:
        if len(os.fsencode(head)) >= PATH_MAX:
            raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG))
        while not os.path.lexists(head):
            missing.append(head)
            head = os.path.dirname(head)
        for directory in reversed(missing):
            try:
                os.mkdir(directory)
            except FileExistsError:
                if not os.path.isdir(directory):
                    raise
    except OSError as err:
        raise InputError(f"{cut(path)}: cannot create directory: {err.strerror}") from None


def directory_or_missing(path: str, option: str = "") -> None:
    """Nothing when ``path`` is a directory or is missing (nothing there yet); an InputError naming
    what is there instead (``option``: the option that named it), or why it cannot be looked at (a
    name too long, no permission), never a traceback."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as err:
        raise InputError(f"{path}: {err.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(f"{path}: {option + ' is ' if option else ''}not a directory")
