"""Which container a sharing directory belongs to, as the hook recorded it at prestart.

A container id alone names no container: another runtime root (or another engine) may run a
container of the same id. So prestart records, beside the shared tmpfs, the bundle and the init
process (host pid, start time, pid namespace) of the container it configured, and what acts on the
directory later believes that record: poststop removes only the directory of the container that
stopped (its bundle, its process gone), and `share status` maps the pids a container reports only
within that container's own pid namespace. The record is root's, in the container's host directory,
which is never mounted into the container: the container cannot change it.
"""

from __future__ import annotations

import json
import os

from nvc.apply.container import start_time
from nvc.records import NamedTuple

TYPE_CHECKING = False
if TYPE_CHECKING:
    from nvc.apply.container import ContainerHandle

FILE = "owner"
_MAX = 8192  # bytes: a bundle path and three numbers


class Owner(NamedTuple):
    bundle: str  # the OCI bundle prestart was given ("" where none: the CLI's configure)
    pid: int | None  # the container's init process, host pid (None: standalone configure)
    start_time: int | None  # that process's start time (/proc/PID/stat field 22, clock ticks)
    pidns: int | None  # the inode of its pid namespace


def of_container(handle: ContainerHandle | None, bundle: str) -> Owner:
    """The record for the container whose init process ``handle`` pins (None: no container process)."""
    from nvc.errors import ContainerError

    if handle is None:
        return Owner(bundle, None, None, None)
    started, pidns = handle.start_time(), handle.pid_namespace()
    if started is None or pidns is None:
        raise ContainerError(f"container process {handle.pid} is gone")
    return Owner(bundle, handle.pid, started, pidns)


def encode(owner: Owner) -> bytes:
    return json.dumps(owner._asdict()).encode() + b"\n"


def decode(data: bytes) -> Owner | None:
    """The record in ``data``; None when it is not one (then nothing is believed of it)."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("bundle"), str):
        return None
    numbers = [doc.get(name) for name in ("pid", "start_time", "pidns")]
    if not all(n is None or (isinstance(n, int) and not isinstance(n, bool) and n >= 0) for n in numbers):
        return None
    return Owner(doc["bundle"], *numbers)


def read(dir_fd: int) -> Owner | None:
    """The record in the container directory open on ``dir_fd`` (None: none, or not root's own file)."""
    from nvc.system import untrusted

    try:
        path_fd = os.open(FILE, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        return decode(untrusted.read_checked(path_fd, max_size=_MAX, owner=0))
    except (OSError, untrusted.UnexpectedFile):
        return None
    finally:
        os.close(path_fd)


def running(owner: Owner) -> bool:
    """Whether the container's init process still runs (the same process: pid and start time)."""
    return owner.pid is not None and owner.start_time is not None and start_time(owner.pid) == owner.start_time


def stopped(owner: Owner, bundle: str) -> bool:
    """Whether a poststop for ``bundle`` ("" when its state named none) is this container's: its
    process is gone and, where both are known, the bundles are the same."""
    return not running(owner) and (not bundle or not owner.bundle or bundle == owner.bundle)
