"""nvc.hook.setup.maintainer and nvc.hook.setup.purge, which the Debian package's maintainer scripts run (test_deb.py runs them for
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

from nvc.hook.setup import maintainer, purge

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
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        started.append(proc)
        return int(proc.stdout.readline())  # type: ignore[union-attr]

    yield start
    for proc in started:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]


def _process(pid: int, cgroup: bytes | None = None) -> maintainer.Process:
    read = {name: Path(f"/proc/{pid}/{name}").read_bytes() for name in ("cmdline", "stat", "status", "cgroup")}
    return maintainer.parse_process(
        pid, read["cmdline"], read["stat"], read["status"], read["cgroup"] if cgroup is None else cgroup
    )


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
    for cgroup in (
        b"0::/system.slice/nvc-py-hook.service\n",
        b"12:pids:/\n1:name=systemd:/system.slice/nvc-py-hook.service\n",
    ):
        assert maintainer.servers_to_stop([_process(server, cgroup)]) == []


def test_the_servers_of_one_socket(spawn) -> None:  # noqa: ANN001
    """``setup server --remove`` where systemd does not run stops the server of the hooks' socket alone."""
    default = _process(spawn(SERVER, *SERVER_ARGS)).ppid
    unnamed = _process(spawn(SERVER, *SERVER_ARGS[:2])).ppid  # `nvc-py-hook serve`: the default socket
    other = _process(spawn(SERVER, *SERVER_ARGS[:3], "/tmp/other.sock")).ppid
    processes = [_process(pid) for pid in (default, unnamed, other)]
    assert maintainer.servers_to_stop(processes, "/run/nvc-py/hook.sock") == sorted([default, unnamed])
    assert maintainer.servers_to_stop(processes, "/tmp/other.sock") == [other]
    assert maintainer.servers_to_stop(processes) == sorted([default, unnamed, other])
    assert not maintainer.serves_socket(("python", "-IS", "x", "serve", "--socket", "/run/nvc-py/hook.sock"), "/x")


def test_server_status_names_a_sockets_servers(spawn) -> None:  # noqa: ANN001
    """The init script's ``status``: each server of the socket, exit status 0; none: 3 (LSB's "not running")."""
    other = _process(spawn(SERVER, *SERVER_ARGS[:3], "/tmp/nvc-test-status.sock")).ppid
    command = [sys.executable, "-I", "-m", "nvc.hook.setup.maintainer", "server-status", "--socket"]
    found = subprocess.run([*command, "/tmp/nvc-test-status.sock"], capture_output=True, text=True, timeout=30)
    assert (found.returncode, found.stdout) == (0, f"nvc-py-hook server {other} serves /tmp/nvc-test-status.sock\n")
    none = subprocess.run([*command, "/tmp/nvc-test-none.sock"], capture_output=True, text=True, timeout=30)
    assert (none.returncode, none.stdout) == (3, "no nvc-py-hook server serves /tmp/nvc-test-none.sock\n")


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


# --- nvc.hook.setup.purge: what postrm's purge removes (test_deb.py runs it through dpkg) -------------------

# Run in a mount namespace of its own (its mounts vanish with it), in the tree $R: after the set-up,
# the purge (its file run alone, nvc not on the path, as postrm runs it), then what is still mounted under $R.
PURGE_RUN = """set -eu
cd "$R"
{setup}
{python} -I {module} --root "$R" && echo "rc=0" || echo "rc=$?"
awk -v r="$R/" 'index($5, r) == 1 {{print "mounted", substr($5, length(r) + 1)}}' /proc/self/mountinfo
"""


def _purge(root: Path, setup: str) -> subprocess.CompletedProcess[str]:
    script = PURGE_RUN.format(setup=setup, python=sys.executable, module=purge.__file__)
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        env={**os.environ, "R": str(root)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_purge_removes_what_nvc_py_made_and_unmounts_its_tmpfs(tmp_path: Path) -> None:
    setup = """mkdir -p run/nvc-py/share run/nvc-py/gpu-sched var/log etc/nvc-py srv/bound
mount -t tmpfs -o mode=0755 tmpfs run/nvc-py/gpu-sched
echo x > run/nvc-py/config-cache.json; echo x > run/nvc-py/server.lock
echo x > var/log/nvc-py.log; echo x > var/log/nvc-py.log.1; echo x > var/log/nvc-py.log.2.gz; echo x > var/log/syslog
echo x > etc/nvc-py/no-server"""
    result = _purge(tmp_path, setup)
    assert result.stdout == "rc=0\n" and result.stderr == "", result
    assert _files(tmp_path) == ["etc", "run", "srv", "srv/bound", "var", "var/log", "var/log/syslog"]


def test_purge_is_refused_while_containers_hold_sharing_state(tmp_path: Path) -> None:
    result = _purge(tmp_path, "mkdir -p run/nvc-py/share/ctr-1 etc/nvc-py && echo x > etc/nvc-py/no-server")
    assert result.stdout == "rc=1\n"
    assert (
        f"nvc-py: not purged: {tmp_path}/run/nvc-py/share holds the GPU-sharing state of containers (ctr-1)"
        in result.stderr
    )
    assert _files(tmp_path) == [
        "etc",
        "etc/nvc-py",
        "etc/nvc-py/no-server",
        "run",
        "run/nvc-py",
        "run/nvc-py/share",
        "run/nvc-py/share/ctr-1",
    ]


THEIRS = """mkdir -p srv/theirs/etc srv/theirs/share srv/theirs/mnt srv/theirs/run/gpu-sched
for f in etc/no-server share/ctr-9 log; do echo theirs > srv/theirs/$f; done
mount -t tmpfs tmpfs srv/theirs/mnt && echo theirs > srv/theirs/mnt/data
mount -t tmpfs tmpfs srv/theirs/run/gpu-sched
"""


@pytest.mark.parametrize(
    ("setup", "left", "mounted"),
    [
        (
            """mkdir -p run/nvc-py var/log etc && ln -s ../../srv/theirs/mnt run/nvc-py/gpu-sched
ln -s ../../srv/theirs/share run/nvc-py/share && ln -s ../srv/theirs/etc etc/nvc-py
ln -s ../../srv/theirs/log var/log/nvc-py.log && echo x > run/nvc-py/server.lock""",
            [
                "run/nvc-py/gpu-sched: a symlink (to ../../srv/theirs/mnt)",
                "run/nvc-py/share: a symlink (to ../../srv/theirs/share)",
                "run/nvc-py: not empty (what is named above)",
                "var/log/nvc-py.log: a symlink (to ../../srv/theirs/log)",
                "etc/nvc-py: a symlink (to ../srv/theirs/etc)",
            ],
            ["srv/theirs/mnt", "srv/theirs/run/gpu-sched"],
        ),
        (
            """mkdir -p run var srv/log && ln -s ../srv/theirs/run run/nvc-py && ln -s ../srv/log var/log
echo theirs > srv/log/nvc-py.log""",
            ["run/nvc-py: a symlink (to ../srv/theirs/run)", "var/log: a symlink (to ../srv/log)"],
            ["srv/theirs/mnt", "srv/theirs/run/gpu-sched"],
        ),
        # Another filesystem on the scheduler's own directory: not nvc-py's tmpfs (its mount entry says so).
        (
            "mkdir -p run/nvc-py/gpu-sched && mount --bind srv/theirs/share run/nvc-py/gpu-sched",
            [
                "run/nvc-py/gpu-sched: another filesystem is mounted there",
                "run/nvc-py: not empty (what is named above)",
            ],
            ["run/nvc-py/gpu-sched", "srv/theirs/mnt", "srv/theirs/run/gpu-sched"],
        ),
    ],
    ids=["links-in-run", "run-and-log-dir-linked", "foreign-mount-on-gpu-sched"],
)
def test_purge_follows_no_link_and_unmounts_no_other_mount(
    tmp_path: Path, setup: str, left: list[str], mounted: list[str]
) -> None:
    result = _purge(tmp_path, THEIRS + setup + "\necho theirs > srv/theirs/mnt/after")
    lines = result.stdout.splitlines()
    assert lines[0] == "rc=0", result
    assert sorted(line.split(" ", 1)[1] for line in lines[1:]) == mounted
    said = [
        line.removeprefix(f"nvc-py: purge left {tmp_path}/").removesuffix(", not nvc-py's")
        for line in result.stderr.splitlines()
    ]
    assert said == left, result.stderr
    for name in ("etc/no-server", "share/ctr-9", "log"):
        assert (tmp_path / "srv/theirs" / name).read_text() == "theirs\n"
    assert not (tmp_path / "srv/log").exists() or (tmp_path / "srv/log/nvc-py.log").read_text() == "theirs\n"


def test_parse_mountinfo_and_the_scheduler_mount() -> None:
    text = (
        "24 1 0:22 / /run rw - tmpfs tmpfs rw\n"
        "31 24 0:40 / /run/nvc-py/gpu-sched rw,nosuid - tmpfs tmpfs rw,size=100k\n"
        "32 24 8:1 /home /run/nvc-py/gpu\\040sched rw shared:1 - ext4 /dev/sda1 rw\n"
        "33 24 0:41 / /srv/x rw - tmpfs tmpfs rw\n"
    )
    mounts = purge.parse_mountinfo(text)
    assert mounts[2] == purge.Mount(32, "/run/nvc-py/gpu sched", "ext4")
    sched = "/run/nvc-py/gpu-sched"
    assert [purge.is_own_sched_mount(mounts, i, sched) for i in (24, 31, 32, 33, None)] == [
        False,
        True,
        False,
        False,
        False,
    ]
    assert purge.fd_mount_id("pos:\t0\nflags:\t02100000\nmnt_id:\t31\nino:\t1\n") == 31
