"""nvc.apply.fdmount: binds and tmpfs mounts through fds, checked sources, rollback.

Mounting happens in a forked child that unshared its mount namespace, so the test process
and the host never see the mounts. Binds are cloned and attached as the applier does (new
mount API); tmpfs mounts run with the new API and with the classic mount(2)-on-/proc/self/fd
fallback.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from harness import mountns
from nvc.apply import fdmount, rootfs
from nvc.errors import MountError
from nvc.system import syscalls
from nvc.system.syscalls import MountAttr


def _enosys(*_args: object, **_kwargs: object) -> None:
    raise OSError(38, "Function not implemented")


def _classic_only() -> None:
    """Mount as on a kernel without the new mount API (tmpfs through mount(2) on /proc/self/fd)."""
    for name in ("open_tree", "mount_setattr", "fsopen"):
        setattr(syscalls, name, _enosys)


def in_private_ns(fn: Callable[[], object], classic: bool) -> object:
    """Run ``fn`` in a child with its own mount namespace (with the classic calls only, if
    ``classic``); return its JSON-able result."""
    return mountns.in_private_ns(fn, _classic_only if classic else None)


def _mountinfo(path: Path) -> list[str]:
    """Per-mount options of the mounts at ``path`` (field 6 of mountinfo)."""
    with open("/proc/self/mountinfo") as f:
        return [line.split()[5] for line in f if line.split()[4] == str(path)]


@pytest.fixture(params=["new-api", "classic"])
def classic(request: pytest.FixtureRequest) -> bool:
    return request.param == "classic"


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "rootfs"
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "proc" / "driver" / "nvidia").mkdir(parents=True)
    src = tmp_path / "libnvidia-ml.so.550.54.15"
    src.write_bytes(b"\x7fELF fake library")
    return root, src


def _bind(source: int, dir_fd: int, name: str, attrs: MountAttr, dest_path: str) -> fdmount.Mount:
    """A bind as the applier makes one: a detached clone of the source, attached on the target."""
    tree = fdmount.clone_tree(source, attrs, dest_path, recursive=os.path.isdir(f"/proc/self/fd/{source}"))
    try:
        return fdmount.attach_tree(tree, dir_fd, name, dest_path=dest_path)
    except MountError:
        os.close(tree)
        raise


def test_bind_file_read_only_then_rollback(layout: tuple[Path, Path]) -> None:
    root, src = layout
    dest = root / "usr" / "lib" / src.name

    def work() -> dict[str, object]:
        root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
        os.close(rootfs.create_file_in_root(root_fd, f"/usr/lib/{src.name}"))
        dir_fd, name = rootfs.open_parent_in_root(root_fd, f"/usr/lib/{src.name}")
        source = fdmount.open_source(str(src))
        attrs = MountAttr.RDONLY | MountAttr.NOSUID | MountAttr.NODEV
        m = _bind(source, dir_fd, name, attrs, f"/usr/lib/{name}")
        seen = {"opts": _mountinfo(dest), "content": dest.read_text()}
        try:
            dest.write_text("x")
        except OSError as err:
            seen["write"] = err.errno
        fdmount.unmount(m)
        seen["after"] = _mountinfo(dest)
        return seen

    seen = in_private_ns(work, classic=False)
    assert len(seen["opts"]) == 1
    assert {"ro", "nosuid", "nodev"} <= set(seen["opts"][0].split(","))
    assert seen["content"] == "\x7fELF fake library"
    assert seen["write"] == 30  # EROFS
    assert seen["after"] == []
    assert _mountinfo(dest) == []  # never visible to the test process


def test_tmpfs_fill_then_read_only(layout: tuple[Path, Path], classic: bool) -> None:
    root, _ = layout
    dest = root / "proc" / "driver" / "nvidia"

    def work() -> dict[str, object]:
        root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
        dir_fd, name = rootfs.open_parent_in_root(root_fd, "/proc/driver/nvidia")
        attrs = MountAttr.NOSUID | MountAttr.NODEV | MountAttr.NOEXEC
        m = fdmount.mount_tmpfs(dir_fd, name, attrs, dest_path="/proc/driver/nvidia", mode=0o555)
        fd = rootfs.create_file_in_root(m.fd, "params", access=os.O_WRONLY)
        os.write(fd, b"ModifyDeviceFiles: 0\n")
        os.close(fd)
        fdmount.set_attrs(m, attrs | MountAttr.RDONLY)
        seen = {
            "opts": _mountinfo(dest),
            "mode": oct(os.stat(dest).st_mode & 0o777),
            "params": (dest / "params").read_text(),
        }
        try:
            (dest / "other").write_text("x")
        except OSError as err:
            seen["write"] = err.errno
        fdmount.unmount(m)
        seen["after"] = _mountinfo(dest)
        return seen

    seen = in_private_ns(work, classic)
    assert {"ro", "nosuid", "nodev", "noexec"} <= set(seen["opts"][0].split(","))
    assert seen["mode"] == "0o555" and seen["params"] == "ModifyDeviceFiles: 0\n"
    assert seen["write"] == 30 and seen["after"] == []


def test_bind_directory_source(layout: tuple[Path, Path], tmp_path: Path) -> None:
    root, _ = layout
    mps = tmp_path / "nvidia-mps"
    mps.mkdir()
    (mps / "control").write_text("pipe")

    def work() -> list[str]:
        (root / "tmp" / "nvidia-mps").mkdir(parents=True)
        root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
        parent = rootfs.open_in_root(root_fd, "/tmp", os.O_PATH | os.O_DIRECTORY)
        source = fdmount.open_source(str(mps), directory=True)
        _bind(source, parent, "nvidia-mps", MountAttr.NOSUID | MountAttr.NODEV | MountAttr.NOEXEC, "/tmp/nvidia-mps")
        return os.listdir(root / "tmp" / "nvidia-mps")

    assert in_private_ns(work, classic=False) == ["control"]


def test_refused_sources(tmp_path: Path) -> None:
    """CVE-2024-0132: symlinks and directories are never mounted where a file is expected."""
    (tmp_path / "link.so").symlink_to("/")
    (tmp_path / "dir.so").mkdir()
    (tmp_path / "file").write_text("")
    with pytest.raises(MountError, match="link.so: it is a symbolic link"):
        fdmount.open_source(str(tmp_path / "link.so"))
    with pytest.raises(MountError, match="dir.so: it is a directory"):
        fdmount.open_source(str(tmp_path / "dir.so"))
    with pytest.raises(MountError, match="file: it is not a directory"):
        fdmount.open_source(str(tmp_path / "file"), directory=True)
    with pytest.raises(MountError, match="not the character device 195:0"):
        fdmount.open_source("/dev/null", rdev=os.makedev(195, 0))
    with pytest.raises(MountError, match="open failed: .*missing"):
        fdmount.open_source(str(tmp_path / "missing"))
    fd = fdmount.open_source("/dev/null", rdev=os.makedev(1, 3))
    os.close(fd)


def test_image_compat_lib_symlink_to_root_refused(tmp_path: Path) -> None:
    """A compat lib in the image that points at / or climbs out is refused as a source."""
    root = tmp_path / "rootfs"
    compat = root / "usr" / "local" / "cuda" / "compat"
    compat.mkdir(parents=True)
    (compat / "libcuda.so.999").symlink_to("/")
    (compat / "libnvidia-ptxjitcompiler.so.999").symlink_to("../../../../../..")
    root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    for name in ("libcuda.so.999", "libnvidia-ptxjitcompiler.so.999"):
        path = f"/usr/local/cuda/compat/{name}"
        fd = rootfs.open_in_root(root_fd, path, os.O_PATH | os.O_NOFOLLOW)
        with pytest.raises(MountError, match="symbolic link"):
            fdmount.check_source(fd, path)
        os.close(fd)
    os.close(root_fd)


def test_destination_symlink_refused(layout: tuple[Path, Path], tmp_path: Path) -> None:
    root, src = layout
    (root / "usr" / "lib" / src.name).symlink_to(tmp_path / "elsewhere")

    def work() -> str:
        root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
        dir_fd, name = rootfs.open_parent_in_root(root_fd, f"/usr/lib/{src.name}")
        try:
            _bind(fdmount.open_source(str(src)), dir_fd, name, MountAttr.RDONLY, name)
        except MountError as err:
            return str(err)
        return "mounted"

    assert "it is a symbolic link" in in_private_ns(work, classic=False)
