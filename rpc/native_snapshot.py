"""The driver's snapshot from the native driver helper (native/driver/driver_snapshot.c, installed as
:data:`PROGRAM`), for every snapshot that no warm Python helper answers.

A Python driver helper waits for its fork, its imports and pynvml before NVML can start: about twice
the reference's whole ``info`` without a server (docs/performance.md). The native helper starts NVML
within a millisecond of its start, confined by the same row of :mod:`nvc.system.confinement`, and
answers as the Python helper does (the same NVML calls, order and messages: one response of the
helpers' protocol on a pipe). It starts in one of two ways:

- The installed ``nvc-py`` (native/client/driver_start.c), for ``info`` that no server answers, starts it
  for the root given before the command (after ``--ldcache``, ``--debug`` and ``--load-kmods`` too, whose
  nodes, where it makes any, end it: :func:`nvc.commands.queries.load_nodes`; after no other global
  option), else the configuration's
  as root's program recorded it (:mod:`nvc.config.driverguess`), else /, and the configuration's
  identity likewise, else the default, as it executes this program, and names it in :data:`ENV`:
  ``FD PID UID GID ROOT``, the pipe its answer comes on, the child, the identity and the root it took.
  NVML then starts while the interpreter does. That start is a guess: where the options ask for
  another root or user, the helper is killed and reaped and one started for them (and root's program
  records the configuration's for the next guess: :func:`missed`).
- This program starts it (:func:`start`) as soon as it knows the options of a snapshot: a global
  option or a configuration naming another root or user, the program run without its front, and
  every inventory that asks NVML (:func:`nvc.rpc.driver_service.inventory`).

A process that keeps a Python helper warm for the same options (a hook server's worker: NVML loaded
already) takes that one instead (:func:`keep_warm`). Where the program is not installed (a source
tree) or ends without an answer, the caller's Python helper answers, saying what goes wrong. One the
command does not take (``--help``, an error before the snapshot) is killed and reaped as the program
ends (:func:`discard`). A caller that sets :data:`ENV` itself names a descriptor and a child of its
own: what it chooses is what its own ``info`` prints.
"""

from __future__ import annotations

import os

from nvc.errors import DriverError, from_kind
from nvc.rpc import DEFAULT_TIMEOUT, describe_status
from nvc.rpc.driver_wire import setup_params, snapshot_from_wire
from nvc.system.programs import LIBDIR

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from nvc.model.devices import DriverSnapshot

ENV = "NVC_PY_DRIVER_SNAPSHOT"  # as native/client/driver_start.c
GRACE = 0.05  # seconds a helper whose answer ended gets to exit before SIGKILL (the Python helper's too)
PROGRAM = os.path.join(LIBDIR, "nvc-py-driver-snapshot")  # as native/client/driver_start.c's

_held: tuple[int, int, dict[str, Any]] | None = None  # (fd, pid, params) of the native helper started
_guessed: dict[str, Any] | None = None  # what the front started its helper for (:func:`missed`)
_warm: Callable[[dict[str, Any]], bool] | None = None  # whether a warm Python helper holds these params


def take() -> None:
    """Take :data:`ENV` out of the environment (nothing this process starts sees it, nor the pipe) and
    keep what it names, for :func:`snapshot`."""
    global _held, _guessed
    value = os.environ.pop(ENV, None)
    if value is None:
        return
    try:
        *numbers, root = value.split(" ", 4)
        fd, pid, uid, gid = (int(word) for word in numbers)
        os.set_inheritable(fd, False)  # no program this one starts holds the pipe
    except (ValueError, OSError):
        return
    if os.path.isabs(root):  # as given: a root the options spell otherwise is not this one
        _guessed = {"root": root, "uid": uid, "gid": gid}
        _held = (fd, pid, _guessed)


def handed() -> bool:
    """Whether a native driver helper runs for this process (the front's, or one :func:`start` started),
    not taken yet."""
    return _held is not None


def missed(root: str, user: tuple[int, int] | None) -> bool:
    """Whether the front started its helper for other options than ``root`` and ``user`` (the
    configuration's, which :mod:`nvc.config.driverguess` records for its next guess)."""
    return _guessed is not None and _guessed != setup_params(root, user)


def installed() -> bool:
    """Whether the native helper can be started here (a source tree has none)."""
    return os.access(PROGRAM, os.X_OK)


def keep_warm(holds: Callable[[dict[str, Any]], bool]) -> None:
    """Let a process that keeps a Python driver helper warm say which parameters it holds
    (:func:`nvc.rpc.driver_service.prestart`): a snapshot for those is that helper's, whose NVML is loaded."""
    global _warm
    _warm = holds


def start(root: str, user: tuple[int, int] | None) -> bool:
    """Start the native helper for ``root`` and ``user`` now, where none runs for them already (one
    started for others is ended): whether one runs for them now. False where a warm Python helper holds
    them (:func:`keep_warm`) or the program cannot be started: the Python helper answers then."""
    global _held
    params = setup_params(root, user)
    if _held is not None and _held[2] == params:
        return True
    discard()
    if _warm is not None and _warm(params):
        return False
    read, write = os.pipe()  # neither inheritable: the child's standard output is a copy of ``write``
    try:
        pid = os.posix_spawn(
            PROGRAM,
            [PROGRAM, params["root"], str(params["uid"]), str(params["gid"])],
            os.environ,
            file_actions=[(os.POSIX_SPAWN_DUP2, write, 1)],
        )
    except OSError:  # not installed, or not executable: the Python helper answers
        os.close(read)
        return False
    finally:
        os.close(write)
    _held = (read, pid, params)
    return True


def snapshot(root: str, user: tuple[int, int] | None, timeout: float = DEFAULT_TIMEOUT) -> DriverSnapshot | None:
    """The native helper's snapshot for ``root`` and ``user`` (as :func:`nvc.rpc.driver_service.open_driver`
    takes them), started now where none runs for them (:func:`start`); None where it cannot answer
    (not started, or it exited without an answer: it could not start NVML's work), the helper gone.
    Raises the error it answered, a driver error where a signal ended it (a crash in NVML, a kill: what
    the Python helper's call says then), or one when it said nothing within ``timeout`` seconds."""
    global _held
    if not start(root, user) or _held is None:
        return None
    fd, pid, _params = _held
    _held = None
    answer, grace, ended = b"", 0.0, None
    try:
        answer = _read(fd, timeout)
        grace = GRACE  # its answer ended: it is exiting
    except OSError:  # no descriptor of this process's: nothing to take
        pass
    finally:
        ended = _end(fd, pid, grace)
    import json

    try:
        body = json.loads(answer)
        if "error" in body:
            err = body["error"]
            raise from_kind(err["kind"], err["message"], err.get("code"))
        return snapshot_from_wire(body["result"])
    except (ValueError, KeyError, TypeError):  # no answer, or not the helper's
        if ended is not None and os.WIFSIGNALED(ended):
            raise DriverError(f"driver rpc error: helper {describe_status(ended)} in snapshot") from None
        return None


def discard() -> None:
    """End the native helper not taken (this process's command did not take it, or asked for other
    options): killed and reaped now, not left to PDEATHSIG and a PID 1 that may never reap it."""
    global _held
    if _held is not None:
        fd, pid, _params = _held
        _held = None
        _end(fd, pid)


def _read(fd: int, timeout: float) -> bytes:
    """Everything the helper writes until it closes its end, within ``timeout`` seconds."""
    import select
    import time

    deadline, chunks = time.monotonic() + timeout, []
    while True:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise DriverError(f"driver rpc error: timed out after {timeout:.1f} s in snapshot")
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _end(fd: int, pid: int, grace: float = 0.0) -> int | None:
    """Close the helper's pipe and reap the helper where it is this process's child (a pid that is no
    child of this one is left alone: :data:`ENV` came from the caller), killed where it did not exit
    within ``grace`` seconds. Returns its wait status where it ended by itself, else None."""
    import select
    import signal

    try:
        os.close(fd)
    except OSError:
        pass
    try:
        ended = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        if not ended:
            pidfd = os.pidfd_open(pid)
            try:
                ended = bool(select.select([pidfd], [], [], grace)[0])
                if not ended:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            finally:
                os.close(pidfd)
        status = os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return None
    return status if ended else None
