"""``--load-kmods``' side effect: the driver's device nodes that ``<root>/dev`` lacks, made on the host.

Which nodes are missing is discovery's (:func:`nvc.discover.kmods.missing`, changes nothing, so
``--dry-run`` shows them as the plan's first step); making them is done here, once a command has
decided to (like udev: the nodes stay). Each directory and node is made inside the driver root,
whatever its symlinks say.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

from nvc.discover import kmods, nodes, procfs, rootpath
from nvc.discover.nodes import NodeSpec
from nvc.errors import DeviceError
from nvc.logger import Logger

log = Logger(__name__)


def makedirs(root: str, path: str, mode: int = 0o755) -> str:
    """Create the missing directories of ``path`` inside ``root``; return its canonical inner path.

    Each existing component is resolved within the root before the next one is created
    in it, so a symlink in the way cannot make the creation land outside the root.
    Raises OSError (e.g. EEXIST for a dangling symlink in the way).
    """
    inner = "/"
    for name in (c for c in path.split("/") if c not in ("", ".")):
        child = inner.rstrip("/") + "/" + name
        found = rootpath.resolve(root, child)
        if found is None:
            os.mkdir(rootpath.host_path(root, child), mode)
            found = child
        inner = found
    return inner


def create_missing(root: str, specs: Iterable[NodeSpec]) -> tuple[str, ...]:
    """mknod the nodes of ``specs`` missing under ``root`` (host paths of those created).

    Missing parent directories are created 0755, inside the root whatever its symlinks say.
    """
    created = []
    for spec in specs:
        if nodes.find(root, spec) is not None:
            continue
        parent, name = spec.path.rsplit("/", 1)
        try:
            parent_inner = makedirs(root, parent)
        except OSError as err:
            raise DeviceError(f"{rootpath.host_path(root, parent)}: cannot create: {err.strerror}") from None
        path = rootpath.host_path(root, f"{parent_inner.rstrip('/')}/{name}")
        try:
            os.mknod(path, stat.S_IFCHR | spec.mode, os.makedev(spec.major, spec.minor))
            os.chmod(path, spec.mode)  # mknod applied the umask
        except OSError as err:
            raise DeviceError(f"{path}: mknod failed: {err.strerror}") from None
        log.debug("created %s (%d:%d)", path, spec.major, spec.minor)
        created.append(path)
    return tuple(created)


def make(root: str, specs: tuple[NodeSpec, ...]) -> tuple[str, ...]:
    """Create the nodes :func:`nvc.discover.kmods.missing` found under ``root``; host paths of those created."""
    if not specs:
        return ()
    created = create_missing(root, specs)
    log.debug("--load-kmods created %d device nodes under %s", len(created), root)
    return created


def load(
    root: str,
    proc: procfs.StrPath = procfs.PROC,
    proc_devices: procfs.StrPath = nodes.PROC_DEVICES,
    sys_module: procfs.StrPath = kmods.SYS_MODULE,
) -> tuple[str, ...]:
    """Create the missing nodes under ``root`` now (``info``, ``list``); host paths of those created."""
    return make(root, kmods.missing(root, proc, proc_devices, sys_module))
