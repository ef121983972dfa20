"""Files ``nvc-py setup`` writes and removes (hooks.d entries, units, engines' configuration, CDI
specs): all of one command or none, each staged beside its place and renamed over it, a symlink in
its place replaced and never written through, an engine's own configuration kept as a backup before
it is replaced (docs/engines.md).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
from collections.abc import Collection, Mapping

from nvc.errors import InputError, shown
from nvc.hook.setup import engineconf
from nvc.system.untrusted import file_problem, make_directory, read_file


def _not_replaceable(path: str) -> str | None:
    """Why the file at ``path`` must not be replaced by a rename: a directory (the rename would fail),
    a FIFO, device or socket (``--output /dev/null`` never means "make /dev/null a file"). A symlink
    is replaced, never followed."""
    try:
        st = os.lstat(path)
    except OSError:
        return None  # missing, or a path the open below refuses with its reason
    if stat.S_ISDIR(st.st_mode):
        return os.strerror(errno.EISDIR)
    return None if stat.S_ISLNK(st.st_mode) else file_problem(st, max_size=st.st_size)


def write_files(texts: Mapping[str, str], mode: int = 0o644, backup: Collection[str] = ()) -> None:
    """Write every file of ``texts`` (path: text) or none: each is staged beside its place and
    renamed over it only once all are staged, so a bad path leaves nothing half-written; a symlink
    in a file's place is replaced, never written through. Each of ``backup`` (an engine's own
    configuration) that exists is kept as ``PATH.nvc-py.bak`` (engineconf.BACKUP_SUFFIX: the very
    file, hard-linked there) before it is replaced, and its mode stays the file's (it may hold
    credentials); one that holds the text already is left alone. A failure is one InputError
    naming the path and the reason."""
    staged: list[tuple[str, str]] = []
    try:
        for path, text in texts.items():
            make_directory(os.path.dirname(path) or ".", f" (cannot write {path})")
            for place in (path, *([path + engineconf.BACKUP_SUFFIX] if path in backup else [])):
                problem = _not_replaceable(place)
                if problem:
                    raise InputError(f"{place}: cannot write: {problem}")
            if path in backup and holds(path, text):
                continue  # no change: no backup of the same text, no rename
            tmp = staging_name(path)
            file_mode = _mode_of(path, mode) if path in backup else mode
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, file_mode)
                staged.append((tmp, path))
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(text)
                    f.flush()
                    os.fchmod(f.fileno(), file_mode)
                    os.fsync(f.fileno())
            except OSError as err:
                raise InputError(f"{path}: cannot write: {err.strerror}") from None
            except UnicodeEncodeError as err:  # a name given in bytes that are not UTF-8
                raise InputError(
                    f"{path}: cannot write: {shown(err.object[err.start : err.end])} is not UTF-8 text"
                ) from None
        for tmp, path in staged:
            if path in backup:
                _keep_backup(path)
            try:
                os.replace(tmp, path)
            except OSError as err:
                raise InputError(f"{path}: cannot write: {err.strerror}") from None
        for directory in {os.path.dirname(path) or "." for _, path in staged}:
            _sync_directory(directory)
    finally:
        for tmp, _ in staged:
            if os.path.lexists(tmp):
                os.unlink(tmp)


def holds(path: str, text: str) -> bool:
    """Whether the regular file at ``path`` (not followed) holds ``text``."""
    try:
        data = text.encode()
        return read_file(path, len(data), follow=False)[0] == data
    except (OSError, InputError, UnicodeEncodeError):
        return False


def _mode_of(path: str, default: int) -> int:
    """The permission bits of the regular file at ``path`` (not followed), else ``default``."""
    try:
        st = os.lstat(path)
    except OSError:
        return default
    return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else default


def staging_name(path: str, kind: str = "tmp") -> str:
    """A temporary name beside ``path``, this process's own."""
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.{kind}")


def _keep_backup(path: str) -> None:
    """``path`` (whatever is there now, never followed) also named ``path.nvc-py.bak``, replacing
    an older backup in one rename; nothing where ``path`` is missing."""
    tmp = staging_name(path, "bak")
    try:
        os.link(path, tmp, follow_symlinks=False)
    except FileNotFoundError:
        return
    except OSError as err:
        raise InputError(f"{path}: cannot keep a backup: {err.strerror}") from None
    try:
        os.replace(tmp, path + engineconf.BACKUP_SUFFIX)
    except OSError as err:
        os.unlink(tmp)
        raise InputError(f"{path + engineconf.BACKUP_SUFFIX}: cannot write: {err.strerror}") from None


def _sync_directory(directory: str) -> None:
    """The renames in ``directory`` made durable; best effort (a file system that cannot sync a
    directory has them anyway)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_files_and_dirs(paths: list[str]) -> list[str]:
    """:func:`remove_files`, then the directories of the files it removed and their parents, each
    removed while it is empty (never a top-level one such as /etc, nor one a package owns, such as
    docker.io's /etc/docker): those :func:`write_files` made where an engine had none
    (/etc/containerd/conf.d, /etc/containers/oci/hooks.d, /etc/cdi). Returns a "removed PATH" line each."""
    present = [path for path in paths if os.path.lexists(path)]
    return remove_files(present) + _remove_empty_dirs(present)


def _remove_empty_dirs(files: list[str]) -> list[str]:
    done = []
    for directory in sorted({os.path.dirname(os.path.abspath(f)) for f in files}, key=len, reverse=True):
        while directory.count("/") > 1 and not _packaged(directory):
            try:
                os.rmdir(directory)
            except OSError:  # missing, not empty (or removed above): left as it is
                break
            done.append(f"removed {directory}")
            directory = os.path.dirname(directory)
    return done


def _packaged(directory: str) -> bool:
    """Whether dpkg's database names ``directory`` as a package's (kept, even empty, for its package)."""
    dpkg = shutil.which("dpkg-query")
    if dpkg is None:
        return False
    found = subprocess.run([dpkg, "--search", "--", directory], capture_output=True, text=True, check=False)
    return found.returncode == 0 and any(line.rpartition(": ")[2] == directory for line in found.stdout.splitlines())


def remove_files(paths: list[str]) -> list[str]:
    """Remove those of ``paths`` that exist; returns a "removed PATH" line each."""
    done = []
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        except OSError as err:
            raise InputError(f"{path}: cannot remove: {err.strerror}") from None
        done.append(f"removed {path}")
    return done
