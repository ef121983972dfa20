"""The container's process resolved once (nvc.apply.container, by the pipeline's container step
only): a handle whose descriptors keep naming that process. Gone before or after it was resolved,
a step fails in one line ("container process PID is gone", status 8) and none reaches a process
that got its pid since; the container helper works on the descriptors it is sent with the call
(SCM_RIGHTS), never on the pid.
"""

from __future__ import annotations

import ast
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness.layers import BELOW_PROGRAMS, LAYERS, MODULES, rank
from nvc.apply.container import ContainerHandle
from nvc.errors import ContainerError, DriverError
from nvc.rpc.helper import HelperClient


def start_sleep() -> subprocess.Popen:
    """``sleep`` in a mount namespace of its own (a container's process, for these tests), once
    unshare has exec'd it there."""
    proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sleep", "300"])
    while os.readlink(f"/proc/{proc.pid}/exe") != os.path.realpath("/bin/sleep"):
        os.sched_yield()
    return proc


@contextmanager
def sleeper() -> Iterator[subprocess.Popen]:
    """:func:`start_sleep`'s process, killed at the end."""
    proc = start_sleep()
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def gone(pid: int) -> str:
    return f"^container error: container process {pid} is gone$"


def test_a_process_gone_has_no_handle() -> None:
    exited = subprocess.Popen(["true"])
    exited.wait()
    with pytest.raises(ContainerError, match=gone(exited.pid)) as failure:
        ContainerHandle.open(exited.pid)
    assert failure.value.exit_code == 8


@pytest.mark.parametrize("pid", [0, -1, (1 << 22) + 1, 1 << 64])
def test_a_pid_no_process_can_have_has_no_handle(pid: int) -> None:
    """Out of the kernel's range (pidfd_open takes a C int: a huge one would overflow; the CLI's
    test_every_nvc_py_command_and_option gives one of 4000 digits): the same line."""
    with pytest.raises(ContainerError, match=gone(pid)) as failure:
        ContainerHandle.open(pid)
    assert failure.value.exit_code == 8


def test_an_exited_process_not_yet_reaped_has_no_handle() -> None:
    """A zombie still has its /proc/PID directory; its pidfd says it exited."""
    zombie = subprocess.Popen(["true"])
    os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # exited, left unreaped
    try:
        with pytest.raises(ContainerError, match=gone(zombie.pid)):
            ContainerHandle.open(zombie.pid)
    finally:
        zombie.wait()


def test_the_handle_holds_the_process_and_lets_go() -> None:
    with sleeper() as proc:
        mine = set(os.listdir("/proc/self/fd"))
        with ContainerHandle.open(proc.pid) as handle:
            assert os.readlink(f"/proc/self/fd/{handle.mnt_ns}") == os.readlink(f"/proc/{proc.pid}/ns/mnt")
            assert os.path.samestat(os.stat(f"/proc/self/fd/{handle.root}"), os.stat(f"/proc/{proc.pid}/root"))
            st = os.stat(f"/proc/{proc.pid}")
            assert handle.owner == (st.st_uid, st.st_gid)
        assert set(os.listdir("/proc/self/fd")) == mine  # every descriptor closed


def take_pid(pid: int) -> subprocess.Popen:
    """A new process (``sleep`` in a mount namespace of its own) numbered ``pid``, a number just
    freed: the kernel's last pid set to the one before, then a fork, again while another process's
    fork takes the number first."""
    for _ in range(100):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        proc = start_sleep()
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    pytest.fail(f"no process got pid {pid} again")


def test_a_pid_taken_by_another_process_is_never_reached(active_2gpu, debian_rootfs: Path) -> None:
    """The container's process exits once its plan is made, and another process gets its pid: every
    step on its handle, the container helper's mounts included, fails in one line, and the other
    process's mount namespace stays as it was (a step that looked the pid up again would mount there)."""
    from nvc.apply import shareowner
    from nvc.config.options import GlobalOptions
    from nvc.pipeline import configure
    from nvc.pipeline.apply import apply, ldcache
    from nvc.plan.request import check, from_flags

    glob = GlobalOptions(str(active_2gpu.root), "/etc/ld.so.cache", (0, 0), False)

    def apply_all(plan, handle) -> None:
        with apply(plan, handle) as applied:
            ldcache(applied)

    # no device cgroup step: the container helper alone decides where the mounts go
    with sleeper() as first:
        request = check(from_flags(str(debian_rootfs), first.pid, ("0",), ("compute",), no_cgroups=True))
        with configure.container(request) as ctr:
            handle = ctr.handle
            plan = configure.plan(configure.discover(glob, request), ctr, request)
            first.kill()
            first.wait()
            second = take_pid(first.pid)
            try:
                mounts = Path(f"/proc/{second.pid}/mountinfo").read_text()
                steps = (
                    handle.check,
                    handle.device_cgroup,
                    lambda: shareowner.of_container(handle, ""),
                    lambda: apply_all(plan, handle),
                )
                for step in steps:
                    with pytest.raises(ContainerError, match=gone(first.pid)):
                        step()
                assert Path(f"/proc/{second.pid}/mountinfo").read_text() == mounts
                assert not any(os.path.lexists(debian_rootfs / "dev" / name) for name in ("nvidia0", "nvidiactl"))
            finally:
                second.kill()
                second.wait()


def test_a_call_carries_descriptors_to_the_helper() -> None:
    """What the container helper gets its container by: descriptors sent with a call arrive as the
    same open files, and are closed in the helper once the call returned."""

    def setup() -> dict:
        return {
            "files": lambda fds: [list(os.fstat(fd)[1:3]) for fd in fds],
            "open": lambda: len(os.listdir("/proc/self/fd")),
        }

    read, write = os.pipe()
    try:
        with HelperClient.spawn("test", setup, failure=DriverError) as helper:
            before = helper.call("open")
            sent = (read, write, read)
            assert helper.call("files", fds=sent) == [list(os.fstat(fd)[1:3]) for fd in sent]
            assert helper.call("open") == before
    finally:
        os.close(read)
        os.close(write)


def test_configure_resolves_the_container_once_and_lets_it_go(active_2gpu, debian_rootfs: Path) -> None:
    """A whole configure on a real process: its GPU mounted there, and no descriptor of it left open."""
    from nvc.config.options import GlobalOptions
    from nvc.pipeline import configure
    from nvc.plan.request import from_flags

    glob = GlobalOptions(str(active_2gpu.root), "/etc/ld.so.cache", (0, 0), False)
    with sleeper() as proc:
        mine = set(os.listdir("/proc/self/fd"))
        configure.configure(glob, from_flags(str(debian_rootfs), proc.pid, ("0",), ("compute",), no_cgroups=True))
        assert f" {debian_rootfs}/dev/nvidia0 " in Path(f"/proc/{proc.pid}/mountinfo").read_text()
        assert set(os.listdir("/proc/self/fd")) == mine


def _configure_with_cgroups(root: Path, rootfs: Path, pid: int) -> None:
    from nvc.config.options import GlobalOptions
    from nvc.pipeline import configure
    from nvc.plan.request import from_flags

    glob = GlobalOptions(str(root), "/etc/ld.so.cache", (0, 0), False)
    configure.configure(glob, from_flags(str(rootfs), pid, ("0",), ("compute",)))


def test_a_cgroup_step_failing_while_the_helper_mounts_undoes_the_mounts(
    active_2gpu, debian_rootfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device cgroup is programmed while the helper mounts: where it fails, the mounts are
    waited for and undone, and the error is the cgroup's."""
    from nvc.apply import cgroups
    from nvc.errors import PrivilegeError

    def refuse(*args: object) -> None:
        raise PrivilegeError("cgroup refused (test)")

    monkeypatch.setattr(cgroups, "allow_devices", refuse)
    with sleeper() as proc:
        mounts = Path(f"/proc/{proc.pid}/mountinfo").read_text()
        with pytest.raises(PrivilegeError, match=r"cgroup refused \(test\)"):
            _configure_with_cgroups(active_2gpu.root, debian_rootfs, proc.pid)
        assert Path(f"/proc/{proc.pid}/mountinfo").read_text() == mounts
    assert not os.path.lexists(debian_rootfs / "dev/nvidia0")


def test_mounts_failing_while_the_cgroup_is_programmed_fail_the_start(
    active_2gpu, debian_rootfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other way round: the cgroup step done, the helper's mounts refused (an image with a
    directory where a device node goes); the error is the mounts', and nothing stays mounted."""
    from nvc.apply import cgroups
    from nvc.errors import MountError

    granted: list[object] = []
    monkeypatch.setattr(cgroups, "allow_devices", lambda cgroup, rules: granted.append(rules))
    (debian_rootfs / "dev/nvidia0").mkdir(parents=True)
    try:
        with sleeper() as proc:
            mounts = Path(f"/proc/{proc.pid}/mountinfo").read_text()
            with pytest.raises(MountError, match="nvidia0"):
                _configure_with_cgroups(active_2gpu.root, debian_rootfs, proc.pid)
            assert Path(f"/proc/{proc.pid}/mountinfo").read_text() == mounts
        assert granted
    finally:
        (debian_rootfs / "dev/nvidia0").rmdir()


# The container's process is resolved from its pid in one place below the programs, the pipeline's
# container step: every other step is handed that handle (a step that resolved the pid again might
# reach another process).
RESOLVER = "nvc.pipeline.configure"


def handle_opens(path: Path) -> list[str]:
    """The calls ``ContainerHandle.open(...)`` of ``path``, with their line."""
    tree = ast.parse(path.read_text(), str(path))
    return [
        f"{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "open"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "ContainerHandle"
    ]


def test_only_the_pipeline_resolves_the_container() -> None:
    below = [m for m in MODULES if m != RESOLVER and LAYERS[rank(m)][0] in BELOW_PROGRAMS]
    assert [f"{m}: {call}" for m in sorted(below) for call in handle_opens(MODULES[m])] == []
    assert handle_opens(MODULES[RESOLVER]) != []  # the check sees the step's own
