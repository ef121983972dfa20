"""GPU sharing's host side, made and removed: the files :mod:`nvc.plan.share` decided for a container.

``make`` makes them when the plan is applied, in the mount namespace the hook runs in (the host's):
the part the container can write is a small tmpfs of fixed size mounted for it alone, so a workload
cannot fill the host's /run; root's tools treat everything in it as hostile. ``remove`` (poststop,
or a later step of the plan failing) takes them away again without following anything the container
planted there.
"""

from __future__ import annotations

import os
from pathlib import Path

from nvc.errors import ContainerError, MountError
from nvc.plan.share import BOUNDS_FILE, GRANTED_DIR, GRANTED_MAX, STATE_DIR, ShareFiles, container_dir, sched_dir_for
from nvc.share.region import SIZE as REGION_SIZE
from nvc.share.sched import SIZE as SCHED_FILE_SIZE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from nvc.apply.container import ContainerHandle

# The scheduler's tmpfs (native/shim/scheduling/sched.c): room for this many containers' files and granted limits.
_SCHED_TENANTS = 1024
_TMPFS_INODES = 3  # the shared tmpfs's root directory, limits and region
_MAX_STACKED = 8  # mounts on a container's shared directory that remove() detaches


def write_new(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    """A new file with exactly this mode (umask ignored); an existing one is an error."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
    finally:
        os.close(fd)


def tmpfs_options(limits_size: int, page_size: int) -> tuple[tuple[str, str], ...]:
    """The shared tmpfs's size and inode count: exactly the limits file and the region (preallocated),
    so once filled it has no room left for anything a container process would write."""
    pages = -(-REGION_SIZE // page_size) + max(1, -(-limits_size // page_size))
    return (("size", str(pages * page_size)), ("nr_inodes", str(_TMPFS_INODES)), ("huge", "never"))


def write_share_files(dir_fd: int, limits: bytes) -> None:
    """The shim's two files in the directory open on ``dir_fd``: limits (0444) and the region (0666,
    so a non-root workload can open it) at its final size, its blocks allocated now: the shim never
    grows it (native/README.md), and a full tmpfs cannot fail its first writes."""
    write_new(dir_fd, "limits", limits, 0o444)
    fd = os.open("region", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dir_fd)
    try:
        os.fchmod(fd, 0o666)
        os.posix_fallocate(fd, 0, REGION_SIZE)
    finally:
        os.close(fd)


def write_share_dir(path: Path, limits: str) -> Path:
    """A plain ``path/shared`` directory with the shim's files (``limits``: the limits file's text,
    :func:`nvc.plan.share.limits_text`), for plain LD_PRELOAD use through NVC_SHARE_DIR (bench/share.py,
    the GPU tests); containers get :func:`make`'s tmpfs. Returns it."""
    shared = path / "shared"
    os.mkdir(shared, 0o755)
    os.chmod(shared, 0o755)
    fd = os.open(shared, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        write_share_files(fd, limits.encode())
    finally:
        os.close(fd)
    return shared


def _open_sched_dir(sched_dir: str) -> int:
    """An O_PATH fd of the scheduler tmpfs, mounted (once, under a lock: hooks run concurrently) on
    first use: ``_SCHED_TENANTS`` files of ``SCHED_FILE_SIZE`` and their granted limits, and no more,
    so a container growing its own file fills that tmpfs, never the host's /run."""
    import fcntl

    from nvc.apply import fdmount
    from nvc.system.syscalls import MountAttr

    parent, name = os.path.split(sched_dir.rstrip("/"))
    lock_fd = _make_dir(sched_dir, 0o755, os.O_RDONLY, "scheduler directory")
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        parent_fd = os.open(parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_dev == os.fstat(parent_fd).st_dev:
                size = _SCHED_TENANTS * (SCHED_FILE_SIZE + GRANTED_MAX)
                inodes = 2 * _SCHED_TENANTS + 2  # the files, the root and GRANTED_DIR
                fdmount.mount_tmpfs(
                    parent_fd,
                    name,
                    MountAttr.NOSUID | MountAttr.NODEV | MountAttr.NOEXEC,
                    dest_path=sched_dir,
                    mode=0o755,
                    options=(("size", str(size)), ("nr_inodes", str(inodes)), ("huge", "never")),
                ).close()
            fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
        finally:
            os.close(parent_fd)
    finally:
        os.close(lock_fd)
    return _ours(fd, "scheduler directory", sched_dir)


def _ours(fd: int, what: str, path: str) -> int:
    """fd, once the directory it names is root's and not writable by others (else closed, refused)."""
    from nvc.system.untrusted import directory_problem

    problem = directory_problem(fd, 0o022)
    if problem:
        os.close(fd)
        raise ContainerError(f"{what} {path} must be ours and not writable by others ({problem})")
    return fd


def _write_sched_file(sched_dir: str, container_id: str, granted: bytes) -> None:
    """The container's scheduler file (0666: the workload may be any uid; only its own bind mount of
    it is writable), allocated now so the shim's writes never need a block; before it, its granted
    limits (``GRANTED_DIR``, root's, 0444), so that a shim that finds the file finds them too."""
    fd = _open_sched_dir(sched_dir)
    try:
        try:
            os.mkdir(GRANTED_DIR, 0o755, dir_fd=fd)
        except FileExistsError:
            pass
        try:
            granted_fd = os.open(GRANTED_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except OSError as err:
            raise ContainerError(f"cannot use {sched_dir}/{GRANTED_DIR}: {err.strerror}") from None
        try:
            os.fchmod(granted_fd, 0o755)
            write_new(granted_fd, container_id, granted, 0o444)
        except FileExistsError:
            raise ContainerError(f"{sched_dir}/{GRANTED_DIR}/{container_id} already exists") from None
        except OSError as err:
            raise ContainerError(f"cannot write {sched_dir}/{GRANTED_DIR}/{container_id}: {err.strerror}") from None
        finally:
            os.close(granted_fd)
        try:
            file_fd = os.open(
                container_id, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=fd
            )
        except FileExistsError:
            raise ContainerError(f"scheduler file {sched_dir}/{container_id} already exists") from None
        try:
            os.fchmod(file_fd, 0o666)
            os.posix_fallocate(file_fd, 0, SCHED_FILE_SIZE)
        except OSError as err:
            raise ContainerError(f"cannot make scheduler file {sched_dir}/{container_id}: {err.strerror}") from None
        finally:
            os.close(file_fd)
    finally:
        os.close(fd)


def _open_state_dir(state_dir: str) -> int:
    """An O_PATH fd of the state directory, made (0700, parents too) if missing. Every container's
    limits live below it, so it must be a directory of ours that no one else can write, and not a
    symlink to someone else's."""
    old = os.umask(0o077)
    try:
        fd = _make_dir(state_dir, 0o700, os.O_PATH, "sharing directory")
    finally:
        os.umask(old)
    return _ours(fd, "sharing directory", state_dir)


def _make_dir(path: str, mode: int, flags: int, what: str) -> int:
    """An fd (``flags``) of directory ``path``, made with ``mode`` (parents too) if missing; no symlink."""
    try:
        os.makedirs(path, mode, exist_ok=True)
        return os.open(path, flags | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise ContainerError(f"cannot use {what} {path}: {err.strerror}") from None


def make(files: ShareFiles, handle: ContainerHandle | None = None) -> None:
    """Make what :func:`nvc.plan.share.files` decided, in the mount namespace the hook runs in (the host's, where the
    runtime runs hooks): the record of the container they belong to (its bundle and init process, the
    one ``handle`` pins: :mod:`nvc.apply.shareowner`), a tmpfs of fixed size (``tmpfs_options``: the limits file and the
    preallocated region, nothing more) on ``<state_dir>/<id>/shared``, filled, so what the container
    may write is that tmpfs, never the host's /run; a scheduled container's file in ``sched_dir``
    (``_open_sched_dir``). On failure at any step, what was made is unmounted and removed again
    (``remove``): nothing is left on the host. A directory that exists already (a stale container's)
    is refused and left alone; a host file that cannot be made (/run full) is one ContainerError."""
    from nvc.apply import shareowner

    record = shareowner.encode(shareowner.of_container(handle, files.bundle))
    path = files.directory
    state_fd = _open_state_dir(files.state_dir)
    try:
        try:
            os.mkdir(files.container_id, 0o755, dir_fd=state_fd)
        except FileExistsError:
            raise ContainerError(
                f"sharing directory {path} already exists (stale container {files.container_id}?)"
            ) from None
        except OSError as err:
            raise _cannot_make(files, err) from None
        try:
            _fill(state_fd, path, record, files.limits.encode(), files.preload.encode(), files.bounds.encode())
            if files.scheduled:
                _write_sched_file(files.sched_dir, files.container_id, files.granted.encode())
        except BaseException as err:
            remove(files.container_id, files.state_dir, files.sched_dir)
            if isinstance(err, OSError):
                raise _cannot_make(files, err) from None
            raise
    finally:
        os.close(state_fd)


def _cannot_make(files: ShareFiles, err: OSError) -> ContainerError:
    return ContainerError(
        f"cannot make the sharing files of container {files.container_id} in {files.state_dir}: {err.strerror}"
    )


def _fill(state_fd: int, path: Path, owner: bytes, limits: bytes, preload: bytes, bounds: bytes) -> None:
    """The new container directory: its owner record first (never mounted into the container), the
    shared tmpfs with its files, and ld.so.preload beside it (outside the tmpfs: the container sees
    it only as a read-only bind); a pod's container's bounds last, root's like its owner record."""
    from nvc.apply import fdmount
    from nvc.apply.shareowner import FILE as OWNER_FILE
    from nvc.system.syscalls import MountAttr

    dir_fd = os.open(path.name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=state_fd)
    try:
        write_new(dir_fd, OWNER_FILE, owner, 0o444)
        os.mkdir("shared", 0o755, dir_fd=dir_fd)
        mount = fdmount.mount_tmpfs(
            dir_fd,
            "shared",
            MountAttr.NOSUID | MountAttr.NODEV | MountAttr.NOEXEC,
            dest_path=str(path / "shared"),
            mode=0o755,
            options=tmpfs_options(len(limits), os.sysconf("SC_PAGE_SIZE")),
        )
        try:
            write_share_files(mount.fd, limits)
        finally:
            mount.close()
        write_new(dir_fd, "ld.so.preload", preload, 0o444)
        if bounds:
            write_new(dir_fd, BOUNDS_FILE, bounds, 0o444)
    finally:
        os.close(dir_fd)


def remove(container_id: str, state_dir: str = STATE_DIR, sched_dir: str | None = None) -> None:
    """Unmount a container's shared tmpfs and drop its directory and scheduler file; missing ones are fine.

    Nothing the container planted is followed or even walked: the tmpfs is detached (MNT_DETACH)
    before anything is removed, and the rest of the directory, the hook's own, is removed relative
    to directory fds without following symlinks. Best effort (the teardown must not fail): a tmpfs
    that cannot be unmounted is left in place, directory and all, rather than walked.
    """
    import shutil  # here: only removal needs it, not the container start that makes the files

    container_dir(container_id, state_dir)
    try:
        sched_fd = os.open(
            sched_dir or sched_dir_for(state_dir), os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        )
    except OSError:
        pass
    else:
        try:
            for name in (container_id, f"{GRANTED_DIR}/{container_id}"):
                try:
                    os.unlink(name, dir_fd=sched_fd)
                except OSError:
                    pass  # none (not scheduled) or gone already
        finally:
            os.close(sched_fd)
    try:
        state_fd = os.open(state_dir, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if _unmount_shared(state_fd, container_id, str(Path(state_dir) / container_id / "shared")):
            shutil.rmtree(container_id, ignore_errors=True, dir_fd=state_fd)
    finally:
        os.close(state_fd)


def remove_stopped(container_id: str, bundle: str, state_dir: str = STATE_DIR) -> bool:
    """poststop: :func:`remove` the directory of ``container_id`` only when it is the stopped
    container's (``bundle``: its state's, "" when none): by the owner record prestart wrote, its
    process gone and its bundle the same. A directory without a record (made before records were)
    is removed by id, as it was then. True when the container was this one (its directory, if
    any, removed)."""
    from nvc.apply import shareowner

    container_dir(container_id, state_dir)
    try:
        dir_fd = os.open(
            os.path.join(state_dir, container_id), os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        )
    except OSError:
        record = None
    else:
        try:
            record = shareowner.read(dir_fd)
        finally:
            os.close(dir_fd)
    if record is None or shareowner.stopped(record, bundle):
        remove(container_id, state_dir)
        return True
    return False


def _unmount_shared(state_fd: int, name: str, path: str) -> bool:
    """Detach whatever is mounted on ``<name>/shared`` (the tmpfs; mounts stacked there too); True
    when the container directory exists and nothing is mounted in it any more."""
    from nvc.apply import fdmount

    try:
        dir_fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=state_fd)
    except OSError:
        return False
    try:
        own_dev = os.fstat(dir_fd).st_dev
        for _ in range(_MAX_STACKED):
            try:
                if os.stat("shared", dir_fd=dir_fd, follow_symlinks=False).st_dev == own_dev:
                    return True
                fd = os.open("shared", os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            except FileNotFoundError:
                return True
            fdmount.unmount(fdmount.Mount(fd, path))
    except (OSError, MountError):
        return False
    finally:
        os.close(dir_fd)
    return False
