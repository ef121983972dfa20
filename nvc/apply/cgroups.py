"""The container's device cgroup: where it is, and granting it access to device nodes.

Bind-mounting a GPU node into the container is not enough: the device cgroup the runtime set up
denies every node it was not told about. cgroup v1 takes extra rules through ``devices.allow``;
cgroup v2 decides with a BPF program, which is replaced by one that checks our rules first and
then runs the runtime's own instructions.

Finding the cgroup reads the container process's ``/proc/PID/cgroup`` (which cgroup, per
hierarchy) and ``/proc/PID/mountinfo`` (where that hierarchy is mounted), through its handle
(:meth:`nvc.apply.container.ContainerHandle.device_cgroup`). Hybrid hosts mount both: if the
devices controller sits on a v1 hierarchy, v1 is what the kernel enforces there. Where the process's
view has the whole unified hierarchy at /sys/fs/cgroup (:func:`unified_at_default`), mountinfo is not
read: it is as long as the view's mount table, and under a start storm, with the runtimes mounting
beside it, one read took tens of milliseconds.
"""

import os
import posixpath
import re
from collections.abc import Sequence

from nvc.apply import bpf
from nvc.errors import ContainerError
from nvc.plan.devfilter import DeviceRule, build_filter
from nvc.records import NamedTuple
from nvc.system import syscalls

FILTER_LICENSE = "Apache-2.0"  # no GPL-only helpers are used, so any licence loads
FILTER_NAME = "nvc_devices"
UNIFIED_MOUNT = "/sys/fs/cgroup"  # where systemd and the runtimes mount cgroup v2
CGROUP2_SUPER_MAGIC = 0x63677270  # statfs f_type of cgroup v2
INIT_CGROUP_NS_INO = 0xEFFFFFFB  # the initial cgroup namespace's inode number (include/linux/proc_ns.h)


class DeviceCgroup(NamedTuple):
    """A device cgroup: ``version`` 1 or 2, ``path`` of its directory, inside the root open on
    ``root_fd`` (a container's, resolved as it sees it) or, -1, on the host."""

    version: int
    path: str
    root_fd: int = -1


class CgroupEntry(NamedTuple):
    """A line of /proc/PID/cgroup: hierarchy 0 with no controllers is the v2 hierarchy."""

    hierarchy: int
    controllers: tuple[str, ...]
    path: str


class CgroupMount(NamedTuple):
    """A cgroup filesystem mount from mountinfo: ``root`` is the cgroup shown at ``mountpoint``."""

    root: str
    mountpoint: str
    fstype: str
    options: tuple[str, ...]


def parse_proc_cgroup(text: str) -> list[CgroupEntry]:
    """Entries of /proc/PID/cgroup; lines that do not parse are skipped, not fatal.

    Only the devices (or v2) line matters, and refusing a whole file over an unrelated odd line
    is a failure users of the reference tool hit ("malformed cgroup entry").
    """
    entries = []
    for line in text.splitlines():
        fields = line.split(":", 2)  # the path itself may contain ':'
        if len(fields) != 3 or not fields[0].isdigit() or not fields[2].startswith("/"):
            continue
        controllers = tuple(c for c in fields[1].split(",") if c)
        entries.append(CgroupEntry(int(fields[0]), controllers, fields[2]))
    return entries


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[CgroupMount]:
    """The cgroup and cgroup2 mounts of a mountinfo file, in file order."""
    mounts = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(rest) < 3 or rest[0] not in ("cgroup", "cgroup2"):
            continue
        mounts.append(CgroupMount(_unescape(fields[3]), _unescape(fields[4]), rest[0], tuple(rest[2].split(","))))
    return mounts


def _under(path: str, root: str) -> str | None:
    """``path`` relative to ``root`` (both cgroup paths), or None if it is not inside it."""
    if root == "/":
        return path.lstrip("/")
    if path == root:
        return ""
    if path.startswith(root + "/"):
        return path[len(root) + 1 :]
    return None


def unified_at_default(proc_cgroup: str, root_fd: int) -> DeviceCgroup | None:
    """The v2 device cgroup :func:`locate_device_cgroup` finds, found without mountinfo where it is
    plain: the process is in no v1 devices hierarchy, this process reads its cgroup paths from the
    initial cgroup namespace (whole-hierarchy paths), and the view of the root open on ``root_fd``
    (-1: the host's) has cgroup v2 at /sys/fs/cgroup showing the hierarchy's root (which alone has
    no ``cgroup.type``; a cgroup namespace's mount shows a cgroup of its own). None otherwise:
    mountinfo decides."""
    entries = parse_proc_cgroup(proc_cgroup)
    v2 = [e for e in entries if e.hierarchy == 0 and not e.controllers]
    if any(e.hierarchy != 0 and "devices" in e.controllers for e in entries) or not v2:
        return None
    if ".." in v2[0].path.split("/"):
        return None
    try:
        if os.stat("/proc/self/ns/cgroup").st_ino != INIT_CGROUP_NS_INO:
            return None
        fd = _open(DeviceCgroup(2, UNIFIED_MOUNT, root_fd), UNIFIED_MOUNT, os.O_RDONLY | os.O_DIRECTORY)
    except (OSError, ContainerError):
        return None
    try:
        if syscalls.fs_type(fd, UNIFIED_MOUNT) != CGROUP2_SUPER_MAGIC:
            return None
        os.stat("cgroup.type", dir_fd=fd, follow_symlinks=False)
        return None  # a cgroup below the root
    except FileNotFoundError:
        return DeviceCgroup(2, posixpath.join(UNIFIED_MOUNT, v2[0].path.lstrip("/")).rstrip("/"), root_fd)
    except OSError:
        return None
    finally:
        os.close(fd)


def locate_device_cgroup(proc_cgroup: str, mountinfo: str) -> DeviceCgroup:
    """The device cgroup directory, as a path in the process's own mount view."""
    entries = parse_proc_cgroup(proc_cgroup)
    mounts = parse_mountinfo(mountinfo)
    v1 = [e for e in entries if e.hierarchy != 0 and "devices" in e.controllers]
    if v1 and v1[0].path == "/" and not any(m.fstype == "cgroup" and "devices" in m.options for m in mounts):
        # The top of a v1 devices hierarchy this view does not mount (a container of systemd on v2
        # alone, on a hybrid host) restricts nothing below it that could be written: v2 decides.
        v1 = []
    if v1:
        version, entry = 1, v1[0]
        candidates = [m for m in mounts if m.fstype == "cgroup" and "devices" in m.options]
    else:
        v2 = [e for e in entries if e.hierarchy == 0 and not e.controllers]
        if not v2:
            raise ContainerError("cgroup subsystem devices not found")
        version, entry = 2, v2[0]
        candidates = [m for m in mounts if m.fstype == "cgroup2"]
    if ".." in entry.path.split("/"):
        # The kernel writes "/.." when the cgroup lies outside the reader's cgroup namespace.
        raise ContainerError(f"cgroup path {entry.path} is outside the visible cgroup tree")
    for mount in candidates:
        relative = _under(entry.path, mount.root)
        if relative is not None:
            return DeviceCgroup(version, posixpath.join(mount.mountpoint, relative).rstrip("/") or "/")
    kind = "devices cgroup v1" if version == 1 else "cgroup v2"
    raise ContainerError(f"no {kind} mount shows cgroup {entry.path}")


def allow_devices(cgroup: DeviceCgroup, rules: Sequence[DeviceRule]) -> None:
    """Add allow ``rules`` to ``cgroup``, keeping every rule it already has."""
    if cgroup.version == 1:
        _allow_v1(cgroup, rules)
    else:
        _allow_v2(cgroup, rules)


def _open(cgroup: DeviceCgroup, path: str, flags: int) -> int:
    """Open ``path`` of ``cgroup`` (its directory or a file in it) where it lies."""
    from nvc.apply.rootfs import open_in_root

    try:
        if cgroup.root_fd < 0:
            return os.open(path, flags | os.O_CLOEXEC)
        return open_in_root(cgroup.root_fd, path, flags)
    except OSError as err:
        raise ContainerError(f"open failed: {path}: {err.strerror}") from None


def _allow_v1(cgroup: DeviceCgroup, rules: Sequence[DeviceRule]) -> None:
    target = posixpath.join(cgroup.path, "devices.allow")
    fd = _open(cgroup, target, os.O_WRONLY)
    try:
        for rule in rules:  # the kernel parses one rule per write
            try:
                os.write(fd, str(rule).encode())
            except OSError as err:
                raise ContainerError(f"write failed: {target}: {rule}: {err.strerror}") from None
    finally:
        os.close(fd)


def _raise_memlock() -> None:
    """Kernels before 5.11 charge BPF programs to RLIMIT_MEMLOCK, whose default is tiny."""
    import resource

    try:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except (ValueError, OSError):
        pass  # newer kernels do not charge it; older ones will say EPERM at load, reported there


def _allow_v2(cgroup: DeviceCgroup, rules: Sequence[DeviceRule]) -> None:
    path = cgroup.path
    cgroup_fd = _open(cgroup, path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            flags, ids = bpf.prog_query(cgroup_fd, bpf.ATTACH_CGROUP_DEVICE)
        except OSError as err:
            raise ContainerError(f"cannot query device filters of {path}: {err.strerror}") from None
        _raise_memlock()
        if not ids:
            # Nothing to fall through to: the reference tool then denies all but our rules.
            _attach(cgroup_fd, path, build_filter(rules), bpf.F_ALLOW_MULTI, None)
        for prog_id in ids:  # with several programs each must allow, so each is extended
            try:
                old_fd = bpf.prog_get_fd_by_id(prog_id)
            except OSError as err:
                raise ContainerError(f"cannot open device filter {prog_id} of {path}: {err.strerror}") from None
            try:
                try:
                    old = bpf.prog_xlated(old_fd)
                except OSError as err:
                    raise ContainerError(f"cannot read device filter {prog_id} of {path}: {err.strerror}") from None
                _attach(cgroup_fd, path, build_filter(rules, old), flags, old_fd)
            finally:
                os.close(old_fd)
    finally:
        os.close(cgroup_fd)


def _attach(cgroup_fd: int, path: str, program: bytes, flags: int, old_fd: int | None) -> None:
    """Load ``program`` and put it in place of ``old_fd`` without a moment with no filter.

    A multi-program attachment is replaced atomically with BPF_F_REPLACE; a single-program one
    (flags 0 or ALLOW_OVERRIDE) is replaced by attaching with the same flags.
    """
    try:
        new_fd = bpf.prog_load(bpf.PROG_TYPE_CGROUP_DEVICE, program, FILTER_LICENSE, FILTER_NAME)
    except OSError as err:
        raise ContainerError(f"cannot load device filter for {path}: {err.strerror}") from None
    try:
        replace = old_fd is not None and bool(flags & bpf.F_ALLOW_MULTI)
        bpf.prog_attach(
            cgroup_fd,
            new_fd,
            bpf.ATTACH_CGROUP_DEVICE,
            flags | (bpf.F_REPLACE if replace else 0),
            old_fd if replace else 0,
        )
    except OSError as err:
        raise ContainerError(f"cannot attach device filter to {path}: {err.strerror}") from None
    finally:
        os.close(new_fd)
