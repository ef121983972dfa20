"""Thin ctypes wrappers over the Linux syscalls that configure needs and Python lacks.

Why not the os module: Python 3.11 has no unshare/setns/pivot_root/openat2/open_tree/
move_mount/mount_setattr/fsopen/execveat, and the mount API calls must be made on file
descriptors so that a hostile image cannot redirect them with symlinks. Every wrapper
raises OSError carrying errno and the path (or fd) it acted on, so that callers can turn
it into an nvc error naming the wrong thing.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import functools
import os
import select
import struct
from collections.abc import Sequence

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

# Syscall numbers that glibc does not wrap (or wraps only in recent versions): nvc-py's one table.
# aarch64 uses the generic table; the new mount API numbers are shared by all arches. bpf(2), the
# device cgroup v2 filter's (nvc.apply.bpf), is known on more architectures than the rest.
_NUMBERS: dict[str, dict[str, int]] = {
    "x86_64": {
        "bpf": 321,
        "pivot_root": 155,
        "setns": 308,
        "unshare": 272,
        "memfd_create": 319,
        "execveat": 322,
        "renameat2": 316,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "openat2": 437,
        "mount_setattr": 442,
        "statmount": 457,
    },
    "aarch64": {
        "bpf": 280,
        "pivot_root": 41,
        "setns": 268,
        "unshare": 97,
        "memfd_create": 279,
        "execveat": 281,
        "renameat2": 276,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "openat2": 437,
        "mount_setattr": 442,
        "statmount": 457,
    },
    "ppc64le": {"bpf": 361},
    "s390x": {"bpf": 351},
    "riscv64": {"bpf": 280},
}

# mount(2) flags
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_MOVE = 0x2000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MNT_DETACH = 0x2

# namespaces
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000

# *at flags
AT_SYMLINK_NOFOLLOW = 0x100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000

# openat2 resolve flags
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10

# new mount API
OPEN_TREE_CLONE = 0x1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOVE_MOUNT_T_EMPTY_PATH = 0x40
FSOPEN_CLOEXEC = 0x1
FSCONFIG_SET_STRING = 1
FSCONFIG_CMD_CREATE = 6
FSMOUNT_CLOEXEC = 0x1

# memfd
MFD_CLOEXEC = 0x1
MFD_ALLOW_SEALING = 0x2
MFD_EXEC = 0x10

RENAME_NOREPLACE = 0x1

# statx(2) and statmount(2) (Linux 6.8): one mount's propagation, asked by its unique id.
STATX_MNT_ID_UNIQUE = 0x4000
STATMOUNT_MNT_BASIC = 0x2
MS_SHARED = 1 << 20

# statfs f_type of the kernel's pseudo filesystems a container sees at /proc and /sys.
PROC_SUPER_MAGIC = 0x9FA0
SYSFS_MAGIC = 0x62656572


class MountAttr(enum.IntFlag):
    """Per-mount flags, as mount_setattr(2) names them."""

    RDONLY = 0x1
    NOSUID = 0x2
    NODEV = 0x4
    NOEXEC = 0x8

    def ms_flags(self) -> int:
        """The same flags for the classic mount(2) call (kernels without the new API)."""
        table = {
            MountAttr.RDONLY: MS_RDONLY,
            MountAttr.NOSUID: MS_NOSUID,
            MountAttr.NODEV: MS_NODEV,
            MountAttr.NOEXEC: MS_NOEXEC,
        }
        return sum(ms for attr, ms in table.items() if attr in self)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _MountAttrStruct(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
PR_SET_PDEATHSIG = 1
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2


@functools.cache
def _machine() -> str:
    """The machine's architecture, asked once: a configure makes some 200 system calls through here."""
    return os.uname().machine


def _nr(name: str) -> int:
    """Syscall number on this machine; ENOSYS where nvc-py does not know the arch."""
    try:
        return _NUMBERS[_machine()][name]
    except KeyError:
        raise OSError(38, f"{name}: unsupported architecture {_machine()}") from None


def _enc(path: str | bytes | None) -> bytes | None:
    if path is None or isinstance(path, bytes):
        return path
    return os.fsencode(path)


def _check(ret: int, what: object, what2: object | None = None) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        if what2 is None:
            raise OSError(err, os.strerror(err), what)
        raise OSError(err, os.strerror(err), what, None, what2)
    return ret


def _syscall(name: str, *args: object) -> int:
    cargs = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    return _libc.syscall(ctypes.c_long(_nr(name)), *cargs)


def _label(fd: int, path: str | bytes) -> str:
    """How an (fd, path) pair is named in errors when no better name was given."""
    return f"fd {fd}" if not path else os.fsdecode(path)


def bpf(cmd: int, attr: ctypes.Structure) -> int:
    """bpf(2) command ``cmd`` with its attribute block ``attr`` (layouts: :mod:`nvc.apply.bpf`)."""
    return _check(_syscall("bpf", cmd, ctypes.byref(attr), ctypes.sizeof(attr)), "bpf")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(_enc(source), _enc(target), _enc(fstype), flags, _enc(data)), target)


def umount2(target: str, flags: int = 0) -> None:
    _check(_libc.umount2(_enc(target), flags), target)


def unshare(flags: int) -> None:
    _check(_syscall("unshare", flags), f"unshare({flags:#x})")


def setns(fd: int, nstype: int, name: str = "") -> None:
    """Join the namespace open on ``fd``; ``name`` (e.g. /proc/PID/ns/mnt) is for errors."""
    _check(_syscall("setns", fd, nstype), name or f"fd {fd}")


def pivot_root(new_root: str, put_old: str) -> None:
    _check(_syscall("pivot_root", _enc(new_root), _enc(put_old)), new_root, put_old)


def openat2(dirfd: int, path: str, flags: int, mode: int = 0, resolve: int = 0, name: str = "") -> int:
    """openat2(2); O_CLOEXEC is always added. ``name`` labels errors (default: ``path``)."""
    creates = flags & os.O_CREAT or flags & os.O_TMPFILE == os.O_TMPFILE  # O_TMPFILE includes O_DIRECTORY
    how = _OpenHow(flags | os.O_CLOEXEC, mode if creates else 0, resolve)
    return _check(_syscall("openat2", dirfd, _enc(path), ctypes.byref(how), ctypes.sizeof(how)), name or path)


def open_tree(dirfd: int, path: str, flags: int, name: str = "") -> int:
    return _check(_syscall("open_tree", dirfd, _enc(path), flags), name or _label(dirfd, path))


def move_mount(
    from_fd: int, from_path: str, to_fd: int, to_path: str, flags: int, names: tuple[str, str] = ("", "")
) -> None:
    _check(
        _syscall("move_mount", from_fd, _enc(from_path), to_fd, _enc(to_path), flags),
        names[0] or _label(from_fd, from_path),
        names[1] or _label(to_fd, to_path),
    )


def mount_setattr(dirfd: int, path: str, flags: int, attr_set: int, attr_clr: int = 0, name: str = "") -> None:
    attr = _MountAttrStruct(attr_set, attr_clr, 0, 0)
    _check(
        _syscall("mount_setattr", dirfd, _enc(path), flags, ctypes.byref(attr), ctypes.sizeof(attr)),
        name or _label(dirfd, path),
    )


def fsopen(fstype: str) -> int:
    return _check(_syscall("fsopen", _enc(fstype), FSOPEN_CLOEXEC), fstype)


def fsconfig_string(fs_fd: int, key: str, value: str) -> None:
    _check(_syscall("fsconfig", fs_fd, FSCONFIG_SET_STRING, _enc(key), _enc(value), 0), f"{key}={value}")


def fsconfig_create(fs_fd: int, name: str) -> None:
    _check(_syscall("fsconfig", fs_fd, FSCONFIG_CMD_CREATE, None, None, 0), name)


def fsmount(fs_fd: int, attr: int, name: str) -> int:
    return _check(_syscall("fsmount", fs_fd, FSMOUNT_CLOEXEC, attr), name)


def memfd_create(name: str, flags: int) -> int:
    """memfd_create(2), asking for an executable memfd where the kernel knows MFD_EXEC (6.3+)."""
    ret = _syscall("memfd_create", _enc(name), flags | MFD_EXEC)
    if ret < 0 and ctypes.get_errno() == 22:  # EINVAL: a kernel older than MFD_EXEC
        ret = _syscall("memfd_create", _enc(name), flags)
    return _check(ret, f"memfd {name}")


def fs_type(fd: int, name: str = "") -> int:
    """fstatfs(2)'s f_type of the filesystem ``fd`` lies on (os.fstatvfs does not give it)."""
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes; f_type comes first, a long
    _check(_libc.fstatfs(fd, buf), name or f"fd {fd}")
    return ctypes.c_long.from_buffer(buf).value


def mount_unique_id(fd: int) -> int:
    """The unique id of the mount ``fd`` lies on (statx's STATX_MNT_ID_UNIQUE); ENOSYS where the
    kernel has none (before 6.8)."""
    buf = ctypes.create_string_buffer(256)  # struct statx
    _check(_libc.statx(fd, b"", AT_EMPTY_PATH, STATX_MNT_ID_UNIQUE, buf), f"fd {fd}")
    mask, mnt_id = struct.unpack_from("=I", buf.raw, 0)[0], struct.unpack_from("=Q", buf.raw, 144)[0]
    if not mask & STATX_MNT_ID_UNIQUE:
        raise OSError(errno.ENOSYS, "statx gives no unique mount id", f"fd {fd}")
    return mnt_id


def mount_propagation(mnt_id: int) -> int:
    """statmount(2)'s ``mnt_propagation`` of the mount with unique id ``mnt_id`` in this process's
    mount namespace (MS_SHARED, MS_SLAVE, MS_PRIVATE, MS_UNBINDABLE bits)."""
    req = ctypes.create_string_buffer(struct.pack("=IIQQ", 24, 0, mnt_id, STATMOUNT_MNT_BASIC), 24)
    buf = ctypes.create_string_buffer(512)  # struct statmount, with room for fields newer kernels add
    _check(_syscall("statmount", req, buf, ctypes.sizeof(buf), 0), f"mount {mnt_id}")
    if not struct.unpack_from("=Q", buf.raw, 8)[0] & STATMOUNT_MNT_BASIC:
        raise OSError(errno.ENOSYS, "statmount gives no propagation", f"mount {mnt_id}")
    return int(struct.unpack_from("=Q", buf.raw, 72)[0])


def renameat2(old_dirfd: int, old: str, new_dirfd: int, new: str, flags: int) -> None:
    _check(_syscall("renameat2", old_dirfd, _enc(old), new_dirfd, _enc(new), flags), old, new)


class _SockFprog(ctypes.Structure):
    """struct sock_fprog: a classic BPF program (an array of 8-byte struct sock_filter)."""

    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load_seccomp_program(program: bytes) -> None:
    """prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER) of a compiled filter (libseccomp's BPF export);
    NO_NEW_PRIVS must be set first."""
    if not program or len(program) % 8 or len(program) // 8 > 0xFFFF:
        raise OSError(errno.EINVAL, "not a BPF program", "seccomp filter")
    code = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(code))
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0), "prctl(PR_SET_SECCOMP)")


def set_pdeathsig(sig: int) -> None:
    """prctl(PR_SET_PDEATHSIG, sig): ``sig`` when the parent (thread) dies; see :func:`die_with_parent`."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")


def die_with_parent(parent_pidfd: int) -> None:
    """SIGKILL this process when its parent dies; exit now if the parent is already gone.

    PR_SET_PDEATHSIG fires only for a death after it is armed, so the parent is checked
    afterwards, through ``parent_pidfd`` (a pidfd it opened on itself before the fork: readable
    once it ended), which holds where getppid() cannot tell (0 for pid 1 of a pid namespace).
    The kernel clears the setting when the process changes its uid or gid: arm it again after
    such a change. Plain libc, no prctl module: a forked child calls this first.
    """
    set_pdeathsig(9)
    if select.select([parent_pidfd], [], [], 0)[0]:
        os._exit(1)


def execveat(fd: int, argv: Sequence[str], envp: Sequence[str], name: str) -> NoReturn:
    """Execute the file open on ``fd`` (AT_EMPTY_PATH): no path, hence no /proc needed."""
    c_argv = (ctypes.c_char_p * (len(argv) + 1))(*[os.fsencode(a) for a in argv], None)
    c_envp = (ctypes.c_char_p * (len(envp) + 1))(*[os.fsencode(e) for e in envp], None)
    _syscall("execveat", fd, b"", c_argv, c_envp, AT_EMPTY_PATH)
    err = ctypes.get_errno()  # execveat returns only on failure
    raise OSError(err, os.strerror(err), name)
