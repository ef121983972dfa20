"""The callers of ``nvc-py-hook serve``: the native client, the native front (nvc-py, nvc-py-hook)
and pip's console script hand their calls over (the caller's streams, directory and output, as a
direct run's) or run the program themselves where no server serves them, and the server records
what each call cost.

The server is started inside the test's private mount namespace where the fake driver (a test
double) is active, so its workers see the fake GPUs, as runc's hooks do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.hookcalls import CANNOT_EXECUTE, MISSING, SERVED_HELP
from harness.hookfixtures import served  # noqa: F401  (fixture)
from harness.hookserver import BUILT_CLIENT as CLIENT
from harness.hookserver import LIBDIR, hook_server
from harness.installed import FRONT, HOOK
from nvc import __version__
from nvc.hook.server import handover

PYTHON_PROGRAM = LIBDIR / "nvc-py-python"  # what the front runs without a server


def test_concurrent_calls_and_streams(served: Path) -> None:
    """Each worker answers on its own caller's streams, with its own status."""
    env = {handover.SOCKET_ENV: str(served), "PATH": "/usr/bin:/bin"}

    def call(stage: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(CLIENT), str(HOOK), stage], capture_output=True, text=True, env=env, input="", timeout=30
        )

    stages = ["poststart", "bogus"] * 8
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(call, stages))
    for stage, result in zip(stages, results, strict=True):
        if stage == "poststart":
            assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
        else:
            assert result.returncode == 2 and result.stderr.startswith("usage: nvc-py-hook prestart")


def test_client_usage() -> None:
    result = subprocess.run([str(CLIENT), "nvc-py-hook", "prestart"], capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.startswith("usage: nvc-py-hook-client /ABSOLUTE/PATH")
    assert os.access(CLIENT, os.X_OK)


def test_cli_call_runs_in_the_callers_directory_and_streams(active_2gpu, served: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [str(CLIENT), "/nonexistent/nvc-py", "--root", str(active_2gpu.root), "--debug", "relative.log", "list"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={handover.SOCKET_ENV: str(served)},
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert f"{active_2gpu.root}/dev/nvidiactl" in result.stdout.splitlines()
    assert (tmp_path / "relative.log").stat().st_size > 0


def test_a_caller_in_another_mount_namespace_runs_the_program_itself(active_2gpu, served: Path) -> None:
    """Paths and process ids would mean something else to a worker: the server tells such a caller
    to fall back, and the client executes the path it was given (here: one that does not exist)."""
    env = {handover.SOCKET_ENV: str(served), "PATH": "/usr/bin:/bin"}
    call = [str(CLIENT), "/nonexistent/nvc-py", "--root", str(active_2gpu.root), "list"]
    here = subprocess.run(call, capture_output=True, text=True, env=env, timeout=30)
    assert here.returncode == 0 and f"{active_2gpu.root}/dev/nvidiactl\n" in here.stdout
    elsewhere = subprocess.run(["unshare", "--mount", *call], capture_output=True, text=True, env=env, timeout=30)
    assert elsewhere.returncode == 127
    assert elsewhere.stderr == "nvc-py-hook-client: cannot execute /nonexistent/nvc-py: No such file or directory\n"


def console_script(tmp_path: Path) -> list[str]:
    """nvc-py as pip alone installs it: the Python console script (make install replaces it)."""
    script = tmp_path / "nvc-py"
    script.write_text(f"#!{sys.executable}\nfrom nvc.__main__ import run\nrun()\n")
    script.chmod(0o755)
    return [str(script)]


@pytest.mark.parametrize(
    "command, served_there",
    [
        (lambda _: [str(FRONT)], True),  # what make install leaves as nvc-py
        (console_script, True),  # pip's console script
        (lambda _: [str(PYTHON_PROGRAM)], False),  # the front's fallback: never hands over again
        (lambda _: [sys.executable, "-m", "nvc"], False),  # not a program the server runs
    ],
    ids=["native-front", "console-script", "python-program", "python-m"],
)
def test_nvc_py_hands_its_call_to_the_server(
    active_2gpu, served: Path, tmp_path: Path, command, served_there: bool
) -> None:
    """nvc-py hands a call over when root's server answers; its output is the direct run's. The
    debug log's pid tells where it ran."""
    root = str(active_2gpu.root)
    log = tmp_path / "debug.log"
    env = {handover.SOCKET_ENV: str(served), "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(
        [*command(tmp_path), "--root", root, "--debug", str(log), "info"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and err == ""
    golden = (Path(__file__).parent / "golden" / "two-gpu-mig-info.txt").read_text()
    assert out.replace(root, "<root>") == golden
    pids = {int(line.split()[2]) for line in log.read_text().splitlines() if line[:1] in "DI"}
    assert (pids != {proc.pid}) is served_there


def test_the_native_front_without_a_server_runs_the_python_program(active_2gpu, tmp_path: Path) -> None:
    """No server (or a caller in other namespaces than the server's): the front executes the Python
    program in its own process, with its arguments, environment and streams."""
    assert FRONT.read_bytes()[:4] == b"\x7fELF"
    root = str(active_2gpu.root)
    log = tmp_path / "debug.log"
    proc = subprocess.Popen(
        [str(FRONT), "--root", root, "--debug", str(log), "info", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={handover.SOCKET_ENV: str(tmp_path / "absent.sock"), "PATH": "/usr/bin:/bin"},
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and err == ""
    assert out.replace(root, "<root>") == (Path(__file__).parent / "golden" / "two-gpu-mig-info-json.txt").read_text()
    assert {int(line.split()[2]) for line in log.read_text().splitlines() if line[:1] in "DI"} == {proc.pid}
    bad = subprocess.run(
        [str(FRONT), "--root", "relative", "info"],
        capture_output=True,
        text=True,
        env={handover.SOCKET_ENV: str(tmp_path / "absent.sock")},
    )
    assert (bad.returncode, bad.stdout) == (2, "")
    assert (
        bad.stderr == "nvc-py: input error: relative: invalid driver root (must be an absolute path to a directory)\n"
    )


def test_the_native_front_runs_serve_and_foreign_callers_itself(served: Path) -> None:
    """``serve`` is never handed over (a worker would refuse it), and a caller in another mount
    namespace is told to fall back: both run the Python program here."""
    env = {handover.SOCKET_ENV: str(served), "PATH": "/usr/bin:/bin"}
    serve = subprocess.run(
        [str(FRONT), "hook", "serve", "--socket"], capture_output=True, text=True, env=env, timeout=30
    )
    assert serve.returncode == 2 and serve.stderr.startswith("usage: nvc-py-hook prestart")
    elsewhere = subprocess.run(
        ["unshare", "--mount", str(FRONT), "--version"], capture_output=True, text=True, env=env, timeout=30
    )
    assert (elsewhere.returncode, elsewhere.stdout, elsewhere.stderr) == (0, f"nvc-py {__version__}\n", "")


def test_an_older_servers_refusal_of_the_exchange_makes_the_client_run_the_program(tmp_path: Path) -> None:
    """A server of the previous exchange (one message, ``exit N`` at once; still running after an
    upgrade until it restarts) refuses the new message without running anything: the client runs
    the program itself rather than failing every container's start."""
    import socket
    import threading

    directory = tmp_path / "run"
    directory.mkdir(mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(directory / "hook.sock"))
    listener.listen(1)

    def old_server() -> None:
        conn, _ = listener.accept()
        with conn:
            _, fds, _, _ = socket.recv_fds(conn, handover.MAX_MESSAGE, 4)
            for fd in fds:
                os.close(fd)
            conn.send(b"exit 2")  # what it answered a message with too few descriptors

    thread = threading.Thread(target=old_server)
    thread.start()
    try:
        result = subprocess.run(
            [str(CLIENT), MISSING, "--version"],
            capture_output=True,
            text=True,
            env={handover.SOCKET_ENV: str(directory / "hook.sock")},
            timeout=30,
        )
    finally:
        thread.join(timeout=30)
        listener.close()
    assert (result.returncode, result.stderr) == (127, CANNOT_EXECUTE)


def test_served_call_time(served: Path) -> None:
    """Not an assertion: what a served call costs end to end with the checks (printed with -s)."""
    env = {handover.SOCKET_ENV: str(served)}
    times = []
    for _ in range(20):
        started = time.monotonic()
        subprocess.run([str(CLIENT), MISSING, *SERVED_HELP], capture_output=True, env=env, timeout=30, check=True)
        times.append(time.monotonic() - started)
    times.sort()
    print(f"served nvc-py info --help: median {times[10] * 1000:.1f} ms, best {times[0] * 1000:.1f} ms")


def test_queue_wait_is_read_from_the_clients_stamp_which_the_program_never_sees() -> None:
    from nvc.hook.server.exchange import queue_wait_ms

    env = {"PATH": "/bin", handover.CONNECTED_ENV: "00000000000001000000"}
    assert queue_wait_ms(env, 3_500_000) == 2.5 and env == {"PATH": "/bin"}
    assert queue_wait_ms(env, 3_500_000) is None  # no stamp (an older client)
    assert queue_wait_ms({handover.CONNECTED_ENV: "junk"}, 1) is None
    assert queue_wait_ms({handover.CONNECTED_ENV: "9" * 20}, 1) is None  # another clock (a time namespace)
    # any process of root's writes the stamp: digits int() refuses (seeds of tests/fuzz/fuzz_hook_call.py)
    assert queue_wait_ms({handover.CONNECTED_ENV: "\u00b2"}, 1) is None
    assert queue_wait_ms({handover.CONNECTED_ENV: "1" * 5000}, 1) is None


def test_the_server_records_each_calls_queue_wait_worker_time_and_cpu(active_2gpu, tmp_path: Path) -> None:
    """With $NVC_PY_SERVE_STATS each served call leaves one JSON line, from both clients (native and
    Python), an inherited stamp replaced by the caller's own. Plausible, not timed: each call's
    queue wait and worker time fit in the wall time its caller saw, and its worker used CPU."""
    sock, stats = tmp_path / "run" / "hook.sock", tmp_path / "stats.jsonl"
    env = {handover.SOCKET_ENV: str(sock), "PATH": "/usr/bin:/bin"}
    calls = [[str(CLIENT), str(HOOK), "poststart"]] * 6 + [
        [*console_script(tmp_path), "--root", str(active_2gpu.root), "info"]
    ]

    def call(argv: list[str]) -> float:
        t0 = time.monotonic()
        result = subprocess.run(
            argv, capture_output=True, text=True, input="", timeout=60, env={**env, handover.CONNECTED_ENV: "1"}
        )  # a stale stamp, inherited
        assert result.returncode == 0, result.stderr
        return (time.monotonic() - t0) * 1000

    with hook_server(HOOK, sock, stats=stats):
        with ThreadPoolExecutor(len(calls)) as pool:
            walls = list(pool.map(call, calls))
        deadline = time.monotonic() + 30  # a worker writes its line after answering and reaping its helpers
        while (len(stats.read_text().splitlines()) if stats.exists() else 0) < len(calls):
            assert time.monotonic() < deadline, "not every call left its line"
            time.sleep(0.05)
    lines = [json.loads(line) for line in stats.read_text().splitlines()]
    assert len(lines) == len(calls) and len({line["pid"] for line in lines}) == len(calls)
    for line in lines:
        assert line["answer"] == "exit 0"
        assert line["queue_ms"] is not None and line["queue_ms"] >= 0
        assert 0 < line["worker_ms"] and line["queue_ms"] + line["worker_ms"] < max(walls)
        assert line["cpu_ms"] > 0
