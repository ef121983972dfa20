"""A worker's life: forked ahead as a spare, it readies its call's path while idle, takes one
call, answers it, then waits for its helpers and exits.

Per-call figures, for benchmarks: with ``$NVC_PY_SERVE_STATS`` set to a file when the server
starts, each worker appends one JSON line once its call is done: ``queue_ms``, how long the call
waited between the client's connect (the stamp the client sends,
:data:`nvc.hook.server.handover.CONNECTED_ENV`) and a worker's accept (null for a client that sends none);
``worker_ms``, from that accept to the answer sent; ``cpu_ms``, the worker's user+system CPU since
it was forked as a spare, its helpers' included.
So a storm's p99 shows whether calls queue for a worker or run slowly once taken.
"""

from __future__ import annotations

import gc
import os
import select
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING

from nvc.errors import InputError
from nvc.hook.server.exchange import Programs, run_call, say
from nvc.hook.server.peer import Standing

if TYPE_CHECKING:
    from nvc.plan.operations import Plan
    from nvc.rpc.pool import WarmHelper

IDLE_BEFORE_HELPERS = 0.05  # seconds a spare waits for a call before it readies a start's path
# Seconds a spare waits, from its fork, before it loads NVML: only `info` and MIG devices need it, and
# in a storm a spare is taken sooner (each NVML helper's start is CPU the storm's starts wait for).
IDLE_BEFORE_NVML = 0.5
STATS_ENV = "NVC_PY_SERVE_STATS"  # a file each worker appends its call's figures to (JSON lines)
NOTE_LIMIT = 1000  # characters of a note to the server: one write under PIPE_BUF never interleaves


def spare(
    sock: socket.socket, taken: int, programs: Programs, ours: Standing, stats: int, scratch: str, nice: int, notes: int
) -> None:
    """A worker forked ahead of its call: waits for the next connection (idle, it readies a start's
    path: ``scratch`` is the dry plan's rootfs; a helper that fails to start is reaped and its reason
    written to ``notes``, for the server to say once; then it copies ahead what it shares with the
    server, :mod:`nvc.system.prefault`; idle longer, it loads NVML), tells the server it was taken (so
    the server forks another spare), then serves it at ``nice``, the nice value the server started
    with. Never returns."""
    import prctl

    forked = time.monotonic()
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)  # a worker runs as the server was started
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # its helpers are waited for
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        prctl.set_pdeathsig(signal.SIGKILL)  # an idle spare goes with the server...
        if os.getppid() == 1:
            os._exit(0)
        gc.disable()  # a worker lives for one call: no collections during it
        if not _called(sock, IDLE_BEFORE_HELPERS):  # idle: ready what a call would otherwise start or touch first
            pending = _settle(sock, _prestart_container(scratch), notes)
            from nvc.system import prefault  # then its own copy of the server's memory (the call's faults)

            prefault.copy_ahead(lambda: _called(sock, 0))
            if not _called(sock, max(0.0, forked + IDLE_BEFORE_NVML - time.monotonic())):
                pending.update(_settle(sock, _prestart_driver(), notes))
            _settle_later(pending, notes)
        while True:
            try:
                conn, _ = sock.accept()
                accepted_ns = time.monotonic_ns()
                break
            except InterruptedError:
                continue
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the call waits for its helpers itself
        prctl.set_pdeathsig(0)  # ...a busy one finishes its call
        os.write(taken, b"t")
        os.close(taken)
        os.close(notes)
        sock.close()
    except BaseException:  # noqa: BLE001 - the server forks another spare
        os._exit(1)
    _worker(conn, programs, ours, accepted_ns, stats)


def _called(sock: socket.socket, timeout: float) -> bool:
    """Whether a call came on ``sock`` within ``timeout`` seconds."""
    return bool(select.select([sock], [], [], timeout)[0])


def _prestart_container(scratch: str) -> list[WarmHelper]:
    """The dry plan (:func:`warm_up`), then a container helper forked and confined for configure
    (container_service.open_container), which clones the dry plan's host sources while it waits.
    Killed with the worker when its call does not take it. Best effort: a call that finds none
    starts its own, and finds out why. Returns it, its set-up still running (none where it failed)."""
    from nvc.errors import NvcError
    from nvc.rpc import container_service

    planned = warm_up(scratch, say=False)
    try:
        return [container_service.prestart(planned)]
    except (NvcError, OSError):
        return []


def _prestart_driver() -> list[WarmHelper]:
    """An NVML helper started for the CLI's defaults (driver root /, the overflow ids), taken over by
    a call that asks for the same (see driver_service.open_driver); killed with the worker otherwise.
    Best effort, as :func:`_prestart_container`."""
    from nvc.errors import NvcError
    from nvc.rpc import driver_service

    try:
        return [driver_service.prestart()]
    except (NvcError, OSError):
        return []


def _settle(sock: socket.socket, warming: list[WarmHelper], notes: int) -> dict[int, WarmHelper]:
    """Until a call comes on ``sock``: take each prestarted helper's set-up report as it comes (see
    :func:`_take_report`). Returns those whose report had not come yet, by their report's descriptor."""
    pending = {fd: helper for helper in warming if (fd := helper.report_fd()) is not None}
    while pending:
        ready = select.select([sock, *pending], [], [])[0]
        if sock in ready:
            break
        for fd in ready:
            _take_report(pending.pop(fd), notes)
    return pending


def _settle_later(pending: dict[int, WarmHelper], notes: int) -> None:
    """The reports still ``pending`` when a call woke this spare, taken as their helpers exit (SIGCHLD)
    until it accepts a call: the call that woke every spare is one spare's, and the others wait in
    accept() for the next, where a helper whose set-up failed since would stay a zombie."""
    if not pending:
        return

    def taken(signum: int, frame: object) -> None:
        for fd in select.select(list(pending), [], [], 0)[0]:
            _take_report(pending.pop(fd), notes)

    signal.signal(signal.SIGCHLD, taken)
    taken(signal.SIGCHLD, None)  # any that exited before the handler was in place


def _take_report(helper: WarmHelper, notes: int) -> None:
    """A prestarted helper's set-up report, come. One whose set-up failed (no driver: NVML does not
    load) has exited; it is reaped now, not left a zombie until a call, and its reason goes to the
    server on ``notes``, one line (the server says each reason once, not once per spare)."""
    from nvc.errors import NvcError

    try:
        helper.settle()
    except NvcError as err:
        line = f"idle workers keep no {helper.name} helper: {err}".replace("\n", " ")[:NOTE_LIMIT]
        try:
            os.write(notes, (line + "\n").encode(errors="replace"))
        except OSError:  # a full pipe: the server has enough to say
            pass


def warm_up(scratch: str, say: bool = True) -> Plan | None:
    """One dry plan with the directory ``scratch`` as its rootfs (the socket's directory: only read,
    nothing made that a kill could leave behind; no container, nothing changed), so what a first call
    builds lazily (compiled patterns, tables, the ld cache's pages) is in the server's memory
    before any worker is forked; run again by an idle spare, it copies ahead the pages a call's
    plan writes (a worker shares the server's until it writes them). Returns the plan. Best effort:
    a host without a driver just skips it (``say``: and says so; None returned)."""
    from nvc import config as config_file
    from nvc.errors import NvcError
    from nvc.hook.oci.prestart import global_options
    from nvc.pipeline.configure import dry_plan
    from nvc.plan.request import Request

    try:
        cfg = config_file.load()
        return dry_plan(
            global_options(cfg), Request(rootfs=scratch, capabilities=frozenset(cfg.supported_capabilities))
        )
    except (NvcError, OSError) as err:
        if say:
            print(f"nvc-py-hook serve: warm-up skipped: {err}", file=sys.stderr, flush=True)
        return None


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
            answer = run_call(conn, programs, ours, accepted_ns, figures)
        except BaseException as err:  # noqa: BLE001 - the caller must get a status, whatever happened
            say(f"nvc-py-hook serve: worker failed: {type(err).__name__}: {err}")
        if answer is not None:
            _release_streams()
            conn.send(answer)
            figures["worker_ms"] = (time.monotonic_ns() - accepted_ns) / 1e6
            helper.reap_deferred()
        if stats >= 0:
            _record(stats, answer, figures)
    finally:
        os._exit(0)


def _release_streams() -> None:
    """Point 0-2 at /dev/null, so that the caller's pipes end when it gets its answer, not when this
    worker has waited for its helpers."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in range(3):
        os.dup2(null, fd)
    os.close(null)


def _record(stats: int, answer: bytes | None, figures: dict[str, float | None]) -> None:
    """One JSON line of this worker's call (see the module's docstring), in one write to a file
    opened for appending, so that lines of workers finishing at once never interleave."""
    import json
    import resource

    cpu = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):  # the helpers are reaped by now
        usage = resource.getrusage(who)
        cpu += usage.ru_utime + usage.ru_stime
    line = {
        "pid": os.getpid(),
        "answer": answer.decode(errors="replace").split("\n")[0] if answer else None,
        **figures,
        "cpu_ms": round(cpu * 1000, 3),
    }
    try:
        os.write(stats, (json.dumps(line) + "\n").encode())
    except OSError:
        pass  # figures are for benchmarks: a full disk costs no call


def open_stats(path: str) -> int:
    """A descriptor appending to ``path`` (created 0600), -1 for none; InputError naming the file."""
    if not path:
        return -1
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as err:
        raise InputError(f"{path}: cannot open ${STATS_ENV}: {err.strerror}") from None
