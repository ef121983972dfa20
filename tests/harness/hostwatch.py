"""The host side of the hostile-image tests: a canary directory standing for everything an image must
not reach, snapshots of it and of the host places the classic attacks aim at, and the check that a
container's mount table shows no host path beyond what it may see."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nvc.doctor.security import driver_files, fs_path

from .hostile import tree

CANARY = "nvc-host-canary"


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    """A host directory standing for everything an image must not reach."""
    root = tmp_path / CANARY
    (root / "lib").mkdir(parents=True)
    (root / "ld.so.cache").write_bytes(b"host cache, not the container's")
    (root / "ld.so.conf.d").mkdir()
    (root / "ld.so.conf.d" / "host.conf").write_text("/host/lib\n")
    (root / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    os.symlink("passwd", root / "link")
    return root


def snapshot(top: Path) -> dict[str, tuple]:
    """Every entry under ``top`` (itself included): type, mode, owner, size, mtime, content hash / link."""
    return tree(top, times=True)


def entries(top: Path) -> dict[str, tuple]:
    """What exists under ``top``: each entry's type and link target (not times: a rollback touches them)."""
    return {path: (entry[0], entry[-1]) for path, entry in snapshot(top).items()}


def driver_named_host_files() -> set[str]:
    """Driver-named entries of the host places the classic attacks aim at (CVE-2024-0133: lib dir -> /etc),
    as doctor --security watches them. Other tests may legitimately change these directories meanwhile,
    so only driver-named entries are looked for."""
    return driver_files()


def host_cache_state() -> tuple:
    st = os.lstat("/etc/ld.so.cache")
    return st.st_ino, st.st_size, st.st_mtime_ns


class HostWatch:
    """Before/after state of the host: the canary tree, driver-named files, the host ld cache."""

    def __init__(self, canary: Path) -> None:
        self.canary = canary
        self.before = (snapshot(canary), driver_named_host_files(), host_cache_state())

    def changes(self) -> list[str]:
        """What differs from before (nothing: an empty list)."""
        after = (snapshot(self.canary), driver_named_host_files(), host_cache_state())
        found = ["host canary changed"] if after[0] != self.before[0] else []
        if after[1] != self.before[1]:
            found.append(f"driver files appeared on the host: {after[1] - self.before[1]}")
        if after[2] != self.before[2]:
            found.append("host /etc/ld.so.cache changed")
        return found

    def assert_unchanged(self) -> None:
        changes = self.changes()
        assert not changes, "; ".join(changes)


def host_paths_in(mountinfo: str, allowed: tuple[Path, ...]) -> list[str]:
    """Mounts of the container that show host files outside ``allowed`` (rootfs, driver root, its /proc)."""
    permitted = [fs_path(p) for p in allowed]
    leaks = []
    for line in mountinfo.splitlines():
        fields = line.split()
        dev, root = fields[2], fields[3]
        same_fs = [p for d, p in permitted if d == dev]
        if not same_fs:
            continue  # another filesystem: proc, sysfs, tmpfs, devpts of the runtime
        if not any((root + "/").startswith(p.rstrip("/") + "/") for p in same_fs):
            leaks.append(line)
    return leaks
