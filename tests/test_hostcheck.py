"""The session-end check that the suite left the host as it found it (tests/hostcheck.py), on real
directories, files and processes: what it reports, and that the session's own state passes it so far."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import hostcheck

from harness.hostile import nvc_processes

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SCRIPTS = Path(sysconfig.get_path("scripts"))
# A process named as nvc-py's helpers are, until killed.
HELPER_LOOKALIKE = "import ctypes, time; ctypes.CDLL(None).prctl(15, b'nvc:[driver]'); time.sleep(60)"


def test_changes_name_what_appeared_and_vanished_and_what_was_written(tmp_path: Path) -> None:
    run, tmp, cache, log = tmp_path / "run-nvc-py", tmp_path / "tmp", tmp_path / "cache", tmp_path / "nvc-py.log"
    (run / "share" / "c1").mkdir(parents=True)
    (tmp / "unrelated").mkdir(parents=True)
    (tmp / "pytest-of-root" / "pytest-1").mkdir(parents=True)
    cache.mkdir()
    (run / "config-cache.json").write_text("{}")
    log.write_text("a line\n")

    def snapshot() -> hostcheck.HostState:
        return hostcheck.snapshot(
            (str(run), str(tmp_path / "run-runc")),
            {str(tmp): hostcheck.TMP_PREFIXES, str(cache): ("",)},
            (str(log), str(tmp / "gone")),
        )

    before = snapshot()
    (run / "config-cache.json").unlink()
    (run / "share" / "c2").mkdir()
    (tmp_path / "run-runc").mkdir()
    (tmp / "nvc-fake-dev-x").mkdir()
    (tmp / "someone-elses").mkdir()
    (tmp / "pytest-of-root" / "pytest-2").mkdir()  # a failed run's, which pytest keeps
    (tmp / "nvc-py-test").mkdir()  # the suite's own names are its own, anywhere
    (cache / "blob-cache").mkdir()
    (cache / "nvc-py-test").mkdir()
    with log.open("a") as f:
        f.write("a hook's line\n")
    after = snapshot()
    assert hostcheck.changes(before, after) == [
        f"{run}/share/c2: left behind",
        f"{run}/config-cache.json: removed",
        f"{tmp_path / 'run-runc'}: created",
        f"{tmp}/nvc-fake-dev-x: left behind",
        f"{tmp}/pytest-of-root/pytest-2: left behind",
        f"{cache}/blob-cache: left behind",
        f"{log}: written to",
    ]
    assert hostcheck.changes(after, after) == []


def test_the_private_dirs_are_tmpfs_of_this_session_and_var_log_its_own(session_dir: str) -> None:
    """Written here, the config cache, sharing directories, runtimes' state, podman's blob-info
    cache and the hooks' log at its default place never reach the host."""
    mounts = {line.split()[4]: line.split(" - ")[1].split()[0] for line in open("/proc/self/mountinfo")}
    for path in hostcheck.PRIVATE_DIRS:
        assert mounts.get(path) == "tmpfs", path
    assert os.stat("/run/nvc-py").st_dev != os.stat("/run").st_dev
    assert os.stat("/var/log").st_ino == os.stat(Path(session_dir) / "var-log").st_ino
    assert session_dir == hostcheck.WORK_DIR  # pytest's base temporary directory is not in /tmp


def test_a_hook_with_the_default_configuration_logs_in_the_session(session_dir: str, tmp_path: Path) -> None:
    """The hook's default log, /var/log/nvc-py.log, is the session's file: the host's is not written to."""
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    (bundle / "config.json").write_text(
        json.dumps(
            {
                "ociVersion": "1.0.2",
                "root": {"path": "rootfs"},
                "process": {"args": ["true"], "cwd": "/", "env": ["PATH=/bin"]},
            }
        )
    )
    state = json.dumps(
        {"ociVersion": "1.0.2", "id": "default-log", "status": "creating", "pid": os.getpid(), "bundle": str(bundle)}
    )
    result = subprocess.run(
        [str(SCRIPTS / "nvc-py-hook"), "prestart"],
        input=state,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ["PATH"], "NVC_PY_CONFIG": str(tmp_path / "none.yaml"), "NVC_PY_HOOK_SOCKET": "none"},
    )
    assert result.returncode == 0, result.stderr
    lines = (Path(session_dir) / "var-log" / "nvc-py.log").read_text().splitlines()
    assert '"container":"default-log"' in lines[-1] and '"outcome":"no-gpu"' in lines[-1]


def test_only_the_sessions_own_processes_are_judged(session_dir: str, tmp_path: Path) -> None:
    """A process looking like nvc-py's helper that names none of the session's paths (another nvc-py
    on the machine) is not the session's; one whose environment names its directory is, and so is
    what runs below it."""
    foreign = subprocess.Popen([sys.executable, "-c", HELPER_LOOKALIKE], env={}, cwd="/")
    own = subprocess.Popen(
        ["sh", "-c", f'{sys.executable} -c "{HELPER_LOOKALIKE}"; true'],
        env={"NVC_PY_CONFIG": str(tmp_path / "config.yaml")},
        cwd="/",
    )
    try:
        deadline = time.monotonic() + 10
        while (
            len(found := nvc_processes(session_dir)) < 1
            or Path(f"/proc/{foreign.pid}/comm").read_text().strip() != "nvc:[driver]"
        ):
            assert time.monotonic() < deadline, found
            time.sleep(0.05)
        assert len(found) == 1 and str(foreign.pid) not in [line.split()[0] for line in found], found
        assert own.pid in hostcheck.own_processes(session_dir) and foreign.pid not in hostcheck.own_processes(
            session_dir
        )
    finally:
        for process in (foreign, own):
            process.kill()
            process.wait()
    deadline = time.monotonic() + 10
    while nvc_processes(session_dir):  # the helper look-alike below the killed shell
        assert time.monotonic() < deadline
        for line in nvc_processes(session_dir):
            os.kill(int(line.split()[0]), 9)
        time.sleep(0.05)


def test_make_clean_removes_the_suites_directories() -> None:
    dry = subprocess.run(["make", "-n", "-C", str(REPO), "clean"], capture_output=True, text=True, timeout=60)
    removed = next(line for line in dry.stdout.splitlines() if line.startswith("rm -rf build")).split()
    assert hostcheck.CACHE_DIR in removed and hostcheck.WORK_DIR in removed


def _nested_session(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """pytest on ``tmp_path``'s test_leaky.py with this suite's conftest, its files in ``tmp_path``."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "conftest",
            "--basetemp",
            str(tmp_path / "basetemp"),
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_leaky.py"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(TESTS)},
    )


def test_a_session_that_leaves_a_file_in_tmp_fails(tmp_path: Path) -> None:
    """A nested session with this suite's conftest, whose one test passes but leaves a directory in
    /tmp: the run fails, naming it."""
    leak = Path("/tmp") / f"nvc-leak-{os.getpid()}"
    (tmp_path / "test_leaky.py").write_text(f"import os\ndef test_leaks():\n    os.mkdir({str(leak)!r})\n")
    try:
        result = _nested_session(tmp_path)
    finally:
        if leak.exists():
            leak.rmdir()
    assert "1 passed" in result.stdout
    assert result.returncode == 1, result.stdout
    assert f"the test suite changed the host:\n  {leak}: left behind\n" in result.stdout


def test_a_session_that_leaves_a_process_running_fails(tmp_path: Path) -> None:
    """A nested session whose one test passes but leaves a process of its own running (it names the
    session's directory): the run fails, naming it."""
    (tmp_path / "test_leaky.py").write_text(
        "import subprocess\ndef test_leaks(tmp_path):\n"
        "    subprocess.Popen(['sleep', '30'], env={'WORK': str(tmp_path)}, start_new_session=True)\n"
    )
    result = _nested_session(tmp_path)
    for pid, command in hostcheck.own_processes(str(tmp_path / "basetemp")).items():
        if command.startswith("sleep 30"):
            os.kill(pid, 9)
    assert "1 passed" in result.stdout
    assert result.returncode == 1, result.stdout
    assert "(sleep 30): left running" in result.stdout
