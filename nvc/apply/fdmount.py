"""Mounts made through file descriptors, never through paths a container image controls.

The source is opened once with O_PATH|O_NOFOLLOW and checked (a symlink, or a directory
where a file is expected, is refused: CVE-2024-0132); the destination is an fd resolved
inside the rootfs (nvc.apply.rootfs). What gets mounted is then exactly what was checked, with
no path looked up again in between (CVE-2025-23359). The new mount API does this
natively (open_tree/fsmount + mount_setattr + move_mount); on kernels without it the
classic mount(2) is given /proc/self/fd/N paths, which name the same objects.

Each mount returns a ``Mount`` holding an fd of the new mount's root: the handle to change
its flags, to fill a tmpfs, and to unmount it on rollback.
"""

from __future__ import annotations

import errno
import os
import stat

from nvc.errors import MountError
from nvc.records import NamedTuple
from nvc.system import syscalls
from nvc.system.syscalls import MountAttr


class Mount(NamedTuple):
    """A mount nvc-py made: ``fd`` is an O_PATH fd of its root, ``path`` names it in messages."""

    fd: int
    path: str

    def close(self) -> None:
        """Forget the handle (the mount stays)."""
        os.close(self.fd)


def _procfd(fd: int) -> str:
    return f"/proc/self/fd/{fd}"


def _new_api_missing(err: OSError) -> bool:
    return err.errno == errno.ENOSYS


def check_source(fd: int, path: str, *, directory: bool = False, rdev: int | None = None) -> os.stat_result:
    """Refuse a mount source that is not what the caller expects; return its stat.

    ``fd`` must have been opened with O_NOFOLLOW, so a symlink shows as one.
    ``rdev``: the source must be that character device (a node in the driver root that is
    something else must not end up in the container as /dev/nvidia*).
    """
    st = os.fstat(fd)
    if stat.S_ISLNK(st.st_mode):
        raise MountError(f"refusing to mount {path}: it is a symbolic link")
    if stat.S_ISDIR(st.st_mode) != directory:
        what = "not a directory" if directory else "a directory"
        raise MountError(f"refusing to mount {path}: it is {what}")
    if rdev is not None and (not stat.S_ISCHR(st.st_mode) or st.st_rdev != rdev):
        raise MountError(f"refusing to mount {path}: not the character device {os.major(rdev)}:{os.minor(rdev)}")
    return st


def open_source(path: str, *, directory: bool = False, rdev: int | None = None) -> int:
    """Open a host mount source with O_PATH|O_NOFOLLOW and check it (see check_source)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise MountError(f"open failed: {path}: {err.strerror}") from None
    try:
        check_source(fd, path, directory=directory, rdev=rdev)
    except MountError:
        os.close(fd)
        raise
    return fd


def _open_dest(dir_fd: int, name: str, path: str, directory: bool) -> int:
    """The mount point ``name`` in ``dir_fd``, which must exist and not be a symlink."""
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as err:
        raise MountError(f"open failed: {path}: {err.strerror}") from None
    mode = os.fstat(fd).st_mode
    if stat.S_ISLNK(mode) or stat.S_ISDIR(mode) != directory:
        os.close(fd)
        what = "a symbolic link" if stat.S_ISLNK(mode) else "a directory" if not directory else "not a directory"
        raise MountError(f"refusing to mount over {path}: it is {what}")
    return fd


def set_attrs(mount: Mount, attrs: MountAttr) -> None:
    """Set the per-mount flags of ``mount`` to exactly ``attrs`` (e.g. read-only once filled)."""
    clear = ~attrs & (MountAttr.RDONLY | MountAttr.NOSUID | MountAttr.NODEV | MountAttr.NOEXEC)
    try:
        try:
            syscalls.mount_setattr(mount.fd, "", syscalls.AT_EMPTY_PATH, attrs, clear, name=mount.path)
        except OSError as err:
            if not _new_api_missing(err):
                raise
            flags = syscalls.MS_REMOUNT | syscalls.MS_BIND | attrs.ms_flags()
            syscalls.mount(None, _procfd(mount.fd), None, flags)
    except OSError as err:
        raise MountError(f"mount failed: {mount.path}: {err.strerror}") from None


def clone_tree(source_fd: int, attrs: MountAttr, dest_path: str, recursive: bool = False) -> int:
    """A detached bind of ``source_fd`` with flags ``attrs`` (new mount API; OSError on failure).

    The kernel lets a bind be cloned only from the caller's own mount namespace but attached
    in another one, so the applier clones host sources before it joins the container's
    namespace and attaches them there (:func:`attach_tree`).
    """
    flags = syscalls.OPEN_TREE_CLONE | syscalls.OPEN_TREE_CLOEXEC | syscalls.AT_EMPTY_PATH
    tree = syscalls.open_tree(source_fd, "", flags | (syscalls.AT_RECURSIVE if recursive else 0))
    try:
        at = syscalls.AT_EMPTY_PATH | (syscalls.AT_RECURSIVE if recursive else 0)
        syscalls.mount_setattr(tree, "", at, attrs, name=dest_path)
    except OSError:
        os.close(tree)
        raise
    return tree


def attach_tree(tree: int, dest_dir_fd: int, dest_name: str, *, dest_path: str) -> Mount:
    """Attach a detached mount ``tree`` (from :func:`clone_tree`) on ``dest_name`` in ``dest_dir_fd``.

    The destination must exist, be of the tree's kind (file or directory) and not be a
    symlink. The returned Mount owns ``tree``; on failure ``tree`` is left to the caller.
    """
    dest_fd = _open_dest(dest_dir_fd, dest_name, dest_path, stat.S_ISDIR(os.fstat(tree).st_mode))
    try:
        both_fds = syscalls.MOVE_MOUNT_F_EMPTY_PATH | syscalls.MOVE_MOUNT_T_EMPTY_PATH
        syscalls.move_mount(tree, "", dest_fd, "", both_fds, names=("", dest_path))
    except OSError as err:
        raise MountError(f"mount failed: {dest_path}: {err.strerror}") from None
    finally:
        os.close(dest_fd)
    return Mount(tree, dest_path)


def mount_tmpfs(
    dest_dir_fd: int,
    dest_name: str,
    attrs: MountAttr,
    *,
    dest_path: str,
    mode: int = 0o555,
    options: tuple[tuple[str, str], ...] = (),
) -> Mount:
    """Mount a fresh tmpfs (root directory mode ``mode``, more tmpfs ``options`` such as its size)
    on directory ``dest_name``."""
    dest_fd = _open_dest(dest_dir_fd, dest_name, dest_path, directory=True)
    options = (("mode", f"{mode:o}"), *options)
    try:
        try:
            return _tmpfs_new_api(dest_fd, attrs, dest_path, options)
        except OSError as err:
            if not _new_api_missing(err):
                raise
        data = ",".join(f"{key}={value}" for key, value in options)
        syscalls.mount("tmpfs", _procfd(dest_fd), "tmpfs", attrs.ms_flags(), data)
        fd = os.open(dest_name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dest_dir_fd)
    except OSError as err:
        raise MountError(f"mount failed: tmpfs -> {dest_path}: {err.strerror}") from None
    finally:
        os.close(dest_fd)
    if os.fstatvfs(fd).f_fsid == os.fstatvfs(dest_dir_fd).f_fsid:
        os.close(fd)
        raise MountError(f"mount of {dest_path} was raced: the path no longer shows the mount")
    return Mount(fd, dest_path)


def _tmpfs_new_api(dest_fd: int, attrs: MountAttr, dest_path: str, options: tuple[tuple[str, str], ...]) -> Mount:
    fs = syscalls.fsopen("tmpfs")
    try:
        for key, value in options:
            syscalls.fsconfig_string(fs, key, value)
        syscalls.fsconfig_create(fs, dest_path)
        mnt = syscalls.fsmount(fs, attrs, dest_path)
    finally:
        os.close(fs)
    try:
        both_fds = syscalls.MOVE_MOUNT_F_EMPTY_PATH | syscalls.MOVE_MOUNT_T_EMPTY_PATH
        syscalls.move_mount(mnt, "", dest_fd, "", both_fds, names=("tmpfs", dest_path))
    except OSError:
        os.close(mnt)
        raise
    return Mount(mnt, dest_path)


def unmount(mount: Mount) -> None:
    """Detach ``mount`` (rollback) and close its handle."""
    try:
        syscalls.umount2(_procfd(mount.fd), syscalls.MNT_DETACH)
    except OSError as err:
        raise MountError(f"unmount failed: {mount.path}: {err.strerror}") from None
    finally:
        os.close(mount.fd)
