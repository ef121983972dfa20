"""A server that stays where systemd does not run: ``nvc-py-hook start-server`` (what ``nvc-py setup``
runs there) starts one detached with no idle exit, keeps one that stays, takes the place of one a hook
call started on demand, and is never stopped by the idle rule of a server a runtime adopted; ``setup
server --remove`` stops it.

Every server here runs in the test's private mount namespace with its socket in the test's temporary
directory; this test process stands for the host (NVC_PY_HOST_PID), and the servers are killed at the
end of their test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.hookfixtures import default_run_dir  # noqa: F401  (fixture)
from harness.hookserver import LIBDIR
from harness.installed import FRONT
from harness.ondemand import (
    kill_servers,
    log_lines,
    no_gpu_state,  # noqa: F401  (fixture)
    prestart,
    servers,
)
from nvc.hook.server import handover
from nvc.hook.setup import maintainer

IDLE_EXIT = b"NVC_PY_SERVE_IDLE_EXIT="

# A child subreaper that, unlike crun's `run`, does not wait for what it adopted: runs its arguments,
# prints their output, then stays 2 s (the server it adopted meanwhile is its child) and exits.
ADOPTER = """
import ctypes, subprocess, sys, time
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(done.returncode, done.stdout, end="", flush=True)
time.sleep(2)
"""


def start_server(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LIBDIR / "nvc-py-hook"), "start-server"], capture_output=True, text=True, env=env, timeout=60
    )


def started_on_demand(pid: int) -> bool:
    return any(entry.startswith(IDLE_EXIT) for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))


def test_start_server_starts_a_server_that_stays_and_keeps_it(no_gpu_state) -> None:
    env, bundle = no_gpu_state
    sock = Path(env[handover.SOCKET_ENV])
    result = start_server(env)
    assert result.returncode == 0, result.stderr
    [pid] = servers(sock)
    assert result.stdout == f"nvc-py-hook: started the hook server on {sock} (pid {pid}), to stay (no idle exit)\n"
    assert result.stderr == ""
    assert not started_on_demand(pid)
    assert b"NVC_PY_SERVE_STAYS=1" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")  # its successor its job
    assert os.getsid(pid) != os.getsid(0)  # detached, as one started on demand
    assert Path(f"/proc/{pid}/cgroup").read_text() == Path("/proc/self/cgroup").read_text()  # the "host's"
    again = start_server(env)
    assert (again.returncode, again.stdout) == (
        0,
        f"nvc-py-hook: the hook server on {sock} (pid {pid}) runs already, to stay\n",
    )
    assert prestart(env, bundle, "served").returncode == 0
    assert log_lines(env)[-1].get("via") == "server" and servers(sock) == [pid]
    log = sock.with_name("server.log").read_text()  # start-server's look at the listener left no trace
    assert "Traceback" not in log and "error" not in log.lower(), log


def test_start_server_takes_the_place_of_a_server_started_on_demand(no_gpu_state) -> None:
    env, bundle = no_gpu_state
    sock = Path(env[handover.SOCKET_ENV])
    assert prestart(env, bundle, "first").returncode == 0
    [on_demand] = servers(sock)
    assert started_on_demand(on_demand)
    result = start_server(env)
    assert result.returncode == 0, result.stderr
    [pid] = servers(sock)
    assert pid != on_demand and not started_on_demand(pid)
    assert result.stdout == f"nvc-py-hook: started the hook server on {sock} (pid {pid}), to stay (no idle exit)\n"
    log = sock.with_name("server.log").read_text()
    assert f"ended the on-demand hook server (pid {on_demand}) to start another" in log, log
    assert prestart(env, bundle, "after").returncode == 0 and log_lines(env)[-1].get("via") == "server"


def test_a_server_that_stays_is_not_stopped_idle_where_a_subreaper_adopted_it(no_gpu_state) -> None:
    """An on-demand server adopted by a subreaper stops after 0.5 s without a call (crun's `run` waits
    for it); one that start-server started was started to stay, whoever adopted it."""
    env, _ = no_gpu_state
    sock = Path(env[handover.SOCKET_ENV])
    with subprocess.Popen(
        [sys.executable, "-c", ADOPTER, str(LIBDIR / "nvc-py-hook"), "start-server"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as adopter:
        assert adopter.stdout is not None
        assert adopter.stdout.readline().startswith("0 nvc-py-hook: started the hook server")
        [pid] = servers(sock)
        stat = Path(f"/proc/{pid}/stat").read_text()
        assert int(stat.rsplit(")", 1)[1].split()[1]) == adopter.pid  # adopted by the subreaper
        time.sleep(1.2)  # past an adopted on-demand server's 0.5 s
        assert servers(sock) == [pid]
        assert adopter.wait(timeout=30) == 0
    assert servers(sock) == [pid]
    assert "no call for" not in sock.with_name("server.log").read_text()


@pytest.mark.parametrize("stopped_by", ["the next call", "the package's stop-servers"])
def test_a_server_that_stays_starts_its_successor_after_an_upgrade(no_gpu_state, stopped_by: str) -> None:
    """An upgrade replaces the installed code: the next call falls back (its caller runs the new code)
    and tells the server to stop, or the package's postinst does (SIGTERM); the server that stays then
    starts the next one of the new code, which stays too. Stopped with its code unchanged (setup
    server --remove, a removal) it starts none: test_setup_starts_a_server_that_stays_…"""
    import nvc.hook

    env, bundle = no_gpu_state
    sock = Path(env[handover.SOCKET_ENV])
    assert start_server(env).returncode == 0
    [first] = servers(sock)
    marker = Path(nvc.hook.__file__).with_name(f".upgrade-{os.getpid()}")
    marker.touch()  # what an upgrade does to the package's directory: it changes
    marker.unlink()
    if stopped_by == "the next call":
        assert prestart(env, bundle, "upgraded").returncode == 0
        assert "via" not in log_lines(env)[-1]  # run by its caller, the new code
    else:
        assert maintainer.stop_servers(str(sock)) == ([f"stopped nvc-py-hook server {first}"], [])
    log = sock.with_name("server.log")
    said = re.compile(
        rf"nvc-py-hook serve: the installed code changed: nvc-py-hook: started the hook server on {re.escape(str(sock))} "
        r"\(pid (\d+)\), to stay \(no idle exit\)\n"
    )
    deadline = time.monotonic() + 30
    while not (found := said.search(log.read_text())) and time.monotonic() < deadline:
        time.sleep(0.05)  # until then the old one's spares hold its socket: servers() would name one
    assert found, log.read_text()
    second = int(found[1])
    while servers(sock) != [second] and time.monotonic() < deadline:
        time.sleep(0.05)  # the old one gone, its spares with it
    assert servers(sock) == [second] and second != first and not started_on_demand(second)
    assert prestart(env, bundle, "after").returncode == 0 and log_lines(env)[-1].get("via") == "server"
    assert servers(sock) == [second]


def test_start_server_refuses_outside_the_hosts_namespaces_and_an_open_directory(no_gpu_state, tmp_path: Path) -> None:
    env, _ = no_gpu_state
    sock = Path(env[handover.SOCKET_ENV])
    elsewhere = {key: value for key, value in env.items() if key != "NVC_PY_HOST_PID"}  # PID 1's: not the suite's
    result = start_server(elsewhere)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f"nvc-py-hook: no hook server started on {sock}: not in the host's namespaces (PID 1's mount, pid, user "
        "and network namespaces)\n"
    )
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    open_dir.chmod(0o777)
    result = start_server({**env, handover.SOCKET_ENV: str(open_dir / "hook.sock")})
    assert result.returncode == 1
    assert result.stderr.endswith(": its directory is not root's, or others can write there\n")
    assert not servers(sock) and not servers(open_dir / "hook.sock") and not (open_dir / "server.lock").exists()


def test_the_python_program_says_start_server_is_the_fronts() -> None:
    result = subprocess.run(
        [str(LIBDIR / "nvc-py-hook-python"), "start-server"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr == f"nvc-py-hook: start-server: run {LIBDIR / 'nvc-py-hook'}, the installed front\n"


def test_setup_starts_a_server_that_stays_and_setup_server_remove_stops_it(
    default_run_dir: Path,
    no_gpu_state,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Where systemd does not run (this host), setup starts the server now, on the socket the
    registered hooks use (the default, whatever NVC_PY_HOOK_SOCKET the front leaves setup with)."""
    env, bundle = no_gpu_state
    env = {**env, handover.SOCKET_ENV: "none"}  # as the front runs setup once no server took it
    sock = default_run_dir / "hook.sock"
    config = env["NVC_PY_CONFIG"]
    setup = [str(FRONT), "setup", "podman", "--hooks-dir", str(tmp_path / "hooks.d"), "--config", config]
    try:
        out = subprocess.run(setup, capture_output=True, text=True, env=env, check=True, timeout=60).stdout
        [pid] = servers(sock)
        assert out.splitlines()[2:] == [
            "systemd is not running: no units written",
            f"started the hook server on {sock} (pid {pid}), to stay (no idle exit)",
        ]
        assert not started_on_demand(pid)
        served = {**env, handover.SOCKET_ENV: str(sock)}
        assert prestart(served, bundle, "served").returncode == 0 and log_lines(env)[-1].get("via") == "server"
        remove = [str(FRONT), "setup", "server", "--remove", "--unit-dir", str(tmp_path / "units"), "--config", config]
        out = subprocess.run(remove, capture_output=True, text=True, env=env, check=True, timeout=60).stdout
        assert f"stopped nvc-py-hook server {pid}\n" in out
        assert not servers(sock)
    finally:
        kill_servers(sock)


def test_start_server_with_no_socket_starts_none() -> None:
    result = start_server({"PATH": "/usr/bin:/bin", handover.SOCKET_ENV: "none"})
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "nvc-py-hook: no hook server to start: NVC_PY_HOOK_SOCKET is none\n"
