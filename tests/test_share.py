"""The Python side of GPU sharing (nvc.containerenv.sharing, nvc.plan.share, nvc.apply.sharefiles,
nvc-py share status) against the real shim and the fake driver: the env grammar, the limits file
the hook writes as the shim reads it, the host-side directory and mounts, the image's ld.so.preload
read in-root, and status from a live region. Test double only: nothing here is a GPU result.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakedriver.activate import private_mounts as private_mount_namespace
from nvc.apply import sharefiles
from nvc.apply.container import resolve
from nvc.commands import configure
from nvc.containerenv import sharing
from nvc.errors import ContainerError, InputError
from nvc.plan import share
from nvc.plan.request import ShareRequest
from nvc.share import status as sharestatus
from nvc.share.region import SIZE as REGION_SIZE
from test_hook_containers import setup_dir  # noqa: F401  (fixture: the fake driver's config and hooks.d)
from test_hook_server import default_run_dir  # noqa: F401  (fixture: /run/nvc-py, a tmpfs of this test's own)
from test_configure import target_process  # noqa: F401  (fixture: a process in a mount namespace of its own)
from test_share_native import GIB, GPU0, MIB, SHIM, meminfo, programs, share as shim  # noqa: F401  (fixtures)


def prepare(request: ShareRequest, container_id: str, rootfs: str, pid: int | None = None, **where: str) -> tuple:
    """The sharing files as a container start has them: planned (configure.share_files, a step of its
    plan), then made (sharefiles.make, for the container whose process is ``pid``); returns where the
    container gets them (share.mounts)."""
    root_fd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        files = configure.share_files(request, container_id, root_fd, rootfs, **where)
    finally:
        os.close(root_fd)
    with resolve(pid) as handle:
        sharefiles.make(files, handle)
    return share.mounts(files)


def image_preload(rootfs: Path) -> str:
    """The image's ld.so.preload as configure reads it, inside the rootfs."""
    root_fd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return configure.read_image_preload(root_fd, str(rootfs))
    finally:
        os.close(root_fd)


# ---------------------------------------------------------------- the env grammar

SIZES = [("1073741824", GIB), ("1g", GIB), ("1G", GIB), ("1Gi", GIB), ("1024m", GIB), ("1024Mi", GIB),
         ("1048576K", GIB), ("1048576Ki", GIB), ("4096", 4096), ("2T", 2 << 40), ("1ti", 1 << 40)]
JUNK_SIZES = ["", "abc", "0", "00", "1.5G", "0x10", "1 G", " 1G", "-1", "1GiB", "1gb", "1B", "1iG", "G",
              "1e9", "+5", "99999999999999999999", "16777216T", "١٢"]


@pytest.mark.parametrize(("text", "value"), SIZES)
def test_sizes(text, value):
    assert sharing.parse_size("NVC_SHARE_MEMORY_LIMIT", text) == value


@pytest.mark.parametrize("text", JUNK_SIZES)
def test_junk_sizes_are_refused_naming_the_variable(text):
    with pytest.raises(InputError, match=re.escape(f"NVC_SHARE_MEMORY_LIMIT={text!r}: not a size")):
        sharing.parse_size("NVC_SHARE_MEMORY_LIMIT", text)


@pytest.mark.parametrize(("env", "memory", "compute"), [
    ({}, None, None),
    ({"NVC_SHARE_MEMORY_LIMIT": "4Gi"}, (("", 4 * GIB),), ()),
    ({"NVC_SHARE_COMPUTE": "50"}, (), (("", 50),)),
    # HAMi's names; NVC_SHARE_* win at the same scope; per-device entries are kept by index
    ({"CUDA_DEVICE_MEMORY_LIMIT": "3g", "NVC_SHARE_MEMORY_LIMIT": "1Gi", "CUDA_DEVICE_MEMORY_LIMIT_1": "2048m"},
     (("", GIB), ("1", 2 * GIB)), ()),
    ({"CUDA_DEVICE_SM_LIMIT": "0"}, (), (("", 100),)),                       # HAMi: 0 = unlimited
    ({"CUDA_DEVICE_SM_LIMIT": "30", "NVC_SHARE_COMPUTE_0": "70"}, (), (("", 30), ("0", 70))),
    ({"NVC_SHARE_MEMORY_LIMIT_007": "1M"}, (("7", MIB),), ()),
    # by UUID, as the device plugin names them: the shim applies them to that device whatever its index
    ({"NVC_SHARE_MEMORY_LIMIT_GPU-4f6a2c1e-8b3d-5e7f-9a1b-2c3d4e5f6a7b": "1M",
      "CUDA_DEVICE_SM_LIMIT_MIG-5a6b7c8d-9e0f-5a1b-8c2d-3e4f5a6b7c8d": "20"},
     (("GPU-4f6a2c1e-8b3d-5e7f-9a1b-2c3d4e5f6a7b", MIB),), (("MIG-5a6b7c8d-9e0f-5a1b-8c2d-3e4f5a6b7c8d", 20),)),
    # other HAMi variables sharing a prefix are not limits
    ({"CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/x", "CUDA_DEVICE_SM_LIMIT_POLICY": "force"}, None, None),
])
def test_env_requests(env, memory, compute):
    request = sharing.parse_share_env({"PATH": "/bin", **env})
    if memory is None:
        assert request is None
    else:
        assert (request.memory, request.compute) == (memory, compute)


@pytest.mark.parametrize(("env", "message"), [
    ({"NVC_SHARE_MEMORY_LIMIT": "lots"}, "NVC_SHARE_MEMORY_LIMIT='lots': not a size"),
    ({"CUDA_DEVICE_MEMORY_LIMIT_0": "0x100"}, "CUDA_DEVICE_MEMORY_LIMIT_0='0x100': not a size"),
    ({"NVC_SHARE_COMPUTE": "0"}, "NVC_SHARE_COMPUTE='0': not a percentage"),
    ({"NVC_SHARE_COMPUTE": "101"}, "not a percentage"),
    ({"CUDA_DEVICE_SM_LIMIT": "50%"}, "CUDA_DEVICE_SM_LIMIT='50%': not a percentage"),
    ({"NVC_SHARE_MEMORY_LIMIT_GPU0": "1G"}, "NVC_SHARE_MEMORY_LIMIT_GPU0: unknown sharing variable"),
    ({"NVC_SHARE_MEMORY_LIMIT_1234": "1G"}, "unknown sharing variable"),
    ({"NVC_SHARE_WEIGHT_GPU-12/gi": "1"}, "NVC_SHARE_WEIGHT_GPU-12/gi: unknown sharing variable"),
])
def test_junk_env_is_refused(env, message):
    with pytest.raises(InputError, match=message):
        sharing.parse_share_env(env)


def test_host_defaults_fill_in_what_the_container_left_out():
    own = sharing.parse_share_env({"NVC_SHARE_COMPUTE": "30", "NVC_SHARE_MEMORY_LIMIT_1": "1G"})
    merged = sharing.with_defaults(own, "8g", 50)
    assert (merged.memory, merged.compute) == ((("", 8 * GIB), ("1", GIB)), (("", 30),))
    assert sharing.with_defaults(None, None, 25) == ShareRequest(compute=(("", 25),))
    assert sharing.with_defaults(None, None, None) == ShareRequest()          # the shim, unlimited
    with pytest.raises(InputError, match="sharing.device-memory-limit='8 g'"):
        sharing.with_defaults(None, "8 g", None)


def prepared(state: Path, container_id: str, env: dict[str, str], pid: int | None = None) -> Path:
    """prepare for a container with this env (an empty image) under the state dir ``state``, its
    process ``pid``; returns its shared directory (a tmpfs: callers run in a private mount namespace)."""
    rootfs = state.parent / f"rootfs-{container_id}"
    rootfs.mkdir(exist_ok=True)
    prepare(sharing.parse_share_env(env), container_id, str(rootfs), pid, library=str(SHIM), state_dir=str(state))
    return state / container_id / "shared"


@pytest.fixture
def private_mounts() -> Iterator[None]:
    """This test's tmpfs mounts in a private mount namespace: never on the host."""
    with private_mount_namespace():
        yield


# ---------------------------------------------------------------- the limits file, as the shim reads it

def test_limits_file_round_trip_through_the_shim(shim, tmp_path):
    shared = prepared(tmp_path / "state", "ctr", {"CUDA_DEVICE_MEMORY_LIMIT_1": "2048m",
                                                   "NVC_SHARE_MEMORY_LIMIT": "1536Mi", "NVC_SHARE_COMPUTE": "50"})
    assert stat.S_IMODE(os.stat(shared / "limits").st_mode) == 0o444
    assert stat.S_IMODE(os.stat(shared / "region").st_mode) == 0o666
    assert os.stat(shared / "region").st_size == REGION_SIZE
    shim.dir = shared
    # The file is the authority: the environment's (larger) limit is ignored, junk in it too.
    out, err = shim.run("cuda_probe", "init", "ctx", 0, "meminfo", "alloc", 1536 * MIB + 1, "ctx", 1, "meminfo",
                        limits={"NVC_SHARE_MEMORY_LIMIT": "60G", "NVC_SHARE_COMPUTE": "junk"})
    assert "FAILED" not in err
    assert meminfo(out[2]) == (1536 * MIB, 1536 * MIB)
    assert out[3] == ["alloc", "CUDA_ERROR_OUT_OF_MEMORY", "-1"]
    assert meminfo(out[5])[1] == 2 * GIB            # memory_limit.1: by NVML index


def test_fake_nvidia_smi_reports_the_written_limit(shim, tmp_path):
    # a plain directory, as bench/share and the GPU tests use through NVC_SHARE_DIR
    shim.dir = sharefiles.write_share_dir(tmp_path, sharing.parse_share_env({"NVC_SHARE_MEMORY_LIMIT": "4Gi"}))
    assert os.stat(shim.dir / "region").st_size == REGION_SIZE
    holder = shim.holder("alloc", GIB, limits={})
    try:
        result = subprocess.run([str(shim.root / "usr" / "bin" / "nvidia-smi"),
                                 "--query-gpu=memory.total,memory.used", "--format=csv,noheader"],
                                env=shim.env({}), capture_output=True, text=True, timeout=20)
    finally:
        holder.kill()
        holder.wait()
    assert result.stdout.splitlines()[0] == "4096 MiB, 1024 MiB", result.stderr


def test_concurrent_allocations_never_exceed_the_budget(shim, programs):
    """Four processes race 4 MiB allocations into a 1 GiB budget (the lock-free charge path) and
    hold them: together they get exactly 256, never more, and all of it once the budget is full."""
    env = shim.env({"NVC_SHARE_MEMORY_LIMIT": "1Gi"})
    ops = ["init"] + ["alloc", str(4 * MIB)] * 200 + ["hold"]
    procs = [subprocess.Popen([str(programs["share_app"]), *ops], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    results = []
    try:
        for proc in procs:
            for line in proc.stdout:
                if line.startswith("holding"):
                    break
                results.append(line.split()[:2])
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert results.count(["alloc", "0"]) == 256
    assert results.count(["alloc", "2"]) == 4 * 200 - 256


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
    (rootfs / "etc" / "ld.so.preload").symlink_to(secret)       # absolute: lands inside the rootfs
    assert image_preload(rootfs) == ""
    (rootfs / "etc" / "ld.so.preload").unlink()
    os.mknod(rootfs / "etc" / "ld.so.preload", stat.S_IFCHR | 0o644, os.makedev(1, 5))   # /dev/zero
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
        time.sleep(0.2)                                       # the writer now waits in open()
        with pytest.raises(ContainerError) as refused:
            prepare(ShareRequest(), "ctr", str(rootfs), library=str(SHIM),
                          state_dir=str(tmp_path / "state"))
        with pytest.raises(subprocess.TimeoutExpired):
            writer.wait(timeout=1)                            # nobody opened the FIFO
        assert "ld.so.preload in " in str(refused.value) and "is a FIFO, not a regular file" in str(refused.value)
        assert not (tmp_path / "state").exists()
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)       # now one open for reading...
        os.close(fd)
        assert writer.communicate(timeout=10)[0] == "opened\n"   # ...releases it: the check could see one
    finally:
        writer.kill()
        writer.wait()


def _mountpoints() -> set[str]:
    return {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}


def test_prepare_and_remove(private_mounts, rootfs, tmp_path):
    library = tmp_path / "libnvc-share.so"
    library.write_bytes(b"\x7fELF")
    state = tmp_path / "state"
    (rootfs / "etc" / "ld.so.preload").write_text("/usr/lib/libfoo.so\n")
    request = sharing.parse_share_env({"NVC_SHARE_MEMORY_LIMIT": "4Gi"})
    mounts = prepare(request, "ctr1", str(rootfs), library=str(library), state_dir=str(state))
    shared = state / "ctr1" / "shared"
    assert [(m.source, m.target, m.readonly, m.directory) for m in mounts] == [
        (str(library), "/usr/lib/nvc-share/libnvc-share.so", True, False),
        (str(shared), "/var/run/nvc-share", False, True),
        (str(shared / "limits"), "/var/run/nvc-share/limits", True, False),
        (str(state / "ctr1" / "ld.so.preload"), "/etc/ld.so.preload", True, False),
    ]
    assert (state / "ctr1" / "ld.so.preload").read_text() == \
        "/usr/lib/nvc-share/libnvc-share.so\n/usr/lib/libfoo.so\n"
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
    request = sharing.parse_share_env({"NVC_SHARE_COMPUTE": "50"})
    with pytest.raises(ContainerError, match="not installed"):
        prepare(request, "ctr", str(rootfs), library=str(tmp_path / "missing.so"), state_dir=str(state))
    with pytest.raises(InputError, match="cannot name a directory"):
        prepare(request, "../x", str(rootfs), library=str(Path(share.__file__)), state_dir=str(state))
    assert not state.exists() or os.listdir(state) == []


def test_granted_limits_too_large_for_the_scheduler_tmpfs_are_refused(private_mounts, rootfs, tmp_path):
    """Other containers' shims read a scheduled container's compute limits from the scheduler tmpfs,
    which keeps 8 KiB for each: a request whose compute lines do not fit is refused, and nothing of
    the container is left (nor the scheduler tmpfs mounted)."""
    state, sched = tmp_path / "state", tmp_path / "sched"
    request = ShareRequest(weight=tuple((str(i), 1) for i in range(1000)))
    with pytest.raises(ContainerError, match="compute limits of container ctr exceed 8192 bytes"):
        prepare(request, "ctr", str(rootfs), library=str(SHIM), state_dir=str(state), sched_dir=str(sched))
    assert os.listdir(state) == [] and not sched.exists()


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
    original = sharefiles._write_new

    def full_on_preload(dir_fd: int, name: str, data: bytes, mode: int) -> None:
        if name == "ld.so.preload":
            assert any(m.startswith(str(state)) for m in _mountpoints())       # midway indeed
            raise OSError(28, "No space left on device")
        original(dir_fd, name, data, mode)

    monkeypatch.setattr(sharefiles, "_write_new", full_on_preload)
    with pytest.raises(ContainerError, match=f"^container error: cannot make the sharing files of container ctr in "
                                             f"{state}: No space left on device$"):
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
    grow = subprocess.run([*as_1000, "dd", "if=/dev/zero", "of=region", "bs=64K", "count=16384", "oflag=append",
                           "conv=notrunc"], cwd=shared, capture_output=True, text=True, timeout=30)
    assert grow.returncode != 0 and "No space left on device" in grow.stderr, grow.stderr
    page = os.sysconf("SC_PAGE_SIZE")
    assert os.stat(shared / "region").st_size <= -(-REGION_SIZE // page) * page     # the region's last page
    new = subprocess.run([*as_1000, "dd", "if=/dev/zero", "of=more", "bs=64K", "count=16"], cwd=shared,
                         capture_output=True, text=True, timeout=30)
    assert new.returncode != 0 and "Permission denied" in new.stderr, new.stderr
    # and root in the container makes no new file either: the inodes are counted too
    with pytest.raises(OSError, match="No space left on device"):
        (shared / "more").touch()
    assert os.statvfs(shared).f_bfree == 0
    assert abs(os.statvfs(state).f_bfree - before) < 256      # nothing of 1 GiB landed beside it
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
    old = state / "old" / "shared"                     # a directory as an earlier nvc-py left it
    old.mkdir(parents=True)
    (old / "link").symlink_to(host)
    (old / "sub").mkdir()
    (old / "sub" / "link").symlink_to(host / "keep")
    for cid in ("new", "old"):
        sharefiles.remove(cid, str(state))
    assert os.listdir(state) == []
    assert (host / "keep").read_text() == "host file\n"
    assert not any(m.startswith(str(state)) for m in _mountpoints())


# ---------------------------------------------------------------- share status

def test_share_status_reads_the_live_region(shim, tmp_path):
    state = tmp_path / "state"
    env = {"NVC_SHARE_MEMORY_LIMIT": "4Gi", "NVC_SHARE_COMPUTE": "50", "NVC_SHARE_WEIGHT": "3"}
    shim.dir = prepared(state, "ctr1", env, os.getpid())   # the "container" in this pid namespace
    prepared(state, "idle", env)
    holder = shim.holder("alloc", 600 * MIB, limits={})
    try:
        result = subprocess.run(["nvc-py", "share", "status", "--json", "--state-dir", str(state)],
                                capture_output=True, text=True, timeout=30)
        text = subprocess.run(["nvc-py", "share", "status", "--state-dir", str(state)],
                              capture_output=True, text=True, timeout=30).stdout
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 0, result.stderr
    ctr, idle = json.loads(result.stdout)["containers"]
    assert idle["id"] == "idle" and idle["region"].startswith("not initialised")
    assert ctr["region"] == "ok"
    assert ctr["limits"] == {"memory_limit": str(4 * GIB), "compute_percent": "50", "compute_weight": "3"}
    key = GPU0[4:]
    (device,) = ctr["devices"]
    assert (device["key"], device["memory_limit"], device["memory_used"], device["compute_percent"],
            device["weight"], device["share_percent"]) == (key, 4 * GIB, 600 * MIB, 50, 3, None)
    assert ctr["processes"] == [{"pid": holder.pid, "host_pid": holder.pid, "used": {key: 600 * MIB}}]
    assert f"{key}: memory 600 MiB used of 4 GiB (15 %); compute cap 50 %, weight 3, idle" in text
    assert "container ctr1\n  limits: memory 4 GiB, compute cap 50 %, weight 3\n" in text
    assert "container idle\n  limits: memory 4 GiB, compute cap 50 %, weight 3\n  usage: none recorded yet (" in text
    assert f"pid {holder.pid} as the container reports it (host pid {holder.pid}): {key} 600 MiB" in text


def test_share_status_marks_dead_processes(shim, tmp_path):
    state = tmp_path / "state"
    shim.dir = prepared(state, "c", {"NVC_SHARE_MEMORY_LIMIT": "1Gi"}, os.getpid())
    holder = shim.holder("alloc", 300 * MIB, limits={})
    holder.kill()
    holder.wait()
    (ctr,) = sharestatus.status(str(state))
    assert [(p.pid, p.host_pid, p.used) for p in ctr.processes] == [(holder.pid, None, {GPU0[4:]: 300 * MIB})]
    assert f"pid {holder.pid} as the container reports it (not running in the container's pid namespace)" in \
        sharestatus.text([ctr])


def test_share_status_text_is_in_human_units_and_json_in_the_files_own() -> None:
    """Sizes in binary units, caps and shares in percent, times in seconds; --json keeps the bytes and
    the limits file's entries as they are. An entry the hook does not write is shown as it is, escaped."""
    ctr = sharestatus.ContainerShare(
        "c", "/x", {"memory_limit": str(4 * GIB), "compute_percent": "50", "memory_limit.1": str(3 * GIB // 2),
                    "compute_weight.GPU-abc": "3", "future": "a\nb"}, "ok",
        (sharestatus.Device("GPU-abc"[4:], 4 * GIB, 600 * MIB, 50, 132, 12.25, 0.5, 10, 3, 24.96),
         sharestatus.Device("def", 0, 0, 100, 132, 0.0, 0.0, 0)),
        (sharestatus.Process(5, None, {"abc": 1536 * MIB}),))
    assert sharestatus.text([ctr]) == (
        "container c\n"
        "  limits: memory 4 GiB, compute cap 50 %, memory 1.5 GiB on GPU 1, weight 3 on GPU-abc, future=a\\nb\n"
        "  abc: memory 600 MiB used of 4 GiB (15 %); compute cap 50 %, weight 3, measured share 25.0 %, busy 12.2 s, "
        "throttled 0.5 s over 10 launches\n"
        "  def: memory 0 B used (no limit); no compute cap, busy 0.0 s, throttled 0.0 s over 0 launches\n"
        "  pid 5 as the container reports it (not running in the container's pid namespace): abc 1.5 GiB\n")
    doc = json.loads(sharestatus.as_json([ctr]))["containers"][0]
    assert doc["limits"]["memory_limit"] == str(4 * GIB) and doc["limits"]["future"] == "a\nb"
    assert doc["devices"][0]["memory_limit"] == 4 * GIB and doc["processes"][0]["used"] == {"abc": 1536 * MIB}
    assert [sharestatus.size_text(n) for n in (0, 1023, 1024, 1536, 80 * GIB, 5 << 50)] == \
        ["0 B", "1023 B", "1 KiB", "1.5 KiB", "80 GiB", "5 PiB"]


def test_share_status_shows_what_a_container_wrote_as_its_word(shim, tmp_path):
    """A container's region is its own to write: a process slot it forges (here a live host process's
    registration, in the host's pid namespace, not the container's) is not shown as a host process,
    and a device key with a newline and terminal escapes is shown escaped, on one line."""
    from nvc.share.region import _HEADER

    state = tmp_path / "state"
    other_ns = subprocess.Popen(["unshare", "--pid", "--fork", "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while not (children := Path(f"/proc/{other_ns.pid}/task/{other_ns.pid}/children").read_text().split()):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        shim.dir = prepared(state, "ctr", {"NVC_SHARE_MEMORY_LIMIT": "80Gi"}, int(children[0]))
        holder = shim.holder("alloc", 600 * MIB, limits={})
        try:
            with open(shim.dir / "region", "r+b") as region:     # the device key, as the container may write it
                region.seek(_HEADER.size)
                region.write(b"evil\nforged line\x1b[2J".ljust(40, b"\0"))
            (ctr,) = sharestatus.status(str(state))
            text = sharestatus.text([ctr])
            result = subprocess.run(["nvc-py", "share", "status", "--json", "--state-dir", str(state)],
                                    capture_output=True, text=True, timeout=30)
        finally:
            holder.kill()
            holder.wait()
    finally:
        other_ns.kill()
        other_ns.wait()
    assert [(p.pid, p.host_pid) for p in ctr.processes] == [(holder.pid, None)]
    assert f"pid {holder.pid} as the container reports it (not running in the container's pid namespace)" in text
    assert "\x1b" not in text and "\nforged line" not in text
    assert "  evil\\nforged line\\x1b[2J: memory 600 MiB used of 80 GiB (1 %)" in text
    assert result.returncode == 0 and json.loads(result.stdout)["containers"][0]["processes"][0]["host_pid"] is None
    assert "\x1b" not in result.stdout
    sharefiles.remove("ctr", str(state))


def _plant(shared: Path, name: str, what: str, host: Path) -> None:
    """What a container (root in it) can put in place of one of its shared files."""
    path = shared / name
    path.unlink()
    if what == "symlink":
        path.symlink_to(host)
    elif what == "fifo":
        os.mkfifo(path, 0o666)
    elif what == "device":
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 5))      # /dev/zero: endless
    elif what == "huge":
        path.write_bytes(b"")
        os.truncate(path, 1 << 40)                                  # sparse: fits any tmpfs
    elif what == "not-root":
        path.write_bytes(bytes(REGION_SIZE))
        os.chown(path, 1000, 1000)


@pytest.mark.parametrize(("name", "what", "message"), [
    ("region", "symlink", "region is a symbolic link (not followed), not a regular file"),
    ("limits", "symlink", "limits is a symbolic link (not followed), not a regular file"),
    ("region", "fifo", "region is a FIFO, not a regular file"),
    ("region", "device", "region is a character device, not a regular file"),
    ("region", "huge", f"region is {1 << 40} bytes, not {REGION_SIZE} (not read)"),
    ("region", "not-root", "region is owned by uid 1000, not 0"),
])
def test_share_status_reports_what_the_container_planted(private_mounts, tmp_path, name, what, message):
    """Finding 3: root's `share status` opens nothing the container put in place of its files: a
    symlink to a host file is not followed, a FIFO does not hang it, a device or a huge file is not
    read. It ends promptly and says what it found; the other containers are shown as usual."""
    state = tmp_path / "state"
    host = tmp_path / "host-limits"             # would read as limits (and a region) if followed
    host.write_text("version=1\nmemory_limit=12345\n" + "#" * REGION_SIZE)
    os.truncate(host, REGION_SIZE)
    _plant(prepared(state, "bad", {"NVC_SHARE_MEMORY_LIMIT": "1Gi"}), name, what, host)
    prepared(state, "good", {"NVC_SHARE_MEMORY_LIMIT": "2Gi"})
    result = subprocess.run(["nvc-py", "share", "status", "--json", "--state-dir", str(state)],
                            capture_output=True, text=True, timeout=20)
    assert result.returncode == 0, result.stderr
    bad, good = json.loads(result.stdout)["containers"]
    assert bad["region"] == f"unreadable: {state}/bad/shared/{message}"
    assert "12345" not in result.stdout
    assert bad["limits"] == ({} if name == "limits" else {"memory_limit": str(GIB)})
    assert good["region"].startswith("not initialised: no CUDA process") and good["limits"] == \
        {"memory_limit": str(2 * GIB)}
    text = subprocess.run(["nvc-py", "share", "status", "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=20).stdout
    assert f"  region: unreadable: {state}/bad/shared/{message}\n" in text
    for cid in ("bad", "good"):
        sharefiles.remove(cid, str(state))
    assert os.listdir(state) == [] and host.exists()


# ---------------------------------------------------------------- steps of the container's plan

def test_sharing_files_are_steps_of_the_plan(default_run_dir, active_2gpu, make_rootfs, target_process):
    """configure's plan has the sharing files as host steps, before the container's: the dry run
    prints them and makes nothing; applying makes them, then the mounts that show them in the
    container; a later step failing removes them again."""
    from nvc.commands import configure
    from nvc.options import GlobalOptions
    from nvc.errors import MountError
    from nvc.plan.request import HostMount, from_flags
    from nvc.rpc import container_service

    debian_rootfs = make_rootfs("debian", name="share-plan-rootfs")  # its own: the mount targets stay in it
    glob = GlobalOptions(str(active_2gpu.root), "/etc/ld.so.cache", (0, 0), False)
    asked = sharing.parse_share_env({"NVC_SHARE_MEMORY_LIMIT": "1Gi", "NVC_SHARE_COMPUTE": "50"})
    req = from_flags(str(debian_rootfs), target_process, devices=("0",), capabilities=("compute", "utility"),
                     no_cgroups=True)._replace(sharing=asked, container_id="ctr-plan")
    where, sched = f"{share.STATE_DIR}/ctr-plan", f"{share.sched_dir_for(share.STATE_DIR)}/ctr-plan"
    host_mounts = Path("/proc/self/mountinfo").read_text()
    listing_before = sorted(str(p) for p in default_run_dir.rglob("*"))

    plan = configure.plan(glob, req)
    lines = plan.text().splitlines()
    assert lines[:4] == [f"mkdir   host      {where}", f"write   host      {where}/owner (the container's bundle and "
                         "process)", f"tmpfs   host      {where}/shared (limits, region)",
                         f"write   host      {where}/shared/limits ({len(plan.share.limits)} bytes: "
                         "'# written by nvc-py for container ctr-pl'…)"]
    assert lines[4].startswith(f"write   host      {where}/ld.so.preload (")
    assert "bytes: '/usr/lib/nvc-share/libnvc-share.so'…)" in lines[4]
    granted = f"{share.sched_dir_for(share.STATE_DIR)}/.granted/ctr-plan"
    assert lines[5:8] == [f"write   host      {granted} (its granted compute limits)",
                          f"write   host      {sched} (scheduler file)",
                          f"rootfs  {debian_rootfs} (pid {target_process}, owner 0:0)"]
    assert f"bind    extra     {share.HOST_LIBRARY} -> {sharing.CONTAINER_LIBRARY} [rdonly,nosuid,nodev]" in lines
    assert f"bind    extra     {where}/shared -> {sharing.CONTAINER_DIR} [nosuid,nodev]" in lines
    assert "memory_limit=1073741824\ncompute_percent=50\n" in plan.share.limits
    # the dry run changed nothing on the host
    assert sorted(str(p) for p in default_run_dir.rglob("*")) == listing_before
    assert Path("/proc/self/mountinfo").read_text() == host_mounts

    missing = HostMount(str(default_run_dir / "no-such-file"), "/opt/missing")
    try:
        with pytest.raises(MountError, match="no-such-file"):  # a mount in the container fails: all undone
            container_service.apply(configure.plan(glob, req._replace(extra_mounts=(missing,))))
        assert not os.path.lexists(where) and not os.path.lexists(sched) and not os.path.lexists(granted)
        assert not any(m.startswith(share.STATE_DIR) for m in _mountpoints())

        container_service.apply(plan)
        assert "memory_limit=1073741824\n" in Path(f"{where}/shared/limits").read_text()
        recorded = json.loads(Path(f"{where}/owner").read_text())
        assert (recorded["bundle"], recorded["pid"]) == ("", target_process)
        assert recorded["pidns"] == os.stat(f"/proc/{target_process}/ns/pid").st_ino
        assert os.path.exists(sched) and str(Path(where) / "shared") in _mountpoints()
        # what other containers' shims trust about it: its compute limits only, root's and read-only
        assert Path(granted).read_text() == "version=1\ncompute_percent=50\n"
        assert (os.stat(granted).st_uid, os.stat(granted).st_mode & 0o7777) == (0, 0o444)
        # (the image's /var/run links to /run)
        assert f" {debian_rootfs}/run/nvc-share " in Path(f"/proc/{target_process}/mountinfo").read_text()
        sharefiles.remove("ctr-plan")          # poststop's part: both scheduler files go, the tmpfs stays
        assert not os.path.lexists(sched) and not os.path.lexists(granted)
    finally:
        sharefiles.remove("ctr-plan")
        if os.path.ismount(default_run_dir / "gpu-sched"):  # the scheduler's tmpfs, mounted on first use
            subprocess.run(["umount", "-l", str(default_run_dir / "gpu-sched")], check=True)
    assert not os.path.lexists(where) and not os.path.lexists(sched) and not os.path.lexists(granted)


# ---------------------------------------------------------------- through the hook, in a runc container

def test_hook_injects_the_shim_into_a_runc_container(default_run_dir, fake_2gpu, runc, debian_rootfs,
                                                     make_rootfs, tmp_path):
    """A container asking for 4 GiB gets the shim preloaded, a limits file it cannot change even as
    root, a full tmpfs of its own as shared directory (root and uid 1000 alike write nothing more
    there), and NVML (the fake nvidia-smi) reporting the limit; poststop unmounts and removes its
    directory, following nothing the container planted; junk limits, or a FIFO as the image's ld.so.preload, refuse the start and leave
    nothing behind (the FIFO never opened)."""
    from harness.bundle import make_bundle
    from test_hook_containers import SCRIPTS

    config = tmp_path / "config.yaml"
    log = f"log: {{file: {tmp_path / 'hook.log'}}}\n"  # not the host's log
    config.write_text(f"root: {fake_2gpu.root}\nload-kmods: false\n{log}")
    hook = {"path": str(SCRIPTS / "nvc-py-hook"), "args": ["nvc-py-hook", "prestart"],
            "env": [f"NVC_PY_CONFIG={config}"]}
    hooks = {"prestart": [hook], "poststop": [{**hook, "args": ["nvc-py-hook", "poststop"]}]}
    fill = ("stat -f -c 'free %f' /var/run/nvc-share; dd if=/dev/zero of=/var/run/nvc-share/region bs=64k "
            "count=1000 oflag=append conv=notrunc 2>&1 | grep -o 'No space left on device'; "
            "touch /var/run/nvc-share/x 2>&1 | grep -o -e 'No space left on device' -e 'Permission denied'")
    script = ("head -1 /etc/ld.so.preload; cat /var/run/nvc-share/limits | grep memory_limit; "
              "(echo memory_limit=80Gi >> /var/run/nvc-share/limits) 2>/dev/null || echo read-only; "
              f"nvidia-smi --query-gpu=memory.total --format=csv,noheader; {fill}; "
              "rm /var/run/nvc-share/region && ln -s /etc /var/run/nvc-share/region && echo planted")
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "NVC_SHARE_MEMORY_LIMIT": "4Gi"}
    bundle = make_bundle(tmp_path / "ok", debian_rootfs, ["sh", "-c", script], env=env, hooks=hooks)
    result = runc.create_start(bundle, container_id="nvc-share-ok")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [sharing.CONTAINER_LIBRARY, f"memory_limit={4 * GIB}", "read-only",
                                          "4096 MiB", "free 0", "No space left on device",
                                          "No space left on device", "planted"]
    assert "nvc-share" not in result.stderr              # the shim used the hook's region as it is
    runc.delete("nvc-share-ok")                        # poststop: the planted symlink is not followed
    assert not (Path(share.STATE_DIR) / "nvc-share-ok").exists()
    assert not any(m.startswith(share.STATE_DIR) for m in _mountpoints())
    assert Path("/etc/passwd").exists()

    # The same as uid 1000, the workload's usual user.
    user = make_bundle(tmp_path / "user", debian_rootfs, ["sh", "-c", fill], env=env, hooks=hooks)
    spec = json.loads((user / "config.json").read_text())
    spec["process"]["user"] = {"uid": 1000, "gid": 1000}
    (user / "config.json").write_text(json.dumps(spec))
    result = runc.create_start(user, container_id="nvc-share-user")
    assert result.stdout.splitlines() == ["free 0", "No space left on device", "Permission denied"], result.stderr
    runc.delete("nvc-share-user")
    assert os.listdir(share.STATE_DIR) == []

    # Sharing enabled on the host: a container that asks for nothing gets the host's default.
    enabled = tmp_path / "enabled.yaml"
    enabled.write_text(f"root: {fake_2gpu.root}\nload-kmods: false\n{log}"
                       "sharing: {enabled: true, device-memory-limit: 2g}\n")
    host_hooks = {stage: [{**h, "env": [f"NVC_PY_CONFIG={enabled}"]} for h in hs] for stage, hs in hooks.items()}
    plain = make_bundle(tmp_path / "plain", debian_rootfs, ["nvidia-smi", "--query-gpu=memory.total",
                        "--format=csv,noheader"], env={"NVIDIA_VISIBLE_DEVICES": "0"}, hooks=host_hooks)
    result = runc.create_start(plain, container_id="nvc-share-default")
    assert (result.returncode, result.stdout) == (0, "2048 MiB\n"), result.stderr

    bad = make_bundle(tmp_path / "bad", debian_rootfs, ["true"], env={**env, "NVC_SHARE_MEMORY_LIMIT": "lots"},
                      hooks=hooks)
    result = runc.create_start(bad, container_id="nvc-share-bad")
    assert result.returncode != 0
    assert "NVC_SHARE_MEMORY_LIMIT='lots': not a size" in result.stderr
    assert not (Path(share.STATE_DIR) / "nvc-share-bad").exists()

    fifo_rootfs = make_rootfs("debian", name="fifo-rootfs")
    fifo = fifo_rootfs / "etc" / "ld.so.preload"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", f"exec 3>'{fifo}'; echo opened"], stdout=subprocess.PIPE, text=True)
    try:
        image = make_bundle(tmp_path / "fifo", fifo_rootfs, ["true"], env=env, hooks=hooks)
        result = runc.create_start(image, container_id="nvc-share-fifo")
        assert result.returncode != 0
        assert writer.poll() is None                          # the hook never opened it
        assert "/etc/ld.so.preload in " in result.stderr and "is a FIFO, not a regular file" in result.stderr
    finally:
        writer.kill()
        writer.wait()
    assert os.listdir(share.STATE_DIR) == []


def test_poststop_removes_only_the_sharing_files_of_the_container_that_stopped(default_run_dir, fake_2gpu, runc,
                                                                              debian_rootfs, make_rootfs, tmp_path):
    """Finding 7: a GPU-less container with the same id under another runtime root stops while the
    sharing container runs: its poststop leaves the running container's directory and scheduler
    file alone (prestart recorded their owner: bundle and process). The right poststop removes them."""
    from harness.bundle import make_bundle
    from harness.runtime import Runc
    from test_hook_containers import SCRIPTS

    config = tmp_path / "config.yaml"
    config.write_text(f"root: {fake_2gpu.root}\nload-kmods: false\nlog: {{file: {tmp_path / 'hook.log'}}}\n")
    hook = {"path": str(SCRIPTS / "nvc-py-hook"), "args": ["nvc-py-hook", "prestart"],
            "env": [f"NVC_PY_CONFIG={config}"]}
    hooks = {"prestart": [hook], "poststop": [{**hook, "args": ["nvc-py-hook", "poststop"]}]}
    cid = "nvc-share-same-id"
    gpu = make_bundle(tmp_path / "gpu", debian_rootfs, ["sleep", "60"], hooks=hooks,
                      env={"NVIDIA_VISIBLE_DEVICES": "0", "NVC_SHARE_COMPUTE": "50"})
    plain = make_bundle(tmp_path / "plain", make_rootfs("debian", name="plain-rootfs"), ["true"], hooks=hooks)
    where, sched = Path(share.STATE_DIR) / cid, Path(share.sched_dir_for(share.STATE_DIR)) / cid
    try:
        with open(tmp_path / "create.log", "w") as log:
            created = subprocess.run(["runc", "--root", str(runc.state_root), "create", "--bundle", str(gpu), cid],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, timeout=60)
        assert created.returncode == 0, (tmp_path / "create.log").read_text()
        assert (where / "shared" / "limits").exists() and sched.exists()
        other = Runc(tmp_path / "other-runtime-root").run(plain, container_id=cid)
        assert other.returncode == 0, other.stderr
        assert (where / "shared" / "limits").exists() and sched.exists()   # not the stopped one's
        runc.delete(cid)
        assert not where.exists() and not sched.exists()
    finally:
        runc.delete(cid)
        if os.path.ismount(default_run_dir / "gpu-sched"):
            subprocess.run(["umount", "-l", str(default_run_dir / "gpu-sched")], check=True)


# ---------------------------------------------------------------- two weighted containers, through the hook

def test_two_weighted_containers_share_the_gpu_by_weight(default_run_dir, active_2gpu, podman, setup_dir, programs,
                                                         tmp_path):
    """Two podman containers through the hook, weights 1 and 3 (and each its own 2 GiB budget), busy
    with 1 ms kernels of the fake GPU at the same time, the weight-3 one waiting 1 ms on its host after
    each (busy half the time, under its three quarters): it runs free (400 kernels in ~0.8 s) while the
    weight-1 one, over its quarter, is held while the other has work (300 kernels in ~0.6 s, not 0.3:
    test_share_native.py's tenant tests). Each sees every scheduled container's file and granted weight
    read-only and writes only its own file; neither can change its limits file; nvc-py share status shows weight, cap and share.
    (Each process's fake GPU is its own: only the scheduler can make one container wait for the other.)"""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    # Both started (each one's scheduler file made by its hook) before either looks at the peers.
    script = ("touch /barrier/$HOSTNAME; while [ $(ls /barrier | wc -l) -lt 2 ]; do sleep 0.02; done; "
              "for f in /var/run/nvc-share-peers/*; do (printf x >> $f) 2>&1 | grep -o 'Read-only file system'; "
              "done; (echo compute_weight=1000 >> /var/run/nvc-share/limits) 2>&1 | grep -o 'Read-only file system'; "
              "echo $(grep -h '^compute_weight=' /var/run/nvc-share-peers/.granted/* | sort); "
              "(echo compute_weight=1000 >> /var/run/nvc-share-peers/.granted/x) 2>&1 | grep -o 'Read-only file system'; "
              "cuda_probe init ctx 0 $WORK")
    image = podman.image()
    results: dict[int, subprocess.CompletedProcess[str]] = {}
    status: list[sharestatus.ContainerShare] = []

    def run(weight: int, work: str) -> None:
        env = {"NVIDIA_VISIBLE_DEVICES": "0", "NVC_SHARE_WEIGHT": str(weight), "NVC_SHARE_MEMORY_LIMIT": "2Gi",
               "FAKE_CUDA_KERNEL_US": "1000", "FAKE_CUDA_CONTEXT_MIB": "0", "WORK": work}
        results[weight] = podman.run(image, ["sh", "-c", script], env=env, hooks_dirs=[setup_dir / "hooks.d"],
                                     extra_args=["-v", f"{programs['cuda_probe']}:/usr/local/bin/cuda_probe:ro",
                                                 "-v", f"{barrier}:/barrier"], timeout=120)

    import threading

    threads = [threading.Thread(target=run, args=args)
               for args in ((1, "launch 300 264 128 sync"), (3, "steps 400 264 128 1000"))]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 60
        while len(list(barrier.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)                                   # both busy for a while: the share is measured
        status = sharestatus.status()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        sched = default_run_dir / "gpu-sched"
        if os.path.ismount(sched):
            subprocess.run(["umount", "-l", str(sched)], check=True)
    walls = {}
    for weight, result in results.items():
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[:3] == ["Read-only file system"] * 3, lines   # both scheduler files, the limits file
        # both containers' granted weights, beside the files, read-only
        assert lines[3:5] == ["compute_weight=1 compute_weight=3", "Read-only file system"], lines
        probe = [line.split() for line in lines[5:]]
        walls[weight] = sum(int(line[2]) for line in probe[2:]) / 1e6
    print(f"walls {walls}")
    assert 0.45 <= walls[1] <= 0.8 and 0.75 <= walls[3] <= 1.1, walls
    by_weight = {d.weight: d for c in status for d in c.devices}
    assert set(by_weight) == {1, 3}, status
    assert all(d.compute_percent == 100 for d in by_weight.values())
    shares = {w: d.share_percent for w, d in by_weight.items()}
    print(f"measured shares {shares}")
    # each one's work over the last 200 ms: the weight-3 one's kernels half the time, the other's in its gaps
    assert shares[1] is not None and shares[3] is not None and 30 <= shares[3] <= 70, shares
    assert not os.listdir(share.STATE_DIR)                  # poststop removed both
