"""Shared fixtures: the fake NVIDIA driver (built once per session) and its activation.

Tests point production code at a fake driver root with ``--root``; /proc and /dev are read at
their real paths, which the ``active_*`` fixtures fill from the fake inside a private mount
namespace. Everything here is a test double: no result obtained on it is a GPU result.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
# The shared fixtures and helpers of tests/harness/ fail with pytest's detailed assertion messages too.
pytest.register_assert_rewrite("harness")

MACHINES = TESTS / "fakedriver" / "machines"


def _build(tmp_path_factory: pytest.TempPathFactory, machine: str):
    from fakedriver.build import build

    return build(MACHINES / f"{machine}.yaml", tmp_path_factory.mktemp(machine))


def _activated(fake) -> Iterator:
    """``fake`` shown at the real /proc and /dev paths while the test runs."""
    from fakedriver.activate import activate

    with activate(fake) as active:
        yield active


@pytest.fixture(scope="session")
def fake_2gpu(tmp_path_factory: pytest.TempPathFactory):
    """Two GPUs (GPU 1 MIG-enabled with two MIG devices), distro library layout."""
    return _build(tmp_path_factory, "two-gpu-mig")


@pytest.fixture(scope="session")
def fake_3gpu(tmp_path_factory: pytest.TempPathFactory):
    """Three GPUs without MIG, distro library layout."""
    return _build(tmp_path_factory, "three-gpu")


@pytest.fixture(scope="session")
def fake_local_nvidia(tmp_path_factory: pytest.TempPathFactory):
    """One GPU, libraries under /usr/local/nvidia reached through ld.so.conf.d."""
    return _build(tmp_path_factory, "local-nvidia")


@pytest.fixture(scope="session")
def fake_debian(tmp_path_factory: pytest.TempPathFactory):
    """Two GPUs with Debian's packaged layout (nvidia/current, alternatives, stray other-version files)."""
    return _build(tmp_path_factory, "debian-nvidia")


@pytest.fixture
def active_debian(fake_debian) -> Iterator:
    yield from _activated(fake_debian)


@pytest.fixture
def active_2gpu(fake_2gpu) -> Iterator:
    yield from _activated(fake_2gpu)


@pytest.fixture
def active_3gpu(fake_3gpu) -> Iterator:
    yield from _activated(fake_3gpu)


@pytest.fixture
def active_local_nvidia(fake_local_nvidia) -> Iterator:
    yield from _activated(fake_local_nvidia)


_HOST: dict[str, object] = {}  # the host's state at the start, and the session's private mounts
_OWN_BASETEMP = pytest.StashKey[bool]()  # the base temporary directory is the suite's own (not --basetemp's)


@pytest.hookimpl(tryfirst=True)  # before pytest's tmpdir plugin reads the option
def pytest_configure(config: pytest.Config) -> None:
    """pytest's base temporary directory in the suite's own place (hostcheck.WORK_DIR), not /tmp: a
    passing run removes it, the next run clears what a failing one left there, ``make clean``
    removes it; the long phases of tests say on the terminal what they do (harness.progress)."""
    import hostcheck

    from harness import progress

    if config.option.basetemp is None:
        config.option.basetemp = hostcheck.WORK_DIR
        config.stash[_OWN_BASETEMP] = True
    progress.attach(config)


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The session's base temporary directory: every process a test starts names it (its
    configuration, driver root, rootfs or store), which is how hostcheck.own_processes tells the
    session's processes from others on the machine."""
    return str(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session", autouse=True)
def private_run_dir(session_dir: str) -> Iterator[None]:
    """The suite in a mount namespace of its own with a tmpfs on /run/nvc-py, /run/containerd,
    /run/runc, /run/docker and podman's blob-info cache, and a directory of the session's on
    /var/log (tests/hostcheck.py): no hook it runs reaches a hook server of the host's or starts one
    (the native front starts servers only from PID 1's namespaces; tests that want one say which
    process stands for the host), no hook writes the host's log, and nothing written there outlives
    it. What the host held is noted first: :func:`pytest_sessionfinish` compares."""
    import hostcheck

    _HOST["before"] = hostcheck.snapshot()
    private = hostcheck.PrivateRun()
    _HOST["private"] = private
    log = Path(session_dir) / "var-log"
    log.mkdir()
    private.bind_log(str(log))
    yield


@pytest.hookimpl(trylast=True)  # after pytest's own teardown of the session's fixtures
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if the host's watched places changed or a process it started still runs
    (tests/hostcheck.py); remove the suite's temporary directory after a passing run."""
    if "private" not in _HOST:
        return
    import shutil

    import hostcheck

    _HOST["private"].leave()
    basetemp = session.config._tmp_path_factory._basetemp  # noqa: SLF001 - where this session's tmp_path lives
    changed = hostcheck.left_running(str(basetemp)) if basetemp is not None else []
    own = session.config.stash.get(_OWN_BASETEMP, False)
    if own and basetemp is not None and exitstatus == 0 and not changed:
        shutil.rmtree(basetemp, ignore_errors=True)
    changed += hostcheck.changes(_HOST["before"], hostcheck.snapshot())
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if own and basetemp is not None and basetemp.exists() and reporter is not None:
        reporter.write_line(
            f"this run's files, the hooks' log among them (var-log/): {basetemp} (the next run, or "
            "make clean, removes them)"
        )
    if changed:
        if reporter is not None:
            reporter.write_line("the test suite changed the host:\n  " + "\n  ".join(changed), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def summary_line(request: pytest.FixtureRequest):  # noqa: ANN201
    """A function adding a line to the run's terminal summary (shown however pytest is called)."""
    return request.config.stash.setdefault(_SUMMARY, []).append


_SUMMARY = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:  # noqa: ANN001
    for line in config.stash.get(_SUMMARY, []):
        terminalreporter.write_line(line)


# Fixtures used by several test files are registered here, once: a fixture imported into each file that
# uses it is a fixture of each file, so a session-scoped one would be made once per file. The Debian
# package (deb, debs); the container harness (rootfs_cache, make_rootfs, debian_rootfs, lib64_rootfs, runc,
# podman, containerd); the shim and its test programs (programs).
from harness.debbuild import deb, debs  # noqa: E402,F401
from harness.fixtures import *  # noqa: E402,F401,F403
from harness.shim import programs  # noqa: E402,F401
