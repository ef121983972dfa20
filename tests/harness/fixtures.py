"""pytest fixtures for container tests; tests/conftest.py re-exports them.

Session-scoped: the rootfs cache, runc with a private state dir, podman with a
private store, one private containerd daemon (stopped at session end), and the
one-node Kubernetes cluster of k8scluster.py (started on first use).
Function-scoped: fresh rootfs copies, which tests may modify freely.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .containerd import Containerd
from .k8scluster import k8s_cluster
from .podman import Podman
from .rootfs import RootfsCache
from .runtime import Runc

__all__ = [
    "rootfs_cache",
    "make_rootfs",
    "debian_rootfs",
    "lib64_rootfs",
    "runc",
    "podman",
    "containerd",
    "k8s_cluster",
]


@pytest.fixture(scope="session")
def rootfs_cache(tmp_path_factory: pytest.TempPathFactory) -> RootfsCache:
    return RootfsCache(tmp_path_factory.mktemp("rootfs-cache"))


@pytest.fixture
def make_rootfs(rootfs_cache: RootfsCache, tmp_path: Path) -> Callable[..., Path]:
    """make_rootfs(variant="debian", name="rootfs") -> a fresh copy under tmp_path."""

    def make(variant: str = "debian", name: str = "rootfs") -> Path:
        return rootfs_cache.copy(variant, tmp_path / name)

    return make


@pytest.fixture
def debian_rootfs(make_rootfs: Callable[..., Path]) -> Path:
    return make_rootfs("debian")


@pytest.fixture
def lib64_rootfs(make_rootfs: Callable[..., Path]) -> Path:
    return make_rootfs("lib64")


@pytest.fixture(scope="session")
def runc(tmp_path_factory: pytest.TempPathFactory) -> Runc:
    return Runc(tmp_path_factory.mktemp("runc-state"))


@pytest.fixture(scope="session")
def podman(tmp_path_factory: pytest.TempPathFactory, rootfs_cache: RootfsCache) -> Podman:
    return Podman(tmp_path_factory.mktemp("podman"), rootfs_cache)


@pytest.fixture(scope="session")
def containerd(tmp_path_factory: pytest.TempPathFactory, rootfs_cache: RootfsCache) -> Iterator[Containerd]:
    daemon = Containerd(tmp_path_factory.mktemp("containerd"), rootfs_cache)
    try:
        yield daemon
    finally:
        daemon.stop()
