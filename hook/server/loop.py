"""The hook server's process: its start-up (imports, a dry plan, its socket), the spares it keeps
forked and waiting in accept(), its idle exit and its stop (the package's docstring says why)."""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import subprocess
import sys
import time

from nvc.hook.server import activation, upgrade, watchdog, wedge
from nvc.hook.server.exchange import Programs
from nvc.hook.server.peer import own_standing
from nvc.hook.server.sockets import listen, socket_directory
from nvc.hook.server.worker import STATS_ENV, open_stats, spare, warm_up
from nvc.system import immortal

SPARE_RESPAWN_DELAY = 0.1  # seconds before replacing a spare that died without a call
# Seconds without a call after which the server marks what it holds immortal (nvc.system.immortal),
# once: the spares forked after it write fewer of the pages they share with it. Some 80-160 ms of CPU
# on an H200 host, so not while a first call waits for an on-demand or socket-activated server, nor in
# a storm.
MARK_QUIET = 0.5
DRAIN_QUIET = 0.1  # seconds without a call, after an idle server unlinked its socket, before it exits
# Seconds a stopping server waits for the calls its workers run (a client gives one 60 s by default),
# below systemd's stop timeout (90 s), after which KillMode=mixed kills what is left of the unit.
STOP_WAIT = 75.0
HOST_PID_ENV = "NVC_PY_HOST_PID"  # another process standing for the host's PID 1 (native/client/server_start.c)
SUCCESSOR_TIMEOUT = 60  # seconds for start-server to start an upgraded server that stays
ADOPTED_IDLE_EXIT = 0.5  # seconds without a call after which an on-demand server a runtime adopted stops
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
PRELOAD = (
    "nvc.hook.oci.prestart",
    "nvc.plan.fromenv",
    "nvc.hook.oci.spec",
    "nvc.hook.oci.log",
    "nvc.config",
    "nvc.pipeline.configure",
    "nvc.plan.requirements",
    "nvc.pipeline.apply",
    "nvc.apply.applier",
    "nvc.apply.ldconfig",
    "nvc.system.confinement",
    "nvc.apply.cgroups",
    "nvc.rpc.container_service",
    "nvc.containerenv.sharing",
    "nvc.apply.sharefiles",
    "nvc.discover.kmods",
    "nvc.apply.hostnodes",
    "nvc.debuglog",
    "nvc.hook.oci.cdihooks",
    "nvc.cdi.devnodes",
    "nvc.commands.cli",
    "nvc.rpc.driver_service",
    "nvc.commands.infoformat",
    "nvc.commands.listing",
    "nvc.discover.elf",
    "elftools.elf.elffile",
    "elftools.common.exceptions",
    "prctl",
    "pynvml",
    "yaml",
    "json",
    "resource",
)


def serve(path: str) -> int:
    """Accept hook calls on ``path`` until SIGTERM, each in a worker forked ahead of it."""
    directory, name = os.path.split(path)
    directory_fd = socket_directory(directory or ".")  # before the warm-up: a refusal is quick
    stats = open_stats(os.environ.pop(STATS_ENV, ""))
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


def _adopted() -> bool:
    """Whether a process other than init is this server's parent. The front detaches an on-demand
    server by a double fork, but the orphan goes to the nearest child subreaper among its starter's
    ancestors, and a runtime that is one may wait for every child it adopted before it returns: crun
    1.8's ``run`` did, a container start blocked until the server's own idle exit (10 minutes), seen
    on the GPU machine. Such a server serves the calls at hand (a start storm) and then makes way."""
    return os.getppid() != 1


def _serve_in(directory_fd: int, path: str, name: str, stats: int, nice: int) -> int:
    """serve() once its socket directory is checked; ``nice``: the value its workers run at."""
    import importlib

    for module in PRELOAD:
        importlib.import_module(module)
    from nvc.commands.cli import main as cli_main
    from nvc.hook.oci.prestart import main as hook_main
    from nvc.hook.oci.runtime import served_create

    scratch = os.path.abspath(os.path.dirname(path) or ".")  # checked by socket_directory
    warm_up(scratch)
    programs: Programs = {
        "nvc-py-hook": lambda args: hook_main(args, via="server"),
        "nvc-py": cli_main,
        "nvc-py-runtime": served_create,
    }

    import prctl

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps finished workers...
    prctl.set_child_subreaper(True)  # ...and the helpers they leave behind (a spare's unused NVML helper)
    # SIGTERM is seen by the accept loop's select through the wakeup pipe, never raised as
    # SystemExit: raised where Python runs a finalizer or a fork callback it would be swallowed,
    # and the server would go on serving (seen once in 400+ stops as a 30 s stop timeout).
    stop_r, stop_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    notes_r, notes_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)  # spares' lines: why a helper did not start
    said: set[str] = set()
    signal.set_wakeup_fd(stop_w)
    signal.signal(signal.SIGTERM, lambda *_: None)
    ours = own_standing()
    upgrade.note_start()
    inherited = activation.inherited_socket()
    sock = inherited if inherited is not None else listen(directory_fd, name, path)
    owned = inherited is None  # a name this server bound: unlinked when it stops
    idle = activation.idle_exit() if owned else None  # systemd's socket is not this server's to unlink
    stays = activation.stays() and owned and idle is None
    dog = watchdog.from_environment()
    with contextlib.suppress(OSError):  # calls that found its predecessor wedged try this one at once
        os.unlink(wedge.MARKER, dir_fd=directory_fd)
    draining = False
    quiet_since = time.monotonic()  # of the last event (a call taken, a spare's end, a signal)
    try:
        gc.collect()
        gc.freeze()  # keep the imported objects' pages shared with the workers
        marked = False  # what the server holds, immortal (once quiet: see MARK_QUIET)
        print(
            f"nvc-py-hook serve: listening on {path}{' (from systemd)' if inherited else ''}",
            file=sys.stderr,
            flush=True,
        )
        activation.release_start_lock()
        spares: dict[int, int] = {}  # each waiting spare's taken pipe: its pidfd (-1: gone already)
        try:
            while True:
                while len(spares) < SPARES:
                    taken_r, taken_w = os.pipe()
                    pid = os.fork()
                    if pid == 0:
                        signal.set_wakeup_fd(-1)
                        for fd in (*spares, *spares.values(), taken_r, stop_r, stop_w, notes_r):
                            if fd >= 0:
                                os.close(fd)
                        spare(sock, taken_w, programs, ours, stats, scratch, nice, notes_w)
                    os.close(taken_w)
                    spares[taken_r] = _pidfd(pid)
                # Until a spare takes a call (a byte) or dies before it (end of file), or SIGTERM; with
                # systemd's watchdog, until its next keep-alive at the latest.
                wait = DRAIN_QUIET if draining else ADOPTED_IDLE_EXIT if idle and _adopted() else idle
                limit = None if wait is None else quiet_since + wait - time.monotonic()
                if dog is not None:
                    dog.tick(queued=bool(select.select([sock], [], [], 0)[0]))
                    limit = dog.due_in() if limit is None else min(dog.due_in(), limit)
                mark = not marked and (wait is None or wait > MARK_QUIET)  # not in a server about to stop
                if mark:
                    due = quiet_since + MARK_QUIET - time.monotonic()
                    limit = due if limit is None else min(limit, due)
                ready = select.select([*spares, stop_r, notes_r], [], [], None if limit is None else max(0.0, limit))[0]
                if stop_r in ready and signal.SIGTERM in os.read(stop_r, 64):
                    if stays and upgrade.changed():  # start-server's, after an upgrade: its successor
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(name, dir_fd=directory_fd)
                        owned = False
                        sock.close()
                        _start_successor(path)
                    return 0
                if notes_r in ready:
                    _say_new(notes_r, said)
                died = False
                for fd in spares.keys() & set(ready):
                    taken = os.read(fd, 1)
                    died |= not taken
                    if dog is not None and taken:
                        dog.taken = True
                    _forget(fd, spares.pop(fd))
                if died:
                    time.sleep(SPARE_RESPAWN_DELAY)  # no tight loop of spares that cannot start
                if ready:  # a call, a dead spare or another signal's byte
                    quiet_since = time.monotonic()
                    continue
                if mark and time.monotonic() - quiet_since >= MARK_QUIET:
                    immortal.make_immortal()
                    gc.freeze()
                    marked = True
                    continue
                if wait is None or time.monotonic() - quiet_since < wait:
                    continue  # the watchdog's or the marking's turn, not idle yet
                if not draining:  # idle: new callers find no socket (and start a server), queued ones are served
                    adopter = f" (pid {os.getppid()} adopted this server and may wait for it)" if wait != idle else ""
                    print(f"nvc-py-hook serve: no call for {wait:g} s: stopping{adopter}", file=sys.stderr, flush=True)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=directory_fd)
                    owned, draining = False, True
                elif not select.select([sock], [], [], 0)[0]:
                    return 0  # nothing queued, nothing can come: the spares go with this process
        finally:
            _stop(spares)
            for fd in (notes_r, notes_w):
                os.close(fd)
    finally:
        sock.close()
        if owned:
            try:
                os.unlink(name, dir_fd=directory_fd)
            except OSError:
                pass


def _start_successor(path: str) -> None:
    """A server that stays (``nvc-py-hook start-server``'s: :func:`.activation.stays`), stopped
    after an upgrade replaced the installed code (a worker's :func:`.upgrade.stale`, or the package's
    ``stop-servers``), starts the next one of the new code the same way once its socket is gone, so
    that the host stays served; it says what it did (its server.log)."""
    import prctl

    from nvc.system.programs import SOCKET_ENV, installed_program

    # Not this subreaper's to adopt: its stop waits for every child it has (_stop), and the successor
    # would be one, orphaned by start-server's double fork.
    prctl.set_child_subreaper(False)
    env = {"PATH": os.environ.get("PATH", ""), SOCKET_ENV: path}
    if HOST_PID_ENV in os.environ:  # tests: the process standing for the host's (native/client/server_start.c)
        env[HOST_PID_ENV] = os.environ[HOST_PID_ENV]
    try:  # SIGCHLD is ignored here: no exit status comes back, what it printed says
        done = subprocess.run(
            [installed_program("nvc-py-hook"), "start-server"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=env,
            timeout=SUCCESSOR_TIMEOUT,
        )
        said = (done.stdout + done.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as err:
        said = f"nvc-py-hook start-server: {err}"
    print(f"nvc-py-hook serve: the installed code changed: {said}", file=sys.stderr, flush=True)


def _say_new(notes: int, said: set[str]) -> None:
    """Say each line the spares wrote to ``notes`` that was not said before: every spare finds the
    same reason a helper does not start (no driver), the journal gets it once."""
    with contextlib.suppress(BlockingIOError):
        for line in os.read(notes, 1 << 16).decode(errors="replace").splitlines():
            if line and line not in said:
                said.add(line)
                print(f"nvc-py-hook serve: {line}", file=sys.stderr, flush=True)


def _pidfd(pid: int) -> int:
    """A pidfd of the spare ``pid`` (-1 where it is gone already: the kernel reaps the server's children)."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return -1


def _forget(taken: int, pidfd: int) -> None:
    """Close what the server kept of a spare that was taken or ended: its taken pipe and pidfd."""
    os.close(taken)
    if pidfd >= 0:
        os.close(pidfd)


def _stop(spares: dict[int, int]) -> None:
    """End the server's children before it exits, so that it stops with them (systemd's unit:
    KillMode=mixed, no process left over): each idle spare killed (a call it accepted got no
    ``ready`` yet, and its client runs the program itself: see nvc.hook.server.handover), each busy
    worker waited for until its call is done (at most STOP_WAIT), and the helpers the spares leave
    to this subreaper with them. A spare that wrote its byte is busy."""
    for taken, pidfd in spares.items():
        if not select.select([taken], [], [], 0)[0] and pidfd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        _forget(taken, pidfd)
    spares.clear()
    deadline = time.monotonic() + STOP_WAIT
    while time.monotonic() < deadline:
        try:  # SIGCHLD ignored: the kernel reaps, and WNOHANG tells whether any child is left
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            return
        time.sleep(0.01)
