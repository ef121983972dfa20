"""The container's process, resolved once into descriptors that every step of a configure uses.

A request names its container by the host pid of the container's process, and a pid is only a
number: the process may exit while nvc-py configures it and the number go to another process,
whose mount namespace or cgroup a later step reading ``/proc/PID`` again would then change. So the
pid is resolved once, when the request has been checked, into a :class:`ContainerHandle` (as
libnvidia-container resolves it into its ``struct nvc_container``): a pidfd, an O_PATH descriptor
of the ``/proc/PID`` directory (opened after the pidfd and checked against it, so the directory is
that very process's), and through that directory its mount and user namespaces and its root; its
owner; its user namespace's id maps and its device cgroup, read through the directory when a step asks for it. A read through the directory
fails once the process is gone (the one-line "container process PID is gone"), and never reaches a
process that got its pid since. The container helper receives the same descriptors over its socket
(SCM_RIGHTS: :meth:`ContainerHandle.fds`, :meth:`ContainerHandle.adopt`) instead of opening
``/proc/PID`` itself.

This is the only module below the commands that reads ``/proc/PID`` of a container process
(tests/test_layers.py); :func:`start_time` is its reading for a pid known only from a record
(poststop's, the device plugin's), where there is no process to hold on to any more.
"""

from __future__ import annotations

import errno
import os
import select

from nvc.errors import ContainerError, proc_failure

TYPE_CHECKING = False
if TYPE_CHECKING:
    from nvc.apply.cgroups import DeviceCgroup
    from nvc.apply.userns import IdMaps

PID_MAX_LIMIT = 1 << 22  # the kernel's highest pid_max: a larger pid names no process
_STAT_MAX = 4096  # bytes of /proc/PID/stat read: its fields fit with room to spare


class ContainerHandle:
    """The container's process, pinned (see the module's docstring). Owns its descriptors: close it
    (``with``) when the configure is done."""

    __slots__ = ("pid", "pidfd", "proc", "mnt_ns", "root", "user_ns", "owner", "_cgroup", "_maps")

    def __init__(self, pid: int, pidfd: int, proc: int, mnt_ns: int, root: int, user_ns: int) -> None:
        self.pid = pid
        self.pidfd = pidfd  # pollable: readable once the process has exited
        self.proc = proc  # O_PATH of /proc/PID
        self.mnt_ns = mnt_ns  # /proc/PID/ns/mnt
        self.root = root  # O_PATH of /proc/PID/root: the container's root, as its process sees it
        self.user_ns = user_ns  # /proc/PID/ns/user
        st = os.fstat(proc)
        self.owner = (st.st_uid, st.st_gid)  # who owns the container: its process
        self._cgroup: DeviceCgroup | None = None
        self._maps: IdMaps | None = None

    @classmethod
    def open(cls, pid: int) -> ContainerHandle:
        """Resolve process ``pid``; ContainerError "container process PID is gone" where it exited."""
        if not 0 < pid <= PID_MAX_LIMIT:  # no process has it (and pidfd_open takes a C int)
            raise ContainerError(f"container process {pid} is gone")
        fds: list[int] = []
        where = f"/proc/{pid}"
        try:
            fds.append(os.pidfd_open(pid))
            fds.append(os.open(where, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
            _check_alive(fds[0])  # not exited before the directory was opened: it is this process's
            for name, flags in (
                ("ns/mnt", os.O_RDONLY),
                ("root", os.O_PATH | os.O_DIRECTORY),
                ("ns/user", os.O_RDONLY),
            ):
                where = f"/proc/{pid}/{name}"
                fds.append(os.open(name, flags | os.O_CLOEXEC, dir_fd=fds[1]))
            return cls(pid, *fds)
        except BaseException as exc:
            for fd in fds:
                os.close(fd)
            if isinstance(exc, OSError):
                raise proc_failure(pid, where, exc) from None
            raise

    @classmethod
    def adopt(cls, pid: int, fds: tuple[int, ...] | list[int]) -> ContainerHandle:
        """A handle on copies of ``fds`` (:meth:`fds` of the handle of process ``pid``, received over
        a socket): the caller keeps its own."""
        if len(fds) != 5:
            raise ContainerError(f"container process {pid}: {len(fds)} descriptors received, not 5")
        return cls(pid, *(os.dup(fd) for fd in fds))

    def fds(self) -> tuple[int, int, int, int, int]:
        """The descriptors to send another process (:meth:`adopt` there), in its order."""
        return self.pidfd, self.proc, self.mnt_ns, self.root, self.user_ns

    def id_maps(self) -> IdMaps | None:
        """The id maps of the process's user namespace; None where it is this process's own (no user
        namespace of the container's). Read on first use, through the pinned directory."""
        from nvc.apply import userns

        if self._maps is None and not userns.is_own(self.user_ns):
            self._maps = userns.IdMaps(
                *(userns.parse_map(self.read(name), f"/proc/{self.pid}/{name}") for name in ("uid_map", "gid_map"))
            )
        return self._maps

    def check(self) -> None:
        """Raise "container process PID is gone" once the process has exited."""
        try:
            _check_alive(self.pidfd)
        except OSError as err:
            raise proc_failure(self.pid, f"/proc/{self.pid}", err) from None

    def read(self, name: str) -> str:
        """The text of ``/proc/PID/<name>``, read through the pinned directory."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=self.proc)
            with open(fd, encoding="utf-8", errors="surrogateescape") as f:
                return f.read()
        except OSError as err:
            raise proc_failure(self.pid, f"/proc/{self.pid}/{name}", err) from None

    def device_cgroup(self) -> DeviceCgroup:
        """The device cgroup, its path in the container's mount view, opened below :attr:`root`.
        Read on first use, not at :meth:`open`: a plan with no device rules never needs it, and
        configures a container whose cgroup cannot be found."""
        if self._cgroup is None:
            from nvc.apply.cgroups import locate_device_cgroup, unified_at_default

            text = self.read("cgroup")
            found = unified_at_default(text, self.root)
            if found is None:
                try:
                    found = locate_device_cgroup(text, self.read("mountinfo"))._replace(root_fd=self.root)
                except ContainerError as err:
                    raise ContainerError(f"/proc/{self.pid}: {err.args[0]}") from None
            self._cgroup = found
        return self._cgroup

    def start_time(self) -> int | None:
        """The process's start time (clock ticks since boot), None once it is gone or a zombie."""
        try:
            fd = os.open("stat", os.O_RDONLY | os.O_CLOEXEC, dir_fd=self.proc)
        except OSError:
            return None
        return _start_time(fd)

    def pid_namespace(self) -> int | None:
        """The inode of the process's pid namespace, None once it is gone."""
        try:
            return os.stat("ns/pid", dir_fd=self.proc).st_ino
        except OSError:
            return None

    def close(self) -> None:
        for fd in self.fds():
            if fd >= 0:
                os.close(fd)
        self.pidfd = self.proc = self.mnt_ns = self.root = self.user_ns = -1

    def __enter__(self) -> ContainerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_alive(pidfd: int) -> None:
    poller = select.poll()  # not select(): a descriptor past FD_SETSIZE is fine
    poller.register(pidfd, select.POLLIN)
    if poller.poll(0):  # a pidfd polls readable once its process has exited
        raise OSError(errno.ESRCH, os.strerror(errno.ESRCH))


def open_rootfs(rootfs: str, handle: ContainerHandle | None) -> int:
    """An O_PATH fd of the container's rootfs. With ``handle`` the path is resolved inside the root
    of the container's process, where an absolute symlink on the way means what it means to the
    container, not to the host; without (standalone), on the host. A rootfs that is a symlink is
    refused."""
    from nvc.apply.rootfs import open_in_root

    flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        if handle is None:
            return os.open(rootfs, flags | os.O_CLOEXEC)
        return open_in_root(handle.root, rootfs, flags)
    except OSError as err:
        where = rootfs if handle is None else f"{rootfs} in the root of container process {handle.pid}"
        raise ContainerError(f"open failed: {where}: {err.strerror}") from None


def start_time(pid: int) -> int | None:
    """The start time of process ``pid`` known only by its number (a record: poststop's, the device
    plugin's), None when it is gone, a zombie (dead, not yet reaped: a killed container's init may
    wait for its reaper while poststop runs) or not visible. Compared with the recorded one, it
    tells whether the pid still names the process recorded."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    return _start_time(fd)


def _start_time(fd: int) -> int | None:
    """Field 22 of the stat text open on ``fd`` (closed here); None for a zombie or an unreadable one."""
    try:
        text = os.read(fd, _STAT_MAX).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)
    fields = text.rpartition(")")[2].split()
    if len(fields) < 20 or fields[0] in ("Z", "X") or not fields[19].isdigit():
        return None
    return int(fields[19])
