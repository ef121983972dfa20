"""A container's sharing files made as a container start makes them (planned by configure, made for
its process), in a private mount namespace of the test's own, and the mount points the tests
look for them at."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakedriver.activate import private_mounts as private_mount_namespace

from nvc.apply import sharefiles
from nvc.apply.container import ContainerHandle
from nvc.pipeline.configure import share_files
from nvc.plan import fromenv, share
from nvc.plan.request import ShareRequest

from .shim import SHIM


def prepare(request: ShareRequest, container_id: str, rootfs: str, pid: int | None = None, **where: str) -> tuple:
    """The sharing files as a container start has them: planned (share_files, of the pipeline's container
    plan), then made (sharefiles.make, for the container whose process is ``pid``); returns where the
    container gets them (share.mounts)."""
    root_fd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        files = share_files(request, container_id, root_fd, rootfs, **where)
    finally:
        os.close(root_fd)
    if pid is None:
        sharefiles.make(files, None)
        return share.mounts(files)
    with ContainerHandle.open(pid) as handle:
        sharefiles.make(files, handle)
    return share.mounts(files)


def prepared(state: Path, container_id: str, env: dict[str, str], pid: int | None = None) -> Path:
    """prepare for a container with this env (an empty image) under the state dir ``state``, its
    process ``pid``; returns its shared directory (a tmpfs: callers run in a private mount namespace)."""
    rootfs = state.parent / f"rootfs-{container_id}"
    rootfs.mkdir(exist_ok=True)
    prepare(fromenv.parse_share_env(env), container_id, str(rootfs), pid, library=str(SHIM), state_dir=str(state))
    return state / container_id / "shared"


@pytest.fixture
def private_mounts() -> Iterator[None]:
    """This test's tmpfs mounts in a private mount namespace: never on the host."""
    with private_mount_namespace():
        yield


def mountpoints() -> set[str]:
    return {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}
