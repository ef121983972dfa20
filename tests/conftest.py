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


@pytest.fixture(scope="session", autouse=True)
def private_run_dir() -> Iterator[None]:
    """The suite in a mount namespace of its own with a tmpfs on /run/nvc-py, /run/containerd and
    /run/runc (tests/hostcheck.py): no hook it runs reaches a hook server of the host's or starts one
    (the native front starts servers only from PID 1's namespaces; tests that want one say which
    process stands for the host), and nothing written there outlives it. What the host held is
    noted first: :func:`pytest_sessionfinish` compares."""
    import hostcheck

    _HOST["before"] = hostcheck.snapshot()
    _HOST["private"] = hostcheck.PrivateRun()
    yield


@pytest.hookimpl(trylast=True)  # after pytest's own removal of the session's temporary directory
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if the host's watched directories or /tmp changed (tests/hostcheck.py)."""
    if "private" not in _HOST:
        return
    import hostcheck

    _HOST["private"].leave()
    changed = hostcheck.changes(_HOST["before"], hostcheck.snapshot())
    factory = session.config._tmp_path_factory  # noqa: SLF001 - where this session's tmp_path lives
    basetemp = factory._basetemp  # noqa: SLF001
    if exitstatus == 0 and basetemp is not None and basetemp.exists() and factory._given_basetemp is None:  # noqa: SLF001
        changed.append(f"{basetemp}: left behind by a passing run")
    if changed:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
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


# Container harness fixtures: rootfs_cache, make_rootfs, debian_rootfs, lib64_rootfs, runc, podman, containerd.
from harness.fixtures import *  # noqa: E402,F401,F403
