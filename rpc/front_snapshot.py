"""The driver snapshot the native front started for an ``nvc-py info`` that no server answers (no global
option: ``--csv`` and ``--json`` are the command's).

Without a server, ``nvc-py info``'s Python program waited for its interpreter, its imports and a
Python driver helper with pynvml before NVML could start: about twice the reference's whole ``info``
(docs/performance.md). The installed ``nvc-py`` (native/client/driver_start.c) starts the native driver
helper (native/driver/driver_snapshot.c) for the root / and the default identity as it executes this
program, and names it in :data:`ENV`: ``FD PID UID GID``, the pipe its answer comes on, the child and the
identity it took. NVML then starts while the interpreter does.

The start is a guess, as the Python helper forked ahead is (:func:`nvc.rpc.driver_service.prefork`):
where the configuration asks for another root or user, the native helper is killed and reaped, and
the Python helper answers. One that ended without an answer (it could not be executed, a crash) is
reaped, and the Python helper answers too, saying what goes wrong. One the command does not take
(``--help``, an error before the snapshot) is killed and reaped as the program ends (:func:`discard`).
A caller that sets :data:`ENV` itself names a descriptor and a child of its own: what it chooses is
what its own ``info`` prints.
"""

from __future__ import annotations

import os

from nvc.errors import DriverError, from_kind
from nvc.rpc import DEFAULT_TIMEOUT
from nvc.rpc.driver_wire import setup_params, snapshot_from_wire

TYPE_CHECKING = False
if TYPE_CHECKING:
    from nvc.model.devices import DriverSnapshot

ENV = "NVC_PY_DRIVER_SNAPSHOT"  # as native/client/driver_start.c
ROOT = "/"  # the root the front starts the native helper for

_handed: tuple[int, int, int, int] | None = None  # (fd, pid, uid, gid) of the native helper started


def take() -> None:
    """Take :data:`ENV` out of the environment (nothing this process starts sees it, nor the pipe) and
    keep what it names, for :func:`snapshot`."""
    global _handed
    value = os.environ.pop(ENV, None)
    if value is None:
        return
    try:
        fd, pid, uid, gid = (int(word) for word in value.split())
        os.set_inheritable(fd, False)  # no program this one starts holds the pipe
    except (ValueError, OSError):
        return
    _handed = (fd, pid, uid, gid)


def handed() -> bool:
    """Whether the front started a native driver helper for this process (not taken yet)."""
    return _handed is not None


def snapshot(root: str, user: tuple[int, int] | None, timeout: float = DEFAULT_TIMEOUT) -> DriverSnapshot | None:
    """The native helper's snapshot where it was started for ``root`` and ``user`` (as
    :func:`nvc.rpc.driver_service.open_driver` takes them) and answered; else None, the helper gone.
    Raises the error it answered, or a driver error when it said nothing within ``timeout`` seconds."""
    global _handed
    if _handed is None:
        return None
    fd, pid, uid, gid = _handed
    _handed = None
    answer = b""
    try:
        if setup_params(root, user) == {"root": ROOT, "uid": uid, "gid": gid}:
            answer = _read(fd, timeout)
    except OSError:  # no descriptor of this process's: nothing to take
        pass
    finally:
        _end(fd, pid)
    import json

    try:
        body = json.loads(answer)
        if "error" in body:
            err = body["error"]
            raise from_kind(err["kind"], err["message"], err.get("code"))
        return snapshot_from_wire(body["result"])
    except (ValueError, KeyError, TypeError):  # no answer, or not the helper's
        return None


def discard() -> None:
    """End the native helper the front started where this process's command did not take it: killed
    and reaped now, not left to PDEATHSIG and a PID 1 that may never reap it."""
    global _handed
    if _handed is not None:
        fd, pid, _uid, _gid = _handed
        _handed = None
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


def _end(fd: int, pid: int) -> None:
    """Close the helper's pipe; kill and reap the helper where it is this process's child and still
    runs (a pid that is no child of this one is left alone: :data:`ENV` came from the caller)."""
    import signal

    try:
        os.close(fd)
    except OSError:
        pass
    try:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
