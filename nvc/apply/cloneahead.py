"""Host sources cloned ahead of the call: a container helper started before its call is known (a
hook server's idle worker's, :func:`nvc.rpc.container_service.prestart`) clones, while it waits, the
host sources a call will likely mount (those of the server's dry plan), so that the call's
:meth:`nvc.apply.applier.Applier.prepare` only opens and checks each.

A clone kept is used only for the very file the call opens and checks then (the same device and
inode): a driver upgraded since gets fresh clones. Its flags are those the plan's mount asks for,
set when it was cloned, as :func:`nvc.apply.fdmount.clone_tree` sets them for a clone made then.
Only files and device nodes are cloned ahead: a directory's clone takes the mounts below it as they
are when it is made, which the directory's own identity does not show.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from nvc.apply import fdmount
from nvc.errors import MountError
from nvc.plan.operations import Bind
from nvc.system.syscalls import MountAttr

_Key = tuple[str, int | None, int]  # source, the device it must be, the mount's flags
_kept: dict[_Key, tuple[int, int, int]] = {}  # key -> (the detached mount, st_dev, st_ino of its source)


def _key(op: Bind) -> _Key:
    return (op.source, op.rdev, op.attrs)


def clone(ops: Iterable[Bind], busy: Callable[[], bool]) -> None:
    """Clone the host source of each of ``ops`` (a file or device node) not kept yet, until ``busy()``
    says the call came. Best effort: a source that cannot be opened, checked or cloned is left to the
    call (which says why). The caller holds the capabilities cloning needs."""
    for op in ops:
        key = _key(op)
        if op.in_rootfs or op.kind == "dir" or key in _kept:
            continue
        if busy():
            return
        try:
            fd = fdmount.open_source(op.source, rdev=op.rdev)
        except MountError:
            continue
        try:
            st = os.fstat(fd)
            tree = fdmount.clone_tree(fd, MountAttr(op.attrs), op.target)
        except OSError:
            continue
        finally:
            os.close(fd)
        _kept[key] = (tree, st.st_dev, st.st_ino)


def take(op: Bind, source_fd: int) -> int | None:
    """The clone kept of ``op``'s source, where it is a clone of the file ``source_fd`` (opened and
    checked by the call) is; else None (a clone kept of another file is closed)."""
    kept = _kept.pop(_key(op), None)  # never a directory: none is kept
    if kept is None:
        return None
    tree, dev, ino = kept
    st = os.fstat(source_fd)
    if (st.st_dev, st.st_ino) == (dev, ino):
        return tree
    os.close(tree)
    return None
