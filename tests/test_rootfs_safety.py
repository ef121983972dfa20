"""nvc.apply.rootfs against hostile rootfs layouts: nothing may be opened or created outside the root.

Each test runs twice: with openat2(RESOLVE_IN_ROOT) and with the hand-walked fallback used
on kernels without openat2.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvc.apply import rootfs


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


def test_symlink_in_root(root: Path, root_fd: int, tmp_path: Path) -> None:
    """CVE-2024-0134: a link whose parent is a symlink to a host dir lands in the root."""
    (root / "usr" / "lib" / "x86_64-linux-gnu").symlink_to(tmp_path / "host")
    (root / str(tmp_path / "host")[1:]).mkdir(parents=True)
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


def _resolve(root_fd: int, path: str, made: list[str]) -> tuple[str, str]:
    """resolve_in_root with directories and the last name made (and listed in ``made``)."""

    def mkdir(dir_fd: int, name: str, where: str) -> None:
        os.mkdir(name, 0o755, dir_fd=dir_fd)
        made.append(where)

    def touch(dir_fd: int, name: str, where: str) -> None:
        os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dir_fd))
        made.append(where)

    dir_fd, name, where = rootfs.resolve_in_root(root_fd, path, mkdir, touch)
    os.close(dir_fd)
    return name, where


@pytest.mark.parametrize("link", ["/abs/dir", "../../../../../../../../abs/dir"], ids=["absolute", "climbing"])
def test_resolve_makes_what_a_dangling_link_names_inside(root: Path, root_fd: int, tmp_path: Path, link: str) -> None:
    """chroot semantics: an absolute target and a ``..`` above the top both land in the root."""
    (root / "usr" / "lib" / "x86_64-linux-gnu").symlink_to(link)
    made: list[str] = []
    name, where = _resolve(root_fd, "/usr/lib/x86_64-linux-gnu/libcuda.so.1", made)
    assert name == "libcuda.so.1" and (root / "abs" / "dir" / "libcuda.so.1").is_file()
    assert made == ["/abs", "/abs/dir", "/abs/dir/libcuda.so.1"] and where == made[-1]
    assert not (tmp_path / "abs").exists()


def test_resolve_follows_the_last_link(root: Path, root_fd: int, tmp_path: Path) -> None:
    """A library name that is a dangling link: what it names is made, inside the root."""
    (root / "usr" / "lib" / "libnvidia-ml.so.1").symlink_to(tmp_path / "host" / "gone" / "libnvidia-ml.so.1")
    made: list[str] = []
    name, where = _resolve(root_fd, "/usr/lib/libnvidia-ml.so.1", made)
    inner = f"{tmp_path}/host/gone/libnvidia-ml.so.1"
    assert (name, where) == ("libnvidia-ml.so.1", inner) and made[-1] == inner
    assert (root / inner.lstrip("/")).is_file() and not (tmp_path / "host" / "gone").exists()


def test_resolve_explains_a_loop(root: Path, root_fd: int) -> None:
    (root / "usr" / "lib" / "x86_64-linux-gnu").symlink_to("/opt/x")
    (root / "opt").mkdir()
    (root / "opt" / "x").symlink_to("/usr/lib/x86_64-linux-gnu")
    with pytest.raises(rootfs.InRootError) as err:
        _resolve(root_fd, "/usr/lib/x86_64-linux-gnu/libcuda.so.1", [])
    assert err.value.errno == 40
    assert err.value.why == "/usr/lib/x86_64-linux-gnu is a symbolic link to /opt/x that loops"


def test_resolve_explains_a_file_where_a_directory_is_needed(root: Path, root_fd: int) -> None:
    (root / "usr" / "bin").write_text("")
    (root / "usr" / "lib" / "x86_64-linux-gnu").symlink_to("/etc/os-release")
    with pytest.raises(rootfs.InRootError) as err:
        _resolve(root_fd, "/usr/bin/nvidia-smi", [])
    assert err.value.why == "/usr/bin is a regular file where a directory is needed"
    with pytest.raises(rootfs.InRootError) as err:
        _resolve(root_fd, "/usr/lib/x86_64-linux-gnu/libcuda.so.1", [])
    assert err.value.why == (
        "/usr/lib/x86_64-linux-gnu is a symbolic link to /etc/os-release: /etc/os-release is "
        "a regular file where a directory is needed"
    )


def test_resolve_explains_what_cannot_be_made(root: Path, root_fd: int) -> None:
    (root / "ro").mkdir()
    (root / "usr" / "lib" / "x86_64-linux-gnu").symlink_to("/ro/libs")
    os.chmod(root / "ro", 0o555)

    def refuse(dir_fd: int, name: str, where: str) -> None:
        raise OSError(30, os.strerror(30))  # EROFS, as a read-only mount answers

    with pytest.raises(rootfs.InRootError) as err:
        rootfs.resolve_in_root(root_fd, "/usr/lib/x86_64-linux-gnu/libcuda.so.1", refuse)
    assert err.value.why == (
        "/usr/lib/x86_64-linux-gnu is a symbolic link to /ro/libs: /ro/libs does not exist "
        "and cannot be created: Read-only file system"
    )


def test_resolve_to_the_root_itself(root: Path, root_fd: int) -> None:
    (root / "top").symlink_to("..")
    dir_fd, name, where = rootfs.resolve_in_root(root_fd, "/top", lambda *_: None)
    os.close(dir_fd)
    assert (name, where) == (".", "/")
