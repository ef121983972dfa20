"""The runtime cache: which runtime nvc-py-runtime executes, for its native front.

Most of an engine's calls to nvc-py-runtime only pass through to runc (start, state, kill, delete, and
create for a container that asks for no GPU). The front (native/client/runtime_front.c) execs the runtime
itself for those, without starting Python, when this file names it for the configuration and PATH it
sees: the configuration file's identity (a missing file is "absent": the defaults), PATH and the identity
of each of its directories (a runtime installed or removed in one of them changes it). Any difference,
and the front runs the program, which resolves the runtime again and writes the file anew.

Its format is the front's: NUL-terminated fields (magic, with nvc-py's version: an upgraded front
believes no older program's file; configuration file, its identity, PATH, its directories' identities
joined by ``;``, the runtime, and what ``--help``/``--version`` print before the runtime answers). Root's
own file in root's /run/nvc-py, as every cache there (:mod:`nvc.system.runcache`).
"""

from __future__ import annotations

import os

from nvc import __version__

CACHE_PATH = "/run/nvc-py/runtime-cache"
MAGIC = f"nvc-py-runtime/2 {__version__}"  # as native/client/runtime_front.c's CACHE_MAGIC


def key(config_file: str, search_path: str | None) -> list[str] | None:
    """The fields the runtime depends on, as the front computes them; None where it cannot be cached
    (no PATH, or a relative or empty entry in it: the working directory would count)."""
    if search_path is None:
        return None
    directories = search_path.split(":")
    if not all(d.startswith("/") for d in directories):
        return None
    from nvc.system.runcache import config_key, identity

    config = config_key(config_file)
    if config is None:
        return None
    found = []
    for directory in directories:
        try:
            found.append(identity(directory))
        except OSError:
            found.append("-")
    return [MAGIC, *config, search_path, ";".join(found)]


def store(config_file: str, runtime: str, about: str) -> None:
    """Record ``runtime`` as what this process's configuration file and PATH resolve to, and ``about``
    (nvc-py-runtime's own lines before a runtime's --help or --version); best effort."""
    from nvc.system import runcache

    fields = key(config_file, os.environ.get("PATH"))
    if fields is None or not os.path.isabs(runtime) or "\0" in about:
        return
    runcache.store(CACHE_PATH, b"".join(os.fsencode(field) + b"\0" for field in [*fields, runtime, about]))
