"""The session-end check that the suite left the host as it found it (tests/hostcheck.py), on real
directories: what it reports, and that the session's own state passes it so far."""

from __future__ import annotations

import os
from pathlib import Path

import hostcheck


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
