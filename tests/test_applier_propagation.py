"""The container helper refuses to mount on a shared mount (a mount there would propagate to its
peers, the host's among them), asking the kernel about that one mount (statmount, Linux 6.8), or
where it cannot, reading the namespace's mountinfo: both must answer alike.

Each case runs in a forked child with a mount namespace of its own (harness.mountns), over a tmpfs
made shared and a directory of a private mount beside it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from harness.mountns import in_private_ns
from nvc.apply.applier import Applier
from nvc.errors import MountError
from nvc.plan.operations import Plan
from nvc.system import syscalls


def _no_statmount(mnt_id: int) -> int:
    raise OSError(errno.ENOSYS, "Function not implemented")


@pytest.mark.parametrize("asked", ["statmount", "mountinfo"])
def test_a_mount_on_a_shared_mount_is_refused_and_one_on_a_private_mount_is_not(tmp_path: Path, asked: str) -> None:
    shared, private = tmp_path / "shared", tmp_path / "private"
    shared.mkdir()
    private.mkdir()

    def look() -> object:
        syscalls.mount("tmpfs", str(shared), "tmpfs", 0)
        syscalls.mount(None, str(shared), None, syscalls.MS_SHARED)
        if asked == "mountinfo":
            syscalls.mount_propagation = _no_statmount
        applier = Applier(Plan(str(tmp_path), None, (0, 0), (), ldconfig=None))
        applier.in_container = True  # as after enter(): the check applies in a container's namespace
        refused = {}
        for where in (shared, private):
            fd = os.open(where, os.O_PATH | os.O_DIRECTORY)
            try:
                applier._refuse_shared(fd, str(where))
                refused[where.name] = None
            except MountError as err:
                refused[where.name] = str(err)
            finally:
                os.close(fd)
        return {"refused": refused, "mountinfo read": applier.shared is not None}

    seen = in_private_ns(look)
    assert seen["refused"]["private"] is None
    assert "its mount is shared" in seen["refused"]["shared"]
    assert seen["mountinfo read"] is (asked == "mountinfo")


def test_standalone_mode_checks_no_propagation(tmp_path: Path) -> None:
    """Outside a container's namespace (the CLI on a plain directory) nothing is refused, as before."""

    def look() -> object:
        syscalls.mount("tmpfs", str(tmp_path), "tmpfs", 0)
        syscalls.mount(None, str(tmp_path), None, syscalls.MS_SHARED)
        applier = Applier(Plan(str(tmp_path), None, (0, 0), (), ldconfig=None))
        fd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
        applier._refuse_shared(fd, str(tmp_path))
        return applier.shared is None

    assert in_private_ns(look) is True
