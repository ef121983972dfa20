"""``nvc-py-hook serve``'s own life: its socket, the spare workers it forks ahead of the next calls
(their priority, the helpers they keep ready, their end with the server), the systemd units
``nvc-py setup server`` writes, and its stop once its installed code changed.

The server is started inside the test's private mount namespace where the fake driver (a test
double) is active, so its workers see the fake GPUs, as runc's hooks do.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness.hookcalls import call_directly
from harness.hookfixtures import served  # noqa: F401  (fixture)
from harness.hookserver import LIBDIR, hook_server
from harness.installed import HOOK
from nvc.errors import MountError


def test_socket_is_root_only(served: Path) -> None:
    assert served.stat().st_mode & 0o777 == 0o600 and served.parent.stat().st_mode & 0o777 == 0o700


def test_an_idle_spare_worker_goes_with_the_server(active_2gpu) -> None:
    """The workers forked ahead of the next calls (a pool of SPARES) must not outlive a server killed outright."""
    from nvc.hook.server.loop import SPARES

    top = Path(tempfile.mkdtemp(prefix="nvc-hook-server-"))
    try:
        with hook_server(HOOK, top / "hook.sock") as proc:
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
            deadline = time.monotonic() + 10
            while len(children.read_text().split()) < SPARES and time.monotonic() < deadline:
                time.sleep(0.05)
            spares = children.read_text().split()
            assert len(spares) == SPARES >= 2
            proc.kill()
            proc.wait()
            deadline = time.monotonic() + 5
            while any(Path(f"/proc/{pid}").exists() for pid in spares) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not [pid for pid in spares if Path(f"/proc/{pid}").exists()]
    finally:
        shutil.rmtree(top)


def test_an_idle_spare_keeps_a_container_helper_ready(served: Path) -> None:
    """A spare left idle forks the container helper its call's configure takes, so no helper fork is
    on a call's path; the spare itself stays the server's child."""
    from nvc.hook.server.loop import SPARES

    server = next(
        p
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and _cmdline(p).endswith(f"serve --socket {served}") and _ppid(p) == os.getpid()
    )
    deadline = time.monotonic() + 10
    while True:
        spares = (server / "task" / server.name / "children").read_text().split()
        helpers = {pid: _names(pid) for pid in spares}
        if len(spares) == SPARES and all("nvc:[container]" in names for names in helpers.values()):
            break
        assert time.monotonic() < deadline, helpers
        time.sleep(0.05)


def test_an_idle_spares_container_helper_clones_the_driver_files_ahead(
    active_2gpu, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While it waits, the container helper an idle spare keeps holds clones (detached mounts) of
    the dry plan's host sources, which the call's mounts take: here the driver's libcuda, under the
    driver root the server's configuration names."""
    from glob import glob

    from harness.hookfixtures import fake_driver_config

    libs = glob(f"{active_2gpu.root}/usr/lib/x86_64-linux-gnu/libcuda.so.*.*")
    inode = next(Path(p) for p in libs if not Path(p).is_symlink()).stat().st_ino
    top = Path(tempfile.mkdtemp(prefix="nvc-hook-server-"))
    try:
        monkeypatch.setenv("NVC_PY_CONFIG", str(fake_driver_config(top / "config.yaml", active_2gpu.root)))
        with hook_server(HOOK, top / "hook.sock") as proc:
            deadline = time.monotonic() + 10
            while True:
                helpers = [h for s in _children(proc.pid) for h in _children(s) if _names_of(h) == "nvc:[container]"]
                if helpers and all(inode in _detached_inodes(h) for h in helpers):
                    break
                assert time.monotonic() < deadline, (inode, {h: _detached_inodes(h) for h in helpers})
                time.sleep(0.05)
    finally:
        shutil.rmtree(top)


def _names_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _detached_inodes(pid: int) -> set[int]:
    """The inodes of process ``pid``'s descriptors of detached mounts (a clone's path reads "/")."""
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd) != "/":
                continue
            info = Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text()
        except OSError:
            continue
        found.update(int(line.split()[1]) for line in info.splitlines() if line.startswith("ino:"))
    return found


def test_the_server_forks_at_a_higher_priority_than_its_workers_run(served: Path) -> None:
    """In a start storm the server's one job, forking the next spare, must not wait for a CPU behind
    the runtimes and workers: it runs SERVER_NICE_BOOST below the nice value it was started with,
    its spares (the workers to be) at that value."""
    from nvc.hook.server.loop import SERVER_NICE_BOOST

    server = next(
        p
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and _cmdline(p).endswith(f"serve --socket {served}") and _ppid(p) == os.getpid()
    )
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    assert _nice(server) == max(-20, ours - SERVER_NICE_BOOST)
    deadline = time.monotonic() + 5
    while True:  # a spare sets its own value first thing after the fork
        spares = {
            pid: _nice(Path(f"/proc/{pid}")) for pid in (server / "task" / server.name / "children").read_text().split()
        }
        if spares and all(nice == ours for nice in spares.values()):
            break
        assert time.monotonic() < deadline, spares
        time.sleep(0.02)


def _nice(proc: Path) -> int:
    return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[16])


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _ppid(proc: Path) -> int:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _names(pid: str) -> list[str]:
    """The names (comm) of the children of process ``pid``."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    names = []
    for child in children:
        try:
            names.append(Path(f"/proc/{child}/comm").read_text().strip())
        except OSError:
            continue
    return names


def test_setup_server_writes_the_systemd_units(tmp_path: Path) -> None:
    config = tmp_path / "other.yaml"  # setup refuses a configuration file the hooks could not read
    config.write_text("load-kmods: false\n")
    out = subprocess.run(
        [str(HOOK.with_name("nvc-py")), "setup", "server", "--unit-dir", str(tmp_path), "--config", str(config)],
        capture_output=True,
        text=True,
        check=True,
    )
    unit = tmp_path / "nvc-py-hook.service"
    assert out.stdout.splitlines()[:2] == [f"wrote {tmp_path / 'nvc-py-hook.socket'}", f"wrote {unit}"]
    lines = unit.read_text().splitlines()
    assert f"ExecStart={LIBDIR / 'nvc-py-hook-python'} serve" in lines and "KillMode=mixed" in lines
    assert "Requires=nvc-py-hook.socket" in lines
    assert "RestartPreventExitStatus=2" in lines  # a refused socket directory: no restart loop
    # systemd replaces a wedged server: SIGKILL, which a stopped one does not hold back
    assert {"WatchdogSec=10", "WatchdogSignal=SIGKILL", "NotifyAccess=main", "Restart=on-failure"} <= set(lines)
    assert [line for line in lines if line.startswith("Environment=")] == [
        "Environment=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        f"Environment=NVC_PY_CONFIG={config}",
    ]


def test_a_server_whose_installed_code_changed_stops_serving_it(active_2gpu, tmp_path: Path) -> None:
    """An upgrade replaces files in the installed package: the next call is told to fall back (its
    caller runs the new code itself) and the server stops (an on-demand one's socket goes with it,
    so the next hook call starts a server of the new code; systemd restarts a socket-activated one)."""
    import nvc.hook

    sock = tmp_path / "run" / "hook.sock"
    with hook_server(HOOK, sock) as proc:
        assert call_directly(sock, ["/x/nvc-py-hook", "poststart"]) == ([b"ready", b"exit 0"], "")
        marker = Path(nvc.hook.__file__).with_name(f".upgrade-{os.getpid()}")
        marker.touch()  # what an upgrade does to the package's directory: it changes
        marker.unlink()
        assert call_directly(sock, ["/x/nvc-py-hook", "poststart"]) == ([b"fall back"], "")
        assert proc.wait(timeout=10) == 0
    assert not sock.exists()


@contextmanager
def _where_nvml_fails() -> Iterator[Path]:
    """A scratch directory for a server's socket, on a host where NVML does not load (no driver: this
    machine without the fake driver active), where each NVML helper's failure is what the server says."""
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        pytest.skip("NVML loads on this host: the driver helper's set-up cannot fail")
    except OSError:
        pass
    top = Path(tempfile.mkdtemp(prefix="nvc-hook-server-"))
    try:
        yield top
    finally:
        shutil.rmtree(top)


def test_a_spare_reaps_a_helper_that_fails_to_start_and_the_server_says_why_once() -> None:
    """Each idle spare's NVML helper fails its set-up and exits: the spare reaps it at once (no
    ``nvc:[driver] <defunct>`` under any spare while it waits for a call), and the server's stderr (the
    journal, under systemd) says why once, not once per spare."""
    from harness.spares import spare_pids

    with _where_nvml_fails() as top:
        with hook_server(HOOK, top / "hook.sock") as proc:
            spares = spare_pids(proc)
            deadline = time.monotonic() + 10
            while True:  # each spare's helpers: the container helper kept, the driver helper gone
                helpers = {pid: _children_states(pid) for pid in spares}
                if all(
                    states and all(state != "Z" for _, state in states) and "nvc:[driver]" not in dict(states)
                    for states in helpers.values()
                ):
                    break
                assert time.monotonic() < deadline, f"spares' helpers (name, state): {helpers}"
                time.sleep(0.05)
            time.sleep(0.5)  # and it stays so
            assert all(state != "Z" for pid in spares for _, state in _children_states(pid))
        assert proc.stderr is not None
        said = [line for line in proc.stderr.read().splitlines() if "idle workers keep no driver helper" in line]
        assert len(said) == 1 and "libnvidia-ml.so.1" in said[0], said


def test_a_spare_loads_nvml_only_once_idle_for_half_a_second() -> None:
    """Calls a tenth of a second apart (a storm's pace, slowed) take or wake every spare before it
    loads NVML: none starts an NVML helper, whose failure the server would say, until the calls stop
    and a spare has waited half a second (IDLE_BEFORE_NVML). A storm the machine slowed, where a spare
    may have waited that long after all (the oldest spare's age at the first call, or the time between
    two calls, over 60 % of it), proves nothing where NVML was loaded, and is run again (three at most)."""
    import select

    from harness.spares import spare_pids
    from nvc.hook.server.worker import IDLE_BEFORE_NVML

    for _ in range(3):
        with _where_nvml_fails() as top, hook_server(HOOK, top / "hook.sock") as proc:
            assert proc.stderr is not None
            calls = [min(_started_s(pid) for pid in spare_pids(proc))]
            until = time.monotonic() + 4 * IDLE_BEFORE_NVML
            while time.monotonic() < until:
                calls.append(time.clock_gettime(time.CLOCK_BOOTTIME))
                assert call_directly(top / "hook.sock", ["/x/nvc-py-hook", "poststart"]) == ([b"ready", b"exit 0"], "")
                time.sleep(IDLE_BEFORE_NVML / 5)
            loaded = select.select([proc.stderr], [], [], 0)[0]
            idle = max(later - earlier for earlier, later in itertools.pairwise(calls))
            if loaded and idle > 0.6 * IDLE_BEFORE_NVML:
                print(f"a spare may have waited {idle:.2f} s for a call: the storm again")
                continue
            assert not loaded, (proc.stderr.readline(), f"longest wait for a call {idle:.2f} s")
            said = select.select([proc.stderr], [], [], 10)[0] and proc.stderr.readline()
            assert said and "idle workers keep no driver helper" in said, said
            return
    pytest.fail("three storms in a row were slowed by this machine: nothing shown")


def _started_s(pid: int) -> float:
    """When process ``pid`` started, in seconds of CLOCK_BOOTTIME (its /proc stat, to a clock tick)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2].split()
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")


def _fails_late() -> dict:
    """A helper's set-up that fails after 0.3 s (an NVML that takes its time to refuse)."""
    time.sleep(0.3)
    raise MountError("late failure")


def test_a_spare_a_call_woke_reaps_a_helper_that_fails_after() -> None:
    """A call wakes every idle spare, and one takes it; the others wait in accept() for the next. A
    helper of theirs whose set-up fails meanwhile is reaped all the same (no ``<defunct>`` under the
    waiting spare), and its reason written to the server once. The spare's wait runs in a child of
    this test (its signal handler and its helpers are its own), over a real helper and a socket a call
    has come on."""
    import json
    import socket

    from nvc.hook.server import worker
    from nvc.rpc.pool import WarmHelper

    result_r, result_w = os.pipe()
    notes_r, notes_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the spare
        try:
            helper = WarmHelper("late", _fails_late, failure=MountError)
            helper.prepare()
            listening, caller = socket.socketpair()
            caller.send(b"call")  # what woke every spare; another took it
            pending = worker._settle(listening, [helper], notes_w)
            woken = len(pending)  # its report still to come when the call woke it
            worker._settle_later(pending, notes_w)
            time.sleep(1.0)  # waiting for the next call, as in accept()
            me = os.getpid()
            found = {"pending": woken, "children": _children_states(me), "kept": helper.kept is not None}
            os.write(result_w, json.dumps(found).encode())
        finally:
            os._exit(0)
    os.close(result_w)
    os.close(notes_w)
    assert os.waitpid(pid, 0)[1] == 0
    with os.fdopen(result_r) as result, os.fdopen(notes_r) as notes:
        assert json.loads(result.read()) == {"pending": 1, "children": [], "kept": False}
        assert notes.read() == "idle workers keep no late helper: mount error: late failure\n"


def _children_states(pid: int) -> list[tuple[str, str]]:
    """(name, state letter) of each child of process ``pid``."""
    found = []
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    for child in children:
        try:
            stat = Path(f"/proc/{child}/stat").read_text()
        except OSError:
            continue
        found.append((stat[stat.index("(") + 1 : stat.rindex(")")], stat.rpartition(") ")[2][:1]))
    return found


def test_a_stopping_server_finishes_the_calls_in_progress_and_leaves_no_process() -> None:
    """SIGTERM (systemd's stop or restart, KillMode=mixed: nothing but the server is signalled) while a
    worker runs a call: the server kills its idle spares, waits for the call to finish (its caller gets
    its status) and only then exits, with nothing of its own left running (systemd would kill and log
    whatever is left: "left-over process" lines)."""
    import signal
    import threading

    from harness.hookcalls import call_raw, message
    from harness.spares import spare_pids

    top = Path(tempfile.mkdtemp(prefix="nvc-hook-server-"))
    stdin_r, stdin_w = os.pipe()
    err_r, err_w = os.pipe()
    null, cwd = os.open(os.devnull, os.O_RDWR), os.open("/", os.O_PATH)
    answers: list[list[bytes]] = []
    try:
        with hook_server(HOOK, top / "hook.sock") as proc:
            spare_pids(proc)
            # prestart reads the container's state from its stdin: the call runs until the pipe ends
            call = threading.Thread(
                target=lambda: answers.append(
                    call_raw(
                        top / "hook.sock",
                        message(["/x/nvc-py-hook", "prestart"], []),
                        [cwd],
                        go_fds=[stdin_r, null, err_w],
                    )
                )
            )
            call.start()
            deadline = time.monotonic() + 10
            while not (busy := _busy_workers(proc.pid, f"pipe:[{os.fstat(stdin_r).st_ino}]")):
                assert time.monotonic() < deadline, "no worker took the call"
                time.sleep(0.02)
            tree = _descendants(proc.pid)
            proc.send_signal(signal.SIGTERM)
            time.sleep(1)
            assert proc.poll() is None, "the server exited with a call in progress"
            assert _descendants(proc.pid) <= tree and busy <= _descendants(proc.pid)
            assert not set(_children(proc.pid)) - busy, "idle spares left running while the server stops"
            os.close(stdin_w)
            stdin_w = -1
            call.join(30)
            assert proc.wait(timeout=10) == 0
            left = [pid for pid in tree if _alive(pid)]
            assert not left, f"processes of the stopped server left running: {left}"
        assert answers and answers[0][0] == b"ready" and answers[0][-1].startswith(b"exit "), answers
    finally:
        for fd in (stdin_r, stdin_w, err_r, err_w, null, cwd):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(top)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _descendants(pid: int) -> set[int]:
    found = set()
    for child in _children(pid):
        found |= {child, *_descendants(child)}
    return found


def _busy_workers(server: int, stdin: str) -> set[int]:
    """The server's children that took the call whose stdin is ``stdin`` (/proc's name of it)."""
    busy = set()
    for child in _children(server):
        try:
            if os.readlink(f"/proc/{child}/fd/0") == stdin:
                busy.add(child)
        except OSError:
            continue
    return busy


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2][:1] != "Z"
    except OSError:
        return False
