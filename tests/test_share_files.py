"""A container's sharing files on the host (planned by configure, made by nvc.apply.sharefiles): the
image's ld.so.preload read in-root, a tmpfs of the container's own and its mounts, refusals before
anything changes, and a removal that follows nothing the container planted.
Test double only: nothing here is a GPU result.
"""

from __future__ import annotations

import functools
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from harness.sharedirs import mountpoints as _mountpoints
from harness.sharedirs import prepare, prepared, private_mounts  # noqa: F401  (fixture)
from harness.shim import SHIM
from nvc.apply import sharefiles
from nvc.apply.rootfs import open_in_root
from nvc.containerenv import sharing
from nvc.discover.container import image_preload as read_preload
from nvc.errors import ContainerError, InputError
from nvc.plan import fromenv, share
from nvc.plan.request import ShareRequest
from nvc.share.region import SIZE as REGION_SIZE


def image_preload(rootfs: Path) -> str:
    """The image's ld.so.preload as configure reads it, inside the rootfs."""
    root_fd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return read_preload(functools.partial(open_in_root, root_fd), sharing.PRELOAD, str(rootfs))
    finally:
        os.close(root_fd)


# ---------------------------------------------------------------- host side: directory, preload, mounts


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    return root


def test_preload_keeps_the_image_entries(rootfs):
    assert image_preload(rootfs) == ""
    (rootfs / "etc" / "ld.so.preload").write_text("/usr/lib/libjemalloc.so.2 /opt/x.so")
    image = image_preload(rootfs)
    assert share.preload_text(image) == f"{sharing.CONTAINER_LIBRARY}\n/usr/lib/libjemalloc.so.2 /opt/x.so\n"


def test_preload_is_read_inside_the_root(rootfs, tmp_path):
    secret = tmp_path / "host-secret"
    secret.write_text("/host/only.so\n")
    (rootfs / "etc" / "ld.so.preload").symlink_to(secret)  # absolute: lands inside the rootfs
    assert image_preload(rootfs) == ""
    (rootfs / "etc" / "ld.so.preload").unlink()
    os.mknod(rootfs / "etc" / "ld.so.preload", stat.S_IFCHR | 0o644, os.makedev(1, 5))  # /dev/zero
    with pytest.raises(ContainerError, match="ld.so.preload in .* is a character device, not a regular file"):
        image_preload(rootfs)


def test_preload_fifo_is_refused_without_being_opened(rootfs, tmp_path):
    """Finding 2: a FIFO (as a device node) in the image is refused from its type alone. A writer
    blocked opening the FIFO is released by any open for reading: it must still be blocked after
    prepare refused, and is released only by the test's own open afterwards."""
    fifo = rootfs / "etc" / "ld.so.preload"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", f"exec 3>'{fifo}'; echo opened"], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.2)  # the writer now waits in open()
        with pytest.raises(ContainerError) as refused:
            prepare(ShareRequest(), "ctr", str(rootfs), library=str(SHIM), state_dir=str(tmp_path / "state"))
        with pytest.raises(subprocess.TimeoutExpired):
            writer.wait(timeout=1)  # nobody opened the FIFO
        assert "ld.so.preload in " in str(refused.value) and "is a FIFO, not a regular file" in str(refused.value)
        assert not (tmp_path / "state").exists()
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # now one open for reading...
        os.close(fd)
        assert writer.communicate(timeout=10)[0] == "opened\n"  # ...releases it: the check could see one
    finally:
        writer.kill()
        writer.wait()


def test_prepare_and_remove(private_mounts, rootfs, tmp_path):
    library = tmp_path / "libnvc-share.so"
    library.write_bytes(b"\x7fELF")
    state = tmp_path / "state"
    (rootfs / "etc" / "ld.so.preload").write_text("/usr/lib/libfoo.so\n")
    request = fromenv.parse_share_env({"NVC_SHARE_MEMORY_LIMIT": "4Gi"})
    mounts = prepare(request, "ctr1", str(rootfs), library=str(library), state_dir=str(state))
    shared = state / "ctr1" / "shared"
    assert [(m.source, m.target, m.readonly, m.directory) for m in mounts] == [
        (str(library), "/usr/lib/nvc-share/libnvc-share.so", True, False),
        (str(shared), "/var/run/nvc-share", False, True),
        (str(shared / "limits"), "/var/run/nvc-share/limits", True, False),
        (str(state / "ctr1" / "ld.so.preload"), "/etc/ld.so.preload", True, False),
    ]
    assert (state / "ctr1" / "ld.so.preload").read_text() == "/usr/lib/nvc-share/libnvc-share.so\n/usr/lib/libfoo.so\n"
    assert "memory_limit=4294967296\n" in (shared / "limits").read_text()
    # the shared directory is a tmpfs of its own, exactly full: the region's blocks are allocated
    assert str(shared) in _mountpoints()
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
    fs = os.statvfs(shared)
    assert (fs.f_bfree, fs.f_ffree) == (0, 0)
    assert fs.f_blocks * fs.f_frsize <= REGION_SIZE + 2 * os.sysconf("SC_PAGE_SIZE")
    assert os.stat(shared / "region").st_blocks * 512 >= REGION_SIZE
    with pytest.raises(ContainerError, match="already exists"):
        prepare(request, "ctr1", str(rootfs), library=str(library), state_dir=str(state))
    sharefiles.remove("ctr1", str(state))
    assert os.listdir(state) == []
    assert str(shared) not in _mountpoints()


def test_prepare_refuses_before_changing_anything(rootfs, tmp_path):
    state = tmp_path / "state"
    request = fromenv.parse_share_env({"NVC_SHARE_COMPUTE": "50"})
    with pytest.raises(ContainerError, match="not installed"):
        prepare(request, "ctr", str(rootfs), library=str(tmp_path / "missing.so"), state_dir=str(state))
    with pytest.raises(InputError, match="cannot name a directory"):
        prepare(request, "../x", str(rootfs), library=str(Path(share.__file__)), state_dir=str(state))
    assert not state.exists() or os.listdir(state) == []


def test_granted_limits_too_large_for_the_scheduler_tmpfs_are_refused(private_mounts, rootfs, tmp_path):
    """Other containers' shims read a scheduled container's compute limits from the scheduler tmpfs,
    which keeps 8 KiB for each: a request whose compute lines do not fit is refused by the plan, before
    anything of the container is made (nor the scheduler tmpfs mounted)."""
    state, sched = tmp_path / "state", tmp_path / "sched"
    request = ShareRequest(weight=tuple((str(i), 1) for i in range(1000)))
    with pytest.raises(ContainerError, match="compute limits of container ctr exceed 8192 bytes"):
        share.files(request, "ctr", "", state_dir=str(state), sched_dir=str(sched))
    with pytest.raises(ContainerError, match="compute limits of container ctr exceed 8192 bytes"):
        prepare(request, "ctr", str(rootfs), library=str(SHIM), state_dir=str(state), sched_dir=str(sched))
    assert (not state.exists() or os.listdir(state) == []) and not sched.exists()


def test_applying_the_sharing_files_plans_nothing() -> None:
    """nvc.apply.sharefiles writes what the plan decided (ShareFiles carries every file's text): of
    nvc.plan.share it takes the record and the host's names, never a function deciding content."""
    import ast

    tree = ast.parse(Path(sharefiles.__file__).read_text())
    taken = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "nvc.plan.share"
        for alias in node.names
    }
    assert "ShareFiles" in taken
    assert taken <= {
        "ShareFiles",
        "STATE_DIR",
        "GRANTED_DIR",
        "GRANTED_MAX",
        "BOUNDS_FILE",
        "container_dir",
        "sched_dir_for",
    }


def test_prepare_refuses_a_state_dir_others_can_write(private_mounts, rootfs, tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o777)
    os.chmod(state, 0o777)
    with pytest.raises(ContainerError, match="must be ours and not writable by others"):
        prepare(ShareRequest(), "ctr", str(rootfs), library=str(SHIM), state_dir=str(state))
    os.chmod(state, 0o700)
    (tmp_path / "link").symlink_to(state)
    with pytest.raises(ContainerError, match="cannot use sharing directory"):
        prepare(ShareRequest(), "ctr", str(rootfs), library=str(SHIM), state_dir=str(tmp_path / "link"))
    assert os.listdir(state) == []


def test_failure_midway_leaves_nothing(private_mounts, rootfs, tmp_path, monkeypatch):
    """The tmpfs is mounted and filled, then writing ld.so.preload fails: the tmpfs is unmounted, the
    directory gone, and the failure is one ContainerError."""
    state = tmp_path / "state"
    original = sharefiles.write_new

    def full_on_preload(dir_fd: int, name: str, data: bytes, mode: int) -> None:
        if name == "ld.so.preload":
            assert any(m.startswith(str(state)) for m in _mountpoints())  # midway indeed
            raise OSError(28, "No space left on device")
        original(dir_fd, name, data, mode)

    monkeypatch.setattr(sharefiles, "write_new", full_on_preload)
    with pytest.raises(
        ContainerError,
        match=f"^container error: cannot make the sharing files of container ctr in {state}: No space left on device$",
    ):
        prepare(ShareRequest(), "ctr", str(rootfs), library=str(SHIM), state_dir=str(state))
    assert os.listdir(state) == []
    assert not any(m.startswith(str(state)) for m in _mountpoints())


def test_a_uid_1000_process_fills_only_the_small_tmpfs(private_mounts, tmp_path):
    """Finding 3: a workload process (uid 1000) writing all it can into the shared directory gets
    ENOSPC at once; it cannot create files there; the state dir's own filesystem is not touched."""
    state = tmp_path / "state"
    shared = prepared(state, "ctr", {"NVC_SHARE_MEMORY_LIMIT": "1Gi"})
    before = os.statvfs(state).f_bfree
    # in the shared directory as its cwd: the container reaches it through its bind mount alone
    as_1000 = ["setpriv", "--reuid", "1000", "--regid", "1000", "--clear-groups"]
    grow = subprocess.run(
        [*as_1000, "dd", "if=/dev/zero", "of=region", "bs=64K", "count=16384", "oflag=append", "conv=notrunc"],
        cwd=shared,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert grow.returncode != 0 and "No space left on device" in grow.stderr, grow.stderr
    page = os.sysconf("SC_PAGE_SIZE")
    assert os.stat(shared / "region").st_size <= -(-REGION_SIZE // page) * page  # the region's last page
    new = subprocess.run(
        [*as_1000, "dd", "if=/dev/zero", "of=more", "bs=64K", "count=16"],
        cwd=shared,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert new.returncode != 0 and "Permission denied" in new.stderr, new.stderr
    # and root in the container makes no new file either: the inodes are counted too
    with pytest.raises(OSError, match="No space left on device"):
        (shared / "more").touch()
    assert os.statvfs(shared).f_bfree == 0
    assert abs(os.statvfs(state).f_bfree - before) < 256  # nothing of 1 GiB landed beside it
    sharefiles.remove("ctr", str(state))


def test_remove_follows_nothing_the_container_planted(private_mounts, tmp_path):
    """Poststop: symlinks to a host directory planted in the tmpfs (in place of the region) and in a
    directory of the old layout (no tmpfs) remove nothing outside."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "keep").write_text("host file\n")
    state = tmp_path / "state"
    shared = prepared(state, "new", {"NVC_SHARE_COMPUTE": "50"})
    (shared / "region").unlink()
    (shared / "region").symlink_to(host)
    old = state / "old" / "shared"  # a directory as an earlier nvc-py left it
    old.mkdir(parents=True)
    (old / "link").symlink_to(host)
    (old / "sub").mkdir()
    (old / "sub" / "link").symlink_to(host / "keep")
    for cid in ("new", "old"):
        sharefiles.remove(cid, str(state))
    assert os.listdir(state) == []
    assert (host / "keep").read_text() == "host file\n"
    assert not any(m.startswith(str(state)) for m in _mountpoints())
