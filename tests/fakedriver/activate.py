"""Activate a fake driver at the real paths, inside a private mount namespace of this process.

Production code reads ``/proc/driver/nvidia``, ``/proc/devices`` and ``/dev/nvidia*`` at their
real locations; this makes the fake's versions appear there for the pytest process and every
child it starts, without changing anything the host sees. Leaving the context re-enters the
original mount namespace, and the private one vanishes with its last user. Test double only.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CLONE_NEWNS = 0x00020000
MS_RDONLY = 0x1
MS_BIND = 0x1000
MS_MOVE = 0x2000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_REMOUNT = 0x20

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str | Path, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else os.fsencode(str(s))  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {source} on {target}")


def bind(source: str | Path, target: str | Path, readonly: bool = True) -> None:
    """``source`` shown at ``target`` in this process's mount namespace (read-only unless ``readonly`` is False)."""
    _mount(str(source), target, None, MS_BIND | MS_REC)
    if readonly:
        _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)


def _copy_nodes(src: Path, dst: Path) -> None:
    """Recreate the fake root's device nodes (and their directories) under ``dst``."""
    for entry in sorted(src.rglob("*")):
        rel = entry.relative_to(src)
        st = entry.lstat()
        if stat.S_ISDIR(st.st_mode):
            (dst / rel).mkdir(mode=stat.S_IMODE(st.st_mode), exist_ok=True)
        elif stat.S_ISCHR(st.st_mode):
            os.mknod(dst / rel, st.st_mode, st.st_rdev)


def _overlay_dev(nodes: Path, staging: Path) -> None:
    """Put the fake nodes over /dev: an overlay keeps every real node and adds the fake ones."""
    _mount("tmpfs", staging, "tmpfs", 0, "mode=0755")
    for name in ("upper", "work", "merged"):
        (staging / name).mkdir()
    _copy_nodes(nodes, staging / "upper")
    merged = staging / "merged"
    _mount("overlay", merged, "overlay", 0, f"lowerdir=/dev,upperdir={staging}/upper,workdir={staging}/work")
    # Mounts below /dev are not part of the devtmpfs the overlay shows: carry them over.
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mountpoint = line.split()[4]
        if mountpoint.startswith("/dev/") and mountpoint.count("/") == 2:
            target = merged / mountpoint[len("/dev/") :]
            if target.is_dir():
                _mount(mountpoint, target, None, MS_BIND | MS_REC)
    _mount(str(merged), "/dev", None, MS_MOVE)


def _setns_back(original: int) -> None:
    """Re-enter mount namespace ``original``. setns refuses a process with several threads: a thread
    a test joined may not have left the kernel yet, so wait for it (bounded)."""
    deadline = time.monotonic() + 5
    while len(os.listdir("/proc/self/task")) > 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    _check(_libc.setns(original, CLONE_NEWNS), "setns back to the original mount namespace")


def _unshare_private() -> None:
    """This process into a mount namespace of its own, every mount private to it."""
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)


@contextmanager
def private_mounts() -> Iterator[None]:
    """Run the body in a private mount namespace of this process (every mount made in it vanishes
    with it); the body's children inherit it."""
    original = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    cwd = os.getcwd()
    try:
        _unshare_private()
        try:
            yield
        finally:
            _setns_back(original)
            os.chdir(cwd)
    finally:
        os.close(original)


@contextmanager
def activate(fake: FakeDriver) -> Iterator[FakeDriver]:  # noqa: F821 (build.FakeDriver)
    """Show ``fake``'s /proc/driver, /proc/devices, /dev nodes and sysfs PCI devices at the real
    paths until exit."""
    staging = Path(tempfile.mkdtemp(prefix="nvc-fake-dev-"))
    try:
        with private_mounts():
            show(fake, staging)
            yield fake
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def show(fake: FakeDriver, staging: Path) -> None:  # noqa: F821 (build.FakeDriver)
    """Show ``fake`` at the real paths in this process's mount namespace, which must be a private
    one (:func:`activate`, or a child's that ends with it: demo/try.py); ``staging`` holds /dev's overlay."""
    bind(fake.proc / "driver", "/proc/driver")
    bind(fake.proc / "devices", "/proc/devices")
    if any(fake.sys.glob("*/drm")):  # only then: under an overmount in /sys, a container with a user
        bind(fake.sys, "/sys/bus/pci/devices")  # namespace may not mount a sysfs of its own (EPERM)
    _overlay_dev(fake.root / "dev", staging)


def enter_private_tmpfs(*paths: str) -> None:
    """This process (and what it starts), from now on, in a private mount namespace with an empty
    tmpfs at each of ``paths``; the host keeps its own directories untouched (a missing one is
    created empty for the mount: :class:`hostcheck.PrivateRun` removes it again). There is no way
    back: it is for a whole test session, whose namespace ends with its process (which may have
    threads by then, and setns refuses a process with several)."""
    _unshare_private()
    for path in paths:
        os.makedirs(path, mode=0o700, exist_ok=True)
        _mount("tmpfs", path, "tmpfs", 0, "mode=0700")


MNT_DETACH = 2


def umount(path: str, flags: int = 0) -> None:
    """umount2(``path``, ``flags``)."""
    _check(_libc.umount2(os.fsencode(path), flags), f"umount {path}")
