"""The sandboxed ldconfig, run for real against throwaway rootfs dirs.

The "container" is a ``sleep`` in its own mount namespace; the rootfs is a tmp dir holding
the host's libc and ld-linux and a small libfoo built here.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvc.apply.container import ContainerHandle
from nvc.apply.ldconfig import run_ldconfig, start_ldconfig
from nvc.errors import LdcacheError
from nvc.system.confinement import SECCOMP_CACHE as CACHES
from nvc.system.confinement import SECCOMP_FILTERS, seccomp_cache_header

SECCOMP_ALLOW, SECCOMP_CACHE = SECCOMP_FILTERS["ldconfig"], CACHES.format("ldconfig")

LIBDIR = Path("/lib/x86_64-linux-gnu")

PROBE_C = r"""
#include <errno.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
    struct timespec t0, t;
    errno = 0;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    printf("argv1=%s uid=%d gid=%d pid=%d socket=%d errno=%d\n",
           argc > 1 ? argv[1] : "", (int)getuid(), (int)getgid(), (int)getpid(), s, errno);
    fflush(stdout);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (access("/go", F_OK) != 0) {   /* wait, busy, until the test has looked at us */
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 5) return 9;
    }
    return 0;
}
"""


# Opens the image's /etc/node for writing as ldconfig would its cache, and says what happened.
OPENER_C = r"""
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
int main(void) {
    errno = 0;
    int fd = open("/etc/node", O_WRONLY | O_NONBLOCK);
    printf("fd=%d errno=%d\n", fd, errno);
    return 0;
}
"""


def _gcc(tmp: Path, source: str, out: Path, *flags: str) -> Path:
    c = tmp / (out.name + ".c")
    c.write_text(source)
    subprocess.run(["gcc", *flags, "-o", str(out), str(c)], check=True)
    return out


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("programs")
    return {
        "probe": _gcc(tmp, PROBE_C, tmp / "probe", "-static", "-O1"),
        "exit3": _gcc(tmp, "int main(void) { return 3; }\n", tmp / "exit3", "-static"),
        "opener": _gcc(tmp, OPENER_C, tmp / "opener", "-static"),
        "libfoo": _gcc(
            tmp, "int foo(void) { return 1; }\n", tmp / "libfoo.so.1.0", "-shared", "-fPIC", "-Wl,-soname,libfoo.so.1"
        ),
    }


@pytest.fixture
def root(tmp_path: Path, programs: dict[str, Path]) -> Path:
    r = tmp_path / "rootfs"
    for d in ("etc", "lib/x86_64-linux-gnu", "opt/foo", "proc", "sys", "dev", "sbin"):
        (r / d).mkdir(parents=True)
    for lib in ("libc.so.6", "ld-linux-x86-64.so.2"):
        shutil.copy(LIBDIR / lib, r / "lib" / "x86_64-linux-gnu" / lib)
    shutil.copy(programs["libfoo"], r / "opt" / "foo" / "libfoo.so.1.0")
    return r


@pytest.fixture
def container() -> Iterator[ContainerHandle]:
    """A process in a mount namespace of its own, standing in for the container: its handle."""
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "30"])
    host_ns = os.readlink("/proc/self/ns/mnt")
    while os.readlink(f"/proc/{proc.pid}/ns/mnt") == host_ns:
        time.sleep(0.005)
    with ContainerHandle.open(proc.pid) as handle:
        yield handle
    proc.kill()
    proc.wait()


def _cache(root: Path) -> str:
    return subprocess.run(
        ["ldconfig", "-p", "-C", str(root / "etc" / "ld.so.cache")], capture_output=True, text=True, check=True
    ).stdout


def test_ldconfig_failure_carries_its_own_line(root: Path, container: ContainerHandle) -> None:
    """ldconfig as an owner who cannot write /etc (a user namespace's root on a host root's rootfs):
    the error ends with what ldconfig itself said, not only its exit code."""
    with pytest.raises(
        LdcacheError,
        match=r"failed with error code: 1: /sbin/ldconfig: Can't create temporary "
        r"cache file /etc/ld\.so\.cache~: Permission denied$",
    ):
        run_ldconfig("@/sbin/ldconfig", str(root), ["/opt/foo"], owner=(100000, 100000), handle=container)
    assert not (root / "etc/ld.so.cache").exists()


def test_host_ldconfig_builds_the_container_cache(root: Path, container: ContainerHandle) -> None:
    assert run_ldconfig("@/sbin/ldconfig", str(root), ["/opt/foo"], owner=(0, 0), handle=container) is True
    cache = _cache(root)
    assert "libfoo.so.1 (libc6,x86-64) => /opt/foo/libfoo.so.1" in cache
    assert os.readlink(root / "opt" / "foo" / "libfoo.so.1") == "libfoo.so.1.0"


def test_no_pivot_and_own_namespace(root: Path) -> None:
    assert run_ldconfig("@/sbin/ldconfig", str(root), ["/opt/foo"], owner=(0, 0), no_pivot=True) is True
    assert "libfoo.so.1" in _cache(root)


def test_rootfs_that_is_a_symlink_is_refused(root: Path, tmp_path: Path) -> None:
    link = tmp_path / "rootfs-link"
    link.symlink_to(root)
    with pytest.raises(LdcacheError, match="Not a directory"):
        run_ldconfig("@/sbin/ldconfig", str(link), ["/opt/foo"], owner=(0, 0))
    assert not (root / "etc" / "ld.so.cache").exists()


def test_without_the_new_mount_api(root: Path, container: ContainerHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels without open_tree: the rootfs is bound through /proc/self/fd and checked."""
    import errno

    from nvc.system import syscalls

    def enosys(*_args, **_kwargs) -> int:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(syscalls, "open_tree", enosys)  # the forked sandbox inherits the patch
    assert run_ldconfig("@/sbin/ldconfig", str(root), ["/opt/foo"], owner=(0, 0), handle=container) is True
    assert "libfoo.so.1" in _cache(root)


def test_image_symlinks_to_host_files_are_harmless(root: Path, container: ContainerHandle, tmp_path: Path) -> None:
    """CVE-2025-23267: ld.so.cache and ld.so.conf.d pointing at host paths."""
    host_cache = tmp_path / "host-ld.so.cache"
    host_cache.write_text("host cache\n")
    host_conf = tmp_path / "host-ld.so.conf.d"
    host_conf.mkdir()
    (root / "etc" / "ld.so.cache").symlink_to(host_cache)
    (root / "etc" / "ld.so.conf.d").symlink_to(host_conf)
    (root / "etc" / "ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    run_ldconfig("@/sbin/ldconfig", str(root), ["/opt/foo"], owner=(0, 0), handle=container)
    assert host_cache.read_text() == "host cache\n"
    assert os.listdir(host_conf) == []
    assert "libfoo.so.1" in _cache(root)


def _find_memfd_process(deadline: float) -> int:
    while time.monotonic() < deadline:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.readlink(f"/proc/{pid}/exe").startswith("/memfd:nvc-ldconfig"):
                    return int(pid)
            except OSError:
                continue
        time.sleep(0.01)
    raise AssertionError("the sandboxed program never showed up")


def test_sandbox_runs_a_memfd_copy_without_privileges(
    root: Path, container: ContainerHandle, programs: dict[str, Path], tmp_path: Path
) -> None:
    """CVE-2024-0135: /proc/<pid>/exe is a memfd, not the host inode; privileges are gone."""
    os.chown(root, 1000, 1000)
    out = tmp_path / "out"
    errors: list[BaseException] = []
    with open(out, "w") as f:

        def run() -> None:
            try:
                run_ldconfig(
                    f"@{programs['probe']}",
                    str(root),
                    ["/opt/foo"],
                    owner=(1000, 1001),
                    handle=container,
                    output_fd=f.fileno(),
                )
            except BaseException as err:  # noqa: BLE001 - re-raised below in the test thread
                errors.append(err)

        worker = threading.Thread(target=run)
        worker.start()
        pid = _find_memfd_process(time.monotonic() + 5)
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        limits = Path(f"/proc/{pid}/limits").read_text()
        (root / "go").touch()
        worker.join()
    assert not errors, errors
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[cap], 16) == 0, cap
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2"
    assert status["Uid"].split()[:2] == ["1000", "1000"] and status["Gid"].split()[:2] == ["1001", "1001"]
    assert status["NSpid"].split()[-1] == "1"  # pid 1 of its own pid namespace
    assert "Max cpu time              10" in limits
    assert "Max open files            64" in limits
    assert "Max data size             67108864" in limits
    assert out.read_text() == "argv1=-f uid=1000 gid=1001 pid=1 socket=-1 errno=1\n"  # socket: EPERM


def test_shell_wrapper_is_replaced_by_real_binary(root: Path, programs: dict[str, Path], tmp_path: Path) -> None:
    wrapper = tmp_path / "ldconfig"
    wrapper.write_text('#!/bin/sh\nexec /sbin/ldconfig.real "$@"\n')
    wrapper.chmod(0o755)
    shutil.copy(programs["exit3"], tmp_path / "ldconfig.real")
    with pytest.raises(
        LdcacheError, match=rf"^ldcache error: process {tmp_path}/ldconfig.real failed with error code: 3$"
    ):
        run_ldconfig(f"@{wrapper}", str(root), [], owner=(0, 0))


def test_container_ldconfig(root: Path, container: ContainerHandle) -> None:
    assert run_ldconfig("/sbin/ldconfig", str(root), ["/opt/foo"], owner=(0, 0), handle=container) is False
    shutil.copy("/sbin/ldconfig", root / "sbin" / "ldconfig")
    assert run_ldconfig("/sbin/ldconfig", str(root), ["/opt/foo"], owner=(0, 0), handle=container) is True
    assert "libfoo.so.1" in _cache(root)


def test_a_caller_that_may_not_make_a_pid_namespace_gets_one_error_and_no_process(root: Path) -> None:
    """The sandbox is pid 1 of a pid namespace the caller makes for it: without CAP_SYS_ADMIN that
    fails as an LdcacheError naming it, before any process is forked and with the caller's own
    namespaces untouched (its next child is in its own pid namespace)."""
    program = (
        "import os, sys\n"
        "from nvc.apply.ldconfig import run_ldconfig\n"
        "from nvc.errors import LdcacheError\n"
        "try:\n"
        f"    run_ldconfig('@/sbin/ldconfig', {str(root)!r}, ['/opt/foo'], owner=(0, 0))\n"
        "except LdcacheError as err:\n"
        "    print(err)\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    os._exit(0 if os.getpid() != 1 else 1)\n"
        "print('child', os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))\n"
    )
    result = subprocess.run(
        ["capsh", "--drop=cap_sys_admin", "--", "-c", 'exec "$0" -c "$1"', sys.executable, program],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.stdout == "ldcache error: cannot make ldconfig's pid namespace: Operation not permitted\nchild 0\n", (
        result.stderr
    )
    assert not (root / "etc" / "ld.so.cache").exists() or "libfoo" not in _cache(root)


def test_missing_host_ldconfig_is_an_error(root: Path, tmp_path: Path) -> None:
    with pytest.raises(LdcacheError, match="open failed: .*nope"):
        run_ldconfig(f"@{tmp_path}/nope", str(root), [], owner=(0, 0))


def test_started_ahead_sees_mounts_made_before_run(
    root: Path, container: ContainerHandle, programs: dict[str, Path], tmp_path: Path
) -> None:
    """configure forks the child before mounting: it must take its namespace copy only at run()."""
    pending = start_ldconfig("@/sbin/ldconfig", str(root), ["/opt/bar"], owner=(0, 0), handle=container)
    (root / "opt" / "bar").mkdir()
    src = tmp_path / "bar"
    src.mkdir()
    shutil.copy(programs["libfoo"], src / "libfoo.so.1.0")
    subprocess.run(
        ["nsenter", f"--mount=/proc/{container.pid}/ns/mnt", "mount", "--bind", str(src), str(root / "opt/bar")],
        check=True,
    )
    assert pending.run() is True
    assert "libfoo.so.1 (libc6,x86-64) => /opt/bar/libfoo.so.1" in _cache(root)
    assert not any((root / "opt" / "bar").iterdir())  # the bind exists in the container's namespace only


def test_cancelled_run_changes_nothing(root: Path, container: ContainerHandle) -> None:
    pending = start_ldconfig("@/sbin/ldconfig", str(root), ["/opt/foo"], owner=(0, 0), handle=container)
    child = pending._child
    pending.cancel()
    assert not (root / "etc" / "ld.so.cache").exists()
    with pytest.raises(ChildProcessError):
        os.waitpid(child, os.WNOHANG)
    with pytest.raises(LdcacheError, match="already started or cancelled"):
        pending.run()


def test_started_run_runs_while_the_caller_works_and_a_cancel_after_start_reaps_it(
    root: Path, container: ContainerHandle
) -> None:
    """configure starts ldconfig, programs the device cgroup meanwhile, then waits; a failure in
    between cancels the started run: the child is killed and reaped, never left behind."""
    pending = start_ldconfig("@/sbin/ldconfig", str(root), ["/opt/foo"], owner=(0, 0), handle=container)
    with pytest.raises(LdcacheError, match="not started"):
        pending.wait()
    pending.start()
    with pytest.raises(LdcacheError, match="already started"):
        pending.start()
    assert pending.wait() is True and "libfoo.so.1" in _cache(root)
    pending.cancel()  # after wait: nothing left to do
    cancelled = start_ldconfig("@/sbin/ldconfig", str(root), ["/opt/foo"], owner=(0, 0), handle=container)
    child = cancelled._child
    cancelled.start()
    cancelled.cancel()
    with pytest.raises(ChildProcessError):
        os.waitpid(child, os.WNOHANG)


@pytest.mark.parametrize("api", ["mount_setattr", "remount"])
def test_the_sandbox_cannot_open_a_device_node_of_the_image(
    root: Path,
    container: ContainerHandle,
    programs: dict[str, Path],
    tmp_path: Path,
    api: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its view of the rootfs is nodev: a node of the image (here /dev/null's 1:3) cannot be opened,
    even by root; whatever ldconfig reads or writes there, it cannot reach a device. Kernels
    without mount_setattr get a classic remount of the rootfs mount."""
    if api == "remount":
        from nvc.system import syscalls

        def enosys(*_args, **_kwargs) -> None:
            raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

        monkeypatch.setattr(syscalls, "mount_setattr", enosys)  # the forked sandbox inherits the patch
    os.mknod(root / "etc" / "node", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    out = tmp_path / "out"
    with open(out, "w") as f:
        run_ldconfig(f"@{programs['opener']}", str(root), [], owner=(0, 0), handle=container, output_fd=f.fileno())
    assert out.read_text() == f"fd=-1 errno={errno.EACCES}\n"


@pytest.mark.parametrize(
    ("name", "make", "what"),
    [
        ("ld.so.cache~", lambda p: os.mknod(p, 0o600 | stat.S_IFBLK, os.makedev(7, 255)), "a block device"),
        ("ld.so.conf", lambda p: os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 5)), "a character device"),
        ("ld.so.conf", os.mkfifo, "a FIFO"),
        ("ld.so.cache", os.mkfifo, "a FIFO"),
        ("ld.so.conf.d/x.conf", os.mkfifo, "a FIFO"),
    ],
)
def test_ldconfig_files_that_are_not_regular_are_refused(
    root: Path, container: ContainerHandle, name: str, make, what: str
) -> None:
    (root / "etc" / "ld.so.conf.d").mkdir()
    make(root / "etc" / name)
    with pytest.raises(
        LdcacheError,
        match=rf"^ldcache error: /etc/{name} in the image is {what}, not a regular "
        "file$",
    ):
        run_ldconfig("@/sbin/ldconfig", str(root), ["/opt/foo"], owner=(0, 0), handle=container)
    assert not (root / "etc" / "ld.so.cache").exists() or name == "ld.so.cache"


def test_a_run_that_blocks_is_killed_at_its_time_limit(root: Path, container: ContainerHandle) -> None:
    """A FIFO ldconfig reads (through an include its checks cannot follow) ends in the wall-time
    limit, with ldconfig and its sandbox killed."""
    (root / "etc" / "fifo.d").mkdir()
    os.mkfifo(root / "etc" / "fifo.d" / "evil.conf")
    (root / "etc" / "ld.so.conf").write_text("include /etc/fifo.d/*.conf\n")
    pending = start_ldconfig("@/sbin/ldconfig", str(root), ["/opt/foo"], owner=(0, 0), handle=container, timeout=1)
    started = time.monotonic()
    pending.start()
    with pytest.raises(
        LdcacheError,
        match=r"^ldcache error: process /sbin/ldconfig(.real)? timed out after 1 s "
        r"\(killed\)$",
    ):
        pending.wait()
    assert time.monotonic() - started < 3
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and _ldconfig_processes():
        time.sleep(0.02)
    assert _ldconfig_processes() == []


def _ldconfig_processes() -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/exe").startswith("/memfd:nvc-ldconfig"):
                if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(pid))
        except OSError:
            continue
    return found


def _compiled(allow: tuple[str, ...]) -> bytes:
    """``allow`` compiled by libseccomp as the sandbox compiles its list (EPERM for the rest)."""
    import pyseccomp

    rules = pyseccomp.SyscallFilter(pyseccomp.ERRNO(errno.EPERM))
    for name in allow:
        if pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name) >= 0:
            rules.add_rule(pyseccomp.ALLOW, name)
    with open(os.memfd_create("test-bpf"), "w+b") as f:
        rules.export_bpf(f)
        f.seek(0)
        return f.read()


def _plant_cache(data: bytes, mode: int = 0o600) -> None:
    cache = Path(SECCOMP_CACHE)
    cache.parent.mkdir(mode=0o700, exist_ok=True)
    cache.write_bytes(data)
    cache.chmod(mode)


def test_the_compiled_filter_is_cached_and_believed_only_as_roots_own_for_this_list(
    root: Path, container: ContainerHandle
) -> None:
    """The allowlist is compiled once and kept (root's 0600 file, headed by the list it holds); a
    cached program for this list is what the sandbox loads (one without rename makes ldconfig fail),
    one that others could have written or one for another list is compiled again."""
    header = seccomp_cache_header("ldconfig")
    Path(SECCOMP_CACHE).unlink(missing_ok=True)
    assert run_ldconfig("@/sbin/ldconfig", str(root), ["/opt/foo"], owner=(0, 0), handle=container) is True
    st = os.lstat(SECCOMP_CACHE)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0
    assert Path(SECCOMP_CACHE).read_bytes() == header + _compiled(SECCOMP_ALLOW)

    no_rename = header + _compiled(tuple(name for name in SECCOMP_ALLOW if name != "rename"))
    _plant_cache(no_rename)
    with pytest.raises(
        LdcacheError,
        match=r"failed with error code: 1: /sbin/ldconfig: Renaming of "
        r"/etc/ld\.so\.cache~ to /etc/ld\.so\.cache failed: Operation not permitted$",
    ):
        run_ldconfig("@/sbin/ldconfig", str(root), ["/opt/foo"], owner=(0, 0), handle=container)
    for planted, mode in (
        (no_rename, 0o644),
        (b"nvc-py ldconfig seccomp: another list\n" + no_rename[len(header) :], 0o600),
    ):
        _plant_cache(planted, mode)
        assert run_ldconfig("@/sbin/ldconfig", str(root), ["/opt/foo"], owner=(0, 0), handle=container) is True
        assert Path(SECCOMP_CACHE).read_bytes() == header + _compiled(SECCOMP_ALLOW)
        assert stat.S_IMODE(os.lstat(SECCOMP_CACHE).st_mode) == 0o600
