"""Run ldconfig for a container, sandboxed, so that the image cannot turn it against the host.

The cache must be built by ldconfig inside the container's view of its rootfs: running the
host's ``ldconfig -r <rootfs>`` follows the image's symlinks on the host (CVE-2025-23267). So a
child, pid 1 of a fresh pid namespace, joins the container's mount namespace, makes its own
private copy of it (plus a fresh ipc namespace), pivots into the rootfs, hides /proc, /sys and
/dev under empty read-only tmpfs, gives up every capability, becomes the container's owner,
takes rlimits, NO_NEW_PRIVS and a seccomp allowlist (the steps and the row
:data:`nvc.system.confinement.LDCONFIG_SANDBOX`), and execs ldconfig with an empty environment. The
private copy of the rootfs is nodev and nosuid (recursively): whatever device node an image
ships, ldconfig cannot open it, nor can a setuid file gain anything. Its fixed inputs and output
(``/etc/ld.so.conf``, ``ld.so.conf.d/*.conf``, ``/etc/ld.so.cache``, ``/etc/ld.so.cache~``) are
checked, in ldconfig's own view, to be regular files before it runs, so that an image's FIFO or
device there is refused with one line naming it rather than blocking or failing obscurely; a
FIFO elsewhere (an ``include``d file) is bounded by the wall-time limit, after which everything
the run started is killed. Every process of the run dies with its parent (PDEATHSIG, armed after
the last credential change, which clears it). What ldconfig prints goes to a memfd, and a failed
run's error ends with ldconfig's own last line (``Can't create temporary cache file ...``). A host ldconfig (``@/path``) is copied into a
sealed memfd before the fork and executed from that fd: the process never maps the host inode,
so nothing the container does to ``/proc/<pid>/exe`` reaches the host binary (CVE-2024-0135).
Executing through execveat(AT_EMPTY_PATH) needs no /proc at all.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import stat
import time
from collections.abc import Sequence

from nvc.errors import LdcacheError, NvcError, cut
from nvc.records import NamedTuple
from nvc.system import syscalls

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from nvc.apply.container import ContainerHandle

# Wall-time limit of one run, from start() (the real ldconfig takes well under a second; CPU
# is bounded at 10 s by RLIMIT_CPU): a FIFO or a stopped filesystem cannot hang configure.
TIMEOUT = 20.0
CACHE = "/etc/ld.so.cache"  # written as CACHE~, then renamed (nvc.apply.applier saves both for a rollback)
# ldconfig's fixed files, as it sees them: (path, follow symlinks, types allowed besides a
# regular file). The cache and its temporary are replaced by rename, so a link there is
# fine for the cache (replaced) and refused for the temporary (ldconfig opens it O_NOFOLLOW).
_FILES: tuple[tuple[str, bool, tuple[str, ...]], ...] = (
    ("/etc/ld.so.conf", True, ()),
    (CACHE, False, ("a symbolic link",)),
    (CACHE + "~", False, ()),
)
_CONF_DIR = "/etc/ld.so.conf.d"
_MISSING = "missing:"  # error-pipe prefix: the container has no ldconfig (not an error)
_TAIL = 4096  # bytes of ldconfig's output read for a failure's message: its last line is in them
_SAID = 300  # characters of ldconfig's line kept in the message
_TYPES = {
    stat.S_IFBLK: "a block device",
    stat.S_IFCHR: "a character device",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFREG: "a regular file",
}


def file_type(mode: int) -> str:
    """What a stat mode is, in words ("a block device")."""
    return _TYPES.get(stat.S_IFMT(mode), "an unknown file type")


def check_files(conf_dir: str = _CONF_DIR) -> None:
    """Refuse an image whose ldconfig files (:data:`_FILES`, ``conf_dir/*.conf``) are not regular.

    Runs in the sandbox, after the pivot: paths and links resolve as ldconfig will resolve
    them. Missing files (a dangling link too) are fine: ldconfig does without them.
    """
    names = []
    try:
        names = sorted(n for n in os.listdir(conf_dir) if n.endswith(".conf"))
    except (FileNotFoundError, NotADirectoryError):
        pass
    wanted = [*_FILES, *((f"{conf_dir}/{n}", True, ()) for n in names)]
    for path, follow, allowed in wanted:
        try:
            mode = os.stat(path, follow_symlinks=follow).st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as err:
            raise LdcacheError(f"{path} in the image cannot be checked: {err.strerror}") from None
        kind = file_type(mode)
        if not stat.S_ISREG(mode) and kind not in allowed:
            raise LdcacheError(f"{path} in the image is {kind}, not a regular file")


def ldconfig_argv(path: str, dirs: Sequence[str]) -> list[str]:
    """The command line: the container's own config and cache, plus the new library dirs."""
    return [path, "-f", "/etc/ld.so.conf", "-C", CACHE, *dirs]


def _is_script(fd: int) -> bool:
    return os.pread(fd, 2, 0) == b"#!"


def _open_program(path: str) -> tuple[int, str]:
    """Open ldconfig for execution; a shell wrapper (Ubuntu's) is replaced by ``<path>.real``.

    The wrapper only execs ``<path>.real``, and a script cannot run here anyway: its
    interpreter would have to be found by path after exec, outside the seccomp-checked fd.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    if not _is_script(fd):
        return fd, path
    os.close(fd)
    real = path + ".real"
    fd = os.open(real, os.O_RDONLY | os.O_CLOEXEC)
    if _is_script(fd):
        os.close(fd)
        raise LdcacheError(f"{path} and {real} are both scripts, not ldconfig")
    return fd, real


def sealed_copy(path: str) -> tuple[int, str]:
    """A sealed, close-on-exec memfd holding the (host) ldconfig at ``path``, and its real path."""
    try:
        src, real = _open_program(path)
    except OSError as err:
        raise LdcacheError(f"open failed: {err.filename}: {err.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):
            raise LdcacheError(f"{real} is not a regular file")
        mem = syscalls.memfd_create("nvc-ldconfig", syscalls.MFD_CLOEXEC | syscalls.MFD_ALLOW_SEALING)
        while os.sendfile(mem, src, None, 1 << 20):
            pass
        seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        fcntl.fcntl(mem, fcntl.F_ADD_SEALS, seals)
        return mem, real
    finally:
        os.close(src)


def run_ldconfig(ldconfig: str, rootfs: str, dirs: Sequence[str], **options: Any) -> bool:
    """Update the container's ld cache now: :func:`start_ldconfig` (same arguments), then run it.

    Returns False when the container has no ldconfig; raises LdcacheError on any failure.
    """
    return start_ldconfig(ldconfig, rootfs, dirs, **options).run()


class PendingLdconfig:
    """An ldconfig run whose child is forked and loading, waiting for :meth:`run`.

    The child's imports and its seccomp filter (read from root's cache, or the first time
    compiled through pyseccomp, whose import runs ``ldconfig -p`` twice) take milliseconds to
    tens of them on a slow host; forked ahead, it does them while the caller still mounts the
    driver files. It enters the container's namespaces only once told to run, so its private
    copy of the mount namespace holds the finished mounts.
    """

    def __init__(self, child: int, go_w: int, err_r: int, shown: str, timeout: float, said: int) -> None:
        self._child, self._go_w, self._err_r, self._shown = child, go_w, err_r, shown
        self._said = said  # the memfd ldconfig's output goes to (-1: the caller's output_fd)
        self._last = ""  # ": " and its last line, read when the child is reaped
        self._exited = os.pidfd_open(child)  # readable once the child (ldconfig, after its exec) ends
        self._timeout = timeout
        self._deadline = 0.0

    def run(self) -> bool:
        """Let the child build the sandbox and run ldconfig; as :func:`run_ldconfig`."""
        self.start()
        return self.wait()

    def start(self) -> None:
        """Let the child build the sandbox and run ldconfig, without waiting (see :meth:`wait`)."""
        if self._child < 0 or self._go_w < 0:
            raise LdcacheError("ldconfig was already started or cancelled")
        try:
            os.write(self._go_w, b"g")
        except BrokenPipeError:  # the child died early: its message or status says why
            pass
        os.close(self._go_w)
        self._go_w = -1
        self._deadline = time.monotonic() + self._timeout

    def wait(self) -> bool:
        """The started run's outcome: False when the container has no ldconfig; LdcacheError on failure."""
        if self._child < 0 or self._go_w >= 0:
            raise LdcacheError("ldconfig was not started")
        message: str | None = None
        try:
            # End of file comes with the exec (the pipe is close-on-exec) or an earlier exit;
            # then ldconfig itself runs, bounded by the same deadline.
            message = _read_all(self._err_r, self._deadline)
            if (
                message is not None
                and not select.select([self._exited], [], [], max(0.0, self._deadline - time.monotonic()))[0]
            ):
                message = None
        finally:
            if message is None:  # pid 1 of its pid namespace: whatever it started goes with it
                os.kill(self._child, signal.SIGKILL)
            status = self._reap()
        if message is None:
            raise LdcacheError(f"process {self._shown} timed out after {self._timeout:g} s (killed)")
        if message.startswith(_MISSING):
            return False
        if message:
            raise LdcacheError(message)
        code = os.waitstatus_to_exitcode(status)
        code = code if code >= 0 else 128 - code  # killed by a signal: as a shell reports it
        if code != 0:
            raise LdcacheError(f"process {self._shown} failed with error code: {code}{self._last}")
        return True

    def cancel(self) -> None:
        """Reap the child without waiting for ldconfig: before :meth:`start` it exits on end-of-file,
        after it is killed (ldconfig replaces the cache by a rename: never half-written); no-op after
        :meth:`wait`."""
        if self._child < 0:
            return
        if self._go_w >= 0:
            os.close(self._go_w)
            self._go_w = -1
        else:
            os.kill(self._child, signal.SIGKILL)
        self._reap()

    def _reap(self) -> int:
        """Wait for the child, close what watched it; its wait status."""
        os.close(self._err_r)
        os.close(self._exited)
        _, status = os.waitpid(self._child, 0)
        if self._said >= 0:
            try:
                self._last = _last_line(self._said)
            finally:
                os.close(self._said)
                self._said = -1
        self._child = -1
        return status


def start_ldconfig(
    ldconfig: str,
    rootfs: str,
    dirs: Sequence[str],
    *,
    owner: tuple[int, int],
    handle: ContainerHandle | None = None,
    no_pivot: bool = False,
    output_fd: int | None = None,
    timeout: float = TIMEOUT,
) -> PendingLdconfig:
    """Fork the ldconfig child now; it builds the sandbox and runs ldconfig on ``run()``.

    ``ldconfig``: ``@/host/path`` (run from a sealed memfd copy) or a path inside the
    container. ``rootfs``: the rootfs as seen in the mount namespace of the container's
    process ``handle`` (the caller's own when None). ``dirs``: library dirs to add, as paths
    inside the container. ``owner``: (uid, gid) ldconfig runs as. ``output_fd``: where
    ldconfig's stdout and stderr go (default a memfd, whose last line a failed run's error
    quotes). ``timeout``: seconds from
    ``start()`` after which the run is killed and fails. Bad arguments (a host ldconfig
    that cannot be opened, a gone container), and what this process may not open or make for
    the run, raise LdcacheError here, before the caller changes anything.
    """
    host = ldconfig.startswith("@")
    path = ldconfig[1:] if host else ldconfig
    program_fd, shown = sealed_copy(path) if host else (-1, path)
    ns_fd = -1 if handle is None else handle.mnt_ns  # the handle's: not closed here
    null_fd = err_r = err_w = go_r = go_w = parent_fd = own_pid_ns = said = -1
    try:
        null_fd = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        if output_fd is None:
            said = output_fd = syscalls.memfd_create("nvc-ldconfig-output", syscalls.MFD_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        go_r, go_w = os.pipe2(os.O_CLOEXEC)
        parent_fd = os.pidfd_open(os.getpid())  # the child's check that we still live: getppid() is 0 there
        own_pid_ns = _open_own_pid_ns()
        child = _fork_into_new_pid_namespace(own_pid_ns)
        if child == 0:
            os.close(err_r)
            os.close(go_w)
            _sandbox_child(
                _Run(rootfs, no_pivot, output_fd, shown, dirs, owner),
                err_w,
                go_r,
                parent_fd,
                ns_fd,
                null_fd,
                program_fd,
            )
        pending = PendingLdconfig(child, go_w, err_r, shown, timeout, said)
        err_r = go_w = said = -1
        return pending
    except OSError as err:  # /dev/null or a pipe refused (a Landlocked caller, the descriptor limit): one line
        raise LdcacheError(_describe(err, "cannot prepare ldconfig's run")) from None
    finally:
        for fd in (err_r, err_w, go_r, go_w, null_fd, program_fd, parent_fd, own_pid_ns, said):
            if fd >= 0:
                os.close(fd)


def _fork_into_new_pid_namespace(own_pid_ns: int) -> int:
    """Fork a child that is pid 1 of a new pid namespace; this process's own stays as it was.

    unshare(CLONE_NEWPID) changes only where this thread's next child goes, and setns back
    into ``own_pid_ns`` (this process's own pid namespace) undoes that right after the fork:
    one forked process builds the sandbox and becomes ldconfig, instead of a second fork
    from inside it.
    """
    try:
        syscalls.unshare(syscalls.CLONE_NEWPID)
    except OSError as err:
        raise LdcacheError(f"cannot make ldconfig's pid namespace: {err.strerror}") from None
    try:
        child = os.fork()
    except OSError as err:
        syscalls.setns(own_pid_ns, syscalls.CLONE_NEWPID, "own pid namespace")
        raise LdcacheError(f"cannot fork ldconfig's sandbox: {err.strerror}") from None
    if child != 0:
        syscalls.setns(own_pid_ns, syscalls.CLONE_NEWPID, "own pid namespace")
    return child


def _last_line(fd: int) -> str:
    """ ": " and the last line written to the memfd ``fd`` (cut; escaped where the error is shown), or ""."""
    size = os.fstat(fd).st_size
    lines = os.pread(fd, _TAIL, max(0, size - _TAIL)).decode(errors="replace").splitlines()
    last = next((line.strip() for line in reversed(lines) if line.strip()), "")
    return f": {cut(last, _SAID)}" if last else ""


def _open_own_pid_ns() -> int:
    ns = "/proc/self/ns/pid"
    try:
        return os.open(ns, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as err:
        raise LdcacheError(f"open failed: {ns}: {err.strerror}") from None


def _read_all(fd: int, deadline: float) -> str | None:
    """Everything written to ``fd`` until end-of-file, decoded; None if the deadline passed first."""
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            return b"".join(chunks).decode(errors="replace")
        chunks.append(chunk)


class _Run(NamedTuple):
    """What the sandboxed child runs (see :func:`start_ldconfig`); ``path`` as shown in messages."""

    rootfs: str
    no_pivot: bool
    output_fd: int
    path: str
    dirs: Sequence[str]
    owner: tuple[int, int]


def _sandbox_child(run: _Run, err_w: int, go_r: int, parent_fd: int, ns_fd: int, null_fd: int, program_fd: int) -> None:
    """The forked child (pid 1 of its own pid namespace): build the mount sandbox, drop
    everything (:data:`nvc.system.confinement.LDCONFIG_SANDBOX`'s steps, in their order), exec ldconfig.

    Never returns: it becomes ldconfig, or writes why it failed to ``err_w`` and exits.
    ``parent_fd``: a pidfd of the caller, checked once PDEATHSIG is armed (getppid() is 0 here).
    """
    path = run.path
    try:
        syscalls.die_with_parent(parent_fd)
        from nvc.system import confinement  # here, not in the caller: while it mounts, before the root changes

        sandbox = confinement.LDCONFIG_SANDBOX
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        program = confinement.seccomp_program(sandbox)  # read or built while the caller mounts: loading it is quick
        if os.read(go_r, 1) != b"g":  # cancelled: the caller's mounts failed, or it is gone
            os._exit(0)
        os.close(go_r)
        if ns_fd >= 0:
            syscalls.setns(ns_fd, syscalls.CLONE_NEWNS, "container mount namespace")
        syscalls.unshare(syscalls.CLONE_NEWNS | syscalls.CLONE_NEWIPC)
        confinement.change_root(sandbox, run.rootfs, run.no_pivot)
        check_files()
        for fd, target in ((null_fd, 0), (run.output_fd, 1), (run.output_fd, 2)):
            os.dup2(fd, target)
    except BaseException as err:  # noqa: BLE001 - a forked child must never unwind into the caller
        _fail(err_w, _describe(err, "sandbox set-up failed"))
    try:
        confinement.limit_bounding(sandbox)
        confinement.switch_identity(sandbox, run.owner, rearm=lambda: syscalls.die_with_parent(parent_fd))
        confinement.limit_caps(sandbox)
        if program_fd < 0:  # opened as the owner, with nothing left of root's power
            try:
                program_fd, path = _open_program(path)
            except FileNotFoundError:
                _fail(err_w, f"{_MISSING}{path}")
        keep = sorted({program_fd, err_w})
        os.closerange(3, keep[0])
        os.closerange(keep[0] + 1, keep[-1])
        os.closerange(keep[-1] + 1, os.sysconf("SC_OPEN_MAX"))
        confinement.limit_resources(sandbox)
        confinement.set_no_new_privs(sandbox)
        confinement.limit_syscalls(sandbox, program)
        syscalls.execveat(program_fd, ldconfig_argv(path, run.dirs), [], path)
    except BaseException as err:  # noqa: BLE001 - a forked child must never unwind into the caller
        _fail(err_w, _describe(err, f"cannot run {path}"))


def _describe(err: BaseException, doing: str) -> str:
    """The message the parent raises as LdcacheError for an exception in a child."""
    if isinstance(err, NvcError):  # LdcacheError, or a confinement step's own
        return str(err.args[0])
    if isinstance(err, OSError):
        return f"{doing}: {err.filename or ''}: {err.strerror}"
    return f"{doing}: {type(err).__name__}: {err}"


def _fail(err_w: int, message: str) -> None:
    try:
        os.write(err_w, message.encode() or b"failed")
    finally:
        os._exit(1)
