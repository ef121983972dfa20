"""Faults inside a hook call, on the fake driver (a test double): the NVML helper killed or hung
mid-call, the container helper killed mid-apply, a mount failing while ldconfig runs beside it, the
container's process gone before the hook runs, /run full while the sharing files are made, the
driver's /proc files and device nodes coming and going through a storm of starts. Each ends in one
line on stderr and a stable status, or in a configured container, and leaves nothing behind: no mount
in the container or on the host, no file of the container's under /run/nvc-py, no helper process, the
rootfs as it was.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import pytest

from harness.bundle import make_bundle
from harness.configurehook import paths as _tree
from harness.hookfixtures import served, setup_dir  # noqa: F401  (fixtures)
from harness.standins import target_process  # noqa: F401  (fixture)
from nvc.plan.operations import Plan

if TYPE_CHECKING:
    from nvc.rpc.container_service import ContainerClient

HOOK = Path(sysconfig.get_path("scripts")) / "nvc-py-hook"
RUN = Path("/run/nvc-py")  # a tmpfs of the test session's own (conftest.private_run_dir)


class State(NamedTuple):
    """What a call may leave behind, and what it must not change."""

    container_mounts: str
    host_mounts: str
    rootfs: set[str]
    run: set[str]  # what the sharing state and scheduler directories hold
    helpers: set[int]


def helpers() -> set[int]:
    """Pids of nvc-py's helper processes (named ``nvc:[...]``) but those a hook server's spare
    workers keep ready (forked ahead of any call: the server's own)."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().startswith("nvc:[") and not _served(entry):
                found.add(int(entry.name))
        except OSError:
            continue
    return found


def _served(proc: Path) -> bool:
    """Whether the process of ``proc`` descends from an ``nvc-py-hook serve`` (within 8 generations:
    the walk stops at init, whose parent 0 has no /proc entry; a chain of fewer generations, as when
    the suite's shell was re-parented to init, must not read as an error that hides the process)."""
    for _ in range(8):
        parent = (proc / "stat").read_text().rpartition(") ")[2].split()[1]
        if parent == "0":
            return False
        proc = Path(f"/proc/{parent}")
        if b"\0serve\0" in (proc / "cmdline").read_bytes():
            return True
    return False


def state(pid: int, rootfs: Path) -> State:
    mounts = Path(f"/proc/{pid}/mountinfo")
    return State(
        mounts.read_text() if mounts.exists() else "",
        Path("/proc/self/mountinfo").read_text(),
        _tree(rootfs),
        {str(p) for d in ("share", "gpu-sched") for p in (RUN / d).rglob("*")},
        helpers(),
    )


class Container(NamedTuple):
    pid: int  # its process, in a mount namespace of its own (a runtime's container before pivot_root)
    rootfs: Path
    bundle: Path


@pytest.fixture
def container(active_2gpu, make_rootfs, target_process: int, tmp_path: Path) -> Iterator[Container]:  # noqa: F811
    rootfs = make_rootfs("debian", name="fault-rootfs")
    yield Container(target_process, rootfs, tmp_path / "bundle")


def prestart(
    setup_dir: Path,
    ctr: Container,
    env: dict[str, str],
    *,
    pid: int | None = None,
    name: str = "faulty",
    hook_env: dict[str, str] | None = None,
    wait: bool = True,
) -> subprocess.Popen[str]:
    """``nvc-py-hook prestart`` for a container asking for ``env``, run directly unless ``hook_env`` names a server."""
    if not (ctr.bundle / "config.json").exists():
        make_bundle(ctr.bundle, ctr.rootfs, ["true"], env=env)
    oci_state = json.dumps(
        {
            "ociVersion": "1.0.2",
            "id": name,
            "pid": ctr.pid if pid is None else pid,
            "bundle": str(ctr.bundle),
            "status": "creating",
        }
    )
    proc = subprocess.Popen(
        [str(HOOK), "prestart"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "NVC_PY_CONFIG": str(setup_dir / "config.yaml"),
            "NVC_PY_HOOK_SOCKET": "none",
            **(hook_env or {}),
        },
    )  # run here, unless a server is named
    assert proc.stdin is not None
    proc.stdin.write(oci_state)
    proc.stdin.close()
    if wait:
        proc.wait(timeout=120)
    return proc


def finished(proc: subprocess.Popen[str]) -> tuple[int, str]:
    assert proc.stderr is not None
    code = proc.wait(timeout=120)
    return code, proc.stderr.read()


def wait_for(what, timeout: float = 30):  # noqa: ANN001, ANN201 - a callable, its truthy result
    deadline = time.monotonic() + timeout
    while not (found := what()):
        assert time.monotonic() < deadline, f"{what} never came"
        time.sleep(0.005)
    return found


def named(pid: int, name: str) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == name
    except OSError:
        return False


def sleeping(pid: int) -> bool:
    """Whether process ``pid`` sleeps in nanosleep (the fake NVML's stall)."""
    try:
        return "nanosleep" in Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False


ALL_GPUS = {"NVIDIA_VISIBLE_DEVICES": "all"}  # the MIG devices of the fake machine: NVML is asked


def test_the_nvml_helper_killed_mid_call_fails_the_start_in_one_line(setup_dir: Path, container: Container) -> None:
    before = state(container.pid, container.rootfs)
    proc = prestart(setup_dir, container, ALL_GPUS, hook_env={"FAKE_NVML_STALL_S": "30"}, wait=False)
    helper = wait_for(
        lambda: [pid for pid in helpers() - before.helpers if named(pid, "nvc:[driver]") and sleeping(pid)]
    )[0]
    os.kill(helper, signal.SIGKILL)
    code, err = finished(proc)
    assert (code, err) == (
        4,
        "nvc-py-hook: driver error: driver rpc error: helper killed by signal SIGKILL in snapshot\n",
    )
    assert state(container.pid, container.rootfs) == before


def test_a_hung_nvml_helper_fails_the_start_after_its_timeout(setup_dir: Path, container: Container) -> None:
    from nvc.rpc.helper import DEFAULT_TIMEOUT

    before = state(container.pid, container.rootfs)
    started = time.monotonic()
    code, err = finished(prestart(setup_dir, container, ALL_GPUS, hook_env={"FAKE_NVML_STALL_S": "60"}))
    took = time.monotonic() - started
    assert (code, err) == (
        4,
        f"nvc-py-hook: driver error: driver rpc error: timed out after {DEFAULT_TIMEOUT:.1f} s in snapshot\n",
    )
    assert DEFAULT_TIMEOUT <= took < DEFAULT_TIMEOUT + 10
    assert state(container.pid, container.rootfs) == before  # the helper killed and reaped


def test_a_container_process_gone_before_the_hook_is_one_line_naming_it(setup_dir: Path, container: Container) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    before = state(container.pid, container.rootfs)
    code, err = finished(
        prestart(setup_dir, container, {"NVIDIA_VISIBLE_DEVICES": "0", "NVC_SHARE_MEMORY_LIMIT": "1Gi"}, pid=gone.pid)
    )
    assert (code, err) == (8, f"nvc-py-hook: container error: container process {gone.pid} is gone\n")
    assert state(container.pid, container.rootfs) == before


@pytest.fixture(params=["no-room", "no-inodes"])
def full_run(request, active_2gpu) -> Iterator[str]:
    """/run/nvc-py a tmpfs with no room left for data, or for one more inode beyond the sharing
    directory (this test's own mount, in its private mount namespace): yields which."""
    options = "size=4k" if request.param == "no-room" else "nr_inodes=3"
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"mode=0700,{options}", "tmpfs", str(RUN)], check=True)
    try:
        if request.param == "no-room":
            (RUN / "filler").write_bytes(b"\0" * 4096)
        else:
            (RUN / "share").mkdir(mode=0o700)  # the root, share and one more: the hook's cache of its configuration
        yield request.param
    finally:
        subprocess.run(["umount", str(RUN)], check=True)


def test_a_full_run_leaves_no_sharing_file_half_made(setup_dir: Path, container: Container, full_run: str) -> None:
    before = state(container.pid, container.rootfs)
    code, err = finished(
        prestart(setup_dir, container, {"NVIDIA_VISIBLE_DEVICES": "0", "NVC_SHARE_MEMORY_LIMIT": "1Gi"})
    )
    assert (code, err) == (
        8,
        f"nvc-py-hook: container error: cannot make the sharing files of container faulty in "
        f"{RUN}/share: No space left on device\n",
    )
    assert state(container.pid, container.rootfs) == before


STABLE_FAILURES = {3, 4, 5, 6, 8, 9, 10}  # initialization, driver, detection, device, container, mount, ldcache


def flicker(stop: threading.Event, nodes: list[tuple[str, int, int]]) -> int:
    """Until ``stop``: the driver's /proc files hidden (an empty tmpfs over /proc/driver/nvidia) and
    shown again, its device nodes removed and made again, every few milliseconds; how many times.
    Everything is back as it was at the end."""
    from fakedriver.activate import MNT_DETACH, _mount, umount

    flips = 0
    while not stop.is_set():
        _mount("tmpfs", "/proc/driver/nvidia", "tmpfs", 0, "mode=0555")
        time.sleep(0.005)
        umount("/proc/driver/nvidia", MNT_DETACH)  # a start may be reading a file there
        for path, _, _ in nodes:
            os.unlink(path)
        time.sleep(0.005)
        for path, mode, rdev in nodes:
            os.mknod(path, mode, rdev)
        time.sleep(0.005)
        flips += 1
    return flips


@pytest.mark.parametrize("via", ["direct", "server"])
def test_the_drivers_proc_files_and_nodes_coming_and_going_through_a_storm(
    setup_dir: Path, make_rootfs, request, active_2gpu, via: str
) -> None:
    """8 starts at once asking for every GPU (run by the hook itself, or by a server's workers) while
    the driver's /proc files and nodes vanish and come back: each start is configured, or fails in
    one line with a stable status and leaves its container as it was."""
    hook_env = {"NVC_PY_HOOK_SOCKET": str(request.getfixturevalue("served"))} if via == "server" else {}
    nodes = [
        (str(p), p.stat().st_mode, p.stat().st_rdev)
        for p in (Path("/dev/nvidia0"), Path("/dev/nvidia1"), Path("/dev/nvidiactl"))
    ]
    targets = [subprocess.Popen(["unshare", "-m", "--propagation", "private", "sleep", "300"]) for _ in range(8)]
    try:
        containers = []
        for number, target in enumerate(targets):
            wait_for(
                lambda target=target: os.readlink(f"/proc/{target.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
            )
            rootfs = make_rootfs("debian", name=f"storm-{number}")
            containers.append(Container(target.pid, rootfs, rootfs.with_name(f"bundle-{number}")))
        before = [state(ctr.pid, ctr.rootfs) for ctr in containers]
        stop = threading.Event()
        with ThreadPoolExecutor(len(containers) + 1) as pool:
            flips = pool.submit(flicker, stop, nodes)
            calls = [
                pool.submit(
                    lambda i: finished(
                        prestart(setup_dir, containers[i], ALL_GPUS, name=f"storm-{i}", hook_env=hook_env)
                    ),
                    number,
                )
                for number in range(len(containers))
            ]
            results = [call.result() for call in calls]
            stop.set()
            print(f"{flips.result()} flickers; results: {sorted({(code, err[:90]) for code, err in results})}")
        for (code, err), ctr, was in zip(results, containers, before, strict=True):
            if code == 0:
                assert err == ""
                continue
            assert code in STABLE_FAILURES and err.count("\n") == 1 and err.startswith("nvc-py-hook: "), err
            assert state(ctr.pid, ctr.rootfs)._replace(helpers=set()) == was._replace(helpers=set()), err
        assert not helpers() - before[0].helpers
    finally:
        for target in targets:
            target.kill()
            target.wait()


def test_the_container_helper_killed_mid_apply_is_rolled_back(setup_dir: Path, container: Container) -> None:
    """Killed once its first mount shows in the container (mounting, or waiting for ldconfig and the
    cgroup to be done, before its commit): it cannot roll back; a fresh helper undoes what its
    journal names, the start fails in one line, and the container is as it was."""
    before = state(container.pid, container.rootfs)
    mountinfo = Path(f"/proc/{container.pid}/mountinfo")
    proc = prestart(setup_dir, container, ALL_GPUS, wait=False)
    helper = wait_for(lambda: [pid for pid in helpers() - before.helpers if named(pid, "nvc:[container]")])[0]
    wait_for(lambda: mountinfo.read_text() != before.container_mounts)
    os.kill(helper, signal.SIGKILL)
    code, err = finished(proc)
    # the kill lands while the helper works on a call ("in mount") or between two ("before commit")
    killed = re.fullmatch(
        r"nvc-py-hook: mount error: container rpc error: helper killed by signal SIGKILL (in|before) \w+\n", err
    )
    assert code == 9 and killed, err
    after = state(container.pid, container.rootfs)
    assert after.rootfs ^ before.rootfs == set()
    assert after == before


def test_links_ldconfig_added_go_with_a_dead_helper_s_journal(tmp_path: Path) -> None:
    """The container helper killed after ldconfig ran, before its commit (the window the test above hits
    now and then): it cannot roll back, and a fresh helper undoes from its journal the links ldconfig
    added in the plan's library dirs (the names there before were noted), leaving what was there and
    anything that is not a link. Standalone mode, a plain directory as the rootfs."""
    from nvc.errors import MountError
    from nvc.rpc.container_service import open_container

    rootfs, lib = tmp_path / "rootfs", tmp_path / "rootfs" / "usr" / "lib"
    lib.mkdir(parents=True)
    (rootfs / "etc").mkdir()
    (lib / "libold.so.1.0").write_bytes(b"")
    (lib / "libold.so.1").symlink_to("libold.so.1.0")
    plan = Plan(str(rootfs), None, (0, 0), (), ldconfig="/sbin/ldconfig", ldconfig_dirs=("/usr/lib",))
    with open_container(5.0) as client:
        client.mount(plan, None)()
        (lib / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.580.1")  # what ldconfig adds
        (lib / "notes").write_text("not a link: not ldconfig's")
        os.kill(client.helper.pid, signal.SIGKILL)
        stat = Path(f"/proc/{client.helper.pid}/stat")
        deadline = time.monotonic() + 10
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the helper did not die"
            time.sleep(0.01)
        with pytest.raises(MountError, match=r"helper killed by signal SIGKILL (in|before) commit"):
            client.commit()
        assert client.recover(plan) == []
    assert sorted(os.listdir(lib)) == ["libold.so.1", "libold.so.1.0", "notes"]


def _split_plan(tmp_path: Path, firmware_target: str, library: bytes = b"") -> Plan:
    """A standalone plan over ``tmp_path/rootfs`` (a plain directory with usr/lib and etc): a library
    ldconfig reads (``library``, its content), then a firmware file at ``firmware_target``, which it
    does not read and which is mounted beside it; the host's ldconfig."""
    from nvc.plan.mountplan import RO
    from nvc.plan.operations import Bind

    rootfs = tmp_path / "rootfs"
    (rootfs / "usr" / "lib").mkdir(parents=True)
    (rootfs / "etc").mkdir()
    sources = (tmp_path / "libnvidia-ml.so.580.1", tmp_path / "gsp.bin")
    sources[0].write_bytes(library)
    sources[1].write_bytes(b"")
    ops = (
        Bind(str(sources[0]), "/usr/lib/libnvidia-ml.so.580.1", int(RO)),
        Bind(str(sources[1]), firmware_target, int(RO), what="firmware"),
    )
    return Plan(
        str(rootfs), None, (0, 0), ops, ldconfig="@/sbin/ldconfig", ldconfig_dirs=("/usr/lib",), before_ldconfig=1
    )


def _apply_failing(
    plan: Plan, monkeypatch: pytest.MonkeyPatch, before_rest: Callable[[ContainerClient], object], match: str
) -> None:
    """Apply ``plan`` with ldconfig, ``before_rest(client)`` run just before the mounts beside ldconfig
    are asked for; the apply must fail with a MountError matching ``match``."""
    from nvc.errors import MountError
    from nvc.pipeline.apply import apply, ldcache
    from nvc.rpc import container_service

    original = container_service.ContainerClient.mount_rest

    def first(client: ContainerClient):  # noqa: ANN202 - the waiter
        before_rest(client)
        return original(client)

    monkeypatch.setattr(container_service.ContainerClient, "mount_rest", first)
    with pytest.raises(MountError, match=match):
        with apply(plan, None) as applied:
            ldcache(applied)


def test_a_mount_failing_beside_ldconfig_puts_back_the_cache_it_wrote(tmp_path: Path, monkeypatch) -> None:
    """ldconfig starts once the mounts it reads are done, beside the rest (Plan.before_ldconfig); a
    mount of the rest that fails after ldconfig has replaced the cache fails the call, and the rollback
    puts the image's cache back as it was and removes the library's mount and the links ldconfig made.
    Standalone mode, a plain directory as the rootfs, the host's ldconfig; the rest waits until ldconfig
    has renamed its cache into place, so the failure comes after it, every time."""
    elf = Path("/usr/lib/x86_64-linux-gnu/libc.so.6").read_bytes()  # any ELF library: ldconfig links it
    plan = _split_plan(tmp_path, "/lib/firmware", elf)
    rootfs = Path(plan.rootfs)
    (rootfs / "lib" / "firmware").mkdir(parents=True)  # a directory where the firmware file goes: refused
    cache, lib = rootfs / "etc" / "ld.so.cache", rootfs / "usr" / "lib"
    cache.write_bytes(b"the image's own cache")
    before, mounts = sorted(os.listdir(lib)), Path("/proc/self/mountinfo").read_text()
    _apply_failing(
        plan,
        monkeypatch,
        lambda client: wait_for(lambda: cache.read_bytes() != b"the image's own cache", timeout=10),
        "refusing to mount over /lib/firmware: it is a directory",
    )
    assert cache.read_bytes() == b"the image's own cache"
    assert sorted(os.listdir(lib)) == before  # no mount point, no link ldconfig made left
    assert Path("/proc/self/mountinfo").read_text() == mounts


def _kill(client: ContainerClient) -> None:
    """SIGKILL the client's helper, and wait until it is a zombie."""
    pid = client.helper.pid
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z")


def test_the_container_helper_killed_before_the_mounts_beside_ldconfig(tmp_path: Path, monkeypatch) -> None:
    """Killed between its two calls (the mounts ldconfig reads done, the rest not asked for yet): the
    call fails naming the kill, and a fresh helper undoes what its journal names (recover), not a
    rollback asked of the dead one: every mount and every file made goes. ldconfig, started already,
    runs to its end: the cache it wrote stays (as the applier's module says), whole, and no temporary
    file of its run is left half written. Standalone mode, a plain directory as the rootfs."""
    plan = _split_plan(tmp_path, "/lib/firmware/gsp.bin")
    rootfs = Path(plan.rootfs)
    (rootfs / "etc" / "ld.so.cache").write_bytes(b"")  # its content is what a dead helper cannot put back
    before, mounts = _tree(rootfs), Path("/proc/self/mountinfo").read_text()
    _apply_failing(plan, monkeypatch, _kill, r"helper killed by signal SIGKILL (in|before) mount_rest")
    assert Path("/proc/self/mountinfo").read_text() == mounts
    assert _tree(rootfs) == before  # no ld.so.cache~ among them
    assert (rootfs / "etc" / "ld.so.cache").read_bytes().startswith(b"glibc-ld.so.cache")  # ldconfig's, whole
