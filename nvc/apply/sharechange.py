"""A running container's share changed on the host (`nvc-py share set`, :mod:`nvc.commands.shareset`): its
limits file rewritten in place and its granted limits replaced, under its directory's lock.

The files are the ones :mod:`nvc.apply.sharefiles` made at the container's start; nothing is followed
(the shared tmpfs is the container's to write, so only its root-owned limits file there is used).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from nvc.apply.sharefiles import write_new
from nvc.errors import ContainerError
from nvc.plan.share import BOUNDS_FILE, GRANTED_DIR, LIMITS_MAX, STATE_DIR, container_dir, sched_dir_for
from nvc.records import NamedTuple


class Current(NamedTuple):
    """A running container's limits as its host directory holds them (:func:`locked`)."""

    limits: str  # the limits file's text
    bounds: str  # its pod's grant ("" = none: not a pod's container)
    scheduled: bool  # it has a scheduler file (a weight needs one)


def _regular(dir_fd: int, name: str, flags: int, path: str) -> int:
    """fd of ``name`` in ``dir_fd``, a regular file of root's with one link, never followed (a missing one:
    FileNotFoundError)."""
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise ContainerError(f"cannot open {path}: {err.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_nlink != 1:
        os.close(fd)
        raise ContainerError(f"{path} is not the regular file of root's nvc-py made")
    return fd


def _limits_fd(dir_fd: int, flags: int, path: Path) -> int:
    """The container's limits file, in the shared tmpfs of its directory (open on ``dir_fd``)."""
    try:
        shared_fd = os.open("shared", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            return _regular(shared_fd, "limits", flags, f"{path}/shared/limits")
        finally:
            os.close(shared_fd)
    except OSError as err:
        raise ContainerError(f"cannot open {path}/shared/limits: {err.strerror}") from None


def _read_text(fd: int, path: str) -> str:
    data = os.pread(fd, LIMITS_MAX + 1, 0)
    if len(data) > LIMITS_MAX:
        raise ContainerError(f"{path} is larger than {LIMITS_MAX} bytes")
    return data.decode("utf-8", "replace")


@contextlib.contextmanager
def locked(container_id: str, state_dir: str = STATE_DIR, sched_dir: str | None = None) -> Iterator[Current]:
    """A running container's limits, its bounds and whether it is scheduled, read under its directory's
    lock (two `share set` at once change it one after the other); what :func:`rewrite` needs is kept
    open meanwhile. Nothing is followed: the directory and files are the hook's (root's), the shared
    tmpfs the container writes is entered by its fd and only its limits file (root's, 0444) is used."""
    import fcntl

    path = container_dir(container_id, state_dir)
    try:
        dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ContainerError(f"no container {container_id} shares a GPU here (no {path})") from None
    except OSError as err:
        raise ContainerError(f"cannot open {path}: {err.strerror}") from None
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_EX)
        fd = _limits_fd(dir_fd, os.O_RDONLY, path)
        try:
            try:
                bounds_fd = _regular(dir_fd, BOUNDS_FILE, os.O_RDONLY, f"{path}/{BOUNDS_FILE}")
            except FileNotFoundError:
                bounds = ""  # not a pod's container
            else:
                try:
                    bounds = _read_text(bounds_fd, f"{path}/{BOUNDS_FILE}")
                finally:
                    os.close(bounds_fd)
            sched = os.path.join(sched_dir or sched_dir_for(state_dir), container_id)
            yield Current(_read_text(fd, f"{path}/shared/limits"), bounds, os.path.lexists(sched))
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)


def rewrite(
    container_id: str, limits: str, granted: str | None, state_dir: str = STATE_DIR, sched_dir: str | None = None
) -> None:
    """A running container's new limits (call it inside :func:`locked`): its limits file rewritten in
    place (the container sees that very file through a read-only bind: a new file would not reach it;
    its processes read it again within 200 ms, native/shim/process/reload.c, and skip a half-written
    one), and with ``granted``, what the other containers' shims trust of it, replaced whole (they
    read it again within 20 ms). The tmpfs has room for the limits it had: longer ones that do not
    fit are refused, the old ones written back."""
    path = container_dir(container_id, state_dir)
    data = limits.encode()
    if len(data) > LIMITS_MAX:
        raise ContainerError(f"the new limits of container {container_id} exceed {LIMITS_MAX} bytes")
    dir_fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fd = _limits_fd(dir_fd, os.O_RDWR, path)
    finally:
        os.close(dir_fd)
    try:
        old = os.pread(fd, LIMITS_MAX + 1, 0)
        try:
            os.ftruncate(fd, 0)
            if os.pwrite(fd, data, 0) != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as err:
            os.ftruncate(fd, 0)
            os.pwrite(fd, old, 0)
            raise ContainerError(f"cannot write the new limits of container {container_id}: {err.strerror}") from None
    finally:
        os.close(fd)
    if granted is not None:
        _replace_granted(sched_dir or sched_dir_for(state_dir), container_id, granted.encode())


def _replace_granted(sched_dir: str, container_id: str, granted: bytes) -> None:
    """``.granted/<id>`` replaced by a new file (renamed over it: a reader sees the old or the new one)."""
    sched_fd = os.open(sched_dir, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        dir_fd = os.open(GRANTED_DIR, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=sched_fd)
    finally:
        os.close(sched_fd)
    temporary = f".{container_id}"  # no container id starts with '.'
    try:
        try:
            os.unlink(temporary, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        write_new(dir_fd, temporary, granted, 0o444)
        os.rename(temporary, container_id, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as err:
        raise ContainerError(f"cannot replace {sched_dir}/{GRANTED_DIR}/{container_id}: {err.strerror}") from None
    finally:
        os.close(dir_fd)
