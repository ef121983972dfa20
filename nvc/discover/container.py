"""What the container's image has: its library dirs, its procfs mount point, its CUDA compat
libraries and its ``/etc/ld.so.preload``.

The image is hostile input: every path is opened through ``open_at`` (an :data:`Opener`), which
the caller binds to the image's root so that a symlink there resolves inside it, never to a host
file (:func:`nvc.apply.rootfs.open_in_root`). Reads only; the owner of the container is the
caller's (it comes with the container's process).
"""

import errno
import os
import posixpath
import stat
from collections.abc import Callable

from nvc.errors import ContainerError
from nvc.records import NamedTuple

Opener = Callable[[str, int], int]  # (path inside the image, open flags) -> fd, resolved inside its root

DEBIAN_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/i386-linux-gnu")
MAX_PRELOAD = 64 * 1024  # bytes of an image's /etc/ld.so.preload
PROC_NVIDIA = "/proc/driver/nvidia"
COMPAT_DIR = "/usr/local/cuda/compat"


class ContainerFacts(NamedTuple):
    """What the container's rootfs says, read safely inside it (:func:`facts`)."""

    owner: tuple[int, int]
    lib_dir: str  # /usr/lib/x86_64-linux-gnu (Debian family) or /usr/lib64
    lib32_dir: str  # /usr/lib/i386-linux-gnu, /usr/lib32 or /usr/lib
    # Where the tmpfs hiding the host's driver state goes: /proc/driver/nvidia; /proc/driver where
    # the container's procfs lacks the nvidia dir (no kernel driver: test doubles); None without
    # a /proc/driver at all (standalone rootfs with no procfs mounted): nothing to hide.
    proc_mountpoint: str | None
    compat_libs: tuple[str, ...] = ()  # regular files /usr/local/cuda/compat/lib*.so.* (container paths)


def _exists(open_at: Opener, path: str, directory: bool = False) -> bool:
    try:
        fd = open_at(path, os.O_PATH | (os.O_DIRECTORY if directory else 0))
    except OSError as err:
        if err.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EXDEV):
            return False
        raise ContainerError(f"cannot inspect the rootfs: {path}: {err.strerror}") from None
    os.close(fd)
    return True


def _compat_libs(open_at: Opener) -> tuple[str, ...]:
    """Regular files ``lib*.so.*`` in the image's CUDA compat dir (symlinks and dirs ignored)."""
    try:
        fd = open_at(COMPAT_DIR, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return ()
    try:
        found = []
        for name in sorted(os.listdir(fd)):
            if not (name.startswith("lib") and ".so." in name):
                continue
            if stat.S_ISREG(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                found.append(f"{COMPAT_DIR}/{name}")
        return tuple(found)
    finally:
        os.close(fd)


def facts(open_at: Opener, owner: tuple[int, int]) -> ContainerFacts:
    """Library dirs, procfs state and compat libraries of the image ``open_at`` opens in."""
    if _exists(open_at, "/etc/debian_version"):
        lib_dir, lib32_dir = DEBIAN_LIB_DIRS
    else:
        lib_dir = "/usr/lib64"
        lib32_dir = "/usr/lib32" if _exists(open_at, "/usr/lib32", directory=True) else "/usr/lib"
    return ContainerFacts(
        owner=owner,
        lib_dir=lib_dir,
        lib32_dir=lib32_dir,
        proc_mountpoint=next(
            (p for p in (PROC_NVIDIA, posixpath.dirname(PROC_NVIDIA)) if _exists(open_at, p, directory=True)), None
        ),
        compat_libs=_compat_libs(open_at),
    )


def image_preload(open_at: Opener, path: str, rootfs: str) -> str:
    """The image's ld.so.preload at ``path`` ("" if none), opened O_PATH first: a FIFO or device node
    there is refused without ever being opened (no blocking, no driver open outside the
    container's device cgroup)."""
    from nvc.system import untrusted

    try:
        path_fd = open_at(path, os.O_PATH)
    except OSError as err:
        if err.errno == errno.ENOENT:
            return ""
        raise ContainerError(f"cannot read {path} in {rootfs}: {err.strerror}") from None
    try:
        data = untrusted.read_checked(path_fd, max_size=MAX_PRELOAD)
    except untrusted.UnexpectedFile as err:
        raise ContainerError(f"{path} in {rootfs} {err}") from None
    finally:
        os.close(path_fd)
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise ContainerError(f"{path} in {rootfs} is not text") from None
