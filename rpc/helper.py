"""A forked helper process that serves requests over a socketpair.

Why a fork and not a thread: the helper confines itself (chroot, another uid, no
capabilities) and loads foreign code (the driver's libnvidia-ml) that may hang or crash;
only a separate process can do that without taking the parent down, and only a process
can be killed when it stops answering.

The child runs in the state ``os.fork`` leaves it: a copy of the parent with only the
forking thread. Locks other threads held stay held, so the child keeps to simple code
paths: no logging, no thread pools, nothing from the parent's event loops; it leaves only
through ``os._exit`` so the parent's atexit handlers, finalizers and buffered output never
run twice. Fork before starting threads where possible (Python 3.12 warns otherwise).

Parent side: :class:`HelperClient`. Child side: a setup callable (run after the fork, in
the child) returns the dispatch table: method name → callable taking the request's params
as keyword arguments and returning a JSON-able result. A ``shutdown`` entry, if present,
is the service's own cleanup, called when the parent closes the client. Descriptors sent with a
call (:meth:`HelperClient.call`'s ``fds``, SCM_RIGHTS) reach its callable as ``fds``, open for the
call only: it duplicates what it keeps.

A helper that changes things the parent must be able to undo even after the helper died (killed
mid-call: the container helper's mounts) keeps a journal (``journal=True``): a memfd both share,
to which the child appends a JSON line per change as it makes it (:func:`note`), and which the
parent reads back (:meth:`HelperClient.journal`). It never blocks the child and outlives it.
"""

from __future__ import annotations

import _socket  # not socket (see nvc.rpc.protocol)
import gc
import os
import select
import signal
import time
from collections.abc import Callable, Mapping
from types import TracebackType

from nvc import errors
from nvc.rpc import DEFAULT_TIMEOUT, describe_status, protocol

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

    Dispatch = Mapping[str, Callable[..., Any]]
    Setup = Callable[..., Dispatch]  # called with no arguments, or a preforked helper's parameters
    # what a helper started ahead does while it waits for its first call; its argument says whether that came
    Idle = Callable[[Callable[[], bool]], object]

IDLE_AFTER = 0.02  # seconds a helper started ahead waits for its first call before it runs its Idle

DEFAULT_GRACE = 0.05  # seconds a helper gets to exit after "shutdown" before SIGKILL
_READY_ID = 0  # id of the message the child sends once its setup finished (or failed)
_SERVICE_FD = 3  # the child's socket is moved here; everything above is closed
_JOURNAL_FD = 4  # a journaling child's journal (see the module's docstring), kept above it
_journal_fd = -1  # in a journaling helper child: _JOURNAL_FD
_parent_pid = 0  # in a helper child: the pid of the process that forked it (see die_with_parent)
# Helpers told to exit whose reaping waits for reap_deferred() (None: close() reaps at once).
_deferred: list[HelperClient] | None = None


def _remote_error(exc: BaseException, method: str, failure: type[errors.NvcError]) -> protocol.RemoteError:
    """Describe an exception raised by the service for the trip back to the parent; one that is no
    :class:`~nvc.errors.NvcError` (a bug, an unexpected OSError) comes back as the service's own
    ``failure`` kind: a mount helper's bug is a mount error, not a driver error."""
    if isinstance(exc, errors.NvcError):
        message = str(exc.args[0]) if exc.args else ""
        code = getattr(exc, "code", None)
        return protocol.RemoteError(exc.kind, message, code if isinstance(code, int) else None)
    return protocol.RemoteError(failure.kind, f"{method} failed: {type(exc).__name__}: {exc}")


def raise_remote(err: protocol.RemoteError) -> NoReturn:
    """Re-raise a transported error as its nvc.errors class, keeping the service's code."""
    raise errors.from_kind(err.kind, err.message, err.code)


def _isolate(name: str, sock: _socket.socket, parent_pid: int, journal: int) -> _socket.socket:
    """First steps of the child: name it, tie its life to the parent's, shed inherited fds but its
    socket and ``journal`` (-1: none), which move to _SERVICE_FD and _JOURNAL_FD."""
    # Objects copied from the parent (its files, sockets) must never be finalised here: their
    # fds are closed below and the numbers reused, so a late close() would hit our own fds.
    gc.freeze()
    import prctl  # the child's alone: its parent never needs it (~1.5 ms of a direct hook's start)

    prctl.set_name(f"nvc:[{name}]")
    global _parent_pid
    _parent_pid = parent_pid
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # The socket moves first so that redirecting 0-2 cannot clobber it (nor it the journal).
    if journal == _SERVICE_FD:
        journal = os.dup(journal)
    if sock.fileno() != _SERVICE_FD:
        os.dup2(sock.fileno(), _SERVICE_FD, inheritable=False)
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    global _journal_fd
    if journal >= 0:
        if journal != _JOURNAL_FD:
            os.dup2(journal, _JOURNAL_FD, inheritable=False)
        _journal_fd = _JOURNAL_FD
    os.closerange(_JOURNAL_FD + 1 if journal >= 0 else _SERVICE_FD + 1, os.sysconf("SC_OPEN_MAX"))
    # The old socket object's fd is closed or reused now; detach it so nothing closes it again.
    sock.detach()
    return _socket.socket(fileno=_SERVICE_FD)


def die_with_parent() -> None:
    """In a helper child: SIGKILL when the parent dies; exit now if it already has.

    SIGKILL rather than the reference's SIGTERM: the child inherited the parent's Python
    signal handlers, which must not run here; there is nothing to clean up on parent death.
    The kernel clears the setting at a uid or gid change, so a helper that switches identity
    (:func:`nvc.system.confinement.switch_identity`) calls this again afterwards, after a change of
    root too: :func:`_isolate` imported prctl first.
    """
    import prctl

    prctl.set_pdeathsig(signal.SIGKILL)
    if os.getppid() != _parent_pid:  # the parent died before PDEATHSIG was armed
        os._exit(1)


def _serve(sock: _socket.socket, dispatch: Dispatch, failure: type[errors.NvcError], idle: Idle | None = None) -> int:
    """Answer requests until the parent says "shutdown" or goes away; return the exit status. ``idle``
    runs once no request has come for :data:`IDLE_AFTER` seconds, until one does."""
    handlers: Dispatch = {"shutdown": lambda: None, **dispatch}
    if idle is not None and not select.select([sock], [], [], IDLE_AFTER)[0]:
        idle(lambda: bool(select.select([sock], [], [], 0)[0]))
    while True:
        fds: list[int] = []
        try:
            request = protocol.decode_request(protocol.recv_payload(sock, fds=fds), tuple(fds))
        except protocol.EndOfStream:
            return 0
        try:
            if request.method not in handlers:
                raise failure(f"unknown rpc method: {request.method}")
            params = {**request.params, "fds": request.fds} if request.fds else request.params
            result = handlers[request.method](**params)
            frame = protocol.encode(protocol.Response(request.id, result=result))
        except Exception as exc:  # every failure (an unencodable result too) goes back, typed
            frame = protocol.encode(protocol.Response(request.id, error=_remote_error(exc, request.method, failure)))
        finally:
            for fd in fds:
                os.close(fd)
        protocol.send_frame(sock, frame)
        if request.method == "shutdown":
            return 0


def _setup_params(sock: _socket.socket) -> dict[str, Any] | None:
    """A preforked child's first message: the ``setup`` request's parameters; None when the
    parent shuts the helper down (or goes away) without starting it."""
    try:
        request = protocol.decode_request(protocol.recv_payload(sock))
    except protocol.EndOfStream:
        return None
    if request.method == "shutdown":
        return None
    if request.method != "setup":
        raise errors.NvcError(f"expected the setup request, got {request.method}")
    return request.params


def note(entry: Any) -> None:
    """In a journaling helper child: append ``entry`` (JSON-able) to the journal, once the change it
    names is made (see the module's docstring); nothing in another helper."""
    if _journal_fd >= 0:
        import json

        os.write(_journal_fd, json.dumps(entry, separators=(",", ":")).encode() + b"\n")


def _child_main(
    name: str,
    sock: _socket.socket,
    parent_pid: int,
    setup: Setup,
    warm: Callable[[], None] | None,
    deferred: bool,
    failure: type[errors.NvcError],
    journal: int,
    idle: Idle | None = None,
) -> int:
    sock = _isolate(name, sock, parent_pid, journal)
    try:
        if warm is not None:
            warm()
        params = _setup_params(sock) if deferred else {}
        if params is None:  # preforked, never started: nothing to do
            return 0
        dispatch = setup(**params)
    except Exception as exc:
        protocol.send_message(sock, protocol.Response(_READY_ID, error=_remote_error(exc, "setup", failure)))
        return 1
    protocol.send_message(sock, protocol.Response(_READY_ID, result=os.getpid()))
    return _serve(sock, dispatch, failure, idle)


class HelperClient:
    """The parent's handle on one running helper: calls with a deadline, clean shutdown.

    Any failure of the helper itself (death, timeout, broken protocol) kills and reaps it and
    raises the service's ``failure`` kind (:class:`~nvc.errors.DriverError` for the NVML helper,
    :class:`~nvc.errors.MountError` for the container helper); the client is unusable afterwards.
    """

    def __init__(
        self,
        name: str,
        pid: int,
        sock: _socket.socket,
        timeout: float,
        grace: float,
        failure: type[errors.NvcError],
        journal: int = -1,
    ) -> None:
        self.name = name
        self._journal = journal  # the memfd of a journaling helper, -1 for none
        self.failure = failure
        self.pid = pid
        self.timeout = timeout
        self.grace = grace
        self.status: int | None = None  # waitpid status, once reaped
        self._sock: _socket.socket | None = sock
        # A pidfd, unlike the pid, cannot be recycled: signals and waits hit our child only.
        self._pidfd = os.pidfd_open(pid)
        self._next_id = _READY_ID + 1
        self._ready = False  # the child's setup report was received

    @classmethod
    def spawn(
        cls,
        name: str,
        setup: Setup,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        grace: float = DEFAULT_GRACE,
        wait: bool = True,
        failure: type[errors.NvcError],
        journal: bool = False,
        idle: Idle | None = None,
    ) -> HelperClient:
        """Fork a helper named ``nvc:[name]`` that runs ``setup`` and then serves its table.

        Returns once the child reported its setup done, and a setup error is re-raised here;
        with ``wait=False`` it returns at once and the first :meth:`call` waits (and re-raises)
        instead, so the caller's own work overlaps the child's setup (NVML's load, for one).
        ``journal``: the helper keeps a journal (see the module's docstring). ``idle``: what the
        child does while it waits for its first call (:func:`_serve`).
        """
        client = cls._fork(name, setup, None, False, timeout, grace, failure, journal, idle)
        if wait:
            client.wait_ready()
        return client

    @classmethod
    def prefork(
        cls,
        name: str,
        setup: Setup,
        *,
        warm: Callable[[], None] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        grace: float = DEFAULT_GRACE,
        failure: type[errors.NvcError],
    ) -> HelperClient:
        """Fork a helper before its parameters are known; :meth:`start` sends them.

        The child runs ``warm`` (imports, say) at once, then ``setup(**params)`` when they
        come. A process can so begin a helper's slow part before it has parsed its command
        line. A helper never started exits when the client is closed or the parent dies.
        """
        return cls._fork(name, setup, warm, True, timeout, grace, failure, False, None)

    def start(self, **params: Any) -> None:
        """Send a preforked helper its setup parameters; the first :meth:`call` waits for its report."""
        if self._sock is None:
            raise self.failure(f"{self.name} rpc error: helper is not running")
        try:
            protocol.send_message(
                self._sock, protocol.Request(_READY_ID, "setup", params), time.monotonic() + self.timeout
            )
        except (TimeoutError, OSError):
            raise self._fail("cannot send the setup parameters") from None

    @classmethod
    def _fork(
        cls,
        name: str,
        setup: Setup,
        warm: Callable[[], None] | None,
        deferred: bool,
        timeout: float,
        grace: float,
        failure: type[errors.NvcError],
        journal: bool,
        idle: Idle | None,
    ) -> HelperClient:
        parent_sock, child_sock = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
        memfd = os.memfd_create(f"nvc-{name}-journal", os.MFD_CLOEXEC) if journal else -1
        parent_pid = os.getpid()
        try:
            pid = os.fork()
        except OSError as err:
            parent_sock.close()
            child_sock.close()
            if memfd >= 0:
                os.close(memfd)
            raise failure(f"{name} rpc error: fork failed: {err.strerror}") from None
        if pid == 0:  # child: never return into the caller's code
            status = 1
            try:
                parent_sock.close()
                status = _child_main(name, child_sock, parent_pid, setup, warm, deferred, failure, memfd, idle)
            finally:
                os._exit(status)
        child_sock.close()
        return cls(name, pid, parent_sock, timeout, grace, failure, memfd)

    def wait_ready(self) -> None:
        """Receive the child's setup report once; a setup failure ends the helper and is re-raised."""
        if self._ready:
            return
        try:
            ready = self._receive(_READY_ID, "setup")
            if ready.error is not None:
                raise_remote(ready.error)
        except BaseException:
            self.close()
            raise
        self._ready = True

    def report_fd(self) -> int | None:
        """The socket the child's set-up report comes on (readable once it came) while it is still to be
        received (:meth:`wait_ready`); None once received, or where the helper is gone."""
        return None if self._ready or self._sock is None else self._sock.fileno()

    def call(self, method: str, /, fds: tuple[int, ...] = (), **params: Any) -> Any:
        """Run ``method`` in the helper and return its result, within the client's timeout; ``fds``
        are sent with it (the helper's callable gets its own copies as ``fds``)."""
        return self.begin(method, fds, **params)()

    def begin(self, method: str, /, fds: tuple[int, ...] = (), **params: Any) -> Callable[[], Any]:
        """Send ``method`` (as :meth:`call`) and return at once a function that waits for its result:
        the caller works while the helper does. Nothing else may be called before that function."""
        if self._sock is None:
            raise self.failure(f"{self.name} rpc error: helper is not running")
        self.wait_ready()
        request = protocol.Request(self._next_id, method, params, tuple(fds))
        self._next_id += 1
        try:
            protocol.send_message(self._sock, request, time.monotonic() + self.timeout)
        except TimeoutError:
            raise self._fail(f"timed out after {self.timeout:.1f} s sending {method}") from None
        except OSError:  # EPIPE / ECONNRESET: the helper is gone
            raise self._fail(f"helper {self._reap(kill=False)} before {method}") from None

        def result() -> Any:
            response = self._receive(request.id, method)
            if response.error is not None:
                raise_remote(response.error)
            return response.result

        return result

    def _receive(self, request_id: int, method: str) -> protocol.Response:
        assert self._sock is not None
        try:
            response = protocol.decode_response(protocol.recv_payload(self._sock, time.monotonic() + self.timeout))
        except TimeoutError:
            raise self._fail(f"timed out after {self.timeout:.1f} s in {method}") from None
        except (protocol.EndOfStream, protocol.TruncatedFrame, ConnectionError):
            raise self._fail(f"helper {self._reap(kill=False)} in {method}") from None
        except protocol.ProtocolError as err:
            raise self._fail(f"{err} in {method}") from None
        if response.id != request_id:
            raise self._fail(f"response id {response.id} does not answer request {request_id} ({method})")
        return response

    @property
    def alive(self) -> bool:
        """Whether the helper still serves (False once it died, timed out or was closed)."""
        return self._sock is not None

    def journal(self) -> list[Any]:
        """The entries a journaling helper noted so far (:func:`note`); [] for one that keeps none.
        Read from the start each time: the helper may be gone, its journal is not."""
        import json

        if self._journal < 0:
            return []
        data, offset = [], 0
        while chunk := os.pread(self._journal, 1 << 16, offset):
            data.append(chunk)
            offset += len(chunk)
        entries = []
        for line in b"".join(data).splitlines():
            try:
                entries.append(json.loads(line))
            except ValueError:  # the last line of a helper killed as it wrote it
                break
        return entries

    def _fail(self, what: str) -> errors.NvcError:
        """Make sure the helper is gone and build the error that says what went wrong."""
        self._reap(kill=True)
        return self.failure(f"{self.name} rpc error: {what}")

    def _reap(self, kill: bool) -> str:
        """Make sure the helper is gone and waited for (no zombie, no leaked fds); describe its end.

        ``kill=False`` first gives it the grace period to exit by itself.
        """
        if self.status is None:
            exited, _, _ = select.select([self._pidfd], [], [], 0 if kill else self.grace)
            if not exited:
                try:
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
                except ProcessLookupError:  # exited in the meantime
                    pass
            _, self.status = os.waitpid(self.pid, 0)
            os.close(self._pidfd)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        return describe_status(self.status)

    def close(self) -> None:
        """Ask the helper to run its cleanup and exit; SIGKILL it after the grace period (after
        :func:`reap_deferred`, once :func:`defer_reaping` was called)."""
        if self._sock is not None:
            try:
                deadline = time.monotonic() + self.grace
                protocol.send_message(self._sock, protocol.Request(self._next_id, "shutdown"), deadline)
            except OSError:  # already gone, or not draining its socket: SIGKILL settles it
                pass
        if self._journal >= 0:
            os.close(self._journal)
            self._journal = -1
        if _deferred is not None and self.status is None:
            _deferred.append(self)
        else:
            self._reap(kill=False)

    def __enter__(self) -> HelperClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def defer_reaping() -> None:
    """From now on, :meth:`HelperClient.close` only tells a helper to exit; :func:`reap_deferred`
    waits for it (and kills it after its grace period).

    For a hook server's worker: it answers its caller first, then waits for the helpers. Their
    cleanup changes nothing the caller sees (NVML's shutdown, an applier that already committed)
    but takes a good part of an ``nvc-py info``'s time.
    """
    global _deferred
    _deferred = []


def reap_deferred() -> None:
    """Wait for every helper closed since :func:`defer_reaping` (no zombie, no leaked fd); later
    closes reap at once again."""
    global _deferred
    pending, _deferred = _deferred or [], None
    for client in pending:
        client._reap(kill=False)
