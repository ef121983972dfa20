"""nvc.rootfs against hostile rootfs layouts: nothing may be opened or created outside the root.

Each test runs twice: with openat2(RESOLVE_IN_ROOT) and with the hand-walked fallback used
on kernels without openat2.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvc import rootfs


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(rootfs, "_openat2_missing", request.param == "walk")
    return request.param


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "rootfs"
    (r / "etc").mkdir(parents=True)
    (r / "etc" / "os-release").write_text("container\n")
    (r / "usr" / "lib").mkdir(parents=True)
    (tmp_path / "host").mkdir()
    (tmp_path / "host" / "secret").write_text("host\n")
    return r


@pytest.fixture
def root_fd(root: Path, resolver: str) -> Iterator[int]:
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def _same(fd: int, path: Path) -> bool:
    a, b = os.fstat(fd), os.stat(path)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def test_escaping_symlinks_stay_inside(root: Path, root_fd: int, tmp_path: Path) -> None:
    (root / "up").symlink_to("../../../../../../../..")
    (root / "abs").symlink_to(tmp_path / "host")
    (root / "dots").symlink_to("../../etc")
    for escape in (f"up{tmp_path}/host/secret", "abs/secret", "/../../host/secret", "../host/secret"):
        with pytest.raises(FileNotFoundError):
            os.close(rootfs.open_in_root(root_fd, escape, os.O_RDONLY))
    fd = rootfs.open_in_root(root_fd, "/dots/../../dots/os-release", os.O_RDONLY)
    assert _same(fd, root / "etc" / "os-release")
    os.close(fd)
    up = rootfs.open_in_root(root_fd, "up", os.O_PATH | os.O_DIRECTORY)
    assert _same(up, root)
    os.close(up)


def test_last_component_nofollow(root: Path, root_fd: int, tmp_path: Path) -> None:
    (root / "lib.so").symlink_to(tmp_path / "host" / "secret")
    fd = rootfs.open_in_root(root_fd, "lib.so", os.O_PATH | os.O_NOFOLLOW)
    assert os.readlink("", dir_fd=fd) == str(tmp_path / "host" / "secret")
    os.close(fd)
    with pytest.raises(OSError):
        rootfs.open_in_root(root_fd, "lib.so", os.O_RDONLY | os.O_NOFOLLOW)


def test_symlinked_rootfs(root: Path, tmp_path: Path, resolver: str) -> None:
    (tmp_path / "alias").symlink_to(root)
    (root / "abs").symlink_to("/etc")
    fd = os.open(tmp_path / "alias", os.O_PATH | os.O_DIRECTORY)
    try:
        got = rootfs.open_in_root(fd, "abs/os-release", os.O_RDONLY)
        assert os.read(got, 100) == b"container\n"
        os.close(got)
    finally:
        os.close(fd)


def test_missing_and_non_directory_components(root_fd: int) -> None:
    with pytest.raises(FileNotFoundError):
        rootfs.open_in_root(root_fd, "/no/such/file", os.O_RDONLY)
    with pytest.raises(NotADirectoryError):
        rootfs.open_in_root(root_fd, "/etc/os-release/x", os.O_RDONLY)


def test_symlink_loop_is_refused(root: Path, root_fd: int) -> None:
    (root / "a").symlink_to("b")
    (root / "b").symlink_to("a")
    with pytest.raises(OSError) as err:
        rootfs.open_in_root(root_fd, "a/x", os.O_RDONLY)
    assert err.value.errno == 40  # ELOOP


def test_create_file_through_symlinked_parent(root: Path, root_fd: int, tmp_path: Path) -> None:
    """CVE-2024-0133: the library dir is a symlink to a host dir."""
    (root / "usr" / "lib" / "x86_64-linux-gnu").symlink_to(tmp_path / "host")
    (root / str(tmp_path / "host")[1:]).mkdir(parents=True)
    fd = rootfs.create_file_in_root(root_fd, "/usr/lib/x86_64-linux-gnu/libcuda.so.1", owner=(1000, 1000))
    os.close(fd)
    assert sorted(os.listdir(tmp_path / "host")) == ["secret"]
    made = root / str(tmp_path / "host")[1:] / "libcuda.so.1"
    assert made.is_file() and made.stat().st_uid == 1000


def test_create_file_never_reuses_or_follows(root: Path, root_fd: int, tmp_path: Path) -> None:
    (root / "etc" / "link").symlink_to(tmp_path / "host" / "secret")
    for existing in ("/etc/os-release", "/etc/link"):
        with pytest.raises(FileExistsError):
            rootfs.create_file_in_root(root_fd, existing, access=os.O_WRONLY)
    assert (tmp_path / "host" / "secret").read_text() == "host\n"


def test_mkdir_follows_dangling_links_inside(root: Path, root_fd: int, tmp_path: Path) -> None:
    (root / "usr" / "lib" / "x86_64-linux-gnu").symlink_to(tmp_path / "nowhere")
    fd = rootfs.mkdir_in_root(root_fd, "/usr/lib/x86_64-linux-gnu/vdpau", owner=(7, 8))
    made = root / str(tmp_path / "nowhere")[1:] / "vdpau"
    assert _same(fd, made) and made.stat().st_uid == 7
    os.close(fd)
    assert not (tmp_path / "nowhere").exists()


def test_symlink_in_root(root: Path, root_fd: int, tmp_path: Path) -> None:
    """CVE-2024-0134: a link whose parent is a symlink to a host dir lands in the root."""
    (root / "usr" / "lib" / "x86_64-linux-gnu").symlink_to(tmp_path / "host")
    rootfs.mkdir_in_root(root_fd, str(tmp_path / "host"))
    link = "/usr/lib/x86_64-linux-gnu/libcuda.so"
    assert rootfs.symlink_in_root(root_fd, link, "libcuda.so.1", owner=(1000, 1000)) is True
    inside = root / str(tmp_path / "host")[1:] / "libcuda.so"
    assert os.readlink(inside) == "libcuda.so.1" and inside.lstat().st_uid == 1000
    assert sorted(os.listdir(tmp_path / "host")) == ["secret"]
    assert sorted(os.listdir(inside.parent)) == ["libcuda.so"]  # no temporary name left
    assert rootfs.symlink_in_root(root_fd, link, "libcuda.so.1") is False
    with pytest.raises(FileExistsError):
        rootfs.symlink_in_root(root_fd, link, "other")
    with pytest.raises(FileExistsError):
        rootfs.symlink_in_root(root_fd, "/etc/os-release", "x")
    assert (root / "etc" / "os-release").read_text() == "container\n"


def test_remove_in_root(root: Path, root_fd: int, tmp_path: Path) -> None:
    (root / "etc" / "host").symlink_to(tmp_path / "host")
    rootfs.remove_in_root(root_fd, "/etc/os-release")
    rootfs.remove_in_root(root_fd, "/etc/host")  # removes the link, not what it points to
    assert os.listdir(root / "etc") == [] and (tmp_path / "host" / "secret").exists()
