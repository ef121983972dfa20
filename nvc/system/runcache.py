"""Files nvc-py keeps under /run/nvc-py to skip work the next start would redo: the parsed
configuration (:mod:`nvc.config`), ldconfig's compiled seccomp filter (:mod:`nvc.apply.ldconfig`), and
what the native fronts read (the runtime wrapper's runtime, the driver helper's guess), keyed by the
configuration file's identity.

Only root's own is believed: a regular file (not a symlink), owned by this user, readable by no
one else, so that another user cannot plant one; anything else there (a FIFO, a device, a huge
file) is a miss, read without blocking and within bounds. Writing is best effort and atomic (a
temporary file renamed into place): a read-only /run or a caller that is not root just redoes the
work next time.
"""

from __future__ import annotations

import os
import stat

from nvc.errors import InputError
from nvc.system.untrusted import read_file


def identity(path: str) -> str:
    """What tells a file's content changed: device, inode, size, modification and change times (ns)."""
    st = os.stat(path)
    return f"{st.st_dev} {st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}"


def config_key(config_file: str) -> list[str] | None:
    """The configuration file and its identity ("absent" where there is none), the first fields of the
    caches the native fronts read (native/client/runcache.c's text_add_config); None where it cannot
    be told."""
    try:
        return [config_file, identity(config_file)]
    except FileNotFoundError:
        return [config_file, "absent"]
    except OSError:
        return None


def load(path: str, limit: int) -> bytes | None:
    """The bytes of this user's cache file at ``path`` (at most ``limit``), or None."""
    try:
        raw, st = read_file(path, limit, follow=False)
    except (OSError, InputError):
        return None
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return None
    return raw


def store(path: str, data: bytes) -> None:
    """Write ``data`` as this user's cache file at ``path`` (mode 0600), in a directory made 0700
    if missing and used only if it is this user's and no one else may write it."""
    try:
        directory = os.path.dirname(path)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        st = os.lstat(directory)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return  # another user's directory, or a symlink to one: never write root's cache there
        tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.rename(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass
