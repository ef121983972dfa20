"""An idmapped bind mount (mount_setattr(2), MOUNT_ATTR_IDMAP): a directory shown at another place with
its owners shifted, as a runtime gives a container whose user namespace maps 0 to ``host_id`` a rootfs
owned by host root (util-linux 2.38, Debian 12's, has no ``X-mount.idmap``)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from nvc.system import syscalls

MOUNT_ATTR_IDMAP = 0x00100000
AT_FDCWD = -100
SYS_MOUNT_SETATTR = 442  # one number on every architecture (added after the tables were unified)


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _user_namespace(host_id: int, size: int) -> int:
    """An fd of a fresh user namespace whose uids and gids 0.. are host ``host_id``.. (``size``)."""
    holder = subprocess.Popen(["unshare", "--user", "sleep", "60"])
    try:
        while os.readlink(f"/proc/{holder.pid}/ns/user") == os.readlink("/proc/self/ns/user"):
            time.sleep(0.005)
        for name in ("uid_map", "gid_map"):
            Path(f"/proc/{holder.pid}/{name}").write_text(f"0 {host_id} {size}\n")
        return os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        holder.kill()
        holder.wait()


@contextmanager
def idmapped(source: Path, target: Path, host_id: int, size: int) -> Iterator[Path]:
    """``source`` shown at ``target`` (an empty directory) with on-disk ids 0.. as ``host_id``..; unmounted
    at the end. Files made there by ``host_id`` land on disk as root's."""
    ns_fd = _user_namespace(host_id, size)
    try:
        flags = syscalls.OPEN_TREE_CLONE | syscalls.OPEN_TREE_CLOEXEC
        tree = syscalls.open_tree(AT_FDCWD, str(source), flags)
        try:
            attr = _MountAttr(MOUNT_ATTR_IDMAP, 0, 0, ns_fd)
            libc = ctypes.CDLL(None, use_errno=True)
            size_of = ctypes.sizeof(attr)
            if libc.syscall(SYS_MOUNT_SETATTR, tree, b"", syscalls.AT_EMPTY_PATH, ctypes.byref(attr), size_of):
                err = ctypes.get_errno()
                raise OSError(err, f"mount_setattr(MOUNT_ATTR_IDMAP) on {source}: {os.strerror(err)}")
            syscalls.move_mount(tree, "", AT_FDCWD, str(target), syscalls.MOVE_MOUNT_F_EMPTY_PATH)
        finally:
            os.close(tree)
    finally:
        os.close(ns_fd)
    try:
        yield target
    finally:
        syscalls.umount2(str(target), syscalls.MNT_DETACH)
