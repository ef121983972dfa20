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


@pytest.fixture(scope="session")
def fake_2gpu(tmp_path_factory: pytest.TempPathFactory):
    """Two GPUs (GPU 1 MIG-enabled with two MIG devices), distro library layout."""
    return _build(tmp_path_factory, "two-gpu-mig")


@pytest.fixture(scope="session")
def fake_local_nvidia(tmp_path_factory: pytest.TempPathFactory):
    """One GPU, libraries under /usr/local/nvidia reached through ld.so.conf.d."""
    return _build(tmp_path_factory, "local-nvidia")


@pytest.fixture
def active_2gpu(fake_2gpu) -> Iterator:
    """``fake_2gpu`` shown at the real /proc and /dev paths for the duration of the test."""
    from fakedriver.activate import activate

    with activate(fake_2gpu) as fake:
        yield fake


@pytest.fixture
def active_local_nvidia(fake_local_nvidia) -> Iterator:
    """``fake_local_nvidia`` shown at the real /proc and /dev paths for the duration of the test."""
    from fakedriver.activate import activate

    with activate(fake_local_nvidia) as fake:
        yield fake


@pytest.fixture(scope="session", autouse=True)
def private_run_dir() -> Iterator[None]:
    """The suite in a mount namespace of its own with a tmpfs on /run/nvc-py: no hook it runs reaches
    a hook server of the host's or starts one (the native front starts servers only from PID 1's
    namespaces; tests that want one say which process stands for the host), and nothing it leaves
    there outlives it."""
    from fakedriver.activate import enter_private_tmpfs

    enter_private_tmpfs("/run/nvc-py")
    yield


# Container harness fixtures: rootfs_cache, make_rootfs, debian_rootfs, lib64_rootfs, runc, podman, containerd.
from harness.fixtures import *  # noqa: E402,F401,F403
