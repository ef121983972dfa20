"""GPU sharing's MPS control daemons on the host: started for a device's first MPS container,
started again when a container finds it dead, stopped after its last container (:mod:`nvc.plan.mps`
plans them).

``<mps_dir>/<UUID>/`` (root's, 0755) holds the daemon's ``pipe/`` and ``log/`` (its
CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY), root's record of the daemon it started
(``daemon``: the pid its pid file gave, that process's start time and the control binary), and one
record per container using it (``clients/<container id>``: the host uid of its user, its weight, its
init process). The pipe directory is mounted into the containers, so nothing in it is believed: the
daemon is the process of the record, the same pid and start time. Hooks run concurrently: every
change is made under one lock (``<mps_dir>/.lock``).

MPS serves one user's clients at a time (a client of another uid waits until the daemon's server for
the first user has exited), so a container whose user is not the user of the containers already on
the device's daemon is refused, naming both uids.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator

from nvc.apply.container import start_time
from nvc.errors import ContainerError
from nvc.logger import Logger
from nvc.plan import mps as mpsplan
from nvc.plan.share import STATE_DIR
from nvc.records import NamedTuple

TYPE_CHECKING = False
if TYPE_CHECKING:
    from nvc.apply.container import ContainerHandle

SYSTEMD_DIR = "/run/systemd/system"  # there where systemd runs (sd_booted(3))
SYSTEMD_RUN = "/usr/bin/systemd-run"
LOCK = ".lock"
DAEMON = "daemon"
CLIENTS = "clients"
PID_FILE = "nvidia-cuda-mps-control.pid"  # what the control daemon writes in its pipe directory
START_WAIT = 10.0  # seconds for a started daemon to write its pid file
STOP_WAIT = 10.0  # seconds for a daemon told to quit to exit
_MAX_RECORD = 4096
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
log = Logger(__name__)


class Daemon(NamedTuple):
    """Root's record of a device's control daemon."""

    pid: int
    start_time: int
    control: str  # the binary that started it (and tells it to quit)


class Client(NamedTuple):
    """Root's record of a container using a device's daemon."""

    container_id: str
    uid: int  # host uid of its user
    weight: int  # 0: none
    pid: int | None  # its init process (None: standalone configure)
    start_time: int | None


class DeviceState(NamedTuple):
    """What ``share status`` says of one device's daemon."""

    device: str
    pid: int | None  # None: not running
    clients: tuple[Client, ...]


@contextlib.contextmanager
def _locked(mps_dir: str) -> Iterator[int]:
    """An fd of ``mps_dir`` (made root's 0755 if missing, refused if anyone else may write it),
    held under the daemons' lock."""
    from nvc.system.untrusted import directory_problem

    try:
        os.makedirs(mps_dir, 0o755, exist_ok=True)
        dir_fd = os.open(mps_dir, _DIR_FLAGS)
    except OSError as err:
        raise ContainerError(f"cannot use the MPS directory {mps_dir}: {err.strerror}") from None
    try:
        problem = directory_problem(dir_fd, 0o022)
        if problem:
            raise ContainerError(f"MPS directory {mps_dir} must be root's and not writable by others ({problem})")
        lock_fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            yield dir_fd
        finally:
            os.close(lock_fd)
    finally:
        os.close(dir_fd)


def _read_json(dir_fd: int, name: str) -> dict | None:
    """A record of root's (a regular file of at most _MAX_RECORD bytes), None when missing or not one."""
    from nvc.system import untrusted

    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        doc = json.loads(untrusted.read_checked(fd, max_size=_MAX_RECORD, owner=0))
    except (OSError, ValueError, untrusted.UnexpectedFile):
        return None
    finally:
        os.close(fd)
    return doc if isinstance(doc, dict) else None


def _write_json(dir_fd: int, name: str, doc: dict) -> None:
    """Root's record ``name``, replaced whole (written aside, renamed)."""
    tmp = f".{name}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    try:
        os.write(fd, json.dumps(doc).encode() + b"\n")
    finally:
        os.close(fd)
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _daemon(device_fd: int) -> Daemon | None:
    """The record of the device's daemon, when the process it names still runs."""
    doc = _read_json(device_fd, DAEMON)
    try:
        daemon = Daemon(int(doc["pid"]), int(doc["start_time"]), str(doc["control"]))  # type: ignore[index]
    except (TypeError, KeyError, ValueError):
        return None
    return daemon if start_time(daemon.pid) == daemon.start_time else None


def _clients(device_fd: int) -> list[Client]:
    try:
        clients_fd = os.open(CLIENTS, _DIR_FLAGS, dir_fd=device_fd)
    except OSError:
        return []
    try:
        found = []
        for name in sorted(os.listdir(clients_fd)):
            if name.startswith("."):  # a record being written (no container id starts with '.')
                continue
            doc = _read_json(clients_fd, name)
            if doc is None:
                continue
            try:
                found.append(Client(name, int(doc["uid"]), int(doc["weight"]), doc["pid"], doc["start_time"]))
            except (KeyError, TypeError, ValueError):
                continue
        return found
    finally:
        os.close(clients_fd)


def _live(client: Client) -> bool:
    """Whether the container still runs: its init process, the same pid and start time (a
    standalone ``configure``'s, with no process, until it is released)."""
    return client.pid is None or start_time(client.pid) == client.start_time


def _host_uid(client: mpsplan.MpsClient, handle: ContainerHandle | None) -> int:
    maps = None if handle is None else handle.id_maps()
    uid = client.uid if maps is None else maps.host_uid(client.uid)
    if uid is None:
        raise ContainerError(f"uid {client.uid} of container {client.container_id} is not mapped to a host user")
    return uid


def _clear(dir_fd: int) -> None:
    """Remove what a dead daemon (or a container) left in the pipe directory, following nothing."""
    for name in os.listdir(dir_fd):
        if _is_dir(dir_fd, name):
            shutil.rmtree(name, dir_fd=dir_fd, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dir_fd)


def _is_dir(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def _subdir(parent_fd: int, name: str) -> int:
    """An fd of directory ``name`` (root's 0755, made if missing)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o755, dir_fd=parent_fd)
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    os.fchown(fd, 0, 0)
    os.fchmod(fd, 0o755)
    return fd


def _start(client: mpsplan.MpsClient, device_fd: int) -> None:
    """Start the device's control daemon (its pipe directory emptied first) and record it."""
    pipe_fd = _subdir(device_fd, "pipe")
    try:
        _clear(pipe_fd)
        os.close(_subdir(device_fd, "log"))
        env = mpsplan.daemon_env(client.device, client.pipe_dir, client.log_dir)
        # its output to a file, never a pipe: a daemon that kept the pipe open would hold this call
        with tempfile.TemporaryFile() as output:
            try:
                done = subprocess.run(
                    _launcher(client, env),
                    env=env,
                    cwd="/",
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=output,
                    timeout=START_WAIT,
                )
            except (OSError, subprocess.TimeoutExpired) as err:
                raise ContainerError(f"{client.device}: cannot start {client.control} -d: {err}") from None
            output.seek(0)
            said = output.read(4096).decode(errors="replace").strip().splitlines()
        if done.returncode != 0:
            raise ContainerError(
                f"{client.device}: {client.control} -d exited with {done.returncode}"
                f"{': ' + said[-1] if said else ''} (its log: {client.log_dir})"
            )
        pid = _wait_pid(pipe_fd)
    finally:
        os.close(pipe_fd)
    started = None if pid is None else start_time(pid)
    if pid is None or started is None:
        raise ContainerError(
            f"{client.device}: {client.control} -d started no daemon within {START_WAIT:g} s (its log: {client.log_dir})"
        )
    _write_json(device_fd, DAEMON, {"pid": pid, "start_time": started, "control": client.control})


def _launcher(client: mpsplan.MpsClient, env: dict[str, str]) -> list[str]:
    """How the daemon is started: where systemd runs, as a transient service of its own
    (``nvc-py-mps-<UUID>``), so that it is neither in the hook's cgroup nor adopted by the hook's
    subreapers (a restart of the hook server's unit, which kills what is left in its cgroup, leaves
    it running); elsewhere directly."""
    argv = [client.control, "-d"]
    if not os.path.isdir(SYSTEMD_DIR) or not os.access(SYSTEMD_RUN, os.X_OK):
        return argv
    setenv = [f"--setenv={name}={value}" for name, value in env.items()]
    unit = [f"--unit=nvc-py-mps-{client.device}", "--property=Type=forking", "--collect", "--quiet"]
    return [SYSTEMD_RUN, *unit, *setenv, *argv]


def _wait_pid(pipe_fd: int) -> int | None:
    """The pid the new daemon writes in its pipe directory (waited for: it writes it as it starts)."""
    from nvc.system.untrusted import decimal

    deadline = time.monotonic() + START_WAIT
    while time.monotonic() < deadline:
        try:
            fd = os.open(PID_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=pipe_fd)
        except FileNotFoundError:
            time.sleep(0.01)
            continue
        except OSError:
            return None
        try:
            text = os.read(fd, 32).decode(errors="replace").strip()
        finally:
            os.close(fd)
        pid = decimal(text, 10) if text else None
        if pid:
            return pid
        time.sleep(0.01)
    return None


def attach(client: mpsplan.MpsClient, handle: ContainerHandle | None, state_dir: str = STATE_DIR) -> str:
    """Make the device's daemon serve the container (started when none runs: the first container,
    or the last one died) and record the container; returns its limits file's MPS lines (and duty cycle).
    The device's other running containers get their duty cycles among the new set of weights
    (``state_dir``: where their limits files are). A container of another user than the daemon's present
    clients is refused."""
    uid = _host_uid(client, handle)
    with _locked(client.mps_dir) as dir_fd:
        device_fd = _subdir(dir_fd, client.device)
        try:
            present = [c for c in _clients(device_fd) if _live(c) and c.container_id != client.container_id]
            others = sorted({c.uid for c in present} - {uid})
            if others:
                raise ContainerError(
                    f"{client.device}: its MPS daemon serves uid {others[0]} (containers "
                    f"{', '.join(c.container_id for c in present)}), this container runs as uid {uid}: MPS serves "
                    "one user at a time (run it as the same user, or share this GPU with backend timeslice)"
                )
            if _daemon(device_fd) is None:
                _start(client, device_fd)
            clients_fd = _subdir(device_fd, CLIENTS)
            try:
                pid, started = (None, None) if handle is None else (handle.pid, handle.start_time())
                record = {"uid": uid, "weight": client.weight or 0, "pid": pid, "start_time": started}
                _write_json(clients_fd, client.container_id, record)
            finally:
                os.close(clients_fd)
        finally:
            os.close(device_fd)
        weights = [c.weight for c in present if c.weight]
        _rebalance(present, [*weights, client.weight] if client.weight else weights, state_dir)
    return mpsplan.client_lines(client, weights)


def release(container_id: str, mps_dir: str = mpsplan.MPS_DIR, state_dir: str = STATE_DIR) -> None:
    """poststop (or a later step of the start failing): the container's records gone; a daemon
    left with no running container stopped, its directory removed, the others' duty cycles recomputed
    without its weight. Never fails the teardown."""
    if not os.path.isdir(mps_dir):
        return
    with _locked(mps_dir) as dir_fd:
        for device in _devices(dir_fd):
            device_fd = os.open(device, _DIR_FLAGS, dir_fd=dir_fd)
            gone = False
            try:
                with contextlib.suppress(OSError):
                    os.unlink(f"{CLIENTS}/{container_id}", dir_fd=device_fd)
                    gone = True
                left = [c for c in _clients(device_fd) if _live(c)]
            finally:
                os.close(device_fd)
            if not left:
                _stop(dir_fd, device, mps_dir)
            elif gone:
                _rebalance(left, [c.weight for c in left if c.weight], state_dir)


def _rebalance(clients: list[Client], weights: list[int], state_dir: str) -> None:
    """Each client's duty cycle among the device's ``weights`` now (nvc.plan.mps.rebalanced), its limits
    file rewritten where it changed: its processes put it in force within 200 ms (the shim rereads the
    file), so a lighter container started first is held once a heavier one comes, and runs free once
    the heavier ones are gone. One whose file cannot be rewritten keeps its duty cycle, and is named."""
    from nvc.apply import sharechange

    for client in clients:
        others = list(weights)
        if client.weight:
            others.remove(client.weight)
        origin = f"container {client.container_id}"
        try:
            with sharechange.locked(client.container_id, state_dir) as current:
                text = mpsplan.rebalanced(current.limits, client.weight, others, origin)
                if text is not None:
                    sharechange.rewrite(client.container_id, text, None, state_dir)
        except (ContainerError, OSError) as err:
            log.warning("%s keeps its duty cycle: %s", origin, err)


def _devices(dir_fd: int) -> list[str]:
    return sorted(name for name in os.listdir(dir_fd) if not name.startswith(".") and _is_dir(dir_fd, name))


def _stop(dir_fd: int, device: str, mps_dir: str) -> str:
    """Tell the device's daemon to quit (killed when it has not exited STOP_WAIT s later), then
    remove its directory; returns what was done."""
    device_fd = os.open(device, _DIR_FLAGS, dir_fd=dir_fd)
    try:
        daemon = _daemon(device_fd)
    finally:
        os.close(device_fd)
    done = f"{device}: no MPS daemon running, its directory removed"
    if daemon is not None:
        directory = os.path.join(mps_dir, device)
        env = mpsplan.daemon_env(device, os.path.join(directory, "pipe"), os.path.join(directory, "log"))
        done = f"{device}: MPS daemon {daemon.pid} stopped"
        try:
            pidfd = os.pidfd_open(daemon.pid)
        except ProcessLookupError:
            pidfd = -1
        if pidfd >= 0:
            try:
                with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                    subprocess.run(
                        [daemon.control], input=b"quit\n", env=env, cwd="/", capture_output=True, timeout=STOP_WAIT
                    )
                if not select.select([pidfd], [], [], STOP_WAIT)[0] and start_time(daemon.pid) == daemon.start_time:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    done = f"{device}: MPS daemon {daemon.pid} killed (it did not quit within {STOP_WAIT:g} s)"
            except ProcessLookupError:
                pass
            finally:
                os.close(pidfd)
    shutil.rmtree(device, dir_fd=dir_fd, ignore_errors=True)
    return done


def stop_idle(mps_dir: str = mpsplan.MPS_DIR) -> tuple[list[str], list[str]]:
    """``setup --remove``, the package's removal: every daemon with no running container stopped
    and its directory removed, then the MPS directory; (what was done, what was left)."""
    if not os.path.isdir(mps_dir):
        return [], []
    done: list[str] = []
    left: list[str] = []
    with _locked(mps_dir) as dir_fd:
        for device in _devices(dir_fd):
            device_fd = os.open(device, _DIR_FLAGS, dir_fd=dir_fd)
            try:
                running = [c.container_id for c in _clients(device_fd) if _live(c)]
            finally:
                os.close(device_fd)
            if running:
                left.append(f"{device}: its MPS daemon serves running containers {', '.join(running)}: left")
            else:
                done.append(_stop(dir_fd, device, mps_dir))
        remaining = _devices(dir_fd)
        if not remaining:
            with contextlib.suppress(OSError):
                os.unlink(LOCK, dir_fd=dir_fd)
    if not remaining:
        with contextlib.suppress(OSError):
            os.rmdir(mps_dir)
    return done, left


def status(mps_dir: str = mpsplan.MPS_DIR) -> list[DeviceState]:
    """Each device's daemon (its pid when running) and its containers, as the records say."""
    if not os.path.isdir(mps_dir):
        return []
    found = []
    with _locked(mps_dir) as dir_fd:
        for device in _devices(dir_fd):
            device_fd = os.open(device, _DIR_FLAGS, dir_fd=dir_fd)
            try:
                daemon = _daemon(device_fd)
                found.append(DeviceState(device, None if daemon is None else daemon.pid, tuple(_clients(device_fd))))
            finally:
                os.close(device_fd)
    return found
