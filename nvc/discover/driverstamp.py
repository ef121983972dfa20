"""The installed driver's identity, cheap enough to take at every call: what a long-running process
(the hook server's warm NVML helper, the device plugin, the DRA driver) keys what it discovered on,
so that a driver upgrade is served without a restart.

An upgrade changes the kernel driver's version (``/proc/driver/nvidia/version``, once the new
module is loaded) and replaces the libraries, after which the installer runs ldconfig (the
``.run`` installer and the distributions' packages both do): so the stamp is the version line, the
ld cache's identity, and that of the libraries the cache names for NVML and CUDA (an upgrade that
keeps the cache byte for byte still replaces them). A stat per file and one read of the cache,
which :mod:`nvc.discover.ldcache` parses once while it is unchanged.
"""

from __future__ import annotations

import os

from nvc.discover import ldcache, procfs, rootpath
from nvc.discover.driver import DEFAULT_LDCACHE
from nvc.errors import NvcError
from nvc.records import NamedTuple

# The libraries whose files identify the driver's user-space half (NVML: what the helpers load).
STAMPED = ("libnvidia-ml.so.1", "libcuda.so.1")


class DriverStamp(NamedTuple):
    version: str  # the kernel driver's version; "" where /proc has none (no driver loaded)
    files: tuple[tuple[str, int, int, int], ...]  # (host path, inode, mtime ns, size); zeros: missing


def _identity(path: str) -> tuple[str, int, int, int]:
    """A file's identity (its links followed); zeros where it is missing."""
    try:
        st = os.stat(path)
    except OSError:
        return (path, 0, 0, 0)
    return (path, st.st_ino, st.st_mtime_ns, st.st_size)


def take(root: str = "/", ldcache_path: str = DEFAULT_LDCACHE, proc: procfs.StrPath = procfs.PROC) -> DriverStamp:
    """The stamp of the driver under ``root`` now; never fails (what cannot be read is part of it)."""
    try:
        version = procfs.read_version(proc)
    except NvcError:
        version = ""
    inner = rootpath.resolve(root, ldcache_path)
    cache = rootpath.host_path(root, inner if inner else ldcache_path)
    files = [_identity(cache)]
    try:
        entries = ldcache.read(cache)
    except NvcError:
        entries = ()
    for entry in entries:
        inner = rootpath.resolve(root, entry.value) if entry.key in STAMPED else None
        if inner:
            files.append(_identity(rootpath.host_path(root, inner)))
    return DriverStamp(version, tuple(files))


def changed(before: DriverStamp, now: DriverStamp) -> str:
    """What a person reads of a change: ``driver 580.95.05 -> 590.44.01``, or that its files changed."""
    if before.version != now.version:
        return f"driver {before.version or 'none'} -> {now.version or 'none'}"
    return f"driver {now.version or 'none'}: its libraries or ld cache changed"
