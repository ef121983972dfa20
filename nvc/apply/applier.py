"""Execute a mount plan: the thin layer with the side effects.

Mounts happen in a forked helper (``nvc:[container]``, see :mod:`nvc.rpc.container_service`)
that clones every host source while still in the host's mount namespace (or takes the clone a
helper started ahead made while it waited, :mod:`nvc.apply.cloneahead`), then joins the
container's mount namespace and attaches them there, on destinations resolved inside the
rootfs (:mod:`nvc.apply.rootfs`) — the calling process never changes namespace. The helper keeps
what it did (mounts, created files) until the caller says ``commit`` or ``rollback``, so a
failure in a later step (ldconfig, device cgroup) still leaves nothing behind: every mount,
every file and directory it made, and what ldconfig changes (the cache, replaced by rename, is
put back as it was; links ldconfig added in the plan's library dirs are removed). Not undone:
SONAME links ldconfig adds for the image's own libraries in dirs outside the plan (the same
links the image's ldconfig would make).

A helper killed mid-apply cannot roll back: it notes each mount and each file or directory it
makes as it makes it (``record``: the helper's journal), and a fresh helper undoes what the
journal names (:meth:`Applier.undo`), each only where it still finds that very mount or inode.
The names in the plan's library dirs before ldconfig ran are noted too, so the links it added
go; what the dead helper kept only in memory is not undone then: the ld cache as it was before
ldconfig replaced it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from nvc.apply import cloneahead, fdmount, userns
from nvc.apply import rootfs as inroot
from nvc.apply.container import open_rootfs
from nvc.apply.ldconfig import CACHE
from nvc.errors import MountError, NvcError
from nvc.logger import Logger
from nvc.plan.operations import Bind, MakeDir, Operation, Plan, Seal, Symlink, Tmpfs, WriteFile
from nvc.system import syscalls
from nvc.system.syscalls import MountAttr

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from nvc.apply.container import ContainerHandle

log = Logger(__name__)

_STEP_CAPS = ("sys_admin", "dac_override", "dac_read_search", "fowner", "chown")  # what the steps use
SEALED = MountAttr.RDONLY | MountAttr.NOSUID | MountAttr.NODEV | MountAttr.NOEXEC
PSEUDO_FS = {syscalls.PROC_SUPER_MAGIC: "procfs", syscalls.SYSFS_MAGIC: "sysfs"}  # no bind lands there


@contextmanager
def raised(*names: str) -> Iterator[None]:
    """Hold exactly the effective capabilities ``names`` for one step, none afterwards (the helper
    keeps them permitted: :data:`nvc.system.confinement.CONTAINER_HELPER`)."""
    import prctl

    for name in names:
        setattr(prctl.cap_effective, name, True)
    try:
        yield
    finally:
        prctl.cap_effective.limit()


class Applier:
    """One plan being applied (helper side). Steps: prepare (host namespace), enter, execute."""

    def __init__(self, plan: Plan, record: Callable[[Any], None] | None = None) -> None:
        self.plan = plan
        self.record = record  # told each change as it is made (a journal entry), for undo()
        self.trees: dict[int, int] = {}  # operation index -> detached mount of its host source
        # ("mount", Mount), ("file", container path) or ("ldconfig", (saved files, dir -> names before))
        self.done: list[tuple[str, object]] = []
        self.tmpfs: dict[str, fdmount.Mount] = {}
        self.root_fd = -1
        self.ns_fd = -1
        self.userns_fd = -1  # the container's user namespace, where it has its own
        self.maps: userns.IdMaps | None = None  # its id maps
        self.owner = plan.owner  # who owns what the steps make, as the helper names ids (see enter)
        self.in_container = False  # joined the container's mount namespace (see _refuse_shared)
        self.shared: set[int] | None = None  # ids of its shared mounts, where mountinfo had to tell
        self.propagation: dict[int, bool] = {}  # whether shared, by unique mount id, as statmount told

    # -- host namespace ------------------------------------------------------------------

    def prepare(self, handle: ContainerHandle | None) -> None:
        """Open and check every host source and clone it, open the rootfs and the namespace of the
        container's process ``handle`` (None: standalone)."""

        if handle is not None:
            handle.check()  # gone: one line, rather than mounts into a namespace nobody uses
        with raised("sys_admin", "dac_read_search", "dac_override", "sys_ptrace"):
            for index, op in enumerate(self.plan.operations):
                if isinstance(op, Bind) and not op.in_rootfs:
                    self.trees[index] = self._clone(op.source, op)
            self._open_container(handle)

    def _open_container(self, handle: ContainerHandle | None) -> None:
        """The container's mount namespace and rootfs (with the capabilities prepare raised), from
        its process's handle: not looked up again by pid, whose process may be another by now."""
        if handle is not None:
            self.ns_fd = os.dup(handle.mnt_ns)
            self.maps = handle.id_maps()
            if self.maps is not None:
                self.userns_fd = os.dup(handle.user_ns)
        self.root_fd = open_rootfs(self.plan.rootfs, handle)

    def _clone(self, source: str, op: Bind, source_fd: int | None = None) -> int:
        fd = (
            source_fd
            if source_fd is not None
            else fdmount.open_source(source, directory=op.kind == "dir", rdev=op.rdev)
        )
        try:
            if source_fd is not None:
                fdmount.check_source(fd, source, directory=op.kind == "dir", rdev=op.rdev)
            else:
                kept = cloneahead.take(op, fd)
                if kept is not None:
                    return kept
            return fdmount.clone_tree(fd, MountAttr(op.attrs), op.target, recursive=op.kind == "dir")
        except OSError as err:
            raise MountError(f"mount failed: {source} -> {op.target}: {err.strerror}") from None
        finally:
            os.close(fd)

    # -- container namespace -----------------------------------------------------------------

    def enter(self) -> None:
        """Join the container's mount namespace, then its user namespace where it has one, as its
        root (:func:`nvc.apply.userns.join_as_root`): from then on the ids the helper names are
        that namespace's, so the owner of what it makes is the container's owner as seen there.
        Nothing to do in standalone mode."""
        if self.ns_fd < 0:
            return
        with raised("sys_admin", "sys_chroot"):
            try:
                syscalls.setns(self.ns_fd, syscalls.CLONE_NEWNS, "the container's mount namespace")
            except OSError as err:
                raise MountError(f"cannot enter the mount namespace of {self.plan.pid}: {err.strerror}") from None
            if self.maps is not None:
                userns.join_as_root(self.userns_fd, self.maps, self.plan.pid)
                owner = self.maps.inside(*self.plan.owner)
                if owner is None:
                    raise MountError(
                        f"the owner {self.plan.owner[0]}:{self.plan.owner[1]} of container process "
                        f"{self.plan.pid} is not mapped in its user namespace"
                    )
                self.owner = owner
        for fd in (self.ns_fd, self.userns_fd):
            if fd >= 0:
                os.close(fd)
        self.ns_fd = self.userns_fd = -1
        self.in_container = True

    def execute(self) -> None:
        """Run the operations ldconfig reads (:meth:`Plan.ldconfig_start`) in order, then save what
        ldconfig may change; the caller rolls back on an exception."""
        with raised(*_STEP_CAPS):
            self._run(0, self.plan.ldconfig_start())
            if self.plan.ldconfig is not None:
                self._save_for_ldconfig()

    def execute_rest(self) -> None:
        """Run the operations after those :meth:`execute` ran (while ldconfig runs); the caller stops
        ldconfig, then rolls back on an exception."""
        with raised(*_STEP_CAPS):
            self._run(self.plan.ldconfig_start(), len(self.plan.operations))

    def _run(self, first: int, end: int) -> None:
        for index in range(first, end):
            op = self.plan.operations[index]
            try:
                self._step(index, op)
            except OSError as err:
                raise MountError(
                    f"{type(op).__name__.lower()} failed: {op.target}: {err.strerror}{self._advice(err.errno)}"
                ) from None

    def _save_for_ldconfig(self) -> None:
        """What the ldconfig that follows may replace (its cache) or add (links in the plan's
        library dirs), so that a rollback after it ran puts the rootfs back as it was."""
        try:
            saved = [inroot.save_file(self.root_fd, path) for path in (CACHE, CACHE + "~")]
        except OSError as err:
            raise MountError(f"cannot save {err.filename} for a rollback: {err.strerror}") from None
        names = {}
        for folder in self.plan.ldconfig_dirs:
            try:
                fd = inroot.open_in_root(self.root_fd, folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK)
            except OSError:
                continue  # not a directory ldconfig can scan either
            try:
                names[folder] = set(os.listdir(fd))
            finally:
                os.close(fd)
            self._note("ldconfig", folder, *sorted(names[folder]))
        self.done.append(("ldconfig", (saved, names)))

    def _step(self, index: int, op: Operation) -> None:
        if isinstance(op, Bind):
            tree = self.trees.pop(index, None)
            if tree is None:  # a source inside the rootfs: resolved there, now that we are inside
                src = inroot.open_in_root(self.root_fd, op.source, os.O_PATH | os.O_NOFOLLOW)
                tree = self._clone(op.source, op, src)
            try:
                parent, name = self._target(
                    op.target,
                    "dir" if op.kind == "dir" else "file",
                    stat.S_IMODE(os.fstat(tree).st_mode),
                    onto_pseudo=False,
                )
                try:
                    self._refuse_shared(parent, op.target)
                    # noted before: a helper killed right after attaching it still has it in its journal
                    self._note("mount", op.target, mount_id(tree))
                    mount = fdmount.attach_tree(tree, parent, name, dest_path=op.target)
                finally:
                    os.close(parent)
            except BaseException:
                os.close(tree)
                raise
            self.done.append(("mount", mount))
        elif isinstance(op, Tmpfs):
            parent, name = self._target(op.target, None, 0)
            try:
                self._refuse_shared(parent, op.target)
                mount = fdmount.mount_tmpfs(
                    parent, name, MountAttr.NOSUID | MountAttr.NODEV | MountAttr.NOEXEC, dest_path=op.target, mode=0o555
                )
            finally:
                os.close(parent)
            self.done.append(("mount", mount))
            self._note("mount", mount.path, mount_id(mount.fd))
            self.tmpfs[op.target] = mount
        elif isinstance(op, MakeDir):
            os.close(self._target(op.target, "dir", 0o755)[0])
        elif isinstance(op, WriteFile):
            fd = inroot.create_file_in_root(self.root_fd, op.target, op.mode, access=os.O_WRONLY)
            self._created(op.target)
            try:
                os.write(fd, op.content.encode())
                os.fchmod(fd, op.mode)
            finally:
                os.close(fd)
        elif isinstance(op, Seal):
            fdmount.set_attrs(self.tmpfs[op.target], SEALED)
        elif isinstance(op, Symlink):
            try:
                if inroot.symlink_in_root(self.root_fd, op.target, op.link_to, self.owner):
                    self._created(op.target)
            except FileExistsError:
                log.debug("%s exists in the image: left alone", op.target)

    def _refuse_shared(self, parent: int, path: str) -> None:
        """A mount made on a shared mount propagates to its peers, which may be the host's own
        mounts (a rootfs under an ``rshared`` propagation): that would leak into the host."""
        if self.in_container and self._is_shared(parent):
            raise MountError(
                f"refusing to mount on {path}: its mount is shared, the mount would propagate "
                "out of the container (use private or slave rootfs propagation)"
            )

    def _is_shared(self, fd: int) -> bool:
        """Whether the mount ``fd`` lies on is shared: asked of the kernel for that mount alone
        (statmount), else found in the namespace's mountinfo, read once. mountinfo is as long as
        the mount table, which at a runtime's prestart is still a copy of the host's: under a start
        storm one read took tens of milliseconds."""
        if self.shared is None:
            try:
                mnt = syscalls.mount_unique_id(fd)
                if mnt not in self.propagation:  # most targets lie on the rootfs's mount
                    self.propagation[mnt] = bool(syscalls.mount_propagation(mnt) & syscalls.MS_SHARED)
                return self.propagation[mnt]
            except OSError:  # a kernel before 6.8, or one that refuses: mountinfo tells
                self.shared = shared_mounts()
        return mount_id(fd) in self.shared

    def _in_tmpfs(self, path: str) -> bool:
        return any(path.startswith(t.rstrip("/") + "/") for t in self.tmpfs)

    def _note(self, *entry: Any) -> None:
        if self.record is not None:
            self.record(list(entry))

    def _created(self, path: str) -> None:
        """Remember a file we made, unless it lives in our tmpfs (gone with it)."""
        if not self._in_tmpfs(path):
            self.done.append(("file", path))
            self._note("file", path)

    def _target(self, path: str, make: str | None, mode: int, onto_pseudo: bool = True) -> tuple[int, str]:
        """Where ``path`` leads inside the rootfs, as the container resolves it: the parent's fd
        and the name there. Missing directories on the way are made (0755), and with ``make``
        ("dir" or "file") the last name too (``mode`` less the group and other write bits),
        owned by the container's owner, as the reference makes them.

        Without ``onto_pseudo`` a path that an image's link leads into the container's procfs or
        sysfs is refused (the reference would mount there): a driver file or socket over a
        /proc/sys or /proc/self/attr entry would take the writes the runtime makes there after
        the hook (sysctls, LSM labels), and the host's IPC sockets and MPS directory are writable."""

        def last(dir_fd: int, name: str, where: str) -> None:
            if make == "dir":
                mkdir(dir_fd, name, where, mode & 0o755)
                return
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            self._making(where)
            fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
            try:
                self._made(dir_fd, name, where, fd, mode & 0o755)
            finally:
                os.close(fd)

        def mkdir(dir_fd: int, name: str, where: str, dir_mode: int = 0o755) -> None:
            self._making(where)
            os.mkdir(name, 0o700, dir_fd=dir_fd)
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            try:
                self._made(dir_fd, name, where, fd, dir_mode)
            finally:
                os.close(fd)

        try:
            parent, name, where = inroot.resolve_in_root(self.root_fd, path, mkdir, last if make else None)
        except inroot.InRootError as err:
            raise MountError(f"cannot mount on {path}: {err.why}{self._advice(err.errno)}") from None
        if name == ".":
            os.close(parent)
            raise MountError(f"refusing to mount over {path}: it leads to the root of the image")
        pseudo = None if onto_pseudo else PSEUDO_FS.get(syscalls.fs_type(parent, where))
        if pseudo is not None:
            os.close(parent)
            raise MountError(f"refusing to mount over {path}: it leads to {where}, on the container's {pseudo}")
        return parent, name

    def _advice(self, code: int | None) -> str:
        """What to do, where a file could not be made because of the container's user namespace."""
        if self.maps is None or not userns.cannot_write(code):
            return ""
        return f"; {userns.advice(self.maps.root())}"

    def _making(self, where: str) -> None:
        """Note that ``where`` (absent: resolve_in_root found no such name) is about to be made: a
        helper killed before it noted what it made leaves it to undo() all the same."""
        if not self._in_tmpfs(where):
            self._note("make", where)

    def _made(self, dir_fd: int, name: str, where: str, fd: int, mode: int) -> None:
        """Remember what was just made as ``name`` in ``dir_fd`` (by that fd: a rollback removes
        exactly it, whatever the image's links say by then), then give it, open on ``fd``, its
        mode (whatever the umask) and the container's owner."""
        if not self._in_tmpfs(where):
            self.done.append(("made", (os.dup(dir_fd), name, where)))
            st = os.fstat(fd)
            self._note("made", where, st.st_dev, st.st_ino)
        os.fchown(fd, *self.owner)
        os.fchmod(fd, mode)

    # -- end -------------------------------------------------------------------------------

    def rollback(self) -> list[str]:
        """Undo everything, newest first; return what could not be undone."""
        problems = []
        with raised("sys_admin", "dac_override", "fowner"):
            for kind, what in reversed(self.done):
                try:
                    if kind == "mount":
                        fdmount.unmount(what)  # type: ignore[arg-type]
                    elif kind == "ldconfig":
                        problems += self._undo_ldconfig(*what)  # type: ignore[misc]
                    elif kind == "made":
                        dir_fd, name, where = what  # type: ignore[misc]
                        try:
                            inroot.remove_at(dir_fd, name, where)
                        finally:
                            os.close(dir_fd)
                    else:
                        inroot.remove_in_root(self.root_fd, what)  # type: ignore[arg-type]
                except (NvcError, OSError) as err:
                    problems.append(str(err))
        self.done.clear()
        self._close()
        return problems

    def _undo_ldconfig(self, saved: list[inroot.SavedFile], names: dict[str, set[str]]) -> list[str]:
        """Put ldconfig's cache back and remove the links it added; return what failed."""
        problems = []
        for folder, before in names.items():
            try:
                self._remove_links_since(folder, before)
            except OSError as err:
                problems.append(f"{folder}: {err.strerror}")
        for file in saved:
            try:
                inroot.restore_file(self.root_fd, file)
            except OSError as err:
                problems.append(f"cannot restore {file.path}: {err.strerror}")
        return problems

    def _remove_links_since(self, folder: str, before: set[str]) -> None:
        """Remove the links in ``folder`` (inside the root) that are not among the names ``before``:
        what ldconfig added (it makes only links)."""
        fd = inroot.open_in_root(self.root_fd, folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK)
        try:
            for name in sorted(set(os.listdir(fd)) - before):
                if stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)

    def undo(self, journal: list[Any], handle: ContainerHandle | None) -> list[str]:
        """Undo what a helper that died noted in its journal (see the module's docstring), newest
        first, in the container as the dead helper saw it; return what could not be undone. A mount
        goes only while it is still the one noted (its mount id), a file or directory only while
        it is still the very inode made (a file named but not given one: while it is there)."""
        with raised("sys_admin", "dac_read_search", "dac_override", "sys_ptrace"):
            self._open_container(handle)
        self.enter()
        problems = []
        made = {path for kind, path, *_ in journal if kind == "made"}
        with raised("sys_admin", "dac_override", "fowner"):
            for kind, path, *identity in reversed(journal):
                if kind == "make" and path in made:
                    continue  # its "made" entry names its very inode
                try:
                    self._undo_one(kind, path, identity)
                except FileNotFoundError:
                    pass  # never made (the helper died first), or gone with its mount
                except (NvcError, OSError) as err:
                    problems.append(f"{path}: {err}")
        self._close()
        return problems

    def _undo_one(self, kind: str, path: str, identity: list[int]) -> None:
        """Undo one journal entry (see undo())."""
        if kind == "ldconfig":  # the folder's names before ldconfig ran: the links it added go
            self._remove_links_since(path, set(identity))
            return
        if kind == "mount":
            fd = inroot.open_in_root(self.root_fd, path, os.O_PATH)
            if mount_id(fd) == identity[0]:
                fdmount.unmount(fdmount.Mount(fd, path))
            else:
                os.close(fd)
            return
        dir_fd, name = inroot.open_parent_in_root(self.root_fd, path)
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if kind == "made" and (st.st_dev, st.st_ino) != tuple(identity):
                return
            # "make": noted before it was made, so it may not be: only what it would be then, empty
            if kind == "make" and (st.st_size if stat.S_ISREG(st.st_mode) else not stat.S_ISDIR(st.st_mode)):
                return
            inroot.remove_at(dir_fd, name, path)
        finally:
            os.close(dir_fd)

    def commit(self) -> None:
        """Keep everything; drop the handles."""
        for kind, what in self.done:
            if kind == "mount":
                what.close()  # type: ignore[attr-defined]
            elif kind == "ldconfig":
                for file in what[0]:  # type: ignore[index]
                    inroot.close_saved(file)
            elif kind == "made":
                os.close(what[0])  # type: ignore[index]
        self.done.clear()
        self._close()

    def _close(self) -> None:
        for fd in (*self.trees.values(), self.root_fd, self.ns_fd, self.userns_fd):
            if fd >= 0:
                os.close(fd)
        self.trees.clear()
        self.root_fd = self.ns_fd = self.userns_fd = -1


def shared_mounts() -> set[int]:
    """Ids of this process's mounts that have peers (``shared:N`` in mountinfo)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError as err:
        raise MountError(f"open failed: /proc/self/mountinfo: {err.strerror}") from None
    shared = set()
    for line in lines:
        fields = line.split(" - ", 1)[0].split()
        if any(tag.startswith("shared:") for tag in fields[6:]):
            shared.add(int(fields[0]))
    return shared


def mount_id(fd: int) -> int:
    """The id of the mount ``fd`` lies on (as mountinfo numbers it)."""
    info = os.open(f"/proc/self/fdinfo/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        text = os.read(info, 4096)
    finally:
        os.close(info)
    for line in text.splitlines():
        if line.startswith(b"mnt_id:"):
            return int(line.split()[1])
    raise MountError(f"no mnt_id in /proc/self/fdinfo/{fd}")
