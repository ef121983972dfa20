"""The configuration's driver root and driver helper identity, kept for the front's guess.

The installed ``nvc-py`` starts the native driver helper for ``info`` before the program has read its
configuration (native/client/driver_start.c): for the root given on the command line, else /, and the
default identity. A configuration naming another root (a driver container's, such as
/run/nvidia/driver) or user made that guess wrong at every ``info``, and the program started the helper
again once it had read them (some 20 ms later on an H200: docs/performance.md). Where that happens,
root's program records the configuration's own root and identity here (:func:`remember`), keyed by the
configuration file's identity as the runtime cache is: the front believes it for root alone, while the
file stays the same (:mod:`nvc.system.runcache`: root's own file in root's own /run/nvc-py).

Its format is the front's: NUL-terminated fields: magic, with nvc-py's version (an upgraded front
believes no older program's file), the configuration file, its identity, the root, the uid, the gid.
"""

from __future__ import annotations

import os

from nvc import __version__
from nvc.errors import NvcError

CACHE_PATH = "/run/nvc-py/driver-guess"
MAGIC = f"nvc-py-driver-guess/1 {__version__}"  # as native/client/driver_start.c's GUESS_MAGIC


def remember() -> None:
    """Record the configuration's driver root and driver helper identity for the front's next guess; by
    root only, best effort (a configuration that cannot be read records nothing)."""
    if os.geteuid() != 0:
        return
    from nvc import config
    from nvc.config.options import parse_user
    from nvc.system import runcache

    path = config.config_path()
    key = runcache.config_key(path)  # before the file is read: an edit since is a different key
    try:
        conf = config.load(path)
        uid, gid = parse_user(conf.user)
    except NvcError:
        return
    if key is not None:
        fields = [MAGIC, *key, os.path.normpath(conf.root), str(uid), str(gid)]
        runcache.store(CACHE_PATH, b"".join(os.fsencode(field) + b"\0" for field in fields))
