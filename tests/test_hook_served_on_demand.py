"""Served by default, on demand: the native front starts one hook server per host (a storm of first
calls starts exactly one), only from PID 1's namespaces and only in a trusted directory; a killed,
stopped or silent server loses no call and is replaced; an idle one stops.

Every server here runs in the test's private mount namespace with its socket in the test's temporary
directory; the on-demand ones are told (NVC_PY_HOST_PID) that this test process stands for the
host, and are killed at the end of their test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path

import pytest

from harness.hookserver import LIBDIR, hook_server
from harness.installed import HOOK
from harness.ondemand import (
    STORM,
    log_lines,
    no_gpu_state,  # noqa: F401  (fixture)
    prestart,
    servers,
)
from nvc.hook.server import handover


def test_a_storm_of_first_calls_starts_exactly_one_server(no_gpu_state) -> None:
    env, bundle = no_gpu_state
    sock = Path(env[handover.SOCKET_ENV])
    leak_r, leak_w = os.pipe()  # a descriptor the runtime leaks to its hooks: never kept by the server
    try:
        with ThreadPoolExecutor(STORM) as pool:
            results = list(pool.map(lambda i: prestart(env, bundle, f"storm-{i}", pass_fds=(leak_w,)), range(STORM)))
        assert [(r.returncode, r.stderr) for r in results] == [(0, "")] * STORM
        pids = servers(sock)
        assert len(pids) == 1, pids
        server = pids[0]
        lines = log_lines(env)
        assert sorted(line["container"] for line in lines) == sorted(f"storm-{i}" for i in range(STORM))
        assert {line["outcome"] for line in lines} == {"no-gpu"}
        # the others waited for it (up to 1 s each; a call that waited longer ran directly, as it may)
        assert any(line.get("via") == "server" for line in lines)
        for ns in ("mnt", "pid", "user", "net"):  # the "host's" (this process's), not a caller's
            assert os.readlink(f"/proc/{server}/ns/{ns}") == os.readlink(f"/proc/self/ns/{ns}")
        assert Path(f"/proc/{server}/cgroup").read_text() == Path("/proc/self/cgroup").read_text()
        assert os.getsid(server) != os.getsid(0)  # detached: a session of its own
        leaked = os.readlink(f"/proc/self/fd/{leak_w}")
        assert leaked not in {os.readlink(f"/proc/{server}/fd/{fd}") for fd in os.listdir(f"/proc/{server}/fd")}
        # the next call is served by it, and starts nothing more
        assert prestart(env, bundle, "after").returncode == 0
        assert log_lines(env)[-1].get("via") == "server" and servers(sock) == [server]
    finally:
        os.close(leak_r)
        os.close(leak_w)


def test_killing_the_server_mid_storm_loses_no_call(no_gpu_state) -> None:
    """Each call is served or run directly, never lost: calls queued when the server dies are reset
    by the kernel, and their clients run the hook themselves (or start the next server)."""
    env, bundle = no_gpu_state
    sock = Path(env[handover.SOCKET_ENV])
    assert prestart(env, bundle, "first").returncode == 0
    calls = 4 * STORM
    done_at_kill = []

    def killer() -> None:  # once a third of the calls are done
        deadline = time.monotonic() + 60
        while len(log_lines(env)) < 1 + calls // 3 and time.monotonic() < deadline:
            time.sleep(0.002)
        for pid in servers(sock):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        done_at_kill.append(len(log_lines(env)) - 1)

    thread = threading.Thread(target=killer)
    with ThreadPoolExecutor(STORM) as pool:
        thread.start()
        results = list(pool.map(lambda i: prestart(env, bundle, f"kill-{i}"), range(calls)))
    thread.join()
    assert 0 < done_at_kill[0] < calls  # killed mid-storm
    assert [(r.returncode, r.stderr) for r in results] == [(0, "")] * calls
    lines = [line for line in log_lines(env) if line["container"].startswith("kill-")]
    assert sorted(line["container"] for line in lines) == sorted(f"kill-{i}" for i in range(calls))


def stopped_server(env: dict[str, str], bundle: Path, *, listener: bool = True) -> tuple[int, list[int]]:
    """An on-demand server started by a first call, its spare workers stopped and with ``listener``
    the server itself: (its pid, the stopped pids)."""
    from harness.spares import spare_pids, stop

    assert prestart(env, bundle, "first").returncode == 0
    (server,) = servers(Path(env[handover.SOCKET_ENV]))
    proc = subprocess.Popen.__new__(subprocess.Popen)  # spare_pids reads only .pid
    proc.pid = server
    stopped = [*([server] if listener else []), *spare_pids(proc)]
    stop(stopped)
    return server, stopped


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie its parent has not reaped yet counts), within 5 s."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2][:1] in "ZX":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.02)
    return False


def storm(env: dict[str, str], bundle: Path, name: str, count: int) -> list[subprocess.CompletedProcess[str]]:
    with ThreadPoolExecutor(min(count, STORM)) as pool:
        return list(pool.map(lambda i: prestart(env, bundle, f"{name}-{i}"), range(count)))


def test_a_stopped_on_demand_server_is_replaced_once_and_costs_no_call_the_timeout(no_gpu_state) -> None:
    """Without systemd the next on-demand start replaces a wedged server: of 16 calls at once on a
    stopped server, one ends it (under the start lock) and starts the next, the others wait for that
    one as for any start; none waits out the hand-over timeout, and one server serves afterwards."""
    env, bundle = no_gpu_state
    sock = Path(env[handover.SOCKET_ENV])
    old, _ = stopped_server(env, bundle)
    results = storm(env, bundle, "stopped", 16)
    assert [r.returncode for r in results] == [0] * 16
    assert not [r.stderr for r in results if "did not answer" in r.stderr]
    (new,) = servers(sock)
    assert new != old and gone(old)
    log = sock.with_name("server.log").read_text()
    assert log.count(f"ended the wedged hook server (pid {old}) to start another") == 1, log
    assert prestart(env, bundle, "after").returncode == 0 and log_lines(env)[-1].get("via") == "server"


def test_a_silent_on_demand_server_is_replaced_after_one_timeout(no_gpu_state) -> None:
    """A server wedged otherwise (its workers stopped, its listener running): the call that waits
    out the hand-over timeout ends it and hands its call to the next server; the calls after it
    are served at once."""
    from nvc.hook.server import wedge

    env, bundle = no_gpu_state
    sock = Path(env[handover.SOCKET_ENV])
    old, stopped = stopped_server(env, bundle, listener=False)
    started = time.monotonic()
    first = prestart(env, bundle, "silent")
    took = time.monotonic() - started
    assert (first.returncode, first.stderr) == (0, "")
    assert handover.ACK_TIMEOUT <= took < handover.ACK_TIMEOUT + 5
    assert log_lines(env)[-1].get("via") == "server"  # the new server's
    (new,) = servers(sock)
    assert new != old and gone(old)
    assert not sock.with_name(wedge.MARKER).exists()  # the new server cleared it
    assert all(gone(pid) for pid in stopped)  # idle spares went with their server
    results = storm(env, bundle, "after", 8)
    assert [(r.returncode, r.stderr) for r in results] == [(0, "")] * 8


def test_a_server_killed_again_and_again_mid_storm_fails_no_start(no_gpu_state) -> None:
    """The server SIGKILLed every 0.15 s while storms of 32 calls run, until it was killed four
    times: every call is served or runs the hook itself, and a next call starts a server on demand."""
    env, bundle = no_gpu_state
    sock = Path(env[handover.SOCKET_ENV])
    assert prestart(env, bundle, "first").returncode == 0
    done = threading.Event()
    kills = []

    def killer() -> None:
        while not done.wait(0.15):
            for pid in servers(sock):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    kills.append(pid)

    thread = threading.Thread(target=killer)
    thread.start()
    results = []
    try:
        while len(kills) < 4 and len(results) < 20 * STORM:
            results += storm(env, bundle, f"killed-{len(results) // STORM}", STORM)
    finally:
        done.set()
        thread.join()
    print(f"{len(kills)} servers killed during {len(results)} calls")
    assert len(kills) >= 4
    assert [(r.returncode, r.stderr) for r in results] == [(0, "")] * len(results)
    assert len([line for line in log_lines(env) if line["container"].startswith("killed-")]) == len(results)


NEVER_ACCEPTS = """
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind(sys.argv[1])
s.listen(8)
print("listening", flush=True)
time.sleep(120)
"""


def test_a_silent_listener_that_is_no_server_of_this_socket_is_never_killed(no_gpu_state) -> None:
    """A call that times out replaces only `nvc-py-hook serve --socket` of this very socket: any
    other listener there (here a program that never accepts) is left alone, and the call runs the
    hook itself."""
    env, bundle = no_gpu_state
    sock = Path(env[handover.SOCKET_ENV])
    sock.parent.mkdir(mode=0o700)
    other = subprocess.Popen([sys.executable, "-c", NEVER_ACCEPTS, str(sock)], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline() == "listening\n"
        result = prestart(env, bundle, "other")
        assert result.returncode == 0
        assert result.stderr == (
            f"nvc-py-hook: the hook server did not answer in {handover.ACK_TIMEOUT:g} s; running "
            f"{LIBDIR / 'nvc-py-hook-python'}\n"
        )
        assert other.poll() is None and not servers(sock)
    finally:
        other.kill()
        other.wait()


def test_no_server_file_keeps_the_hook_from_starting_one(no_gpu_state) -> None:
    env, bundle = no_gpu_state
    Path(env["NVC_PY_CONFIG"]).with_name("no-server").write_text("")
    result = prestart(env, bundle, "direct")
    assert (result.returncode, result.stderr) == (0, "")
    assert "via" not in log_lines(env)[-1] and not servers(Path(env[handover.SOCKET_ENV]))


def test_a_caller_in_other_namespaces_starts_no_server(no_gpu_state) -> None:
    env, bundle = no_gpu_state
    result = prestart(env, bundle, "elsewhere", "unshare", "--mount")
    assert (result.returncode, result.stderr) == (0, "")
    assert "via" not in log_lines(env)[-1] and not servers(Path(env[handover.SOCKET_ENV]))


@pytest.mark.parametrize("kind", ["another-users", "group-writable", "a-symlink"])
def test_no_server_is_started_in_a_socket_directory_others_control(no_gpu_state, tmp_path: Path, kind: str) -> None:
    """The on-demand start writes its lock and log beside the socket: only in a directory the
    clients would trust (root's, not a symlink, not writable by group or others). Elsewhere nothing
    is created there, and the call runs the hook itself, saying why in one line."""
    env, bundle = no_gpu_state
    sock = Path(env[handover.SOCKET_ENV])
    directory = tmp_path / "elsewhere" if kind == "a-symlink" else sock.parent
    directory.mkdir(mode=0o700)
    if kind == "a-symlink":
        sock.parent.symlink_to(directory)
    elif kind == "another-users":
        os.chown(directory, 1000, 1000)
    else:
        directory.chmod(0o770)
    result = prestart(env, bundle, "untrusted-directory")
    assert (result.returncode, result.stderr) == (
        0,
        f"nvc-py-hook: not starting the hook server ({sock}: its "
        "directory is not root's, or others can write there); running "
        f"{LIBDIR / 'nvc-py-hook-python'}\n",
    )
    assert "via" not in log_lines(env)[-1] and not servers(sock)
    assert list(directory.iterdir()) == []


def prestart_until_streams_end(env: dict[str, str], bundle: Path, name: str) -> tuple[int, str, float]:
    """``nvc-py-hook prestart`` through the installed front with pipes as stdout and stderr, as a
    runtime reads a hook's: (status, stderr, seconds from its exit until both pipes ended)."""
    import select

    state = json.dumps(
        {"ociVersion": "1.0.2", "id": name, "pid": os.getpid(), "bundle": str(bundle), "status": "creating"}
    )
    proc = subprocess.Popen(
        [str(LIBDIR / "nvc-py-hook"), "prestart"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdin and proc.stdout and proc.stderr
    proc.stdin.write(state.encode())
    proc.stdin.close()
    code = proc.wait(timeout=60)
    exited, err, open_streams = time.monotonic(), b"", {proc.stdout, proc.stderr}
    while open_streams and time.monotonic() < exited + 10:
        for stream in select.select(list(open_streams), [], [], 0.1)[0]:
            chunk = os.read(stream.fileno(), 4096)
            err += chunk if stream is proc.stderr else b""
            if not chunk:
                open_streams.discard(stream)
    for stream in (proc.stdout, proc.stderr):
        stream.close()
    return code, err.decode(), time.monotonic() - exited if not open_streams else float("inf")


@pytest.mark.parametrize(
    "name, kind",
    [
        ("server.log", "fifo"),
        ("server.log", "symlink"),
        ("server.lock", "fifo"),
        ("server.lock", "another-users"),
        ("server.lock", "readable-by-others"),
    ],
)
def test_a_start_lock_or_log_that_is_no_file_of_roots_alone_is_not_used(
    no_gpu_state, tmp_path: Path, name: str, kind: str
) -> None:
    """Opened without blocking or following a link, and used only as a regular file of root's: a
    FIFO as server.log once blocked the detached start for ever, as root, holding the start lock
    (no server ever started) and the first caller's stdout and stderr (a runtime reading them
    waited for ever). Now the call ends and its pipes with it; a log that is not one is replaced by
    /dev/null (the server starts), a lock that is not one means the call runs the hook itself; and
    so does the next call: nothing is left stuck."""
    env, bundle = no_gpu_state
    sock = Path(env[handover.SOCKET_ENV])
    sock.parent.mkdir(mode=0o700)
    planted = sock.parent / name
    if kind == "fifo":
        os.mkfifo(planted, 0o600)
    elif kind == "symlink":
        (tmp_path / "target").write_text("")
        planted.symlink_to(tmp_path / "target")
    else:
        planted.touch(mode=0o644 if kind == "readable-by-others" else 0o600)
        os.chown(planted, 1000 if kind == "another-users" else 0, 0)
    for call in ("first", "second"):
        code, err, ended = prestart_until_streams_end(env, bundle, f"planted-{call}")
        assert ended < 2, f"the {call} call's stdout and stderr did not end with it"
        assert code == 0
        if name == "server.log":  # the server starts, logging nowhere; the second call is its
            assert err == ""
            assert call == "first" or log_lines(env)[-1].get("via") == "server"
        else:
            assert err == (
                f"nvc-py-hook: not starting the hook server ({sock}: its server.lock is not a regular file "
                f"only root can open); running {LIBDIR / 'nvc-py-hook-python'}\n"
            )
            assert "via" not in log_lines(env)[-1] and not servers(sock)
    assert (tmp_path / "target").read_text() == "" if kind == "symlink" else planted.exists()


def test_an_idle_on_demand_server_stops(active_2gpu, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVC_PY_SERVE_IDLE_EXIT", "0.5")
    sock = tmp_path / "run" / "hook.sock"
    with hook_server(HOOK, sock) as proc:
        assert proc.wait(timeout=30) == 0
        assert "no call for 0.5 s: stopping" in proc.stderr.read()
        assert not sock.exists()


# A runtime that is a child subreaper and, like crun's `run`, returns only once every child it adopted
# has exited: runs its arguments, then reaps until none is left; prints the seconds that took.
SUBREAPER_RUNTIME = """
import ctypes, os, subprocess, sys, time
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
start = time.monotonic()
code = subprocess.run(sys.argv[1:]).returncode
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
print(f"{time.monotonic() - start:.1f}", file=sys.stderr)
sys.exit(code)
"""


def test_a_runtime_that_adopts_the_on_demand_server_is_not_held(no_gpu_state) -> None:
    """The server a hook call starts goes to a subreaper runtime among the call's ancestors (crun):
    it serves that call, then stops once idle for a moment, so that such a runtime, which waits for
    what it adopted, returns in about a second instead of the server's 10 minutes of idle time."""
    env, bundle = no_gpu_state
    sock = Path(env[handover.SOCKET_ENV])
    result = prestart(env, bundle, "adopted", sys.executable, "-c", SUBREAPER_RUNTIME)
    assert result.returncode == 0, result.stderr
    assert float(result.stderr.split()[-1]) < 10
    assert log_lines(env)[-1].get("via") == "server"
    assert not servers(sock) and not sock.exists()
    log = sock.with_name("server.log").read_text()
    assert "no call for 0.5 s: stopping (pid " in log and "adopted this server" in log, log
