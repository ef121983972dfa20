"""nvc.hook.maintainer, which the Debian package's maintainer scripts run (test_deb.py runs them for
real, in a root of their own): which processes ``stop-servers`` signals, judged from the real /proc
of processes shaped like a server, its worker, a server still starting and a stranger; which CDI
specs ``unregister`` removes. Nothing here signals a process or removes a file of the host's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvc.hook import maintainer

SERVER_ARGS = ("/usr/lib/nvc-py/nvc-py-hook-python", "serve", "--socket", "/run/nvc-py/hook.sock")
# A server: catches SIGTERM, and forks a worker that does not (as nvc.hook.server's spares).
SERVER = """import os, signal, time
signal.signal(signal.SIGTERM, lambda *_: None)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.write(w, b"x")
    time.sleep(60)
    os._exit(0)
os.read(r, 1)
print(pid, flush=True)
time.sleep(60)
"""
# A server still importing (or a worker whose server is gone): SIGTERM not caught.
STARTING = "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)\n"


@pytest.fixture
def spawn() -> Iterator:
    """Start ``python -c CODE ARGS...`` in a session of its own; the pid it prints first. Every
    session started is killed at the end."""
    started: list[subprocess.Popen[str]] = []

    def start(code: str, *args: str) -> int:
        proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
        started.append(proc)
        return int(proc.stdout.readline())  # type: ignore[union-attr]

    yield start
    for proc in started:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]


def _process(pid: int, cgroup: bytes | None = None) -> maintainer.Process:
    read = {name: Path(f"/proc/{pid}/{name}").read_bytes() for name in ("cmdline", "stat", "status", "cgroup")}
    return maintainer.parse_process(pid, read["cmdline"], read["stat"], read["status"],
                                    read["cgroup"] if cgroup is None else cgroup)


def test_only_a_server_that_catches_sigterm_is_stopped(spawn) -> None:  # noqa: ANN001
    worker = spawn(SERVER, *SERVER_ARGS)
    server = _process(worker).ppid
    starting = spawn(STARTING, *SERVER_ARGS)
    stranger = _process(spawn(SERVER, "/usr/lib/nvc-py/nvc-py-python", "serve")).ppid  # another program's argv
    processes = [_process(pid) for pid in (server, worker, starting, stranger)]
    assert [p.catches_sigterm for p in processes] == [True, False, False, True]
    assert [maintainer.is_server(p.argv) for p in processes] == [True, True, True, False]
    assert maintainer.servers_to_stop(processes) == [server]
    # The worker alone (its server gone): SIGTERM would end it in the middle of a container's start.
    assert maintainer.servers_to_stop(processes[1:]) == []


def test_systemds_server_is_left_to_systemd(spawn) -> None:  # noqa: ANN001
    server = _process(spawn(SERVER, *SERVER_ARGS)).ppid
    assert maintainer.servers_to_stop([_process(server, b"0::/init.scope\n")]) == [server]
    for cgroup in (b"0::/system.slice/nvc-py-hook.service\n", b"12:pids:/\n1:name=systemd:/system.slice/nvc-py-hook.service\n"):
        assert maintainer.servers_to_stop([_process(server, cgroup)]) == []


def test_parse_process_reads_a_name_with_spaces_and_parentheses() -> None:
    stat = b"42 (a) b (c) S 7 42 42 0 -1 4194560"
    status = b"Name:\ta) b (c\nSigIgn:\t0000000000000000\nSigCgt:\t0000000000004000\n"
    process = maintainer.parse_process(42, b"python\0-IS\0x\0", stat, status, b"0::/\n")
    assert process == maintainer.Process(42, 7, ("python", "-IS", "x"), True, ("/",))


def test_unregister_removes_the_cdi_specs_that_name_the_hook(tmp_path: Path) -> None:
    etc, run = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    etc.mkdir()
    run.mkdir()
    ours = '{"kind": "nvidia.com/gpu", "containerEdits": {"hooks": [{"path": "/usr/lib/nvc-py/nvc-py-hook"}]}}'
    (etc / "nvidia.json").write_text(ours)
    (etc / "other.yaml").write_text("kind: example.com/fpga\n")
    (etc / "link.yaml").symlink_to(etc / "nvidia.json")  # not followed: a link is nobody's spec of ours
    os.mkfifo(etc / "fifo.yaml")  # never opened blocking, never ours
    (run / "nvidia.yaml").write_text(f"# {ours}\n")
    removed = maintainer.remove_cdi_specs((str(etc), str(run), str(tmp_path / "missing")))
    assert removed == [f"removed {etc / 'nvidia.json'}", f"removed {run / 'nvidia.yaml'}", f"removed {run}"]
    assert sorted(p.name for p in etc.iterdir()) == ["fifo.yaml", "link.yaml", "other.yaml"]
