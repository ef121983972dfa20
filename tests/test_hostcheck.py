"""The session-end check that the suite left the host as it found it (tests/hostcheck.py), on real
directories: what it reports, and that the session's own state passes it so far."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import hostcheck

TESTS = Path(__file__).resolve().parent


def test_changes_name_what_appeared_and_vanished(tmp_path: Path) -> None:
    run, tmp = tmp_path / "run-nvc-py", tmp_path / "tmp"
    (run / "share" / "c1").mkdir(parents=True)
    (tmp / "unrelated").mkdir(parents=True)
    (run / "config-cache.json").write_text("{}")
    before = hostcheck.snapshot((str(run), str(tmp_path / "run-runc")), str(tmp))
    (run / "config-cache.json").unlink()
    (run / "share" / "c2").mkdir()
    (tmp_path / "run-runc").mkdir()
    (tmp / "nvc-fake-dev-x").mkdir()
    (tmp / "someone-elses").mkdir()
    (tmp / hostcheck.PYTEST_TMP).mkdir()
    after = hostcheck.snapshot((str(run), str(tmp_path / "run-runc")), str(tmp))
    assert hostcheck.changes(before, after) == [
        f"{run}/share/c2: left behind", f"{run}/config-cache.json: removed", f"{tmp_path / 'run-runc'}: created",
        f"{tmp}/nvc-fake-dev-x: left behind"]
    assert hostcheck.changes(after, after) == []


def test_the_private_run_dirs_are_tmpfs_of_this_session() -> None:
    """Written here, the config cache, sharing directories and runtimes' state never reach the host."""
    mounts = {line.split()[4]: line.split(" - ")[1].split()[0] for line in open("/proc/self/mountinfo")}
    for path in hostcheck.PRIVATE_RUN_DIRS:
        assert mounts.get(path) == "tmpfs", path
    assert os.stat("/run/nvc-py").st_dev != os.stat("/run").st_dev


def test_a_session_that_leaves_a_file_in_tmp_fails(tmp_path: Path) -> None:
    """A nested session with this suite's conftest, whose one test passes but leaves a directory in
    /tmp: the run fails, naming it."""
    leak = Path("/tmp") / f"nvc-leak-{os.getpid()}"
    (tmp_path / "test_leaky.py").write_text(
        f"import os\ndef test_leaks():\n    os.mkdir({str(leak)!r})\n")
    try:
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                                 "--basetemp", str(tmp_path / "basetemp"), "--rootdir", str(tmp_path),
                                 str(tmp_path / "test_leaky.py")],
                                capture_output=True, text=True, timeout=120, cwd=tmp_path,
                                env={**os.environ, "PYTHONPATH": str(TESTS)})
    finally:
        if leak.exists():
            leak.rmdir()
    assert "1 passed" in result.stdout
    assert result.returncode == 1, result.stdout
    assert f"the test suite changed the host:\n  {leak}: left behind\n" in result.stdout
