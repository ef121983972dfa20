"""``nvc-py-hook serve``: run hook (and CLI) calls in workers forked from one warm interpreter.

A Python hook started per container pays for the interpreter and its imports every time
(most of its cost: docs/performance.md), while the work itself takes a few tens of
milliseconds. The server imports everything the hook needs once; ``nvc-py-hook-client``
(native/client/hook_client.c), registered as the hook, passes each call to it: arguments,
environment, the three standard streams and the working directory (SCM_RIGHTS) over a
SOCK_SEQPACKET connection (the exchange is below); a hook script may hand ``nvc-py configure``
over the same way. The server keeps one worker forked ahead (so no fork is on a call's path); the worker that takes a
call makes the server fork the next, takes the caller's streams and directory as its own, runs
:func:`nvc.hook.prestart.main` (or :func:`nvc.commands.cli.main` for ``nvc-py``) exactly as the console
script would, and answers ``exit N``.
Before the first fork the server imports everything a call needs and plans once without a
container (a dry run), so a worker starts with warm caches. A spare left idle for
:data:`IDLE_BEFORE_HELPERS` readies its call's path: it forks an NVML helper and a container
helper (each confined as for a call, given nothing of one until it comes) and runs the dry plan
itself, which copies the pages a plan writes before the call is waiting for them.

What stays the same as a direct hook run: the configuration file is read per call, nothing
of one call survives into the next (each worker is a fresh fork of a process that never ran a
call), the privileged helpers serve one call each. What differs: the worker runs in the
server's namespaces and cgroup, so the server must run in the host's (a plain systemd service,
``KillMode=process`` so a restart lets running calls finish), and new code takes effect when
the server restarts: a worker that finds the installed code changed (:func:`code_stamp`) answers
"fall back" and stops the server.

Per-call figures, for benchmarks: with ``$NVC_PY_SERVE_STATS`` set to a file when the server
starts, each worker appends one JSON line once its call is done: ``queue_ms``, how long the call
waited between the client's connect (the stamp the client sends, :data:`CONNECTED_ENV`) and a worker's
accept (null for a client that sends none); ``worker_ms``, from that accept to the answer sent;
``cpu_ms``, the worker's user+system CPU since it was forked as a spare, its helpers' included.
So a storm's p99 shows whether calls queue for a worker or run slowly once taken.

It runs the hook's stages and ``nvc-py configure``/``info``/``list`` (:mod:`nvc.hook.scope`);
anything else is answered "fall back" and runs in the caller. It is started by systemd's socket
unit or on demand by a hook client (:mod:`nvc.hook.activation`); an on-demand one exits when idle.
A wedged server costs the clients one hand-over timeout (:mod:`nvc.hook.wedge`): a starting server
removes the marker a client left for its predecessor; under systemd it feeds the watchdog from its
accept loop while its workers take calls (:mod:`nvc.hook.watchdog`), and is replaced when it stops;
without, a hook call that finds it wedged replaces it (native/client/server_start.c).

Only callers with the server's own uid (root) are served; the socket is 0600 in a directory of
the server's own with mode 0700 (the server refuses to start in any other, or through a
symlink, and never changes one it did not create), and the peer's credentials are checked again
on every connection. A root caller weaker than the server (fewer capabilities, under seccomp,
no_new_privs, another LSM label or a Landlock domain, chrooted) or in other mount, pid, user or
cgroup namespaces (a runtime inside a container) is told to fall back and runs the program
itself: :mod:`nvc.hook.peer` says why, and how the peer is pinned against pid reuse.

A call is a short exchange, so that a caller can give up on a wedged server without the call
running twice, and without its streams held by a worker that never ran it: the caller sends its
message with its working directory; the worker checks the caller and the message and answers
``ready PID FD`` with its own pidfd (or a refusal: ``fall back``, or ``refused N`` and one line
the caller writes on its stderr); the caller answers ``go`` with its stdin, stdout and stderr
and /proc/PID/fd/FD opened (:mod:`nvc.hook.peer`: a Landlocked caller cannot open it); only
then, if that last descriptor is its connection, does the worker run the call, and it answers
``exit N`` (else ``fall back``, having run nothing). A malformed message (bad counts,
missing or extra descriptors, a truncated message, a working-directory descriptor that is not a
directory, an unknown program) is refused so, with status 2. A caller that gets no status in
time kills the worker through its pidfd, as a runtime kills a hook past its timeout (so that
the caller's streams, which the runtime may wait on, are closed).
"""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import select
import signal
import socket
import stat
import struct
import sys
import time
from collections.abc import Callable

from nvc.errors import InputError
from nvc.hook import activation, scope, watchdog, wedge
from nvc.hook.handover import (CONNECTED_ENV, FALL_BACK, GO, MAX_MESSAGE, PROGRAMS, READY, REFUSED, CallError,
                               parse_call)
from nvc.hook.peer import SO_PEERPIDFD, Standing, caller_shortfall, own_standing, reaches_worker
from nvc.untrusted import directory_problem

SPARE_RESPAWN_DELAY = 0.1  # seconds before replacing a spare that died without a call
DRAIN_QUIET = 0.1  # seconds without a call, after an idle server unlinked its socket, before it exits
ADOPTED_IDLE_EXIT = 0.5  # seconds without a call after which an on-demand server a runtime adopted stops
IDLE_BEFORE_HELPERS = 0.05  # seconds a spare waits for a call before it starts its helpers and warms up
# Workers forked ahead and waiting in accept(): a storm of calls is taken by as many at once while
# the server forks their replacements, instead of each call waiting for the fork of the one before.
# Each keeps an NVML helper ready once idle: the kernel hands a call to any of them, and a call
# that lands on one without pays for starting it.
SPARES = max(2, min(4, (os.cpu_count() or 1) // 4))
# The server's nice value while it starts and serves, below its workers' (which go back to the one it
# started with): in a start storm its only work, forking the next spare, waits on a CPU behind every
# runtime and worker, and the calls queue behind that fork (or, on demand, behind its start-up).
SERVER_NICE_BOOST = 10
# What a prestart call imports, lazily or in its forked children: imported once, here (not
# pyseccomp: ldconfig's sandbox loads its filter from root's cache, compiled once per boot).
PRELOAD = ("nvc.hook.prestart", "nvc.containerenv.gpus", "nvc.hook.spec", "nvc.hook.log", "nvc.config",
           "nvc.commands.configure", "nvc.apply.applier", "nvc.apply.ldconfig", "nvc.apply.cgroups",
           "nvc.rpc.container_service", "nvc.containerenv.sharing", "nvc.apply.sharefiles", "nvc.discover.kmods",
           "nvc.debuglog", "nvc.hook.cdihooks", "nvc.commands.cli", "nvc.rpc.driver_service", "nvc.commands.infoformat",
           "nvc.commands.listing", "nvc.discover.elf", "elftools.elf.elffile", "elftools.common.exceptions", "prctl",
           "pynvml", "yaml", "json", "resource")
GO_TIMEOUT = 10.0  # seconds a worker waits for the caller's ``go`` after ``ready``
STATS_ENV = "NVC_PY_SERVE_STATS"  # a file each worker appends its call's figures to (JSON lines)
_started_code: tuple[tuple[int, int], ...] = ()  # code_stamp() when the server started


def code_stamp() -> tuple[tuple[int, int], ...]:
    """Inode and modification time of each installed package directory (nvc, nvc.hook, nvc.rpc).

    An upgrade (pip, make install) replaces the files there, which changes the directories; a
    server running the code it imported before would serve stale code. Three stats per call."""
    import nvc
    import nvc.hook
    import nvc.rpc

    stamps = []
    for package in (nvc, nvc.hook, nvc.rpc):
        st = os.stat(os.path.dirname(package.__file__ or "."))
        stamps.append((st.st_ino, st.st_mtime_ns))
    return tuple(stamps)


def _stale() -> bool:
    """Whether nvc-py's installed code changed since the server started; if so the server is told
    to stop (SIGTERM): an on-demand one unlinks its socket and the next hook call starts a server
    of the new code, a socket-activated one is started again by systemd at the next connection."""
    try:
        changed = code_stamp() != _started_code
    except OSError:
        changed = True
    if changed:
        os.kill(os.getppid(), signal.SIGTERM)
    return changed


def peer_credentials(conn: socket.socket) -> tuple[int, int]:
    """The connecting process's (pid, uid), as the kernel saw them at connect time."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    return pid, uid


def _peer_pidfd(conn: socket.socket) -> int | None:
    """A pidfd of the connecting process (Linux 6.5+), None where the kernel has none."""
    try:
        return conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError:
        return None


def socket_directory(directory: str) -> int:
    """A descriptor of ``directory``, created 0700 if absent; InputError unless it is a real
    directory (not a symlink) of this process's uid with no access for group or others: whoever
    else could write there could answer root's hook calls in the server's place."""
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise InputError(f"{directory}: cannot create the socket directory: {err.strerror}") from None
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        what = "a symlink" if err.errno == errno.ELOOP else err.strerror
        raise InputError(f"{directory}: socket directory is {what}; refusing to serve there") from None
    problem = directory_problem(fd, 0o077)
    if problem:
        os.close(fd)
        raise InputError(f"{directory}: socket directory must belong to uid {os.geteuid()} with mode 0700 "
                         f"({problem}); refusing to serve there")
    return fd


def listen(directory_fd: int, name: str, path: str) -> socket.socket:
    """A SOCK_SEQPACKET socket named ``name`` in the directory ``directory_fd`` (checked by
    :func:`socket_directory`, and bound through its descriptor, so the directory checked is the
    one used), reachable by root only; a stale socket is replaced. ``path``: its name for messages."""
    try:
        try:
            os.unlink(name, dir_fd=directory_fd)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)
        try:
            sock.bind(f"/proc/self/fd/{directory_fd}/{name}")
        finally:
            os.umask(old)
    except OSError as err:
        raise InputError(f"{path}: cannot listen there: {err.strerror}") from None
    sock.listen(128)
    return sock


Programs = dict[str, Callable[[list[str]], int]]


class _Refused(Exception):
    """A call not run; ``answer`` is what the caller is told (None: nothing, it is gone)."""

    def __init__(self, answer: bytes | None) -> None:
        super().__init__(answer)
        self.answer = answer


def _malformed(what: str) -> _Refused:
    """The refusal of a malformed call: status 2 and the line the client writes on its stderr."""
    return _Refused(f"{REFUSED.decode()} {InputError.exit_code}\nnvc-py-hook serve: refused a call: "
                    f"{what[:200]}\n".encode())


def _received(conn: socket.socket, size: int, count: int) -> tuple[bytes, list[int]]:
    """One message of at most ``size`` bytes with exactly ``count`` descriptors, or a _Refused
    naming what is wrong (the descriptors that came are closed); _Refused(None) at end of file
    (the caller is gone)."""
    data, fds, flags, _ = socket.recv_fds(conn, size, count + 1)
    if not data and not fds:
        raise _Refused(None)
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != count:
        for fd in fds:
            os.close(fd)
        raise _malformed(f"truncated message or not {count} descriptor{'s' if count > 1 else ''}")
    return data, fds


def _checked_call(conn: socket.socket, ours: Standing) -> tuple[list[str], dict[str, str], int]:
    """(argv, env, working directory's descriptor) of the call on ``conn``, or _Refused: a caller
    that must run the program itself (weaker than the server, or elsewhere: see nvc.hook.peer),
    another user, or a malformed call. The message is read first: a connection closed on unread
    data would reach the caller as a reset, not as the answer."""
    message, (cwd,) = _received(conn, MAX_MESSAGE, 1)
    try:
        pid, uid = peer_credentials(conn)
        if uid != os.geteuid():
            raise _Refused(REFUSED + b" 126\n")
        pidfd = _peer_pidfd(conn)
        try:
            if caller_shortfall(pid, pidfd, ours) is not None:
                raise _Refused(FALL_BACK)
        finally:
            if pidfd is not None:
                os.close(pidfd)
        argv, env = parse_call(message)
        if not stat.S_ISDIR(os.fstat(cwd).st_mode):
            raise CallError("the working directory's descriptor is not a directory")
        if os.path.basename(argv[0]) not in PROGRAMS:
            raise CallError(f"{argv[0]}: not one of {', '.join(PROGRAMS)}")
    except CallError as err:
        os.close(cwd)
        raise _malformed(str(err)) from None
    except _Refused:
        os.close(cwd)
        raise
    return argv, env, cwd


def _streams_on_go(conn: socket.socket) -> list[int]:
    """After ``ready PID FD`` (this worker's pid and its connection's descriptor, which the caller
    opens as the Landlock proof of nvc.hook.peer; with this worker's pidfd, so that a caller that
    gets no status in time can end it; none where the kernel has no pidfd_open): the caller's
    ``go`` with its stdin, stdout, stderr and that proof, or _Refused (``fall back`` where the proof
    is not this worker's connection)."""
    try:
        pidfd = [os.pidfd_open(os.getpid())]
    except OSError:
        pidfd = []
    try:
        socket.send_fds(conn, [b"%s %d %d" % (READY, os.getpid(), conn.fileno())], pidfd)
    finally:
        for fd in pidfd:
            os.close(fd)
    conn.settimeout(GO_TIMEOUT)
    try:
        go, fds = _received(conn, 64, 4)
    except OSError:  # the caller gave up, and runs the program itself: nothing was done
        raise _Refused(None) from None
    *streams, proof = fds
    reached = reaches_worker(proof, conn.fileno())
    os.close(proof)
    if go != GO or not reached:
        for fd in streams:
            os.close(fd)
        raise _malformed("no go") if go != GO else _Refused(FALL_BACK)
    conn.settimeout(None)
    return streams


def queue_wait_ms(env: dict[str, str], accepted_ns: int) -> float | None:
    """How long a call waited for a worker: from the client's connect (its CLOCK_MONOTONIC stamp,
    which is removed from ``env``: the program never sees it) to ``accepted_ns``; None without a
    stamp, or with one that cannot be a wait (another clock: a caller in a time namespace)."""
    stamp = env.pop(CONNECTED_ENV, "")
    if not stamp.isdigit():
        return None
    wait = (accepted_ns - int(stamp)) / 1e6
    return wait if 0 <= wait < 3_600_000 else None


def _run_call(conn: socket.socket, programs: Programs, ours: Standing, accepted_ns: int,
              figures: dict[str, float | None]) -> bytes | None:
    """Worker side: check the caller and its call, take over the caller's streams, directory and
    environment once the caller says ``go``, run the call; the answer (None: none, the caller is
    gone; it runs the program itself). ``figures`` gets the call's queue wait."""
    try:
        argv, env, cwd = _checked_call(conn, ours)
    except _Refused as refused:
        return refused.answer
    figures["queue_ms"] = queue_wait_ms(env, accepted_ns)
    if not scope.served(argv) or _stale():  # not the server's business, or new code: the caller runs it
        os.close(cwd)
        return FALL_BACK
    try:
        streams = _streams_on_go(conn)
    except _Refused as refused:
        os.close(cwd)
        return refused.answer
    for target, fd in enumerate(streams):
        os.dup2(fd, target)
        os.close(fd)
    os.fchdir(cwd)
    os.close(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = argv
    try:
        code = programs[os.path.basename(argv[0])](argv[1:])
    except SystemExit as done:  # sys.exit() as the console script would end (``nvc-py hook``)
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if not isinstance(done.code, (int, type(None))):
            _say(str(done.code))
    except BaseException as err:  # noqa: BLE001 - the caller must get a status, whatever happened
        _say(f"nvc-py-hook: internal error: {type(err).__name__}: {err}")
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:
            code = code or 1
    return f"exit {code & 0xFF}".encode()  # as the process's status would be


def _say(line: str) -> None:
    """One line on the caller's stderr, if it takes one (a closed or read-only stderr does not)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _release_streams() -> None:
    """Point 0-2 at /dev/null, so that the caller's pipes end when it gets its answer, not when this
    worker has waited for its helpers."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in range(3):
        os.dup2(null, fd)
    os.close(null)


def _worker(conn: socket.socket, programs: Programs, ours: Standing, accepted_ns: int, stats: int) -> None:
    """Run the call on ``conn``, answer its status, append its figures to ``stats`` (a descriptor;
    -1: none kept), never return.

    The helpers the call closed are waited for after the answer (their cleanup is nothing the
    caller sees: see nvc.rpc.helper.defer_reaping)."""
    from nvc.rpc import helper

    answer: bytes | None = b"exit 1"
    figures: dict[str, float | None] = {"queue_ms": None}
    try:
        helper.defer_reaping()
        try:
            answer = _run_call(conn, programs, ours, accepted_ns, figures)
        except BaseException as err:  # noqa: BLE001 - the caller must get a status, whatever happened
            _say(f"nvc-py-hook serve: worker failed: {type(err).__name__}: {err}")
        if answer is not None:
            _release_streams()
            conn.send(answer)
            figures["worker_ms"] = (time.monotonic_ns() - accepted_ns) / 1e6
            helper.reap_deferred()
        if stats >= 0:
            _record(stats, answer, figures)
    finally:
        os._exit(0)


def _record(stats: int, answer: bytes | None, figures: dict[str, float | None]) -> None:
    """One JSON line of this worker's call (see the module's docstring), in one write to a file
    opened for appending, so that lines of workers finishing at once never interleave."""
    import json
    import resource

    cpu = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):  # the helpers are reaped by now
        usage = resource.getrusage(who)
        cpu += usage.ru_utime + usage.ru_stime
    line = {"pid": os.getpid(), "answer": answer.decode(errors="replace").split("\n")[0] if answer else None,
            **figures, "cpu_ms": round(cpu * 1000, 3)}
    try:
        os.write(stats, (json.dumps(line) + "\n").encode())
    except OSError:
        pass  # figures are for benchmarks: a full disk costs no call


def _spare(sock: socket.socket, taken: int, programs: Programs, ours: Standing, stats: int, scratch: str,
           nice: int) -> None:
    """A worker forked ahead of its call: waits for the next connection (idle, it readies the call's
    path: ``scratch`` is the dry plan's rootfs), tells the server it was taken (so the server forks
    another spare), then serves it at ``nice``, the nice value the server started with. Never returns."""
    import prctl

    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)  # a worker runs as the server was started
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # its helpers are waited for
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        prctl.set_pdeathsig(signal.SIGKILL)  # an idle spare goes with the server...
        if os.getppid() == 1:
            os._exit(0)
        gc.disable()  # a worker lives for one call: no collections during it
        ready, _, _ = select.select([sock], [], [], IDLE_BEFORE_HELPERS)
        if not ready:  # idle: ready what a call would otherwise start or touch first
            _prestart_helpers()
            _warm_up(scratch, say=False)
        while True:
            try:
                conn, _ = sock.accept()
                accepted_ns = time.monotonic_ns()
                break
            except InterruptedError:
                continue
        prctl.set_pdeathsig(0)  # ...a busy one finishes its call
        os.write(taken, b"t")
        os.close(taken)
        sock.close()
    except BaseException:  # noqa: BLE001 - the server forks another spare
        os._exit(1)
    _worker(conn, programs, ours, accepted_ns, stats)


def _adopted() -> bool:
    """Whether a process other than init is this server's parent. The front detaches an on-demand
    server by a double fork, but the orphan goes to the nearest child subreaper among its starter's
    ancestors, and a runtime that is one may wait for every child it adopted before it returns: crun
    1.8's ``run`` did, a container start blocked until the server's own idle exit (10 minutes), seen
    on the GPU machine. Such a server serves the calls at hand (a start storm) and then makes way."""
    return os.getppid() != 1


def _prestart_helpers() -> None:
    """An NVML helper started for the CLI's defaults (driver root /, the overflow ids), taken
    over by a call that asks for the same (see driver_service.open_driver), and a container
    helper forked and confined for configure (container_service.open_container); each killed
    with the worker when its call does not take it. Best effort: a call that needs one and
    finds none starts its own, and finds out why."""
    from nvc.errors import NvcError
    from nvc.rpc import container_service, driver_service

    for prestart in (driver_service.prestart, container_service.prestart):
        try:
            prestart()
        except (NvcError, OSError):
            pass


def _warm_up(scratch: str, say: bool = True) -> None:
    """One dry plan with the directory ``scratch`` as its rootfs (the socket's directory: only read,
    nothing made that a kill could leave behind; no container, nothing changed), so what a first call
    builds lazily (compiled patterns, tables, the ld cache's pages) is in the server's memory
    before any worker is forked; run again by an idle spare, it copies ahead the pages a call's
    plan writes (a worker shares the server's until it writes them). Best effort: a host
    without a driver just skips it (``say``: and says so)."""
    from nvc import config as config_file
    from nvc.commands.configure import plan
    from nvc.errors import NvcError
    from nvc.hook.prestart import global_options
    from nvc.plan.request import Request

    try:
        cfg = config_file.load()
        plan(global_options(cfg), Request(rootfs=scratch, capabilities=frozenset(cfg.supported_capabilities)))
    except (NvcError, OSError) as err:
        if say:
            print(f"nvc-py-hook serve: warm-up skipped: {err}", file=sys.stderr, flush=True)


def serve(path: str) -> int:
    """Accept hook calls on ``path`` until SIGTERM, each in a worker forked ahead of it."""
    directory, name = os.path.split(path)
    directory_fd = socket_directory(directory or ".")  # before the warm-up: a refusal is quick
    stats = _open_stats(os.environ.pop(STATS_ENV, ""))
    # From here, its start-up included: an on-demand server starts in the storm of calls waiting for it.
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    with contextlib.suppress(OSError):  # best effort: a server without CAP_SYS_NICE runs as it is
        os.setpriority(os.PRIO_PROCESS, 0, max(-20, nice - SERVER_NICE_BOOST))
    try:
        return _serve_in(directory_fd, path, name, stats, nice)
    finally:
        os.close(directory_fd)
        if stats >= 0:
            os.close(stats)


def _open_stats(path: str) -> int:
    """A descriptor appending to ``path`` (created 0600), -1 for none; InputError naming the file."""
    if not path:
        return -1
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as err:
        raise InputError(f"{path}: cannot open ${STATS_ENV}: {err.strerror}") from None


def _serve_in(directory_fd: int, path: str, name: str, stats: int, nice: int) -> int:
    """serve() once its socket directory is checked; ``nice``: the value its workers run at."""
    import importlib

    for module in PRELOAD:
        importlib.import_module(module)
    from nvc.commands.cli import main as cli_main
    from nvc.hook.prestart import main as hook_main

    scratch = os.path.abspath(os.path.dirname(path) or ".")  # checked by socket_directory
    _warm_up(scratch)
    programs: Programs = {"nvc-py-hook": lambda args: hook_main(args, via="server"), "nvc-py": cli_main}

    import prctl

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps finished workers...
    prctl.set_child_subreaper(True)  # ...and the helpers they leave behind (a spare's unused NVML helper)
    # SIGTERM is seen by the accept loop's select through the wakeup pipe, never raised as
    # SystemExit: raised where Python runs a finalizer or a fork callback it would be swallowed,
    # and the server would go on serving (seen once in 400+ stops as a 30 s stop timeout).
    stop_r, stop_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(stop_w)
    signal.signal(signal.SIGTERM, lambda *_: None)
    ours = own_standing()
    global _started_code
    _started_code = code_stamp()
    inherited = activation.inherited_socket()
    sock = inherited if inherited is not None else listen(directory_fd, name, path)
    owned = inherited is None  # a name this server bound: unlinked when it stops
    idle = activation.idle_exit() if owned else None  # systemd's socket is not this server's to unlink
    dog = watchdog.from_environment()
    with contextlib.suppress(OSError):  # calls that found its predecessor wedged try this one at once
        os.unlink(wedge.MARKER, dir_fd=directory_fd)
    draining = False
    quiet_since = time.monotonic()  # of the last event (a call taken, a spare's end, a signal)
    try:
        gc.collect()
        gc.freeze()  # keep the imported objects' pages shared with the workers
        print(f"nvc-py-hook serve: listening on {path}{' (from systemd)' if inherited else ''}", file=sys.stderr,
              flush=True)
        activation.release_start_lock()
        spares: set[int] = set()  # each waiting spare's taken pipe
        try:
            while True:
                while len(spares) < SPARES:
                    taken_r, taken_w = os.pipe()
                    if os.fork() == 0:
                        signal.set_wakeup_fd(-1)
                        for fd in (*spares, taken_r, stop_r, stop_w):
                            os.close(fd)
                        _spare(sock, taken_w, programs, ours, stats, scratch, nice)
                    os.close(taken_w)
                    spares.add(taken_r)
                # Until a spare takes a call (a byte) or dies before it (end of file), or SIGTERM; with
                # systemd's watchdog, until its next keep-alive at the latest.
                wait = DRAIN_QUIET if draining else ADOPTED_IDLE_EXIT if idle and _adopted() else idle
                limit = wait
                if dog is not None:
                    dog.tick(queued=bool(select.select([sock], [], [], 0)[0]))
                    limit = dog.due_in() if wait is None else min(dog.due_in(), quiet_since + wait - time.monotonic())
                ready = select.select([*spares, stop_r], [], [], None if limit is None else max(0.0, limit))[0]
                if stop_r in ready and signal.SIGTERM in os.read(stop_r, 64):
                    return 0
                died = False
                for fd in spares.intersection(ready):
                    taken = os.read(fd, 1)
                    died |= not taken
                    if dog is not None and taken:
                        dog.taken = True
                    os.close(fd)
                    spares.discard(fd)
                if died:
                    time.sleep(SPARE_RESPAWN_DELAY)  # no tight loop of spares that cannot start
                if ready:  # a call, a dead spare or another signal's byte
                    quiet_since = time.monotonic()
                    continue
                if wait is None or (dog is not None and time.monotonic() - quiet_since < wait):
                    continue  # the watchdog's turn, not idle yet
                if not draining:  # idle: new callers find no socket (and start a server), queued ones are served
                    adopter = f" (pid {os.getppid()} adopted this server and may wait for it)" if wait != idle else ""
                    print(f"nvc-py-hook serve: no call for {wait:g} s: stopping{adopter}", file=sys.stderr, flush=True)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=directory_fd)
                    owned, draining = False, True
                elif not select.select([sock], [], [], 0)[0]:
                    return 0  # nothing queued, nothing can come: the spares go with this process
        finally:
            for fd in spares:
                os.close(fd)
    finally:
        sock.close()
        if owned:
            try:
                os.unlink(name, dir_fd=directory_fd)
            except OSError:
                pass
