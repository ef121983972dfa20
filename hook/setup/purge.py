"""What ``dpkg --purge nvc-py`` removes of the files nvc-py's programs made at run time: the hooks'
run directory /run/nvc-py (the scheduler's tmpfs on its gpu-sched unmounted first), the MPS daemons'
directory /run/nvc-py-mps (each daemon its record names told to quit, killed when it does not), the
log and its rotations in /var/log, the no-server file and /etc/nvc-py once empty.

Any of these paths may have been replaced by a symlink (a local administrator's mistake, a container
that wrote through a bind mount, someone who wants root to remove or unmount their target for them).
So nothing is ever reached through a link: every directory is opened relative to its parent's fd
with O_NOFOLLOW, every entry removed with unlinkat against that fd, never a path string; a link, an
entry of another mount, or anything nvc-py does not make is left where it is and named. The
scheduler's tmpfs is unmounted only when it is nvc-py's own: /proc/self/mountinfo lists a tmpfs
mounted exactly at /run/nvc-py/gpu-sched, and the directory reached by the walk is the root of that
very mount (its mount id, from fdinfo); it is unmounted through that fd, never by path.

Refused (exit 1, nothing changed) while /run/nvc-py/share or gpu-sched holds a container's
GPU-sharing state: the rest waits for another purge once the containers have stopped.

Standard library only, no import of nvc: at purge the package's files are gone, so tools/debpkg.py
writes this file into postrm, which runs it with the distribution's python3. ``--root`` (tests) reads
another tree as /.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import os
import re
import stat
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

RUN_DIR = "run/nvc-py"
MPS_DIR = "run/nvc-py-mps"  # nvc.plan.mps.MPS_DIR: <UUID>/daemon is root's record of the daemon started
MPS_STOP_WAIT = 10.0  # seconds for a daemon told to quit to exit
SHARING_DIRS = ("share", "gpu-sched")  # the containers' state: a purge waits until they are empty
SCHED_DIR = "gpu-sched"
LOG_DIR = "var/log"
LOG_FILE = re.compile(r"nvc-py\.log(\.[0-9].*)?")  # the log and logrotate's rotations
ETC_DIR = "etc/nvc-py"
ETC_FILES = ("no-server",)  # what `nvc-py setup --no-server` writes; dpkg removes the conffile
MNT_DETACH = 2
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Mount(NamedTuple):
    """One line of /proc/self/mountinfo, as far as telling nvc-py's tmpfs needs."""

    mount_id: int
    mount_point: str
    fstype: str


class Outcome(NamedTuple):
    """What a purge did: ``refused`` (nothing changed), or removed what it could and ``left`` the rest."""

    refused: str
    left: list[str]


def _unescape(path: str) -> str:
    """mountinfo writes space, tab, newline and backslash as three octal digits after a backslash."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def parse_mountinfo(text: str) -> list[Mount]:
    """Every mount of a mountinfo text: its id, mount point and filesystem type (after the " - ")."""
    mounts = []
    for line in text.splitlines():
        fields, sep, rest = line.partition(" - ")
        parts = fields.split()
        if sep and len(parts) >= 5 and rest.split():
            mounts.append(Mount(int(parts[0]), _unescape(parts[4]), rest.split()[0]))
    return mounts


def fd_mount_id(fdinfo: str) -> int | None:
    """The ``mnt_id`` of an fdinfo text."""
    found = re.search(r"^mnt_id:\s*(\d+)$", fdinfo, re.MULTILINE)
    return int(found.group(1)) if found else None


def is_own_sched_mount(mounts: Sequence[Mount], mount_id: int | None, sched_path: str) -> bool:
    """Whether the mount with ``mount_id`` (the directory the walk reached) is a tmpfs mounted
    exactly at ``sched_path`` (mountinfo's paths are the kernel's, never through a link)."""
    return any(m.mount_id == mount_id and m.mount_point == sched_path and m.fstype == "tmpfs" for m in mounts)


def sharing_refusal(held: dict[str, list[str]]) -> str:
    """The refusal for sharing directories that hold entries (``path -> entries``), "" for none."""
    for path, entries in held.items():
        if entries:
            return (
                f"nvc-py: not purged: {path} holds the GPU-sharing state of containers ({' '.join(entries[:5])}); "
                "run apt purge nvc-py again once they have stopped (a container that stopped after nvc-py "
                "was removed had no poststop hook: remove its entries by hand)"
            )
    return ""


# --- the walks: never through a link --------------------------------------------------------------


class NotOurs(Exception):
    """A path that the purge leaves: a link, not a directory, another mount."""


def _describe(dir_fd: int, name: str, path: str) -> str:
    """Why ``name`` (at ``path``) is not walked into: a link (and where it leads), or its type."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as err:
        return f"{path}: {err.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path}: a symlink (to {os.readlink(name, dir_fd=dir_fd)}), not nvc-py's"
    return f"{path}: not a directory"


def open_dir(dir_fd: int, name: str, path: str) -> int | None:
    """``name`` in ``dir_fd`` opened as a directory without following a link; None when absent."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NotOurs(_describe(dir_fd, name, path)) from None
        raise NotOurs(f"{path}: {err.strerror}") from None


def open_path(root_fd: int, relative: str, base: str) -> tuple[int, int] | None:
    """The parent's fd and the directory's fd of ``relative`` under ``root_fd`` (``base`` its path
    without the final slash, for messages), every component opened with O_NOFOLLOW; None when a
    component is absent."""
    parent = os.dup(root_fd)
    path = base
    fd: int | None = None
    try:
        for name in relative.split("/"):
            if fd is not None:
                os.close(parent)
                parent, fd = fd, None
            path = f"{path}/{name}"
            fd = open_dir(parent, name, path)
            if fd is None:
                break
    finally:
        if fd is None:
            os.close(parent)
    return None if fd is None else (parent, fd)


def _entries(fd: int) -> list[str]:
    return sorted(os.listdir(fd))


def remove_tree(parent_fd: int, name: str, path: str, outcome: Outcome) -> bool:
    """Remove ``name`` in ``parent_fd`` and what it holds, on the parent's mount alone, links and
    other mounts left (and named); whether it went."""
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return True
    if stat.S_ISLNK(st.st_mode):
        outcome.left.append(_describe(parent_fd, name, path))
        return False
    try:
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=parent_fd)
            return True
        fd = open_dir(parent_fd, name, path)
        if fd is None:
            return True
        try:
            if _other_mount(fd, parent_fd):
                outcome.left.append(f"{path}: another filesystem is mounted there")
                return False
            gone = [remove_tree(fd, entry, f"{path}/{entry}", outcome) for entry in _entries(fd)]
        finally:
            os.close(fd)
        if not all(gone):
            outcome.left.append(f"{path}: not empty (what is named above)")
            return False
        os.rmdir(name, dir_fd=parent_fd)
    except NotOurs as err:
        outcome.left.append(str(err))
        return False
    except OSError as err:
        outcome.left.append(f"{path}: {err.strerror}")
        return False
    return True


def _umount_fd(fd: int) -> None:
    """Detach the mount whose root ``fd`` is, through /proc/self/fd (the very mount, no path lookup)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(f"/proc/self/fd/{fd}".encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _mount_id(fd: int) -> int | None:
    """The id of the mount ``fd`` is on (None without /proc: a bare chroot)."""
    try:
        with open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as f:
            return fd_mount_id(f.read())
    except OSError:
        return None


def _other_mount(fd: int, parent_fd: int) -> bool:
    """Whether directory ``fd`` is the root of a mount other than its parent's (by mount id: st_dev
    misses a bind mount of the same filesystem)."""
    ids = _mount_id(fd), _mount_id(parent_fd)
    return os.fstat(fd).st_dev != os.fstat(parent_fd).st_dev or (None not in ids and ids[0] != ids[1])


def _is_own_sched_mount(fd: int, sched_path: str) -> bool:
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            mounts = parse_mountinfo(f.read())
    except OSError:
        return False
    return is_own_sched_mount(mounts, _mount_id(fd), sched_path)


def _purge_run(root_fd: int, base: str, outcome: Outcome) -> str:
    """/run/nvc-py: the sharing directories checked, the scheduler's tmpfs unmounted, the tree
    removed; returns a refusal, "" when none."""
    run_path = f"{base}/{RUN_DIR}"
    try:
        opened = open_path(root_fd, RUN_DIR, base)
    except NotOurs as err:
        outcome.left.append(str(err))
        return ""
    if opened is None:
        return ""
    parent_fd, run_fd = opened
    sched_fd = -1  # nvc-py's own scheduler tmpfs, when mounted
    try:
        held: dict[str, list[str]] = {}
        for name in SHARING_DIRS:
            path = f"{run_path}/{name}"
            try:
                fd = open_dir(run_fd, name, path)
            except NotOurs:  # a link holds no state of ours; the removal below names it
                continue
            if fd is None:
                continue
            mounted = _other_mount(fd, run_fd)
            own = mounted and name == SCHED_DIR and _is_own_sched_mount(fd, path)
            if own or not mounted:  # another mount's entries are no container's state; the removal leaves it
                held[path] = _entries(fd)
            if own:
                sched_fd = fd
            else:
                os.close(fd)
        refusal = sharing_refusal(held)
        if refusal:
            return refusal
        if sched_fd >= 0:
            try:
                _umount_fd(sched_fd)
            except OSError as err:
                outcome.left.append(f"{run_path}/{SCHED_DIR}: cannot unmount nvc-py's tmpfs: {err.strerror}")
        remove_tree(parent_fd, os.path.basename(RUN_DIR), run_path, outcome)
        return ""
    finally:
        if sched_fd >= 0:
            os.close(sched_fd)
        os.close(run_fd)
        os.close(parent_fd)


def _start_time(pid: int) -> int | None:
    """/proc/PID/stat's start time (field 22), None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        return int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def stop_mps_daemon(device_fd: int, device: str, pipe_dir: str, log_dir: str) -> None:
    """The daemon root's record in the device directory names (the same pid and start time: the pid
    file in its pipe directory, which containers can write, is not believed) told to quit through
    its control binary, killed when it has not exited ``MPS_STOP_WAIT`` s later."""
    import json
    import select
    import signal
    import subprocess

    try:
        fd = os.open("daemon", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=device_fd)
        try:
            if os.fstat(fd).st_uid != 0:
                return
            doc = json.loads(os.read(fd, 4096))
        finally:
            os.close(fd)
        pid, started, control = int(doc["pid"]), int(doc["start_time"]), str(doc["control"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    if _start_time(pid) != started:
        return
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        env = {"CUDA_VISIBLE_DEVICES": device, "CUDA_MPS_PIPE_DIRECTORY": pipe_dir, "CUDA_MPS_LOG_DIRECTORY": log_dir}
        try:
            subprocess.run([control], input=b"quit\n", env=env, cwd="/", capture_output=True, timeout=MPS_STOP_WAIT)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if not select.select([pidfd], [], [], MPS_STOP_WAIT)[0] and _start_time(pid) == started:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass
    finally:
        os.close(pidfd)


def _purge_mps(root_fd: int, base: str, outcome: Outcome) -> None:
    """/run/nvc-py-mps: each device's daemon stopped, then the tree removed."""
    path = f"{base}/{MPS_DIR}"
    try:
        opened = open_path(root_fd, MPS_DIR, base)
    except NotOurs as err:
        outcome.left.append(str(err))
        return
    if opened is None:
        return
    parent_fd, mps_fd = opened
    try:
        for device in _entries(mps_fd):
            try:
                device_fd = open_dir(mps_fd, device, f"{path}/{device}")
            except NotOurs:
                continue  # the removal below names it
            if device_fd is None:
                continue
            try:
                where = f"/{MPS_DIR}/{device}"
                stop_mps_daemon(device_fd, device, f"{where}/pipe", f"{where}/log")
            finally:
                os.close(device_fd)
        remove_tree(parent_fd, os.path.basename(MPS_DIR), path, outcome)
    finally:
        os.close(mps_fd)
        os.close(parent_fd)


def _purge_files(
    root_fd: int, base: str, relative: str, wanted: Callable[[str], bool], outcome: Outcome, *, then_dir: bool
) -> None:
    """Remove the regular files of directory ``relative`` that ``wanted`` names (anything else of
    such a name is left), then (``then_dir``) the directory itself when that left it empty."""
    path = f"{base}/{relative}"
    try:
        opened = open_path(root_fd, relative, base)
    except NotOurs as err:
        outcome.left.append(str(err))
        return
    if opened is None:
        return
    parent_fd, fd = opened
    try:
        for name in _entries(fd):
            if not wanted(name):
                continue
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                try:
                    os.unlink(name, dir_fd=fd)
                except OSError as err:
                    outcome.left.append(f"{path}/{name}: {err.strerror}")
            elif stat.S_ISLNK(st.st_mode):
                outcome.left.append(_describe(fd, name, f"{path}/{name}"))
            else:
                outcome.left.append(f"{path}/{name}: not a regular file")
        if then_dir:
            left = _entries(fd)
            if left:
                outcome.left.append(f"{path}: it holds {' '.join(left[:5])}")
            else:
                try:
                    os.rmdir(os.path.basename(relative), dir_fd=parent_fd)
                except OSError as err:
                    outcome.left.append(f"{path}: {err.strerror}")
    finally:
        os.close(fd)
        os.close(parent_fd)


def purge(root: str = "/") -> Outcome:
    """The purge (see the module's docstring)."""
    outcome = Outcome("", [])
    base = root.rstrip("/")
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        refusal = _purge_run(root_fd, base, outcome)
        if refusal:
            return Outcome(refusal, [])
        _purge_mps(root_fd, base, outcome)
        _purge_files(root_fd, base, LOG_DIR, lambda name: LOG_FILE.fullmatch(name) is not None, outcome, then_dir=False)
        _purge_files(root_fd, base, ETC_DIR, lambda name: name in ETC_FILES, outcome, then_dir=True)
    finally:
        os.close(root_fd)
    return outcome


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvc-py purge", description=__doc__.split("\n")[0])
    parser.add_argument("--root", default="/", help="the tree to purge (tests)")
    args = parser.parse_args(argv)
    outcome = purge(args.root)
    if outcome.refused:
        print(outcome.refused, file=sys.stderr)
        return 1
    for line in outcome.left:
        print(f"nvc-py: purge left {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
