"""A wedged ``nvc-py-hook serve``: a stopped server, or a call left unanswered, costs the calls on a
busy node one hand-over timeout at most (the marker beside the socket, trusted only as a file of
root's alone), systemd's watchdog is fed only while the workers take calls, a wedged worker fails
its call after $NVC_PY_HOOK_TIMEOUT, and both clients read that variable with one grammar.

The server is started inside the test's private mount namespace where the fake driver (a test
double) is active, so its workers see the fake GPUs, as runc's hooks do.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from harness.hookcalls import CANNOT_EXECUTE, MISSING
from harness.hookfixtures import served, setup_dir  # noqa: F401  (fixtures)
from harness.hookserver import BUILT_CLIENT as CLIENT
from harness.hookserver import hook_server
from harness.installed import HOOK
from harness.spares import spare_pids, stop
from nvc.hook.server import handover


def hook_command(client: str, tmp_path: Path) -> tuple[list[str], str]:
    """nvc-py-hook run through the native client or as pip's console script (the Python client):
    (command, the name its lines begin with)."""
    if client == "native":
        return [str(CLIENT), str(HOOK)], CLIENT.name
    script = tmp_path / "nvc-py-hook"
    script.write_text(f"#!{sys.executable}\nfrom nvc.hook.program import run\nrun()\n")
    script.chmod(0o755)
    return [str(script)], "nvc-py-hook"


@contextmanager
def stopped_server(
    setup_dir: Path, *, listener: bool = True
) -> Iterator[tuple[subprocess.Popen[str], dict[str, str], Callable[[], None]]]:
    """A server whose spare workers are stopped (SIGSTOP), and with ``listener`` the server itself:
    (the server, the environment of a call that reaches it, what continues them). Continued at the end."""
    import signal

    top = Path(tempfile.mkdtemp(prefix="nvc-hook-server-"))
    env = {
        handover.SOCKET_ENV: str(top / "run" / "hook.sock"),
        "NVC_PY_CONFIG": str(setup_dir / "config.yaml"),
        "PATH": "/usr/bin:/bin",
    }

    def resume() -> None:
        for pid in stopped:
            with suppress(ProcessLookupError):  # a continued spare that served a call is gone
                os.kill(pid, signal.SIGCONT)

    try:
        with hook_server(HOOK, top / "run" / "hook.sock") as server:
            stopped = [*([server.pid] if listener else []), *spare_pids(server)]
            stop(stopped)
            try:
                yield server, env, resume
            finally:
                resume()
    finally:
        shutil.rmtree(top)


def hook_log_lines(setup_dir: Path) -> list[str]:
    log = setup_dir / "hook.log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("client", ["native", "python"])
def test_a_stopped_server_is_seen_at_once_and_runs_nothing(
    active_2gpu, setup_dir: Path, tmp_path: Path, client: str
) -> None:
    """Server and spare worker stopped (SIGSTOP): the client sees the listener stopped as it connects,
    runs the hook itself at once, and the worker, once continued, runs nothing of that call."""
    with stopped_server(setup_dir) as (server, env, resume):
        lines = len(hook_log_lines(setup_dir))
        started = time.monotonic()
        command, name = hook_command(client, tmp_path)
        result = subprocess.run([*command, "prestart"], capture_output=True, text=True, env=env, input="", timeout=60)
        took = time.monotonic() - started
        print(f"stopped server: the call ran the hook itself after {took:.2f} s")
        running = HOOK if client == "native" else "here"
        assert result.stderr.startswith(f"{name}: the hook server (pid {server.pid}) is stopped; running {running}\n")
        assert result.stderr.count("is stopped") == 1  # the program run after it did not try again
        assert result.returncode == 2  # the hook's own answer to an empty state
        resume()
        again = subprocess.run(
            [str(CLIENT), str(HOOK), "poststart"], capture_output=True, text=True, env=env, timeout=30
        )
        assert (again.returncode, again.stderr) == (0, "")
        time.sleep(0.5)  # the continued worker had its chance to run the abandoned call
    new = hook_log_lines(setup_dir)[lines:]
    assert len(new) == 1 and "via" not in json.loads(new[0])


def concurrent_calls(command: list[str], env: dict[str, str], count: int) -> list[tuple[int, str, float]]:
    """``count`` calls of ``command prestart`` (an empty OCI state: the hook's status 2) at once:
    (status, stderr, seconds) of each."""

    def call(_: int) -> tuple[int, str, float]:
        started = time.monotonic()
        result = subprocess.run([*command, "prestart"], capture_output=True, text=True, env=env, input="", timeout=120)
        return result.returncode, result.stderr, time.monotonic() - started

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(call, range(count)))


@pytest.mark.parametrize("client", ["native", "python"])
def test_a_stopped_server_costs_16_concurrent_calls_the_timeout_once_at_most(
    active_2gpu, setup_dir: Path, tmp_path: Path, client: str
) -> None:
    """The issue's case: a wedged server (here stopped) on a busy node. Each call waited out the
    hand-over timeout on its own before running the hook itself; now at most one does."""
    command, name = hook_command(client, tmp_path)
    with stopped_server(setup_dir) as (server, env, _):
        results = concurrent_calls(command, env, 16)
    waited = [err for _, err, _ in results if "did not answer in" in err]
    print(
        f"16 calls on a stopped server: {len(waited)} waited the timeout; slowest {max(t for *_, t in results):.2f} s"
    )
    assert len(waited) <= 1, waited
    assert [code for code, _, _ in results] == [2] * 16
    assert all(
        err.startswith(f"{name}: the hook server (pid {server.pid}) is stopped; running ")
        for _, err, _ in results
        if err not in waited
    )


@pytest.mark.parametrize("client", ["native", "python"])
def test_a_call_left_unanswered_keeps_the_next_calls_from_waiting(
    active_2gpu, setup_dir: Path, tmp_path: Path, client: str
) -> None:
    """A server wedged otherwise (here its spare workers stopped, its listener running): the first
    call waits the hand-over timeout and leaves a marker beside the socket (root's, 0600); 16
    concurrent calls after it run the hook at once. Once the marker is older than wedge.RETRY one
    call tries the server again, and a server that answers it removes the marker."""
    from nvc.hook.server import wedge

    command, name = hook_command(client, tmp_path)
    with stopped_server(setup_dir, listener=False) as (_, env, resume):
        marker = Path(env[handover.SOCKET_ENV]).with_name(wedge.MARKER)
        first = subprocess.run([*command, "prestart"], capture_output=True, text=True, env=env, input="", timeout=60)
        assert f"{name}: the hook server did not answer in {handover.ACK_TIMEOUT:g} s; running " in first.stderr
        st = marker.lstat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode), stat.S_ISREG(st.st_mode)) == (0, 0o600, True)
        results = concurrent_calls(command, env, 16)
        print(f"16 calls after a timeout: slowest {max(t for *_, t in results):.2f} s")
        assert [(code, err.split("; running ")[0]) for code, err, _ in results] == [
            (2, f"{name}: the hook server left a call unanswered less than {wedge.RETRY} s ago")
        ] * 16
        resume()
        lines = len(hook_log_lines(setup_dir))
        old = time.time() - wedge.RETRY - 1
        os.utime(marker, (old, old))
        again = subprocess.run([*command, "prestart"], capture_output=True, text=True, env=env, input="", timeout=60)
        assert again.returncode == 2 and "hook server" not in again.stderr
        assert json.loads(hook_log_lines(setup_dir)[lines])["via"] == "server"  # tried again, and served
        assert not marker.exists()


@pytest.mark.parametrize("plant", ["another-users", "group-writable", "symlink", "fifo"])
@pytest.mark.parametrize("client", ["native", "python"])
def test_a_marker_that_is_no_file_of_roots_alone_is_ignored(
    served: Path, setup_dir: Path, tmp_path: Path, client: str, plant: str
) -> None:
    """The marker is trusted under the socket directory's rules: anything but a regular file of
    root's that group and others cannot write keeps no call away, and is never written through."""
    from nvc.hook.server import wedge

    marker = served.with_name(wedge.MARKER)
    target = tmp_path / "target"
    target.write_text("")
    if plant == "symlink":
        marker.symlink_to(target)
    elif plant == "fifo":
        os.mkfifo(marker, 0o600)
    else:
        marker.write_text("")
        marker.chmod(0o620 if plant == "group-writable" else 0o600)
        os.chown(marker, 1000 if plant == "another-users" else 0, 0)
    before = (marker.lstat(), target.stat())
    command, _ = hook_command(client, tmp_path)
    env = {handover.SOCKET_ENV: str(served), "NVC_PY_CONFIG": str(setup_dir / "config.yaml"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([*command, "prestart"], capture_output=True, text=True, env=env, input="", timeout=60)
    assert result.returncode == 2 and "hook server" not in result.stderr
    assert json.loads(hook_log_lines(setup_dir)[-1])["via"] == "server"
    assert (marker.lstat(), target.stat()) == before


def keep_alives(manager: socket.socket, seconds: float) -> list[bytes]:
    """The sd_notify datagrams ``manager`` (systemd's end of $NOTIFY_SOCKET) got within ``seconds``."""
    got, deadline = [], time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        manager.settimeout(left)
        try:
            got.append(manager.recv(4096))
        except TimeoutError:
            break
    return got


def test_the_server_keeps_systemds_watchdog_fed_only_while_its_workers_take_calls(active_2gpu, tmp_path: Path) -> None:
    """With WatchdogSec= (here 0.4 s: WATCHDOG_USEC) the server sends WATCHDOG=1 every half of it
    from its accept loop; while a call waits in its queue and no worker takes it (its spares
    stopped), it sends none, so systemd replaces it; once the workers take calls again, it sends
    again. A server not named by WATCHDOG_PID sends nothing."""
    import signal

    manager = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    manager.bind(str(tmp_path / "notify"))
    sock = tmp_path / "run" / "hook.sock"
    env = {"NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "400000"}
    wrapper = ["env", *(f"{name}={value}" for name, value in env.items())]
    with hook_server(HOOK, sock, wrapper=wrapper) as server:
        assert keep_alives(manager, 1.0).count(b"WATCHDOG=1") >= 3
        spares = spare_pids(server)
        stop(spares)
        queued = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        queued.connect(str(sock))  # a call no worker takes
        keep_alives(manager, 0.3)  # the one due before it was seen
        assert keep_alives(manager, 1.0) == []
        for pid in spares:
            os.kill(pid, signal.SIGCONT)
        assert keep_alives(manager, 1.0).count(b"WATCHDOG=1") >= 3
        queued.close()
    with hook_server(HOOK, sock, wrapper=[*wrapper, "WATCHDOG_PID=1"]):
        assert keep_alives(manager, 0.6) == []
    manager.close()


def test_a_server_clears_a_marker_as_it_starts(active_2gpu, setup_dir: Path) -> None:
    """Calls that found its predecessor wedged try a new server at once."""
    from nvc.hook.server import wedge

    top = Path(tempfile.mkdtemp(prefix="nvc-hook-server-"))
    try:
        (top / "run").mkdir(mode=0o700)
        (top / "run" / wedge.MARKER).write_text("")
        with hook_server(HOOK, top / "run" / "hook.sock"):
            assert not (top / "run" / wedge.MARKER).exists()
    finally:
        shutil.rmtree(top)


@pytest.mark.parametrize("client", ["native", "python"])
def test_a_wedged_worker_fails_the_call_after_the_timeout(
    served: Path, setup_dir: Path, tmp_path: Path, client: str
) -> None:
    """Once the worker has the call (`go` sent), the client never falls back: a worker that gives
    no status in $NVC_PY_HOOK_TIMEOUT seconds (here: waiting on a stdin nobody writes) is killed
    (the caller's streams it held close: capture_output returns) and the call fails with one line."""
    stdin_r, stdin_w = os.pipe()
    env = {handover.SOCKET_ENV: str(served), handover.TIMEOUT_ENV: "1", "NVC_PY_CONFIG": str(setup_dir / "config.yaml")}
    try:
        started = time.monotonic()
        command, name = hook_command(client, tmp_path)
        result = subprocess.run(
            [*command, "prestart"], capture_output=True, text=True, env=env, stdin=stdin_r, timeout=60
        )
        print(f"wedged worker: the call failed after {time.monotonic() - started:.2f} s")
    finally:
        os.close(stdin_r)
        os.close(stdin_w)
    assert (result.returncode, result.stderr) == (
        1,
        f"{name}: the hook server's worker gave no status in 1 s (killed)\n",
    )


@pytest.mark.parametrize(
    "text, micro",
    [
        ("60", 60_000_000),
        ("0.5", 500_000),
        (".5", 500_000),
        ("5.", 5_000_000),
        ("007", 7_000_000),
        ("0.0000001", 1),
        ("0.000001", 1),
        ("0.0000011", 2),
        ("0.9999999", 1_000_000),
        ("999999999", 999_999_999_000_000),
        ("0." + "0" * 29 + "1", 1),
        ("1000000000", None),
        ("0", None),
        ("0.000", None),
        ("", None),
        (".", None),
        ("-1", None),
        ("+1", None),
        (" 1", None),
        ("1 ", None),
        ("1e-7", None),
        ("0x10", None),
        ("inf", None),
        ("nan", None),
        ("1.2.3", None),
        ("\u0663", None),
        ("1" * 5000, None),
        ("0." + "0" * 4997 + "1", None),
    ],
)
def test_nvc_py_hook_timeout_grammar(text: str, micro: int | None) -> None:
    """Decimal seconds rounded up to whole microseconds; anything else (None) means the default."""
    assert handover.timeout_us(text) == micro


# $NVC_PY_HOOK_TIMEOUT and the seconds a client then waits for ``ready``: min(ACK_TIMEOUT, it), the
# default (60 s) for what the grammar refuses.
TIMEOUTS = [
    ("0.0000001", 1e-06),
    ("0.000001", 1e-06),
    ("0.3", 0.3),
    (".25", 0.25),
    ("1.", 1.0),
    ("0", 2.0),
    ("-1", 2.0),
    ("1e-7", 2.0),
    ("junk", 2.0),
    ("9" * 10, 2.0),
    ("1" * 5000, 2.0),
    ("0." + "0" * 4997 + "1", 2.0),
]


def test_both_clients_read_nvc_py_hook_timeout_alike(tmp_path: Path) -> None:
    """One grammar (handover.timeout_us) in both clients: against a wedged server (a listening
    socket nobody accepts on, one per call: a call that times out marks its server wedged for the
    calls after it) each value bounds the wait for ``ready`` alike, and both say so in the same
    words; none waits for ever, as a value under 1 µs once did in the native client (its socket
    timeout rounded to 0, which means none)."""
    code = "from nvc.hook.server.handover import hand_over; hand_over(['/x/nvc-py', '--version']); print('ran here')"
    commands = {
        "native": ([str(CLIENT), MISSING, "--version"], (127, "", f"running {MISSING}\n{CANNOT_EXECUTE}")),
        "python": ([sys.executable, "-c", code], (0, "ran here\n", "running here\n")),
    }
    cases = [(client, value) for client in commands for value, _ in TIMEOUTS]
    wedged = []
    for number in range(len(cases)):
        (tmp_path / str(number)).mkdir(mode=0o700)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(str(tmp_path / str(number) / "hook.sock"))
        listener.listen(1)
        wedged.append(listener)

    def call(number: int) -> tuple[str, float, subprocess.CompletedProcess[str]]:
        client, value = cases[number]
        started = time.monotonic()
        result = subprocess.run(
            commands[client][0],
            capture_output=True,
            text=True,
            timeout=30,
            env={handover.SOCKET_ENV: str(tmp_path / str(number) / "hook.sock"), handover.TIMEOUT_ENV: value},
        )
        return client, time.monotonic() - started, result

    try:
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(call, range(len(cases))))
    finally:
        for listener in wedged:
            listener.close()
    for (client, took, result), (value, waited) in zip(results, TIMEOUTS * 2, strict=True):
        code, out, err_end = commands[client][1]
        said = re.fullmatch(r"[\w-]+: the hook server did not answer in (\S+) s; (.*\n)+", result.stderr)
        assert said and said.group(1) == f"{waited:g}", (client, value[:20], result.stderr)
        assert (result.returncode, result.stdout) == (code, out) and result.stderr.endswith(err_end)
        assert took < waited + 3, (client, value[:20], took)
