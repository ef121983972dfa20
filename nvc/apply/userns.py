"""The container's user namespace: its id maps, and the container helper's way into it.

A container with a user namespace owns the filesystems its runtime mounted for it (its /dev
tmpfs, its /dev/shm): there, a host uid it does not map (host root's) can create nothing
(EOVERFLOW), whatever its capabilities. So the container helper, once in the container's mount
namespace, joins its user namespace too and becomes the container's root there: what it makes
then belongs to that root, and it can do there only what that root's capabilities in that
namespace allow. What must come from the host (the driver's device nodes and libraries) it has
opened and cloned before, in the host's namespaces: a bind of a host node onto an empty file is
how a device reaches a user namespace, where mknod is refused.
"""

import errno
import os

from nvc.errors import MountError
from nvc.records import NamedTuple
from nvc.system import syscalls

CLONE_NEWUSER = 0x10000000
_MAX_MAP = 4096  # bytes of a uid_map or gid_map read: 340 lines of three numbers at most


class IdRange(NamedTuple):
    """One line of a uid_map or gid_map: ``count`` ids from ``inside`` are the host's from ``outside``."""

    inside: int
    outside: int
    count: int


class IdMaps(NamedTuple):
    """A user namespace's uid and gid maps, as /proc/PID/uid_map and gid_map give them."""

    uids: tuple[IdRange, ...]
    gids: tuple[IdRange, ...]

    def inside(self, uid: int, gid: int) -> tuple[int, int] | None:
        """Host ``uid``, ``gid`` as the namespace sees them; None where one is not mapped."""
        found = (_lookup(self.uids, uid, outward=False), _lookup(self.gids, gid, outward=False))
        return None if None in found else found  # type: ignore[return-value]

    def host_uid(self, uid: int) -> int | None:
        """The host uid of ``uid`` inside the namespace; None where it is not mapped."""
        return _lookup(self.uids, uid, outward=True)

    def root(self) -> tuple[int, int] | None:
        """The host uid and gid of the namespace's root (0 inside); None where it has none."""
        found = (_lookup(self.uids, 0, outward=True), _lookup(self.gids, 0, outward=True))
        return None if None in found else found  # type: ignore[return-value]


def parse_map(text: str, where: str) -> tuple[IdRange, ...]:
    """The lines of a uid_map or gid_map (``where`` names it in the error)."""
    ranges = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 3 or not all(f.isdigit() for f in fields):
            raise MountError(f"{where}: unexpected line {line.strip()[:80]!r}")
        ranges.append(IdRange(*(int(f) for f in fields)))
    return tuple(ranges)


def _lookup(ranges: tuple[IdRange, ...], value: int, outward: bool) -> int | None:
    for r in ranges:
        start, other = (r.inside, r.outside) if outward else (r.outside, r.inside)
        if start <= value < start + r.count:
            return other + value - start
    return None


def is_own(ns_fd: int) -> bool:
    """Whether the user namespace open on ``ns_fd`` is this process's own."""
    mine, theirs = os.stat("/proc/self/ns/user"), os.fstat(ns_fd)
    return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)


def join_as_root(ns_fd: int, maps: IdMaps, pid: int | None) -> None:
    """Join the user namespace open on ``ns_fd`` and become its root, keeping only the container
    helper's capabilities (now those of that namespace: joining one grants them all there, and
    a full bounding set). Needs CAP_SYS_ADMIN over the namespace (host root's, in the caller's
    effective set) and a single-threaded process."""
    from nvc.system import confinement  # the helper's, which confined itself with it: the planner needs none

    try:
        syscalls.setns(ns_fd, CLONE_NEWUSER, "the container's user namespace")
    except OSError as err:
        raise MountError(f"cannot enter the user namespace of {pid}: {err.strerror}") from None
    row = confinement.CONTAINER_HELPER
    confinement.limit_bounding(row)
    if maps.root() is None:
        raise MountError(
            f"the user namespace of container process {pid} maps no root (uid and gid 0): "
            "nvc-py makes the container's files as its root; map 0 inside (podman: not --userns=nomap)"
        )
    try:
        os.setgroups([])
    except PermissionError:
        pass  # /proc/PID/setgroups is "deny": the host groups stay, unmapped, granting nothing there
    try:
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
    except OSError as err:
        raise MountError(f"cannot become root in the user namespace of {pid}: {err.strerror}") from None
    confinement.limit_caps(row)


def cannot_write(code: int | None) -> bool:
    """Whether an error creating a file is one a user namespace explains: its root has no power
    over files of host ids it does not map (EACCES, EPERM), nor can it create files as one (EOVERFLOW)."""
    return code in (errno.EACCES, errno.EPERM, errno.EOVERFLOW)


def advice(root: tuple[int, int] | None) -> str:
    """What to do where the container's root in its user namespace cannot make a file there."""
    who = "the container's root" if root is None else f"the container's root (host uid {root[0]})"
    return (
        f"{who} cannot write there in its user namespace: the rootfs is owned by a host uid "
        "that namespace does not map; give the container a rootfs owned by the container's user "
        "namespace (chown it to its mapped range, or an idmapped mount)"
    )
