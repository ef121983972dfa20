"""Confinement of a forked helper: driver root, unprivileged identity, no capabilities.

The helper loads the driver's own code (libnvidia-ml) from the driver root. Confining it
first means a hostile or broken driver root can at most lie to nvc-py, never act as root on
the host: it sees only the root it was given, runs as an unprivileged user, holds no
capability and cannot gain any back through a setuid or file-capability binary.
"""

from __future__ import annotations

import os

import prctl

from nvc.errors import InitializationError, PrivilegeError


def overflow_ids(proc: str = "/proc") -> tuple[int, int]:
    """The kernel's overflow uid/gid (normally 65534): the reference's default helper identity.

    Read by the parent: once chrooted, the helper may have no /proc to read them from.
    (Plain strings, not pathlib: this module is on ``info``'s start-up path before the
    helper forks, where every import delays NVML's load.)
    """
    ids = []
    for name in ("overflowuid", "overflowgid"):
        with open(f"{proc}/sys/kernel/{name}") as f:
            ids.append(int(f.read()))
    return ids[0], ids[1]


def confine(root: str, uid: int, gid: int) -> None:
    """Enter ``root`` and become ``uid``:``gid`` with no capabilities and NO_NEW_PRIVS.

    Order matters: chroot and the bounding-set drop need capabilities that the switch to a
    non-root uid takes away, so they come first; caps are then cleared explicitly because a
    switch to uid 0 keeps them. An unprivileged caller can only keep its own identity.
    """
    if root != "/":
        try:
            os.chroot(root)
        except PermissionError as err:
            raise PrivilegeError(f"chroot failed: {root}: {err.strerror}") from None
        except OSError as err:
            raise InitializationError(f"chroot failed: {root}: {err.strerror}") from None
        os.chdir("/")
    if prctl.cap_effective.setpcap:
        prctl.capbset.limit()
    if (uid, gid) != (os.geteuid(), os.getegid()) or os.getgroups():
        try:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        except PermissionError as err:
            raise PrivilegeError(f"cannot switch to user {uid}:{gid}: {err.strerror}") from None
    prctl.cap_effective.limit()
    prctl.cap_inheritable.limit()
    prctl.cap_permitted.limit()
    prctl.set_no_new_privs(1)
    from nvc.rpc.helper import die_with_parent  # loaded already: confine runs in a helper child

    die_with_parent()  # the uid switch cleared PDEATHSIG
