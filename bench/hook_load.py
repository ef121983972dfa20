#!/usr/bin/env python3
"""Start storms: 32 containers started at once (crun, else runc), with nvc-py-hook as prestart hook.

Each round starts N containers concurrently (``RUNTIME run`` of ``true``, each on an overlay of one
rootfs, as an engine's snapshot, mounted before the clock starts, all on a tmpfs of the bench's own:
harness.timing.bench_workdir) and times each start to exit. nvc-py runs with its DEFAULT
configuration (only the log file's place is set: ``load-kmods: true``), as a user gets it.
Rows, in the same run and interleaved round by round so drift hits every row alike:

  no hook              the baseline
  installed, setup's server
                       GPU 0 as a host without systemd has it after ``make install && nvc-py setup
                       podman``: the installed native front (nvc-py-hook) hands each call to the
                       server setup started to stay (``nvc-py-hook start-server``: not the
                       runtime's child, no idle exit), started by the bench before the storm (a
                       second before its clock) and stopped after it
  installed, no server GPU 0 where no server runs yet (a host restarted since setup): the installed
                       front finds no server and starts one on demand
                       (native/client/server_start.c); no server runs when the round starts (the
                       bench stops the one the round before started)
  installed, its server
                       GPU 0, the next storm, served by the server the row above started; the
                       bench then stops it (by its pid), so the host is left as it was. Under a
                       runtime that adopts orphans (crun is a child subreaper) that server stops
                       0.5 s after its storm (docs/hook-server.md: served by default), and this row starts another
                       (both: the socket in the bench's own directory, so a server of the host's
                       own is never touched)
  socket unit, no server
                       GPU 0 as a host with systemd has it after boot: the bench plays systemd's
                       socket unit (nvc-py-hook.socket: it binds the socket, keeps it, and starts
                       ``nvc-py-hook serve`` on the first connection, handing it over as fd 3);
                       no server runs when the round starts, the storm's first call starts it and
                       every call waits in the socket's queue meanwhile (what systemd itself spends
                       to start a unit, its fork and the unit's cgroup, is not in it)
  socket unit, its server
                       GPU 0, the next storm, served by the server the row above started; the
                       bench then stops it (SIGTERM, as ``systemctl stop``; the socket stays)
  hook, no GPU asked   the hook attached but NVIDIA_VISIBLE_DEVICES unset (what podman's
                       hooks.d costs every container, since hooks.d cannot match env vars)
  hook, GPU 0          NVIDIA_VISIBLE_DEVICES=0: the full in-process configure
  hook, all GPUs       NVIDIA_VISIBLE_DEVICES=all
                       (these three where no server can answer: NVC_PY_HOOK_SOCKET=none)
  server, ...          the last three again through nvc-py-hook-client and a ``nvc-py-hook
                       serve`` the bench started (spare workers forked ahead: a storm may queue)

Every counted storm follows a SPACER: a storm of as many starts with no hook, not counted, so that no
row pays for what the row before it left behind (bench/configure.py says what the reference's did).

``--row LABEL`` (again for more) runs only those rows, with the baseline (and a fault row's healthy
storm): a few rows' storms at less cost.

With ``--reference PATH``, a row of NVIDIA's ``nvidia-container-cli`` at PATH in a bash prestart hook
(bench/reference.py) follows the baseline, and a last table gives every row's p50 and p99 as multiples of
the reference's, and its p50 over the baseline's (what the hook adds) as a multiple of the reference's.

``--cold``: every row's storm right after the page cache was dropped (``sync``, then
``/proc/sys/vm/drop_caches``), as the first starts after boot find it; a server running then (setup's,
or the one the row before started) keeps the pages it maps. With ``--containers 1``, each host's first
container start after boot: setup's server (an init script's at boot), a server started on demand
(``make install`` alone), systemd's socket.

Fault rows (GPU 0; ``--faults`` runs only these, their healthy storms and the baseline): the server
wedged (SIGSTOP of the server process FAULT_AT s into the storm: its idle workers still take a call
each, it forks no more) or crashing (SIGKILL FAULT_AT s in and every KILL_EVERY s through the storm), in the default
configuration first and then as under systemd:

  installed, server stopped / killed
                       the installed front with a warm server the bench started on its socket: a
                       call that finds the server stopped ends it and starts the next one on
                       demand, and a call that finds none starts one (native/client/server_start.c)
  server, GPU 0, stopped / killed
                       nvc-py-hook-client and a server the bench started, no start on demand; the
                       bench restarts a killed server RESTART_AFTER s later, as systemd's
                       ``Restart=`` does (its watchdog would end a stopped one after WatchdogSec=,
                       longer than a storm: calls that find it stopped run the hook themselves)

Printed: failures, p50 and p99 of the start times and both as ratios of the baseline's; the CPU
time (user+system) the hook costs per container start: the row's CPU per start (the runtime, the
hook and its helpers: the bench's reaped children) minus the baseline's, plus for the server rows
the server's side (each worker's CPU from the server's per-call figures, $NVC_PY_SERVE_STATS, and
the server process's own); and for the server rows p50/p99 of each call's queue wait (client's
connect to a worker's accept) and worker time (accept to answer), so a storm's p99 tells
queueing for a worker from slow work. The installed rows' server is not the bench's child: their
CPU column counts the client side only (marked *), and they have no per-call figures. The fault
rows get a table of their own: failures, the medians of each round's p50 and p99, each as a ratio
of its healthy storm in the same round (median of the rounds' ratios: ``installed, its server`` and
``server, GPU 0``), how many starts took the hand-over timeout or longer, and what happened to
the servers (stopped or killed by the bench; ended by a call and started again on demand, from
server.log).
On a host with an NVIDIA driver it uses the real driver; otherwise (or with --fake) the test
suite's FAKE driver (a test double: two fake GPUs) in a private mount namespace, and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, closing, nullcontext, suppress
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.append(str(REPO))  # nvc, where the interpreter has none installed (harness.timing reads mountinfo with it)

from harness.bundle import make_bundle  # noqa: E402
from harness.hookserver import LIBDIR, client_hook, hook_server  # noqa: E402
from harness.rootfs import RootfsCache, overlay_rootfs  # noqa: E402
from harness.timing import bench_runtime, bench_workdir, drop_page_cache  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))
import reference  # noqa: E402

FAKE_MACHINE = REPO / "tests" / "fakedriver" / "machines" / "two-gpu-mig.yaml"
GPU0 = {"NVIDIA_VISIBLE_DEVICES": "0"}
FAULT_AT = 0.05  # seconds into a storm at which the server is stopped, or first killed (a storm of 32
# may be over in 0.2 s: a later fault would find the storm done)
KILL_EVERY = 0.15  # seconds between two kills of the server through a storm
RESTART_AFTER = 0.1  # seconds before the bench restarts a killed server (systemd's default RestartSec=)
ACK_TIMEOUT_MS = 2000  # the clients' hand-over timeout (nvc.hook.server.handover.ACK_TIMEOUT)


class Row(NamedTuple):
    label: str
    env: dict[str, str] | None  # the container's; None: no hook
    via: str  # "direct", "server" (the bench's), "installed" (the front; a server it starts), "socket-unit"
    # (the front; the server the bench's socket unit starts), "reference"
    fault: str = ""  # "stop" or "kill": done to the server through the storm
    healthy: str = ""  # the row of the same hook without the fault
    after: str = ""  # the row whose storm started the server this one's storm finds


ROWS = (
    Row("no hook", None, "direct"),
    Row("installed, setup's server", GPU0, "installed"),
    Row("installed, no server", GPU0, "installed"),
    Row("installed, its server", GPU0, "installed", after="installed, no server"),
    Row("installed, server stopped", GPU0, "installed", "stop", "installed, its server"),
    Row("installed, server killed", GPU0, "installed", "kill", "installed, its server"),
    Row("socket unit, no server", GPU0, "socket-unit"),
    Row("socket unit, its server", GPU0, "socket-unit", after="socket unit, no server"),
    Row("hook, no GPU asked", {}, "direct"),
    Row("hook, GPU 0", GPU0, "direct"),
    Row("hook, all GPUs", {"NVIDIA_VISIBLE_DEVICES": "all"}, "direct"),
    Row("server, no GPU asked", {}, "server"),
    Row("server, GPU 0", GPU0, "server"),
    Row("server, GPU 0, stopped", GPU0, "fault-server", "stop", "server, GPU 0"),
    Row("server, GPU 0, killed", GPU0, "fault-server", "kill", "server, GPU 0"),
    Row("server, all GPUs", {"NVIDIA_VISIBLE_DEVICES": "all"}, "server"),
)
SETUP_SETTLE = 1.0  # seconds between start-server and the storm: setup ran before any start
FAULT_ROWS = (
    "no hook",
    "installed, no server",
    "installed, its server",
    "server, GPU 0",
    *(row.label for row in ROWS if row.fault),
)


def children_cpu_ms() -> float:
    """User+system CPU of this process's reaped children (and theirs), in ms."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


def process_cpu_ms(pid: int) -> float:
    """User+system CPU of one live process (its own, not its children's), in ms."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def servers_of(sock: Path) -> dict[int, int]:
    """{pid: parent pid} of the processes serving ``sock`` (``nvc-py-hook serve --socket SOCK``: the
    server, its spares and busy workers; the path is the bench's own, so they are the bench's)."""
    needle = f"\0serve\0--socket\0{sock}\0".encode()
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and needle in (proc / "cmdline").read_bytes():
                found[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return found


def listening() -> set[str]:
    """The fd link names (``socket:[INODE]``) of the listening unix sockets (/proc/net/unix; their path
    is the one bound, which a server may have renamed into place since)."""
    with open("/proc/net/unix", encoding="utf-8", errors="surrogateescape") as f:
        next(f)
        return {
            f"socket:[{fields[6]}]" for fields in map(str.split, f) if len(fields) >= 7 and int(fields[3], 16) & 0x10000
        }  # __SO_ACCEPTCON


def holds(pid: int, links: set[str]) -> bool:
    """Whether process ``pid`` has one of ``links`` open."""
    try:
        return any(os.readlink(fd) in links for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False


def server_pids(sock: Path) -> list[int]:
    """The servers of ``sock``: the processes listening on it that no other one forked (a killed
    server's busy workers outlive it, orphans no longer listening: a crash ends the server only)."""
    found = servers_of(sock)
    links = listening()
    return [pid for pid, parent in found.items() if parent not in found and holds(pid, links)]


def stop_servers(sock: Path) -> int:
    """Stop what serves ``sock`` (SIGTERM to each server, as systemd would, continued first where a
    fault row stopped it; its spares go with it), wait until nothing does; the number of servers stopped."""
    found = servers_of(sock)
    servers = [pid for pid, parent in found.items() if parent not in found]
    deadline = time.monotonic() + 30
    for pid in found:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    for pid in servers:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    while found:
        for pid in found if time.monotonic() > deadline else ():  # only the bench's: the socket is its own
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
        found = servers_of(sock)
    return len(servers)


def start_to_stay(hook_path: str, env: list[str]) -> None:
    """``nvc-py-hook start-server`` as ``nvc-py setup`` runs it where systemd does not, on the
    installed rows' socket, then SETUP_SETTLE seconds for its spares to warm up."""
    subprocess.run(
        [hook_path, "start-server"],
        env=dict(entry.split("=", 1) for entry in env),
        check=True,
        stdout=subprocess.DEVNULL,
        timeout=60,
    )
    time.sleep(SETUP_SETTLE)


class SocketUnit:
    """The bench as systemd's ``nvc-py-hook.socket`` (hook/setup/engines.py): it binds the socket (root's,
    0600 in a 0700 directory, systemd's default backlog) and keeps it while servers come and go; the
    first connection that finds no server starts ``nvc-py-hook serve`` with the listening socket as fd 3,
    ``LISTEN_FDS=1`` and ``LISTEN_PID`` its pid, in the hooks' environment (the unit's ``Environment=``),
    its stderr to server.log beside the socket. The server is the bench's child, so its CPU and its
    workers' per-call figures (``stats``) are counted as the bench's own server's are."""

    def __init__(self, path: Path, env: list[str], stats: Path) -> None:
        path.parent.mkdir(mode=0o700)
        self.path, self.stats = path, stats
        self.env = {**dict(entry.split("=", 1) for entry in env), "NVC_PY_SERVE_STATS": str(stats)}
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.bind(str(path))
        os.chmod(path, 0o600)
        self.sock.listen(socket.SOMAXCONN)
        self.server: subprocess.Popen[bytes] | None = None
        self.started = 0

    def activate(self, over: threading.Event) -> None:
        """Through a storm (``one_round``'s ``during``): start the server once a connection waits."""
        while not over.is_set():
            if select.select([self.sock], [], [], 0.01)[0]:
                self.start()
                return

    def start(self) -> None:
        """What systemd does on the first connection: the service started with the socket handed over."""
        with open(self.path.with_name("server.log"), "ab") as log:
            self.server = subprocess.Popen(
                [
                    "sh",
                    "-c",
                    'exec 3<&0 0</dev/null; LISTEN_PID=$$ LISTEN_FDS=1 exec "$@"',
                    "sh",
                    str(LIBDIR / "nvc-py-hook-python"),  # the unit's ExecStart=
                    "serve",
                    "--socket",
                    str(self.path),
                ],
                stdin=self.sock.fileno(),
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=self.env,
                start_new_session=True,
            )
        self.started += 1

    def cpu_ms(self) -> float:
        """The running server's own CPU (0 where none runs)."""
        return process_cpu_ms(self.server.pid) if self.server is not None else 0.0

    def stop(self) -> None:
        """``systemctl stop``: SIGTERM to the server, and wait for it (the socket stays)."""
        if self.server is None:
            return
        self.server.terminate()
        try:
            self.server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()
        self.server = None

    def close(self) -> None:
        self.stop()
        self.sock.close()


def installed_front(hook_path: str) -> bool:
    """Whether the installed nvc-py-hook is the native front (make install), not pip's console script."""
    try:
        with open(hook_path, "rb") as f:
            return f.read(4) == b"\x7fELF" and Path(hook_path).resolve().parent == LIBDIR
    except OSError:
        return False


def in_init_namespaces() -> bool:
    """Whether this process shares PID 1's mount, pid, user and network namespaces: the front starts
    a server only for a caller that does (a sandboxed shell's runtime would start it in the sandbox);
    one that may not even look at PID 1's is not in them."""
    try:
        return all(
            os.stat(f"/proc/1/ns/{ns}") == os.stat(f"/proc/self/ns/{ns}") for ns in ("mnt", "pid", "user", "net")
        )
    except OSError:
        return False


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (p99 of 96 samples is the 96th smallest... i.e. the 2nd largest)."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


def disturb(fault: str, sock: Path, over: threading.Event, restart: Callable[[], None] | None, done: list[int]) -> None:
    """Through a storm (until ``over``): ``stop`` the server of ``sock`` FAULT_AT s in, or ``kill``
    it FAULT_AT s in and every KILL_EVERY s after and, with ``restart`` (the bench as systemd), start it again RESTART_AFTER
    s later. ``done`` gets the pid of each server stopped or killed."""
    if fault == "stop":
        if not over.wait(FAULT_AT):
            for pid in server_pids(sock):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                    done.append(pid)
        return
    if over.wait(FAULT_AT):
        return
    while True:
        for pid in server_pids(sock):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                done.append(pid)
        if restart is not None and not over.wait(RESTART_AFTER):
            restart()
        if over.wait(KILL_EVERY):
            return


def one_round(
    runtime: str,
    work: Path,
    base_rootfs: Path,
    env: dict[str, str] | None,
    hook: dict,
    count: int,
    tag: str,
    during: Callable[[threading.Event], None] | None = None,
) -> tuple[list[float], list[str], float]:
    """Start ``count`` containers at once (``during``: run in a thread through the storm, told by the
    event when it is over); (start times in ms, failure messages, CPU ms of the runtimes, hooks and
    their helpers)."""
    with ExitStack() as roots:
        bundles = []
        for i in range(count):
            rootfs = roots.enter_context(overlay_rootfs(base_rootfs, work / f"{tag}-{i}"))
            hooks = {"prestart": [hook]} if env is not None else None
            bundles.append(make_bundle(work / f"{tag}-{i}", rootfs, ["true"], env=env or {}, hooks=hooks))
        results, cpu = storm(runtime, work / "runtime-state", bundles, tag, during)
    for i in range(count):
        shutil.rmtree(work / f"{tag}-{i}", ignore_errors=True)
    return [t for t, _ in results], [e for _, e in results if e], cpu


def storm(
    runtime: str, state: Path, bundles: list[Path], tag: str, during: Callable[[threading.Event], None] | None
) -> tuple[list[tuple[float, str | None]], float]:
    """Start the bundles at once; each one's (start time in ms, failure message), and the CPU ms of the runtimes,
    hooks and their helpers."""

    def start(i: int) -> tuple[float, str | None]:
        cid = f"nvc-load-{tag}-{i}"
        t0 = time.perf_counter()
        r = subprocess.run(
            [runtime, "--root", str(state), "run", "--bundle", str(bundles[i]), cid],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=120,
        )
        elapsed = (time.perf_counter() - t0) * 1000
        subprocess.run([runtime, "--root", str(state), "delete", "-f", cid], capture_output=True)
        return elapsed, None if r.returncode == 0 else f"{cid}: rc {r.returncode}: {r.stderr.strip()[-300:]}"

    cpu = children_cpu_ms()
    over = threading.Event()
    thread = threading.Thread(target=during, args=(over,)) if during is not None else None
    with ThreadPoolExecutor(max_workers=len(bundles)) as pool:
        if thread is not None:
            thread.start()
        try:
            results = list(pool.map(start, range(len(bundles))))
        finally:
            over.set()
            if thread is not None:
                thread.join()
    return results, children_cpu_ms() - cpu


def new_lines(path: Path, seen: int, want: int) -> list[dict]:
    """The JSON lines of ``path`` after the first ``seen``, once ``want`` of them are there (a worker
    writes its line after answering; at most 10 s more)."""
    deadline = time.monotonic() + 10
    while True:
        lines = path.read_text().splitlines()[seen:] if path.exists() else []
        if len(lines) >= want or time.monotonic() > deadline:
            return [json.loads(line) for line in lines]
        time.sleep(0.05)


def spread(values: list[float]) -> str:
    """p50/p99 of ``values``, or a dash for none."""
    return f"{statistics.median(values):.1f}/{percentile(values, 99):.1f}" if values else "-"


def server_log_counts(sock: Path) -> tuple[int, int]:
    """(servers a call ended as wedged, servers started on demand) so far, from server.log beside ``sock``."""
    log = sock.with_name("server.log")
    text = log.read_text() if log.exists() else ""
    return text.count("ended the wedged hook server"), text.count(": listening on ")


def fault_round(
    runtime: str,
    work: Path,
    base_rootfs: Path,
    row: Row,
    hook: dict,
    count: int,
    tag: str,
    hook_path: str,
    sock: Path,
    done: list[int],
) -> tuple[list[float], list[str], float]:
    """one_round() of a fault row: a warm server the bench starts on ``sock``, stopped or killed
    through the storm (disturb(); restarted by the bench for the systemd-like rows), then whatever
    serves ``sock`` stopped."""
    stop_servers(sock)
    with ExitStack() as started:

        def start() -> None:
            started.enter_context(hook_server(hook_path, sock))

        start()
        restart = start if row.via == "fault-server" else None
        try:
            return one_round(
                runtime,
                work,
                base_rootfs,
                row.env,
                hook,
                count,
                tag,
                lambda over: disturb(row.fault, sock, over, restart, done),
            )
        finally:
            stop_servers(sock)


def fault_table(
    rows: tuple[Row, ...],
    by_round: dict[str, list[list[float]]],
    times: dict[str, list[float]],
    failures: dict[str, list[str]],
    faulted: dict[str, list[int]],
    logged: dict[str, tuple[int, int]],
) -> None:
    """The fault rows against their healthy storms (see the module's docstring)."""
    print(
        f"\nfault rows: medians of the rounds' p50 and p99, and of their ratios to the healthy storm of the same "
        f"round; the server stopped {FAULT_AT:g} s into the storm, or killed {FAULT_AT:g} s in and every {KILL_EVERY:g} s"
    )
    print(
        f"{'row':<27}{'healthy storm':<23}{'failures':>9}{'p50 ms':>9}{'p99 ms':>9}{'p50 / healthy':>15}"
        f"{'p99 / healthy':>15}{'starts >= 2 s':>15}  servers"
    )
    for row in rows:
        if not row.fault or row.healthy not in by_round:
            continue
        mine, healthy = by_round[row.label], by_round[row.healthy]
        p50s, p99s = [statistics.median(t) for t in mine], [percentile(t, 99) for t in mine]
        ratio50 = statistics.median(a / statistics.median(b) for a, b in zip(p50s, healthy, strict=True))
        ratio99 = statistics.median(a / percentile(b, 99) for a, b in zip(p99s, healthy, strict=True))
        slow = sum(t >= ACK_TIMEOUT_MS for t in times[row.label])
        ended, started = logged[row.label]
        what = f"{len(faulted[row.label])} {'stopped' if row.fault == 'stop' else 'killed'} by the bench"
        if row.via == "installed":
            what += f", {ended} ended by a call, {started} started on demand"
        elif row.fault == "kill":
            what += ", each restarted by it"
        print(
            f"{row.label:<27}{row.healthy:<23}{len(failures[row.label]):>9}{statistics.median(p50s):>9.1f}"
            f"{statistics.median(p99s):>9.1f}{ratio50:>15.2f}{ratio99:>15.2f}{slow:>15}  {what}"
        )


def reference_table(rows: tuple[Row, ...], times: dict[str, list[float]]) -> None:
    """Every row's p50 and p99 as multiples of the reference's in the same storms, and what it adds to
    the baseline's p50 (the first row) as a multiple of what the reference adds."""
    p50, p99 = statistics.median(times[reference.LABEL]), percentile(times[reference.LABEL], 99)
    baseline = statistics.median(times[rows[0].label])
    print(f"\n{'against the reference':<27}{'p50':>9}{'p99':>9}{'p50 over the baseline':>23}")
    for row in rows:
        if row.via != "reference":
            mine = statistics.median(times[row.label])
            added = f"{(mine - baseline) / (p50 - baseline):.2f}x" if p50 > baseline else "-"
            print(f"{row.label:<27}{mine / p50:>8.2f}x{percentile(times[row.label], 99) / p99:>8.2f}x{added:>23}")


def chosen(rows: tuple[Row, ...], wanted: set[str]) -> tuple[Row, ...]:
    """``rows`` cut to the ``wanted`` labels (none: all), in their order, with the baseline (the first
    row), each wanted fault row's healthy storm, which its ratios need, and the storm that starts the
    server a wanted "its server" row is served by."""
    if not wanted:
        return rows
    needed = {row.healthy for row in rows if row.label in wanted} | {row.after for row in rows if row.label in wanted}
    return tuple(row for row in rows if row.label in wanted | needed or row is rows[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containers", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runtime", default=None, help="crun or runc (default: crun, else runc; harness.timing)")
    parser.add_argument("--fake", action="store_true", help="use the fake driver even on a GPU host")
    parser.add_argument(
        "--faults", action="store_true", help="only the fault rows, their healthy storms and the baseline"
    )
    parser.add_argument("--reference", type=Path, help="nvidia-container-cli to time beside, in a bash hook")
    parser.add_argument("--cold", action="store_true", help="each storm right after dropping the page cache")
    parser.add_argument(
        "--row",
        action="append",
        metavar="LABEL",
        help="only this row (again for more), with the baseline and a fault row's healthy storm",
    )
    args = parser.parse_args()
    wanted = set(args.row or ())
    if wanted - {row.label for row in ROWS}:
        parser.error(f"--row: no such row: {'; '.join(sorted(wanted - {row.label for row in ROWS}))}")
    runtime, runtime_why = bench_runtime(args.runtime)
    real = Path("/proc/driver/nvidia/version").exists() and not args.fake
    if args.reference and not real:
        parser.error(f"--reference needs the real driver ({reference.NEEDS_REAL})")
    hook_path = str(Path(sysconfig.get_path("scripts")) / "nvc-py-hook")
    with bench_workdir("nvc-hook-load-") as work:
        if real:
            print("== bench/hook_load.py: real NVIDIA driver on this host ==")
            root, activation = "/", nullcontext()
        else:
            print("== bench/hook_load.py: no NVIDIA driver used; FAKE driver (test double), not GPU results ==")
            from fakedriver.activate import activate
            from fakedriver.build import build

            fake = build(FAKE_MACHINE, work / "fake")
            root, activation = str(fake.root), activate(fake)
        log = work / "hook.log"
        config = work / "config.yaml"
        config.write_text(f"root: {root}\nlog: {{file: {log}}}\n")  # the defaults otherwise
        hook_env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", f"NVC_PY_CONFIG={config}"]
        # The direct rows forbid a hand-over: no server of the host's own answers them.
        hook = {"path": hook_path, "args": ["nvc-py-hook", "prestart"], "env": [*hook_env, "NVC_PY_HOOK_SOCKET=none"]}
        sock = work / "run" / "hook.sock"
        served_hook = client_hook(hook_path, sock, hook_env)
        # As installed: the front's own hand-over and on-demand start. Where the bench does not run in
        # PID 1's namespaces (the fake driver's private mount namespace, or a sandboxed shell), its own
        # process stands for the host's PID 1: NVC_PY_HOST_PID.
        installed_sock = work / "installed" / "hook.sock"
        stand_in = [] if real and in_init_namespaces() else [f"NVC_PY_HOST_PID={os.getpid()}"]
        if real and stand_in:
            print("(not in PID 1's namespaces: the bench process stands for the host's for the installed rows)")
        installed_hook = {
            "path": hook_path,
            "args": ["nvc-py-hook", "prestart"],
            "env": [*hook_env, f"NVC_PY_HOOK_SOCKET={installed_sock}", *stand_in],
        }
        rows = tuple(row for row in ROWS if row.label in FAULT_ROWS) if args.faults else ROWS
        rows = chosen(rows, wanted)
        if args.reference:
            rows = (rows[0], Row(reference.LABEL, GPU0, "reference"), *rows[1:])
        if not installed_front(hook_path):
            print(f"(no installed rows: {hook_path} is not the native front; run `make install`)")
            rows = tuple(row for row in rows if row.via not in ("installed", "socket-unit"))
        fault_sock = work / "fault" / "hook.sock"  # the systemd-like fault rows' server: the bench's
        hooks = {
            "direct": hook,
            "server": served_hook,
            "installed": installed_hook,
            "fault-server": client_hook(hook_path, fault_sock, hook_env),
        }
        if args.reference:
            hooks["reference"] = reference.write_hook(args.reference, root, work / "reference-hook.sh")
        stats = work / "server-stats.jsonl"
        unit_stats = work / "unit-stats.jsonl"
        unit = SocketUnit(work / "unit" / "hook.sock", hook_env, unit_stats)
        hooks["socket-unit"] = {**installed_hook, "env": [*hook_env, f"NVC_PY_HOOK_SOCKET={unit.path}", *stand_in]}
        base = RootfsCache(work / "cache").get("debian")
        times: dict[str, list[float]] = {row.label: [] for row in rows}
        failures: dict[str, list[str]] = {row.label: [] for row in rows}
        cpu: dict[str, float] = {row.label: 0.0 for row in rows}
        calls: dict[str, list[dict]] = {row.label: [] for row in rows}
        by_round: dict[str, list[list[float]]] = {row.label: [] for row in rows}
        faulted: dict[str, list[int]] = {row.label: [] for row in rows}  # servers stopped or killed by the bench
        logged: dict[str, tuple[int, int]] = {row.label: (0, 0) for row in rows}  # (ended by a call, started) per row
        stopped = 0  # on-demand servers the bench stopped
        with activation, closing(unit), hook_server(hook_path, sock, stats=stats) as server:
            began = time.monotonic()
            try:
                for round_no in range(args.rounds):
                    for number, row in enumerate(rows):
                        if row.label == "installed, no server":
                            stopped += stop_servers(installed_sock)  # none, unless one outlived a failure
                        if row.label == "installed, setup's server":
                            start_to_stay(hook_path, installed_hook["env"])
                        if row.label == "socket unit, no server":
                            unit.stop()  # none, unless only this row runs: the round before started it
                        tag = f"r{round_no}-{number}"
                        spaced = one_round(runtime, work, base, None, hook, args.containers, f"{tag}-spacer")[1]
                        failures[row.label] += [f"the spacer storm before it: {message}" for message in spaced]
                        seen = len(stats.read_text().splitlines()) if stats.exists() else 0
                        seen_unit = len(unit_stats.read_text().splitlines()) if unit_stats.exists() else 0
                        own = process_cpu_ms(server.pid)
                        own_unit = unit.cpu_ms()
                        if args.cold:
                            drop_page_cache()
                        if row.fault:
                            fault_at = installed_sock if row.via == "installed" else fault_sock
                            before = server_log_counts(fault_at)
                            t, f, used = fault_round(
                                runtime,
                                work,
                                base,
                                row,
                                hooks[row.via],
                                args.containers,
                                tag,
                                hook_path,
                                fault_at,
                                faulted[row.label],
                            )
                            after = server_log_counts(fault_at)
                            logged[row.label] = tuple(
                                total + a - b for total, a, b in zip(logged[row.label], after, before, strict=True)
                            )  # type: ignore[assignment]
                        else:
                            activate = unit.activate if row.via == "socket-unit" and unit.server is None else None
                            t, f, used = one_round(
                                runtime, work, base, row.env, hooks[row.via], args.containers, tag, activate
                            )
                        by_round[row.label].append(t)
                        times[row.label] += t
                        failures[row.label] += f
                        cpu[row.label] += used
                        if row.via == "server":
                            calls[row.label] += new_lines(stats, seen, args.containers)
                            cpu[row.label] += process_cpu_ms(server.pid) - own
                        if row.via == "socket-unit":
                            calls[row.label] += new_lines(unit_stats, seen_unit, args.containers)
                            cpu[row.label] += unit.cpu_ms() - own_unit
                            if row.label == "socket unit, its server":
                                unit.stop()
                        if row.label in ("installed, its server", "installed, setup's server"):
                            stopped += stop_servers(installed_sock)
                        print(
                            f"round {round_no + 1}, {row.label}: p50 {statistics.median(t):.1f} ms, {len(f)} failed "
                            f"({time.monotonic() - began:.0f} s)",
                            file=sys.stderr,
                            flush=True,
                        )
            finally:
                stopped += stop_servers(installed_sock)
                stop_servers(fault_sock)
        lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        leftover = servers_of(installed_sock)
        server_log = installed_sock.with_name("server.log")
        started = server_log.read_text().count(": listening on ") if server_log.exists() else 0
    print(
        f"{args.containers} concurrent `{Path(runtime).name} run` ({runtime_why}) per round, {args.rounds} rounds "
        f"({args.containers * args.rounds} starts per row); times are start-to-exit of `true`\n"
    )
    print(
        f"{'row':<27}{'failures':>9}{'p50 ms':>9}{'p99 ms':>9}{'p50 / baseline':>16}{'p99 / baseline p99':>20}"
        f"{'hook CPU ms/start':>19}{'queue p50/p99':>15}{'worker p50/p99':>16}"
    )
    baseline, baseline_row = statistics.median(times[rows[0].label]), rows[0].label
    baseline99 = percentile(times[baseline_row], 99)
    starts = args.containers * args.rounds
    for row in rows:
        label = row.label
        p50, p99 = statistics.median(times[label]), percentile(times[label], 99)
        own_cpu = (cpu[label] + sum(call["cpu_ms"] for call in calls[label]) - cpu[baseline_row]) / starts
        cpu_text = "-" if row.env is None or row.fault else f"{own_cpu:.1f}{'*' if row.via == 'installed' else ''}"
        queued = [call["queue_ms"] for call in calls[label] if call.get("queue_ms") is not None]
        worked = [call["worker_ms"] for call in calls[label] if call.get("worker_ms") is not None]
        print(
            f"{label:<27}{len(failures[label]):>9}{p50:>9.1f}{p99:>9.1f}{p50 / baseline:>16.2f}"
            f"{p99 / baseline99:>20.2f}{cpu_text:>19}{spread(queued):>15}{spread(worked):>16}"
        )
    if any(row.via == "installed" for row in rows):
        fault_starts = sum(logged[row.label][1] for row in rows if row.via == "installed" and row.fault)
        setup_starts = args.rounds if any(row.label == "installed, setup's server" for row in rows) else 0
        print(
            f"\n* client side only (the installed rows' server is not the bench's child). Servers: {setup_starts} "
            f"started to stay for setup's row, {started - fault_starts - setup_starts} on demand by the plain rows "
            f"(one per round expected) and {fault_starts} by the fault rows, {stopped} stopped by the bench, "
            f"{len(leftover)} left"
        )
    if any(row.via == "socket-unit" for row in rows):
        print(f"Servers started by the socket unit: {unit.started} (one per round expected)")
    if any(row.fault for row in rows):
        fault_table(rows, by_round, times, failures, faulted, logged)
    if args.reference:
        reference_table(rows, times)
    print(f"\nhook log: {len(lines)} lines; the hook's own duration (duration_ms), p50 / max, by request:")
    for via, asked in sorted({(line.get("via", "direct"), str(line.get("devices", "-"))) for line in lines}):
        mine = [line for line in lines if (line.get("via", "direct"), str(line.get("devices", "-"))) == (via, asked)]
        own = [line["duration_ms"] for line in mine]
        kinds = sorted({line["outcome"] for line in mine})
        print(
            f"  {via:<7} devices {asked:<10} {len(own):>4} x {'/'.join(kinds):<12} "
            f"p50 {statistics.median(own):8.1f} ms   max {max(own):8.1f} ms"
        )
    total = sum(len(f) for f in failures.values()) + len(leftover)
    for label in failures:
        for message in failures[label][:3]:
            print(f"FAILED ({label}): {message}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
