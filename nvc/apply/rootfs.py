"""Path resolution and file creation inside a container rootfs that nvc-py does not trust.

A hostile image controls every symlink in its rootfs: ``/usr/lib/x86_64-linux-gnu -> /etc``
or ``lib -> ../../../..`` must never make nvc-py create or mount anything on the host
(CVE-2024-0132/0133/0134, CVE-2025-23359). So everything here works on file descriptors
relative to an fd of the rootfs, and symlinks are resolved as the container would see
them: an absolute target or a ``..`` at the top lands back in the rootfs, never above it.
The kernel does this for us with openat2(RESOLVE_IN_ROOT); where the kernel lacks openat2
(ENOSYS) the same resolution is done by hand, one O_PATH|O_NOFOLLOW component at a time.
"""

import errno
import os
import posixpath
import stat
from collections import deque
from collections.abc import Callable

from nvc.records import NamedTuple
from nvc.system import syscalls

_MAX_SYMLINKS = 40  # the kernel's limit (ELOOP beyond it)

_openat2_missing = False  # set once openat2 answered ENOSYS: do not ask again


def _components(path: str) -> list[str]:
    return [c for c in path.split("/") if c not in ("", ".")]


class InRootError(OSError):
    """A path inside the root that cannot be resolved or made, with ``why`` in the image's terms.

    ``why`` names the path inside the image that is in the way and what it is (a symbolic
    link that loops, a file where a directory is needed, a link leading where nothing can be
    made), because the bare errno would point at the wrong thing: the component the user has
    to fix is rarely the path that was asked for.
    """

    def __init__(self, code: int, path: str, why: str) -> None:
        super().__init__(code, os.strerror(code), path)
        self.why = why


_KINDS = {
    stat.S_IFREG: "a regular file",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
}


class _Link(NamedTuple):
    """A symbolic link followed on the way, as the image names it (for messages)."""

    path: str
    target: str


Maker = Callable[[int, str, str], None]  # (dir fd, name, path as resolved): makes name in dir fd


def _walk(
    root_fd: int, path: str, follow_last: bool, mkdir: Maker | None = None, make_last: Maker | None = None
) -> tuple[int, str, str]:
    """Resolve ``path`` inside the root by hand: (fd of its parent dir, last name, canonical path).

    chroot semantics, as openat2(RESOLVE_IN_ROOT) and runc's securejoin have them: symlinks
    met on the way (and the last one if ``follow_last``) are read and resolved again from the
    root for an absolute target, or from the current directory for a relative one; ".." never
    climbs above the root. The parent fd is an O_PATH directory fd owned by the caller; the
    last name may not exist, and is "." only where the path is the root itself. With
    ``mkdir``, missing directories (also those a dangling symlink points to) are made by
    ``mkdir(dir_fd, name, canonical path)``, and a missing last name by ``make_last``.
    Failures raise :class:`InRootError`.
    """
    stack = [(os.dup(root_fd), "")]  # (O_PATH fd, canonical path inside the root) of each dir
    todo = deque(_components(path))
    links: list[_Link] = []  # every link followed, in order: the first names a loop, the last a dead end
    retries = 0  # times the current name was made and not found again
    try:
        while todo:
            name = todo.popleft()
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop()[0])
                continue
            last = not todo
            dir_fd, dir_path = stack[-1]
            here = f"{dir_path}/{name}"
            try:
                fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            except FileNotFoundError:
                if last:
                    _make(make_last, dir_fd, name, path, here, links)
                    return os.dup(dir_fd), name, here
                if mkdir is None:
                    raise _dead_end(errno.ENOENT, path, here, links, "does not exist") from None
                retries += 1
                if retries > _MAX_SYMLINKS:  # made and gone again, over and over: a racing image
                    raise _dead_end(errno.ENOENT, path, here, links, "keeps disappearing") from None
                _make(mkdir, dir_fd, name, path, here, links)
                todo.appendleft(name)  # looked at again: what was made, or what was made meanwhile
                continue
            except OSError as err:
                raise _dead_end(
                    err.errno or errno.EIO, path, here, links, f"cannot be opened: {err.strerror}"
                ) from None
            retries = 0
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode) and (follow_last or not last):
                target = os.readlink("", dir_fd=fd)
                os.close(fd)
                links.append(_Link(here, target))
                if len(links) > _MAX_SYMLINKS:
                    raise InRootError(
                        errno.ELOOP, path, f"{links[0].path} is a symbolic link to {links[0].target} that loops"
                    )
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop()[0])
                todo.extendleft(reversed(_components(target)))
                continue
            if last:
                os.close(fd)
                return os.dup(dir_fd), name, here
            if not stat.S_ISDIR(mode):
                os.close(fd)
                raise _dead_end(
                    errno.ENOTDIR,
                    path,
                    here,
                    links,
                    f"is {_KINDS.get(stat.S_IFMT(mode), 'not a directory')} where a directory is needed",
                )
            stack.append((fd, here))
        # The path ended on a directory reached through "..", "/" or a link: name it in its parent.
        if len(stack) == 1:
            return os.dup(stack[0][0]), ".", "/"
        fd, here = stack.pop()
        os.close(fd)
        return os.dup(stack[-1][0]), posixpath.basename(here), here
    finally:
        for fd, _ in stack:
            os.close(fd)


def _make(maker: Maker | None, dir_fd: int, name: str, path: str, here: str, links: list[_Link]) -> None:
    """``maker(dir_fd, name, here)``; an existing file is fine (its kind is checked by its user)."""
    if maker is None:
        return
    try:
        maker(dir_fd, name, here)
    except FileExistsError:
        pass
    except OSError as err:
        raise _dead_end(
            err.errno or errno.EIO, path, here, links, f"does not exist and cannot be created: {err.strerror}"
        ) from None


def _dead_end(code: int, path: str, here: str, links: list[_Link], what: str) -> InRootError:
    """The error for ``here`` (canonical, inside the root), which ``what`` says is unusable, told
    through the last link followed, the one that most likely led there."""
    if not links:
        return InRootError(code, path, f"{here} {what}")
    return InRootError(code, path, f"{links[-1].path} is a symbolic link to {links[-1].target}: {here} {what}")


def open_in_root(root_fd: int, path: str, flags: int, mode: int = 0o644) -> int:
    """Open ``path`` (read as a path inside the root) relative to ``root_fd``; return the fd.

    Symlinks are followed as the container would follow them, but never out of the root
    and never through /proc magic links. O_NOFOLLOW in ``flags`` applies to the last
    component as usual. The fd is close-on-exec.
    """
    global _openat2_missing
    if not _openat2_missing:
        try:
            return syscalls.openat2(
                root_fd,
                path,
                flags,
                mode,
                syscalls.RESOLVE_IN_ROOT | syscalls.RESOLVE_NO_MAGICLINKS,
            )
        except OSError as err:
            if err.errno != errno.ENOSYS:
                raise
            _openat2_missing = True
    return _open_walked(root_fd, path, flags, mode)


def _open_walked(root_fd: int, path: str, flags: int, mode: int) -> int:
    """open_in_root without openat2: walk to the parent, then open the last name no-follow.

    If the last name turns out to be a symlink (it may have become one since the walk),
    it is resolved inside the root like any other and the open retried.
    """
    follow = not flags & os.O_NOFOLLOW
    for _ in range(_MAX_SYMLINKS):
        try:
            dir_fd, name, _ = _walk(root_fd, path, follow_last=follow)
        except InRootError as err:
            raise OSError(err.errno, err.strerror, path) from None
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
        except OSError as err:
            if not follow or err.errno != errno.ELOOP:
                raise OSError(err.errno, err.strerror, path) from None
            continue  # swapped for a symlink under our feet: resolve again
        finally:
            os.close(dir_fd)
        if follow and flags & os.O_PATH and stat.S_ISLNK(os.fstat(fd).st_mode):
            os.close(fd)
            continue
        return fd
    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)


def open_parent_in_root(root_fd: int, path: str) -> tuple[int, str]:
    """An O_PATH fd of the directory that holds ``path`` inside the root, and the last name.

    The last name is not resolved: callers create, link or mount it relative to the fd,
    where a symlink under that name can no longer redirect them.
    """
    parent, name = posixpath.split(path.rstrip("/") or "/")
    if name in ("", ".", ".."):
        raise OSError(errno.EINVAL, "path has no last name to create", path)
    return open_in_root(root_fd, parent or "/", os.O_PATH | os.O_DIRECTORY), name


def _chown(name: str, owner: tuple[int, int] | None, dir_fd: int) -> None:
    if owner is not None:
        os.chown(name, owner[0], owner[1], dir_fd=dir_fd, follow_symlinks=False)


def resolve_in_root(root_fd: int, path: str, mkdir: Maker, make_last: Maker | None = None) -> tuple[int, str, str]:
    """Where ``path`` leads inside the root, for creating or mounting something there.

    Returns an O_PATH fd of the directory that holds it, the last name there (anything but a
    symlink: the last component is followed too, as runc and the reference follow a mount
    destination; absent unless ``make_last`` made it) and the path as resolved (for
    messages). Missing directories on the way, also those a dangling symlink points to, are
    made by ``mkdir(dir_fd, name, path)``. The common case (the parent exists) costs one
    openat2; anything else is walked by hand, which makes what is missing and explains what
    is in the way (:class:`InRootError`).
    """
    parent, name = posixpath.split(path.rstrip("/") or "/")
    if not _openat2_missing and name not in ("", ".", ".."):
        try:
            dir_fd = open_in_root(root_fd, parent or "/", os.O_PATH | os.O_DIRECTORY)
        except OSError:
            pass  # missing, a loop, a file on the way: the walk makes or explains it
        else:
            try:
                try:
                    if not stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                        return os.dup(dir_fd), name, path
                except FileNotFoundError:
                    _make(make_last, dir_fd, name, path, path, [])
                    return os.dup(dir_fd), name, path
            finally:
                os.close(dir_fd)
    return _walk(root_fd, path, follow_last=True, mkdir=mkdir, make_last=make_last)


def create_file_in_root(
    root_fd: int,
    path: str,
    mode: int = 0o644,
    owner: tuple[int, int] | None = None,
    access: int = os.O_RDONLY,
) -> int:
    """Create a new regular file inside the root (never an existing one); return its fd.

    O_CREAT|O_EXCL|O_NOFOLLOW on the resolved parent: a symlink at ``path`` is not
    followed, an existing file raises FileExistsError. Parents must exist.
    """
    dir_fd, name = open_parent_in_root(root_fd, path)
    try:
        fd = os.open(name, access | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    except OSError as err:
        raise OSError(err.errno, err.strerror, path) from None
    finally:
        os.close(dir_fd)
    if owner is not None:
        os.fchown(fd, *owner)
    return fd


def symlink_in_root(root_fd: int, path: str, target: str, owner: tuple[int, int] | None = None) -> bool:
    """Create symlink ``path`` -> ``target`` inside the root, never replacing a file.

    Returns False when ``path`` already is a symlink to ``target`` (nothing to do); any
    other existing file raises FileExistsError. The link is made under a temporary name
    in the resolved parent, owned, then renamed with RENAME_NOREPLACE, so it appears
    complete or not at all and a file created meanwhile is never overwritten.
    """
    dir_fd, name = open_parent_in_root(root_fd, path)
    try:
        try:
            if os.readlink(name, dir_fd=dir_fd) == target:
                return False
            raise OSError(errno.EEXIST, os.strerror(errno.EEXIST), path)
        except OSError as err:
            if err.errno == errno.EINVAL:  # exists, not a symlink
                raise OSError(errno.EEXIST, os.strerror(errno.EEXIST), path) from None
            if err.errno != errno.ENOENT:
                raise
        tmp = f".nvc-{os.urandom(6).hex()}"  # not secrets: it imports hashlib (OpenSSL), ms per start
        os.symlink(target, tmp, dir_fd=dir_fd)
        try:
            _chown(tmp, owner, dir_fd)
            syscalls.renameat2(dir_fd, tmp, dir_fd, name, syscalls.RENAME_NOREPLACE)
        except OSError as err:
            os.unlink(tmp, dir_fd=dir_fd)
            raise OSError(err.errno, err.strerror, path) from None
        return True
    finally:
        os.close(dir_fd)


def remove_in_root(root_fd: int, path: str) -> None:
    """Remove a file, symlink or empty directory that nvc-py created (for rollback)."""
    dir_fd, name = open_parent_in_root(root_fd, path)
    try:
        remove_at(dir_fd, name, path)
    finally:
        os.close(dir_fd)


def remove_at(dir_fd: int, name: str, path: str) -> None:
    """Remove ``name`` in ``dir_fd`` (a file, symlink or empty directory; ``path`` names it in errors)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            os.rmdir(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)
    except OSError as err:
        raise OSError(err.errno, err.strerror, path) from None


class SavedFile:
    """What ``path`` inside a root was before a tool (ldconfig) replaced it, for :func:`restore_file`.

    ``kind``: "absent", "link" (``link`` its target) or "file" (``fd`` open for reading on the
    old inode: a tool that replaces by rename leaves it intact); anything else is "other",
    which the tool refuses to touch, so there is nothing to restore.
    """

    __slots__ = ("path", "kind", "link", "fd", "stat")

    def __init__(self, path: str, kind: str, link: str = "", fd: int = -1, stat: os.stat_result | None = None) -> None:
        self.path, self.kind, self.link, self.stat = path, kind, link, stat
        self.fd = fd  # -1 once closed (close_saved)


def save_file(root_fd: int, path: str) -> SavedFile:
    """Remember ``path`` (never opened through a device or FIFO: checked on an O_PATH fd first)."""
    try:
        dir_fd, name = open_parent_in_root(root_fd, path)
    except (FileNotFoundError, NotADirectoryError):
        return SavedFile(path, "absent")
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return SavedFile(path, "absent")
    finally:
        os.close(dir_fd)
    try:
        st = os.fstat(fd)
        if stat.S_ISLNK(st.st_mode):
            return SavedFile(path, "link", link=os.readlink("", dir_fd=fd), stat=st)
        if not stat.S_ISREG(st.st_mode):
            return SavedFile(path, "other", stat=st)
        # A regular file, checked: reopened through the fd, no path looked up again.
        return SavedFile(path, "file", fd=os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC), stat=st)
    finally:
        os.close(fd)


def restore_file(root_fd: int, saved: SavedFile) -> None:
    """Put ``saved`` back as it was (same type, content, mode, owner, times); closes its fd.

    A replacement is built under a temporary name in the same directory, then renamed over
    whatever is there now, so the path is never missing or half-written.
    """
    try:
        try:
            dir_fd, name = open_parent_in_root(root_fd, saved.path)
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            _restore_at(dir_fd, name, saved)
        except OSError as err:
            raise OSError(err.errno, err.strerror, saved.path) from None
        finally:
            os.close(dir_fd)
    finally:
        close_saved(saved)


def close_saved(saved: SavedFile) -> None:
    """Drop a saved file's fd (kept: nothing to restore)."""
    if saved.fd >= 0:
        os.close(saved.fd)
        saved.fd = -1


def _restore_at(dir_fd: int, name: str, saved: SavedFile) -> None:
    try:
        now: os.stat_result | None = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        now = None
    if saved.kind == "absent":
        if now is not None and not stat.S_ISDIR(now.st_mode):
            os.unlink(name, dir_fd=dir_fd)
        return
    if saved.kind == "other" or saved.stat is None:
        return
    old = saved.stat
    if now is not None and (now.st_dev, now.st_ino) == (old.st_dev, old.st_ino):
        return  # untouched
    tmp = f".nvc-{os.urandom(6).hex()}"
    if saved.kind == "link":
        os.symlink(saved.link, tmp, dir_fd=dir_fd)
    else:
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        try:
            offset = 0
            while sent := os.sendfile(out, saved.fd, offset, 1 << 20):
                offset += sent
            os.fchmod(out, stat.S_IMODE(old.st_mode))
        except BaseException:
            os.close(out)
            os.unlink(tmp, dir_fd=dir_fd)
            raise
        os.close(out)
    try:
        os.chown(tmp, old.st_uid, old.st_gid, dir_fd=dir_fd, follow_symlinks=False)
        os.utime(tmp, ns=(old.st_atime_ns, old.st_mtime_ns), dir_fd=dir_fd, follow_symlinks=False)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        os.unlink(tmp, dir_fd=dir_fd)
        raise
