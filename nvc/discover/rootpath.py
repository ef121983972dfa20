"""Resolve paths inside a driver root as if it were ``/``.

The driver root may be a directory of somebody else's filesystem (a driver container,
``/run/nvidia/driver``). Its symlinks are interpreted relative to that root: absolute
targets are re-rooted and ``..`` stops at the root, so a lookup can never leave it,
whatever the links say. Resolution is manual (no ``realpath``) for exactly that reason.

This module names files (discovery reports paths and opens them to read ELF headers).
Creating or mounting files in an untrusted container rootfs, where check/use races
matter, goes through the fd-based :mod:`nvc.apply.rootfs` instead.

While :func:`recording`, every lookup's answer is noted, so that a result found from them can be
kept until one of them answers otherwise (:mod:`nvc.discover.keptfiles`).
"""

from __future__ import annotations

import errno
import os
import stat
from _thread import get_ident
from collections.abc import Iterator
from contextlib import contextmanager

from nvc.errors import DetectionError

MAX_SYMLINKS = 40  # the kernel's limit (ELOOP)

# What a path names (not followed): type, device, inode, and but for a directory that was not
# listed, size, mtime ns and ctime ns. A directory's times change with any entry made in it (/tmp
# all the time); a lookup depends only on the names it looks up, each of them noted in turn.
Signature = list[int]


class Lookups:
    """The lookups made while recording: host path -> its signature (None: missing), the
    directories listed, and whether what was found from them warned."""

    def __init__(self) -> None:
        self.seen: dict[str, Signature | None] = {}
        self.listed: set[str] = set()
        self.warned = False


_recording: dict[int, Lookups] = {}  # by thread: a daemon's threads may discover at once


@contextmanager
def recording() -> Iterator[Lookups]:
    """Note every lookup :func:`resolve` makes in this thread until the ``with`` ends."""
    me = get_ident()
    outer = _recording.get(me)
    lookups = _recording[me] = Lookups()
    try:
        yield lookups
    finally:
        if outer is None:
            del _recording[me]
        else:
            _recording[me] = outer


def _noting() -> Lookups | None:
    """This thread's recording, if any."""
    return _recording.get(get_ident()) if _recording else None


def warned() -> None:
    """What is being found from the lookups recorded now warned the user (never kept: each call warns)."""
    noting = _noting()
    if noting is not None:
        noting.warned = True


def signature(st: os.stat_result, listed: bool = False) -> Signature:
    if stat.S_ISDIR(st.st_mode) and not listed:
        return [st.st_mode, st.st_dev, st.st_ino]
    return [st.st_mode, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def lookup(host: str, listed: bool = False) -> Signature | None:
    """What an lstat of ``host`` answers now, as recorded (None: no such path)."""
    try:
        return signature(os.lstat(host), listed)
    except (FileNotFoundError, NotADirectoryError):
        return None


def listdir(host: str) -> list[str]:
    """The names in directory ``host`` (a resolved path), the listing noted while recording."""
    noting = _noting()
    if noting is not None:
        noting.seen[host] = lookup(host, listed=True)
        noting.listed.add(host)
    return os.listdir(host)


def host_path(root: str, inner: str) -> str:
    """The host path of ``inner``, an absolute path inside ``root``."""
    if root == "/":
        return inner
    return root.rstrip("/") + inner


def resolve(root: str, path: str) -> str | None:
    """Canonical absolute path inside ``root`` that ``path`` leads to, or None if a component is missing.

    ``path`` is read as a path inside the root (absolute or relative to its top). Every
    component, the last one included, has its symlinks followed within the root.
    """
    noting = _noting()
    pending = [c for c in path.split("/") if c not in ("", ".")]
    pending.reverse()  # a stack: the next component is at the end
    done: list[str] = []
    links = 0
    while pending:
        name = pending.pop()
        if name == "..":
            if done:
                done.pop()
            continue
        inner = "/" + "/".join(done + [name])
        try:
            st = os.lstat(host_path(root, inner))
        except (FileNotFoundError, NotADirectoryError):
            if noting is not None:
                noting.seen[host_path(root, inner)] = None
            return None
        except OSError as err:
            raise DetectionError(f"{host_path(root, inner)}: {err.strerror}") from None
        if noting is not None:
            host = host_path(root, inner)
            noting.seen[host] = signature(st, host in noting.listed)
        if not stat.S_ISLNK(st.st_mode):
            done.append(name)
            continue
        links += 1
        if links > MAX_SYMLINKS:
            raise DetectionError(f"{host_path(root, path)}: {os.strerror(errno.ELOOP)}")
        target = os.readlink(host_path(root, inner))
        if target.startswith("/"):
            done = []
        pending.extend(reversed([c for c in target.split("/") if c not in ("", ".")]))
    return "/" + "/".join(done)
