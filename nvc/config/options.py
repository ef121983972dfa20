"""Global options (given before the command), importable without click.

The OCI hook calls :func:`nvc.pipeline.configure.configure` in-process with these, and must not pay
for the CLI's imports at every container start.
"""

import os

from nvc.errors import InputError
from nvc.records import NamedTuple
from nvc.system.untrusted import decimal

OVERFLOW_IDS = ("/proc/sys/kernel/overflowuid", "/proc/sys/kernel/overflowgid")


class GlobalOptions(NamedTuple):
    """Options given before the command."""

    root: str  # driver root, absolute
    ldcache: str  # ld cache path inside the root
    user: tuple[int, int]  # uid, gid the driver helper runs as
    load_kmods: bool


def _read_id(path: str) -> int:
    try:
        with open(path) as f:
            return int(f.read())
    except (OSError, ValueError):
        return 65534


def parse_user(value: str | None) -> tuple[int, int]:
    """uid and gid of ``--user``.

    Absent: the kernel's overflow ids when running as root (the helper drops to nobody),
    else the caller's own ids (nothing to drop to). ``--user`` alone: the effective ids.
    ``UID`` alone: that uid and the same number as gid.
    """
    if value is None:
        if os.geteuid() != 0:
            return os.geteuid(), os.getegid()
        return _read_id(OVERFLOW_IDS[0]), _read_id(OVERFLOW_IDS[1])
    if value == "":
        return os.geteuid(), os.getegid()
    uid, sep, gid = value.partition(":")
    if decimal(uid, 10) is None or (sep and decimal(gid, 10) is None):
        raise InputError(f"{value}: invalid user (expected UID[:GID])")
    return int(uid), int(gid) if sep else int(uid)


def resolve_options(root: str | None, ldcache: str | None, user: str | None, load_kmods: bool) -> GlobalOptions:
    """The global options, the configuration file's ``root``, ``ldcache`` and ``user`` standing in for
    those not given (as the hook and the runtime wrapper read them)."""
    if root is None or ldcache is None or user is None:
        from nvc import config

        conf = config.load()
        root = conf.root if root is None else root
        ldcache = conf.ldcache if ldcache is None else ldcache
        user = conf.user if user is None else user
    if not os.path.isabs(root) or not os.path.isdir(root):
        raise InputError(f"{root}: invalid driver root (must be an absolute path to a directory)")
    return GlobalOptions(os.path.normpath(root), ldcache, parse_user(user), load_kmods)
