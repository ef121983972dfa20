"""Served by default: the hook server started by systemd's socket unit or on demand by the native
front, set up by ``nvc-py setup``, limited to the hook's commands, isolated from the caller's Python
environment, and out of pip's reach.

Every server here runs in the test's private mount namespace with its socket in the test's temporary
directory; the on-demand ones are told (NVC_PY_HOST_PID) that this test process stands for the
host, and are killed at the end of their test.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path

import pytest

from harness.bundle import make_bundle
from harness.hookcalls import call_directly
from harness.hookfixtures import default_run_dir, served  # noqa: F401  (fixtures)
from harness.hookserver import LIBDIR, REPO, hook_server
from harness.installed import FRONT, HOOK
from nvc.hook import handover

STORM = 32


def servers(sock: Path) -> list[int]:
    """Pids of the ``nvc-py-hook serve`` processes of ``sock`` (not their workers, forked from them)."""
    wanted = f"\0serve\0--socket\0{sock}\0".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and wanted in (entry / "cmdline").read_bytes():
                found[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return sorted(pid for pid, parent in found.items() if parent not in found)


def kill_servers(sock: Path) -> None:
    for pid in servers(sock):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while servers(sock) and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture
def no_gpu_state(active_2gpu, debian_rootfs: Path, tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    """The environment of a hook that reaches an on-demand server in tmp_path/run (this process's
    namespaces and cgroups stand for the host's), and a bundle asking for no GPU; servers that
    the test's calls started are killed at the end."""
    sock = tmp_path / "run" / "hook.sock"
    config = tmp_path / "config.yaml"
    config.write_text(f"root: {active_2gpu.root}\nload-kmods: false\nlog: {{file: {tmp_path / 'hook.log'}}}\n")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NVC_PY_CONFIG": str(config), handover.SOCKET_ENV: str(sock),
           "NVC_PY_HOST_PID": str(os.getpid())}
    bundle = make_bundle(tmp_path / "bundle", debian_rootfs, ["true"])
    try:
        yield env, bundle
    finally:
        kill_servers(sock)


def prestart(env: dict[str, str], bundle: Path, name: str, *wrapper: str, **popen) -> subprocess.CompletedProcess[str]:
    """``nvc-py-hook prestart`` through the installed front, as a runtime runs it (through ``wrapper``)."""
    state = json.dumps({"ociVersion": "1.0.2", "id": name, "pid": os.getpid(), "bundle": str(bundle),
                        "status": "creating"})
    return subprocess.run([*wrapper, str(LIBDIR / "nvc-py-hook"), "prestart"], input=state, capture_output=True,
                          text=True, env=env, timeout=60, **popen)


def log_lines(env: dict[str, str]) -> list[dict]:
    path = Path(env["NVC_PY_CONFIG"]).with_name("hook.log")
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


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
    from nvc.hook import wedge

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
        assert result.stderr == (f"nvc-py-hook: the hook server did not answer in {handover.ACK_TIMEOUT:g} s; running "
                                 f"{LIBDIR / 'nvc-py-hook-python'}\n")
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
    assert (result.returncode, result.stderr) == (0, f"nvc-py-hook: not starting the hook server ({sock}: its "
                                                     "directory is not root's, or others can write there); running "
                                                     f"{LIBDIR / 'nvc-py-hook-python'}\n")
    assert "via" not in log_lines(env)[-1] and not servers(sock)
    assert list(directory.iterdir()) == []


def prestart_until_streams_end(env: dict[str, str], bundle: Path, name: str) -> tuple[int, str, float]:
    """``nvc-py-hook prestart`` through the installed front with pipes as stdout and stderr, as a
    runtime reads a hook's: (status, stderr, seconds from its exit until both pipes ended)."""
    import select

    state = json.dumps({"ociVersion": "1.0.2", "id": name, "pid": os.getpid(), "bundle": str(bundle),
                        "status": "creating"})
    proc = subprocess.Popen([str(LIBDIR / "nvc-py-hook"), "prestart"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
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


@pytest.mark.parametrize("name, kind", [("server.log", "fifo"), ("server.log", "symlink"), ("server.lock", "fifo"),
                                        ("server.lock", "another-users"), ("server.lock", "readable-by-others")])
def test_a_start_lock_or_log_that_is_no_file_of_roots_alone_is_not_used(no_gpu_state, tmp_path: Path, name: str,
                                                                        kind: str) -> None:
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
            assert err == (f"nvc-py-hook: not starting the hook server ({sock}: its server.lock is not a regular file "
                           f"only root can open); running {LIBDIR / 'nvc-py-hook-python'}\n")
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


def systemd_socket(path: Path, kind: int = socket.SOCK_SEQPACKET) -> socket.socket:
    """A listening socket as systemd's socket unit makes it."""
    path.parent.mkdir(mode=0o700)
    sock = socket.socket(socket.AF_UNIX, kind)
    sock.bind(str(path))
    sock.listen(16)
    return sock


def activated(fd: int) -> list[str]:
    """A wrapper that hands the server ``fd`` as systemd does: as fd 3, LISTEN_PID its pid."""
    move = "" if fd == 3 else f"exec 3<&{fd} {fd}<&-; "
    return ["bash", "-c", f'{move}LISTEN_PID=$$ LISTEN_FDS=1 exec "$@"', "bash"]


def test_a_socket_activated_server_serves_the_inherited_socket(active_2gpu, tmp_path: Path) -> None:
    path = tmp_path / "run" / "hook.sock"
    listening = systemd_socket(path)
    with listening, hook_server(HOOK, tmp_path / "unused.sock", activated(listening.fileno()),
                                (listening.fileno(),)) as proc:
        result = subprocess.run([str(FRONT), "--root", str(active_2gpu.root), "--debug", str(tmp_path / "debug.log"),
                                 "list"], capture_output=True, text=True, env={handover.SOCKET_ENV: str(path)},
                                timeout=30)
        assert result.returncode == 0, result.stderr
        pids = {int(line.split()[2]) for line in (tmp_path / "debug.log").read_text().splitlines()
                if line[:1] in "DI"}
        assert pids and os.getpid() not in pids and proc.pid not in pids  # a worker's
    assert proc.returncode == 0 and path.exists()  # systemd's socket: not unlinked, never bound here
    assert not (tmp_path / "unused.sock").exists()


@pytest.mark.parametrize("kind", [socket.SOCK_STREAM, socket.SOCK_DGRAM])
def test_a_socket_activated_server_refuses_another_kind_of_socket(active_2gpu, tmp_path: Path, kind: int) -> None:
    path = tmp_path / "run" / "hook.sock"
    sock = socket.socket(socket.AF_UNIX, kind)
    path.parent.mkdir(mode=0o700)
    sock.bind(str(path))
    with sock:
        result = subprocess.run([*activated(sock.fileno()), str(HOOK), "serve", "--socket", str(path)],
                                capture_output=True, text=True, pass_fds=(sock.fileno(),), timeout=60)
    assert result.returncode == 2
    assert result.stderr.endswith("fd 3 from systemd: not a listening AF_UNIX SOCK_SEQPACKET socket\n")


@pytest.mark.parametrize("argv", [
    ["/x/nvc-py", "setup", "podman", "--hooks-dir", "{tmp}/hooks.d"],
    ["/x/nvc-py", "--root", "/", "config", "show"],
    ["/x/nvc-py", "share", "status"],
    ["/x/nvc-py", "-V"],
    ["/x/nvc-py", "--bogus", "info"],
    ["/x/nvc-py", "--root", "/", "hook", "prestart"],
    ["/x/nvc-py-hook", "bogus"],
], ids=["setup", "config", "share", "version", "unknown-option", "cli-hook", "hook-usage"])
def test_the_server_runs_only_the_hook_and_read_only_commands(served: Path, tmp_path: Path, argv: list[str]) -> None:
    """Anything but the hook's stages and configure/info/list is the caller's to run, as itself."""
    answers, err = call_directly(served, [word.format(tmp=tmp_path) for word in argv])
    assert (answers, err) == ([b"fall back"], "")
    assert not (tmp_path / "hooks.d").exists()


def test_the_server_runs_list_info_and_the_hook(active_2gpu, served: Path) -> None:
    root = str(active_2gpu.root)
    for argv in (["/x/nvc-py", "-r", root, "list"], ["/x/nvc-py", f"--root={root}", "info", "--csv"],
                 ["/x/nvc-py-hook", "poststart"]):
        assert call_directly(served, argv) == ([b"ready", b"exit 0"], ""), argv


def setup_podman(tmp_path: Path, *args: str, wrap: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    (tmp_path / "config.yaml").touch()  # setup refuses a configuration file the hooks could not read
    command = [*wrap, str(FRONT), "setup", "podman", "--hooks-dir", str(tmp_path / "hooks.d"),
               "--config", str(tmp_path / "config.yaml"), *args]
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=60)


def test_setup_podman_writes_the_socket_unit(tmp_path: Path) -> None:
    out = setup_podman(tmp_path, "--unit-dir", str(tmp_path / "units")).stdout.splitlines()
    socket_unit, service = tmp_path / "units" / "nvc-py-hook.socket", tmp_path / "units" / "nvc-py-hook.service"
    assert out[2:] == [f"wrote {socket_unit}", f"wrote {service}",
                       "not enabled (systemd is not running): systemctl enable --now nvc-py-hook.socket"]
    lines = socket_unit.read_text().splitlines()
    for line in ("ListenSequentialPacket=/run/nvc-py/hook.sock", "SocketMode=0600", "DirectoryMode=0700",
                 "SocketUser=root", "SocketGroup=root", "WantedBy=sockets.target"):
        assert line in lines
    assert "Requires=nvc-py-hook.socket" in service.read_text().splitlines()
    assert not (tmp_path / "no-server").exists()


def test_setup_podman_where_systemd_runs_enables_the_socket(tmp_path: Path) -> None:
    """systemd "runs" in a private mount namespace: /run/systemd/system and the system's unit
    directory are tmpfs there; the systemctl run is a stand-in that records its arguments."""
    record = tmp_path / "systemctl.log"
    systemctl = tmp_path / "systemctl"
    systemctl.write_text(f'#!/bin/sh\necho "$@" >> {record}\n')
    systemctl.chmod(0o755)
    wrap = ("unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/system && '
            'mount -t tmpfs tmpfs /etc/systemd/system && "$@" && cat /etc/systemd/system/nvc-py-hook.socket', "sh")
    out = setup_podman(tmp_path, "--systemctl", str(systemctl), wrap=wrap).stdout
    assert "wrote /etc/systemd/system/nvc-py-hook.socket\nwrote /etc/systemd/system/nvc-py-hook.service\n" \
           "enabled and started nvc-py-hook.socket\n" in out
    assert "ListenSequentialPacket=/run/nvc-py/hook.sock\n" in out
    assert record.read_text() == "daemon-reload\nenable --now nvc-py-hook.socket\ntry-restart nvc-py-hook.service\n"
    assert not Path("/etc/systemd/system/nvc-py-hook.socket").exists()


def test_setup_podman_no_server(tmp_path: Path) -> None:
    out = setup_podman(tmp_path, "--no-server", "--unit-dir", str(tmp_path / "units")).stdout.splitlines()
    assert out[2:] == [f"wrote {tmp_path / 'no-server'}"] and not (tmp_path / "units").exists()
    out = setup_podman(tmp_path).stdout.splitlines()  # served again: the hooks may start a server
    assert out[2:] == ["systemd is not running: no units written (the hook client starts the server on demand)",
                       f"removed {tmp_path / 'no-server'}"]


SHADOWS = ("json", "yaml", "click", "elftools", "nvc")


@pytest.fixture
def hostile_python_env(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    """A caller's environment whose PYTHONPATH holds modules named like nvc-py's imports (each leaves
    a marker when imported), with PYTHONHOME and PYTHONSTARTUP that would break or hijack Python."""
    evil, marker = tmp_path / "evil", tmp_path / "imported"
    for name in SHADOWS:
        (evil / name).mkdir(parents=True)
        (evil / name / "__init__.py").write_text(f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n")
    (tmp_path / "startup.py").write_text(f"open({str(marker)!r}, 'a').write('startup\\n')\n")
    yield {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": str(evil), "PYTHONHOME": str(evil),
           "PYTHONSTARTUP": str(tmp_path / "startup.py"), "PYTHONUSERBASE": str(evil)}, marker


@pytest.mark.parametrize("how", ["front-served", "front-direct", "python-program"])
def test_pythonpath_of_the_caller_is_never_imported(active_2gpu, served: Path, hostile_python_env, how: str) -> None:
    env, marker = hostile_python_env
    env = {**env, handover.SOCKET_ENV: str(served) if how == "front-served" else str(served) + ".absent"}
    program = LIBDIR / ("nvc-py-python" if how == "python-program" else "nvc-py")
    result = subprocess.run([str(program), "--root", str(active_2gpu.root), "info", "--json"], capture_output=True,
                            text=True, env=env, timeout=60)
    assert (result.returncode, result.stderr) == (0, "")
    assert json.loads(result.stdout)["devices"]
    assert not marker.exists(), marker.read_text()


def test_pythonpath_reaches_neither_the_hook_nor_the_runtime(no_gpu_state, hostile_python_env) -> None:
    (env, bundle), (hostile, marker) = no_gpu_state, hostile_python_env
    hook = prestart({**env, **hostile, "NVC_PY_HOST_PID": "0"}, bundle, "hostile")  # no server: the Python hook
    assert (hook.returncode, hook.stderr) == (0, "") and "via" not in log_lines(env)[-1]
    for program in (LIBDIR / "nvc-py-runtime", HOOK.with_name("nvc-py-runtime")):  # the console script links to it
        runtime = subprocess.run([str(program), "--version"], capture_output=True, text=True,
                                 env={**hostile, "NVC_PY_CONFIG": env["NVC_PY_CONFIG"]}, timeout=60)
        assert runtime.returncode == 0 and "version" in runtime.stdout, runtime.stderr
        assert program.read_text().splitlines()[0].endswith(" -IS")
    assert not marker.exists(), marker.read_text()


def test_pip_reinstall_leaves_the_registered_hook_served(default_run_dir: Path, no_gpu_state,  # noqa: F811
                                                         tmp_path: Path) -> None:
    """pip rewrites its console scripts at every install; the hooks.d entry names make install's front
    in /usr/lib/nvc-py, which pip never writes, so the hook is still handed to the server."""
    env, bundle = no_gpu_state
    setup_podman(tmp_path)
    entry = json.loads((tmp_path / "hooks.d" / "oci-nvc-py-hook.json").read_text())["hook"]
    try:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                        "--no-build-isolation", "--force-reinstall", str(REPO)], check=True, capture_output=True,
                       cwd=tmp_path, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}, timeout=300)
        assert HOOK.read_bytes()[:2] == b"#!"  # pip's Python console script again
        assert Path(entry["path"]).read_bytes()[:4] == b"\x7fELF"
        with hook_server(HOOK, Path(handover.DEFAULT_SOCKET)):
            state = json.dumps({"ociVersion": "1.0.2", "id": "after-pip", "pid": os.getpid(), "bundle": str(bundle),
                                "status": "creating"})
            result = subprocess.run([entry["path"], *entry["args"][1:]], executable=entry["path"], input=state,
                                    capture_output=True, text=True, env=dict(e.split("=", 1) for e in entry["env"]),
                                    timeout=60)
        assert (result.returncode, result.stderr) == (0, "")
        assert log_lines(env)[-1] == {**log_lines(env)[-1], "container": "after-pip", "via": "server"}
    finally:
        subprocess.run(["make", "-C", str(REPO), "--no-print-directory", "fronts"], check=True, capture_output=True)
    assert HOOK.read_bytes()[:4] == b"\x7fELF"


def test_setup_containerd_sets_up_the_server_for_the_runtimes_configuration(tmp_path: Path) -> None:
    """The runtime's hooks read $NVC_PY_CONFIG (else the default file): the no-server file goes beside it."""
    env = {**os.environ, "NVC_PY_CONFIG": str(tmp_path / "nvc" / "config.yaml")}

    def setup(*args: str) -> list[str]:
        return subprocess.run([str(FRONT), "setup", "containerd", "--config", str(tmp_path / "config.toml"),
                               "--drop-in", str(tmp_path / "drop-in.toml"), *args], capture_output=True, text=True,
                              check=True, env=env, timeout=60).stdout.splitlines()[2:]

    assert setup("--no-server") == [f"wrote {tmp_path / 'nvc' / 'no-server'}"]
    units = tmp_path / "units"
    assert setup("--unit-dir", str(units)) == [
        f"wrote {units / 'nvc-py-hook.socket'}", f"wrote {units / 'nvc-py-hook.service'}",
        "not enabled (systemd is not running): systemctl enable --now nvc-py-hook.socket",
        f"removed {tmp_path / 'nvc' / 'no-server'}"]
    assert f"Environment=NVC_PY_CONFIG={tmp_path / 'nvc' / 'config.yaml'}" in (units / "nvc-py-hook.service").read_text()
