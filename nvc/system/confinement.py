"""What each process of nvc-py keeps of root's power (one table), and the steps that drop the rest.

Four processes act for a caller that runs as root. Each keeps only what its work needs, so that
what it touches (a driver root, a container's mount namespace, an image's files) can at most make
it fail, never act as root on the host:

- the driver helper (``nvc:[driver]``, :mod:`nvc.rpc.driver_service`) loads the driver's own
  libnvidia-ml from the driver root: it keeps nothing;
- the container helper (``nvc:[container]``, :mod:`nvc.rpc.container_service`) mounts in the
  container's mount namespace: it keeps the capabilities mounting needs, none effective until a
  step raises its own (:func:`nvc.apply.applier.raised`);
- the ldconfig sandbox (:mod:`nvc.apply.ldconfig`) runs an image's or the host's ldconfig on the
  image's files: it keeps nothing, in a private nodev copy of the rootfs, with rlimits and a
  seccomp allowlist;
- the hook server's worker (:mod:`nvc.hook.server`) runs a call as the program would: it keeps
  all of the server's power, and serves only callers that hold as much (:mod:`nvc.hook.peer`).

Every process takes the same steps in the same order (:data:`STEPS`), each doing what the row
says (nothing where the row keeps a thing): change root, then limit the bounding set (both need
capabilities the identity switch takes away), switch identity, limit the capability sets, limit
resources, set NO_NEW_PRIVS, limit syscalls (a seccomp filter needs NO_NEW_PRIVS). Where a process
does work of its own between two steps (the sandbox checks the image's files once in its root),
it calls the steps one by one, in that order; else :func:`confine` runs them all.

Its imports are all here, not in the steps: a step after the root's change could not import from
the host. The processes that fork the helpers leave this module (and python-prctl) to them: the
driver helper's parent on ``nvc-py info``'s start-up path, the direct hook while it plans (the container
helper imports it at set-up, ldconfig's sandbox before its root changes); a hook server preloads it.
"""

import errno
import os
import resource
import stat
from collections.abc import Callable

import prctl

from nvc.errors import InitializationError, NvcError, PrivilegeError
from nvc.records import NamedTuple
from nvc.system import syscalls


class Confinement(NamedTuple):
    """One process's row: what it keeps, and what each step does for it. (A NamedTuple, immutable
    like a frozen dataclass: importing dataclasses would delay the driver helper's NVML load.)"""

    process: str
    # Capability sets kept, by python-prctl's names (its CAP_<NAME>); None: the parent's, untouched.
    bounding: tuple[str, ...] | None
    permitted: tuple[str, ...] | None
    effective: tuple[str, ...] | None
    inheritable: tuple[str, ...] | None  # the ambient set is emptied with it (the kernel's rule)
    root: str  # "kept"; "chroot": into the root it is given; "private": see change_root
    identity: str  # "kept"; "given": becomes the uid:gid it is given, no supplementary groups
    rlimits: tuple[tuple[int, int], ...]  # (resource, soft and hard limit)
    no_new_privs: bool
    seccomp: str | None  # the allowlist's name in SECCOMP_FILTERS


NOTHING: tuple[str, ...] = ()

# Mounts and setns (SYS_ADMIN, SYS_CHROOT), /proc/PID/ns of a more privileged process
# (SYS_PTRACE), files the helper does not own (DAC_*, FOWNER), created files' owner (CHOWN).
MOUNT_CAPS = ("sys_admin", "sys_chroot", "sys_ptrace", "dac_override", "dac_read_search", "fowner", "chown")

# The ldconfig sandbox's limits. DATA bounds its memory (heap and private writable maps): the
# host's ldconfig needs under 0.5 MiB for 620 libraries, so 64 MiB leaves room for images with
# tens of thousands while an endless ld.so.conf line stops there, not at 1 GiB. AS only bounds
# address space: ldconfig maps each library whole, read-only (page cache, not counted in DATA),
# and CUDA images ship single libraries near 1 GiB. FSIZE bounds the cache file ldconfig writes:
# 64 MiB is far above any real cache (a few hundred KiB for thousands of libraries) yet still
# stops a runaway write filling the container's disk.
LDCONFIG_RLIMITS: tuple[tuple[int, int], ...] = (
    (resource.RLIMIT_CPU, 10),
    (resource.RLIMIT_DATA, 64 << 20),
    (resource.RLIMIT_AS, 2 << 30),
    (resource.RLIMIT_NOFILE, 64),
    (resource.RLIMIT_FSIZE, 64 << 20),
)

# Everything else fails with EPERM. ldconfig's: the reference tool's list plus clock_gettime (new
# glibc). Static glibc's start-up calls that are missing here (set_tid_address, set_robust_list,
# rseq, prlimit64, getrandom, futex) fail harmlessly, which the tests check by running the real
# ldconfig under this filter.
SECCOMP_FILTERS: dict[str, tuple[str, ...]] = {
    "ldconfig": (
        "access", "arch_prctl", "brk", "chdir", "chmod", "clock_gettime", "close", "execve",
        "execveat", "exit", "exit_group", "fcntl", "fdatasync", "fstat", "fsync", "ftruncate",
        "getcwd", "getdents", "getdents64", "getegid", "geteuid", "getgid", "getpgrp", "getpid",
        "gettid", "gettimeofday", "getuid", "_llseek", "lseek", "lstat", "mkdir", "mmap",
        "mprotect", "mremap", "munmap", "newfstatat", "open", "openat", "pread64", "read",
        "readlink", "readv", "rename", "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "stat",
        "symlink", "tgkill", "time", "uname", "unlink", "write", "writev",
    ),
}  # fmt: skip

DRIVER_HELPER = Confinement(
    "driver helper",
    bounding=NOTHING,
    permitted=NOTHING,
    effective=NOTHING,
    inheritable=NOTHING,
    root="chroot",
    identity="given",
    rlimits=(),
    no_new_privs=True,
    seccomp=None,
)
CONTAINER_HELPER = Confinement(
    "container helper",
    bounding=MOUNT_CAPS,
    permitted=MOUNT_CAPS,
    effective=NOTHING,
    inheritable=NOTHING,
    root="kept",
    identity="kept",
    rlimits=(),
    no_new_privs=True,
    seccomp=None,
)
LDCONFIG_SANDBOX = Confinement(
    "ldconfig sandbox",
    bounding=NOTHING,
    permitted=NOTHING,
    effective=NOTHING,
    inheritable=NOTHING,
    root="private",
    identity="given",
    rlimits=LDCONFIG_RLIMITS,
    no_new_privs=True,
    seccomp="ldconfig",
)
SERVER_WORKER = Confinement(
    "server worker",
    bounding=None,
    permitted=None,
    effective=None,
    inheritable=None,
    root="kept",
    identity="kept",
    rlimits=(),
    no_new_privs=False,
    seccomp=None,
)
TABLE = (DRIVER_HELPER, CONTAINER_HELPER, LDCONFIG_SANDBOX, SERVER_WORKER)

SECCOMP_CACHE = "/run/nvc-py/{}-seccomp.bpf"  # a compiled allowlist, by name (nvc.system.runcache: root's own file)
_MAX_BPF = 4096 * 8  # bytes: the kernel's limit of 4096 instructions of 8 bytes
_RO_TMPFS = syscalls.MS_RDONLY | syscalls.MS_NOSUID | syscalls.MS_NODEV | syscalls.MS_NOEXEC


def _numbers(names: tuple[str, ...]) -> list[int]:
    return [getattr(prctl, f"CAP_{name.upper()}") for name in names]


# ---- the steps, in their order ---------------------------------------------------------------


def change_root(row: Confinement, root: str, no_pivot: bool = False) -> None:
    """Make ``root`` this process's root, as the row says.

    "chroot": chroot into it (nothing for "/"). "private": a private bind of it, nodev and nosuid,
    becomes the root by pivot_root (``no_pivot``: by a move and chroot), with /proc, /sys and /dev
    hidden under empty read-only tmpfs; the process must be in a mount namespace of its own.
    """
    if row.root == "chroot" and root != "/":
        try:
            os.chroot(root)
        except PermissionError as err:
            raise PrivilegeError(f"chroot failed: {root}: {err.strerror}") from None
        except OSError as err:
            raise InitializationError(f"chroot failed: {root}: {err.strerror}") from None
        os.chdir("/")
    elif row.root == "private":
        _enter_private_copy(root, no_pivot)


def limit_bounding(row: Confinement) -> None:
    """Keep the row's bounding set. Dropping from it needs CAP_SETPCAP: an unprivileged caller keeps
    its own, as it keeps its identity."""
    if row.bounding is not None and prctl.cap_effective.setpcap:
        prctl.capbset.limit(*_numbers(row.bounding))


def switch_identity(row: Confinement, user: tuple[int, int] | None, rearm: Callable[[], None]) -> None:
    """Become ``user`` (uid, gid) with no supplementary groups where the row says "given", then
    ``rearm`` PDEATHSIG, which the kernel clears at the switch. An unprivileged caller can only
    keep its own identity, its supplementary groups with it."""
    if row.identity != "given":
        return
    if user is None:
        raise NvcError(f"no identity given for the {row.process}")
    uid, gid = user
    own = (uid, gid) == (os.geteuid(), os.getegid())
    if not own or os.getgroups():
        try:
            try:
                os.setgroups([])
            except PermissionError:
                if not own:
                    raise
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        except PermissionError as err:
            raise PrivilegeError(f"cannot switch to user {uid}:{gid}: {err.strerror}") from None
    rearm()


def limit_caps(row: Confinement) -> None:
    """Keep the row's effective, inheritable (and so ambient) and permitted sets. Explicitly: a
    switch to uid 0, or none, keeps them all."""
    if row.effective is None or row.inheritable is None or row.permitted is None:
        return
    prctl.cap_effective.limit(*_numbers(row.effective))  # first: it must stay within permitted
    prctl.cap_inheritable.limit(*_numbers(row.inheritable))
    prctl.cap_permitted.limit(*_numbers(row.permitted))


def limit_resources(row: Confinement) -> None:
    for limit, value in row.rlimits:
        resource.setrlimit(limit, (value, value))


def set_no_new_privs(row: Confinement) -> None:
    """No setuid or file-capability binary can give back what was dropped."""
    if row.no_new_privs:
        prctl.set_no_new_privs(1)


def limit_syscalls(row: Confinement, program: bytes | None) -> None:
    """Load the row's compiled allowlist (:func:`seccomp_program`, read ahead: compiling is slow)."""
    if row.seccomp is not None:
        if program is None:
            raise NvcError(f"no seccomp program given for the {row.process}")
        syscalls.load_seccomp_program(program)


STEPS = (change_root, limit_bounding, switch_identity, limit_caps, limit_resources, set_no_new_privs, limit_syscalls)


def confine(
    row: Confinement, root: str = "/", user: tuple[int, int] | None = None, rearm: Callable[[], None] = lambda: None
) -> None:
    """Every step, in order, for a process with no work of its own between them."""
    change_root(row, root)
    limit_bounding(row)
    switch_identity(row, user, rearm)
    limit_caps(row)
    limit_resources(row)
    set_no_new_privs(row)
    limit_syscalls(row, seccomp_program(row) if row.seccomp is not None else None)


# ---- seccomp allowlists ----------------------------------------------------------------------


def seccomp_cache_header(name: str) -> bytes:
    """What the cached program must start with: the allowlist and architecture it was built for."""
    return f"nvc-py {name} seccomp: {os.uname().machine} EPERM {' '.join(SECCOMP_FILTERS[name])}\n".encode()


def seccomp_program(row: Confinement) -> bytes:
    """The row's allowlist compiled to BPF by libseccomp: root's cached copy (:data:`SECCOMP_CACHE`)
    when it was built for this list, else built now and cached. Built once per boot, not per
    container start: importing pyseccomp alone runs ``ldconfig -p`` twice
    (ctypes.util.find_library), which on a loaded host costs more than the mounts it overlaps."""
    from nvc.system import runcache

    name = str(row.seccomp)
    header = seccomp_cache_header(name)
    cached = runcache.load(SECCOMP_CACHE.format(name), len(header) + _MAX_BPF)
    if cached is not None and cached.startswith(header):
        program = cached[len(header) :]
        if program and len(program) % 8 == 0:
            return program
    import pyseccomp

    rules = pyseccomp.SyscallFilter(pyseccomp.ERRNO(errno.EPERM))
    for syscall in SECCOMP_FILTERS[name]:
        if pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, syscall) >= 0:  # skip other arches' names
            rules.add_rule(pyseccomp.ALLOW, syscall)
    with os.fdopen(syscalls.memfd_create("nvc-seccomp", syscalls.MFD_CLOEXEC), "w+b") as exported:
        rules.export_bpf(exported)
        exported.seek(0)
        program = exported.read(_MAX_BPF + 1)
    if not program or len(program) > _MAX_BPF:
        raise NvcError(f"libseccomp exported a filter of {len(program)} bytes")
    runcache.store(SECCOMP_CACHE.format(name), header + program)
    return program


# ---- the private root ------------------------------------------------------------------------


def _enter_private_copy(rootfs: str, no_pivot: bool) -> None:
    """Make (a private bind of) ``rootfs`` our root, with /proc, /sys, /dev emptied.

    The rootfs path is looked up once, its last component never followed (a rootfs that is
    a symlink is refused, as configure refuses it); the bind, the working directory and the
    pivot then go through file descriptors, so a path swapped meanwhile cannot redirect them.
    """
    syscalls.mount(None, "/", None, syscalls.MS_REC | syscalls.MS_PRIVATE)
    fd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        top = _bind_onto_itself(fd, rootfs)
    finally:
        os.close(fd)
    try:
        _nodev(top)
        os.fchdir(top)
    finally:
        os.close(top)
    if no_pivot:
        syscalls.mount(".", "/", None, syscalls.MS_MOVE)
        os.chroot(".")
    else:
        syscalls.pivot_root(".", ".")
        syscalls.umount2(".", syscalls.MNT_DETACH)
    os.chdir("/")
    for hidden in ("/proc", "/sys", "/dev"):
        if stat.S_ISDIR(_lstat_mode(hidden)):  # a symlink here stays a symlink into this root
            syscalls.mount("tmpfs", hidden, "tmpfs", _RO_TMPFS, "size=4k")


def _bind_onto_itself(fd: int, rootfs: str) -> int:
    """Bind the directory open on ``fd`` onto itself (recursively); return an fd of the new mount's root.

    The new mount API names both ends by ``fd``. Without it, mount(2) is given
    /proc/self/fd/N, which names the same directory, and the new mount is opened by path
    (no-follow) and checked to show that directory.
    """
    clone = syscalls.OPEN_TREE_CLONE | syscalls.OPEN_TREE_CLOEXEC | syscalls.AT_RECURSIVE | syscalls.AT_EMPTY_PATH
    try:
        tree = syscalls.open_tree(fd, "", clone, name=rootfs)
    except OSError as err:
        if err.errno != errno.ENOSYS:
            raise
        expect = os.fstat(fd)
        syscalls.mount(f"/proc/self/fd/{fd}", f"/proc/self/fd/{fd}", None, syscalls.MS_BIND | syscalls.MS_REC)
        top = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        st = os.fstat(top)
        if (st.st_dev, st.st_ino) != (expect.st_dev, expect.st_ino):
            os.close(top)
            raise NvcError(f"{rootfs} changed while its sandbox was being set up") from None
        return top
    try:
        both = syscalls.MOVE_MOUNT_F_EMPTY_PATH | syscalls.MOVE_MOUNT_T_EMPTY_PATH
        syscalls.move_mount(tree, "", fd, "", both, names=(rootfs, rootfs))
    except BaseException:
        os.close(tree)
        raise
    return tree


def _nodev(top: int) -> None:
    """Make the private tree under the mount at ``top`` nodev and nosuid, every mount of it.

    Kernels without mount_setattr (before 5.12) get the classic remount of the top mount only:
    the image's own filesystem, where its nodes live (the flags it has, read-only, noexec,
    are kept); mounts under it are the runtime's and the user's, and the caller still checks
    the files it relies on.
    """
    flags = syscalls.MountAttr.NODEV | syscalls.MountAttr.NOSUID
    try:
        syscalls.mount_setattr(top, "", syscalls.AT_EMPTY_PATH | syscalls.AT_RECURSIVE, flags)
    except OSError as err:
        if err.errno != errno.ENOSYS:
            raise
        keep = os.fstatvfs(top).f_flag & (syscalls.MS_RDONLY | syscalls.MS_NOEXEC)
        remount = syscalls.MS_REMOUNT | syscalls.MS_BIND | flags.ms_flags() | keep
        syscalls.mount(None, f"/proc/self/fd/{top}", None, remount)


def _lstat_mode(path: str) -> int:
    try:
        return os.lstat(path).st_mode
    except FileNotFoundError:
        return 0
