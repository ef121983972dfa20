"""``nvc-py-hook serve``: run hook (and CLI) calls in workers forked from one warm interpreter.

A Python hook started per container pays for the interpreter and its imports every time
(about four fifths of its cost on the H100 host), while the work itself takes a few tens of
milliseconds. The server imports everything the hook needs once; ``nvc-py-hook-client``
(native/hook_client.c), registered as the hook, passes each call to it: arguments,
environment, the three standard streams and the working directory (SCM_RIGHTS) in one
SOCK_SEQPACKET message; a hook script may hand ``nvc-py configure`` over the same way. The
server keeps one worker forked ahead (so no fork is on a call's path); the worker that takes a
call makes the server fork the next, takes the caller's streams and directory as its own, runs
:func:`nvc.hook.prestart.main` (or :func:`nvc.cli.main` for ``nvc-py``) exactly as the console
script would, and answers ``exit N``.
Before the first fork the server imports everything a call needs and plans once without a
container (a dry run), so a worker starts with warm caches.

What stays the same as a direct hook run: the configuration file is read per call, nothing
of one call survives into the next (each worker is a fresh fork of a process that never ran a
call), the privileged helpers are forked per call. What differs: the worker runs in the
server's namespaces and cgroup, so the server must run in the host's (a plain systemd service,
``KillMode=process`` so a restart lets running calls finish), and new code takes effect when
the server restarts.

It runs the hook's stages and ``nvc-py configure``/``info``/``list`` (:mod:`nvc.hook.scope`);
anything else is answered "fall back" and runs in the caller. It is started by systemd's socket
unit or on demand by a hook client (:mod:`nvc.hook.activation`); an on-demand one exits when idle.

Only callers with the server's own uid (root) are served; the socket is 0600 in a 0700
directory, and the peer's credentials are checked again on every connection. A caller in other
mount, pid or user namespaces than the server's (a runtime inside a container, say) is told to
fall back: its paths and process ids would mean something else to a worker.
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable

from nvc.errors import InputError
from nvc.hook import activation, scope
from nvc.hook.handover import FALL_BACK, MAX_MESSAGE, PROGRAMS, CallError, parse_call

SPARE_RESPAWN_DELAY = 0.1  # seconds before replacing a spare that died without a call
IDLE_BEFORE_NVML = 0.05  # seconds a spare waits for a call before it starts an NVML helper
DRAIN_QUIET = 0.1  # seconds without a call, after an idle server unlinked its socket, before it exits
# What a prestart call imports, lazily or in its forked children: imported once, here.
PRELOAD = ("nvc.hook.prestart", "nvc.hook.request", "nvc.hook.spec", "nvc.hook.log", "nvc.config",
           "nvc.configure", "nvc.apply", "nvc.ldconfig", "nvc.cgroups", "nvc.rpc.container_service",
           "nvc.share", "nvc.kmods", "nvc.debuglog", "nvc.hook.cdihooks", "nvc.cli", "nvc.rpc.driver_service",
           "nvc.infoformat", "nvc.listing", "nvc.elf", "elftools.elf.elffile", "elftools.common.exceptions", "prctl",
           "pyseccomp", "pynvml", "yaml", "json")
STREAMS = 4  # stdin, stdout, stderr, working directory
NAMESPACES = ("mnt", "pid", "user")
FALLING_BACK = -1  # _run_call's answer when the caller must run the program itself
_in_worker = False  # set in a worker once it runs a call


def peer_credentials(conn: socket.socket) -> tuple[int, int]:
    """The connecting process's (pid, uid), as the kernel saw them at connect time."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    return pid, uid


def same_namespaces(pid: int) -> bool:
    """Whether process ``pid`` shares this process's mount, pid and user namespaces: paths,
    process ids (a hook's ``--pid``) and privileges then mean the same to a worker as to the caller."""
    try:
        for ns in NAMESPACES:
            theirs, ours = os.stat(f"/proc/{pid}/ns/{ns}"), os.stat(f"/proc/self/ns/{ns}")
            if (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino):
                return False
    except OSError:
        return False
    return True


def listen(path: str) -> socket.socket:
    """A SOCK_SEQPACKET socket at ``path``, reachable by root only (a stale socket is replaced)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(128)
    return sock


Programs = dict[str, Callable[[list[str]], int]]


def _run_call(conn: socket.socket, programs: Programs) -> int:
    """Worker side: take over the caller's streams, directory and environment, run the call, return
    its status."""
    message, fds, flags, _ = socket.recv_fds(conn, MAX_MESSAGE, STREAMS)
    pid, uid = peer_credentials(conn)
    if uid != os.geteuid() or not same_namespaces(pid):
        for fd in fds:
            os.close(fd)
        # Another user gets no help; a caller in other namespaces runs the program itself.
        return 126 if uid != os.geteuid() else FALLING_BACK
    try:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != STREAMS:
            raise CallError("truncated message or missing streams")
        argv, env = parse_call(message)
        program = os.path.basename(argv[0])
        if program not in PROGRAMS:
            raise CallError(f"{argv[0]}: not one of {', '.join(PROGRAMS)}")
    except CallError as err:
        line = f"nvc-py-hook serve: refused a call: {err}\n".encode()
        try:
            os.write(fds[2] if len(fds) > 2 else 2, line)  # the caller's stderr where it came along
        except OSError:
            pass  # a closed stderr: the status still says it
        for fd in fds:
            os.close(fd)
        return InputError.exit_code
    if not scope.served(argv):  # not the server's business: the caller runs it as itself
        for fd in fds:
            os.close(fd)
        return FALLING_BACK
    global _in_worker
    _in_worker = True  # serve() refuses to run here (``nvc-py hook serve`` would take the socket over)
    *streams, cwd = fds
    for target, fd in enumerate(streams):
        os.dup2(fd, target)
        os.close(fd)
    os.fchdir(cwd)
    os.close(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = argv
    try:
        code = programs[program](argv[1:])
    except SystemExit as done:  # sys.exit() as the console script would end (``nvc-py hook``)
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if not isinstance(done.code, (int, type(None))):
            print(done.code, file=sys.stderr)
    except BaseException as err:  # noqa: BLE001 - the caller must get a status, whatever happened
        print(f"nvc-py-hook: internal error: {type(err).__name__}: {err}", file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:
            code = code or 1
    return code


def _release_streams() -> None:
    """Point 0-2 at /dev/null, so that the caller's pipes end when it gets its answer, not when this
    worker has waited for its helpers."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in range(3):
        os.dup2(null, fd)
    os.close(null)


def _worker(conn: socket.socket, programs: Programs) -> None:
    """Run the call on ``conn``, answer its status, never return.

    The helpers the call closed are waited for after the answer (their cleanup is nothing the
    caller sees: see nvc.rpc.helper.defer_reaping)."""
    from nvc.rpc import helper

    code = 1
    try:
        helper.defer_reaping()
        code = _run_call(conn, programs)
        _release_streams()
        conn.send(FALL_BACK if code == FALLING_BACK else f"exit {code}".encode())
        code = max(code, 0)
        helper.reap_deferred()
    finally:
        os._exit(code)


def _spare(sock: socket.socket, taken: int, programs: Programs) -> None:
    """A worker forked ahead of its call: waits for the next connection, tells the server it was
    taken (so the server forks the next spare), then serves it. Never returns."""
    import prctl

    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # its helpers are waited for
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # blocked by the server around fork
        prctl.set_pdeathsig(signal.SIGKILL)  # an idle spare goes with the server...
        if os.getppid() == 1:
            os._exit(0)
        gc.disable()  # a worker lives for one call: no collections during it
        ready, _, _ = select.select([sock], [], [], IDLE_BEFORE_NVML)
        if not ready:  # idle: have NVML loaded for a call that needs it (nvc-py info, MIG)
            _prestart_driver()
        while True:
            try:
                conn, _ = sock.accept()
                break
            except InterruptedError:
                continue
        prctl.set_pdeathsig(0)  # ...a busy one finishes its call
        os.write(taken, b"t")
        os.close(taken)
        sock.close()
    except BaseException:  # noqa: BLE001 - the server forks another spare
        os._exit(1)
    _worker(conn, programs)


def _prestart_driver() -> None:
    """An NVML helper started for the CLI's defaults (driver root /, the overflow ids), taken
    over by a call that asks for the same (see driver_service.open_driver); killed with the
    worker otherwise. Best effort: without NVML a call finds out itself."""
    from nvc.errors import NvcError
    from nvc.rpc import driver_service

    try:
        driver_service.prestart()
    except (NvcError, OSError):
        pass


def _warm_up() -> None:
    """One dry plan on a scratch rootfs (no container, nothing changed), so what a first call
    builds lazily (compiled patterns, tables, the ld cache's pages) is in the server's memory
    before any worker is forked. Best effort: a host without a driver just skips it."""
    import tempfile

    from nvc import config as config_file
    from nvc.configure import ConfigureRequest, plan
    from nvc.errors import NvcError
    from nvc.hook.prestart import global_options

    try:
        cfg = config_file.load()
        with tempfile.TemporaryDirectory(prefix="nvc-py-warm-up-") as rootfs:
            plan(global_options(cfg), ConfigureRequest(rootfs=rootfs, pid=None, devices="none",
                                  capabilities=frozenset(cfg.supported_capabilities)))
    except (NvcError, OSError) as err:
        print(f"nvc-py-hook serve: warm-up skipped: {err}", file=sys.stderr, flush=True)


def serve(path: str) -> int:
    """Accept hook calls on ``path`` until SIGTERM, each in a worker forked ahead of it."""
    import importlib

    if _in_worker:
        raise InputError("serve: refused inside a worker of a running server")

    for name in PRELOAD:
        importlib.import_module(name)
    from nvc.cli import main as cli_main
    from nvc.hook.prestart import main as hook_main

    _warm_up()
    programs: Programs = {"nvc-py-hook": lambda args: hook_main(args, via="server"), "nvc-py": cli_main}

    import prctl

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps finished workers...
    prctl.set_child_subreaper(True)  # ...and the helpers they leave behind (a spare's unused NVML helper)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    inherited = activation.inherited_socket()
    sock = inherited if inherited is not None else listen(path)
    owned = inherited is None  # a path this server bound: unlinked when it stops
    idle = activation.idle_exit() if owned else None  # systemd's socket is not this server's to unlink
    draining = False
    try:
        gc.collect()
        gc.freeze()  # keep the imported objects' pages shared with the workers
        print(f"nvc-py-hook serve: listening on {path}{' (from systemd)' if inherited else ''}", file=sys.stderr,
              flush=True)
        activation.release_start_lock()
        while True:
            taken_r, taken_w = os.pipe()
            # SIGTERM's SystemExit must not be raised inside fork's callbacks (they swallow it).
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            if os.fork() == 0:
                os.close(taken_r)
                _spare(sock, taken_w, programs)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            os.close(taken_w)
            try:
                # Until the spare takes a call (a byte) or dies before it (end of file).
                while not select.select([taken_r], [], [], DRAIN_QUIET if draining else idle)[0]:
                    if not draining:  # idle: new callers find no socket (and start a server), queued ones are served
                        print(f"nvc-py-hook serve: no call for {idle:g} s: stopping", file=sys.stderr, flush=True)
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(path)
                        owned, draining = False, True
                    elif not select.select([sock], [], [], 0)[0]:
                        return 0  # nothing queued, nothing can come: the spare goes with this process
                if not os.read(taken_r, 1):
                    time.sleep(SPARE_RESPAWN_DELAY)  # no tight loop of spares that cannot start
            finally:
                os.close(taken_r)
    finally:
        sock.close()
        if owned:
            try:
                os.unlink(path)
            except OSError:
                pass
