"""Device cgroup discovery (pure parsing) and granting device access on the real kernel (v1 and v2)."""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Iterator

import pytest

from harness.mountns import in_private_ns
from nvc.apply import bpf
from nvc.apply.cgroups import (
    INIT_CGROUP_NS_INO,
    DeviceCgroup,
    allow_devices,
    locate_device_cgroup,
    parse_proc_cgroup,
    unified_at_default,
)
from nvc.apply.container import ContainerHandle
from nvc.apply.rootfs import open_in_root
from nvc.errors import ContainerError
from nvc.plan.devfilter import ALU64_MOV_K, JMP_CALL, JMP_EXIT, DeviceRule, Insn, build_filter, encode
from nvc.system import syscalls

V1_ROOT = "/sys/fs/cgroup/devices"
V2_ROOT = "/sys/fs/cgroup/unified"

HYBRID_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
32 31 0:29 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
33 31 0:30 / /sys/fs/cgroup/systemd rw,nosuid shared:11 - cgroup cgroup rw,xattr,name=systemd
34 31 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:12 - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/devices rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,devices
36 31 0:33 / /sys/fs/cgroup/net_cls,net_prio rw shared:14 - cgroup cgroup rw,net_cls,net_prio
"""

HYBRID_CGROUP = """\
6:devices:/docker/0123abcd
5:net_cls,net_prio:/
4:cpu,cpuacct:/docker/0123abcd
1:name=systemd:/docker/0123abcd
0::/docker/0123abcd
"""

V2_MOUNTINFO = """\
24 1 259:2 / / rw,relatime shared:1 - ext4 /dev/root rw
30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
"""


@pytest.mark.parametrize(
    ("cgroup", "mountinfo", "expected"),
    [
        (HYBRID_CGROUP, HYBRID_MOUNTINFO, DeviceCgroup(1, "/sys/fs/cgroup/devices/docker/0123abcd")),
        (
            "0::/system.slice/docker-0123.scope\n",
            V2_MOUNTINFO,
            DeviceCgroup(2, "/sys/fs/cgroup/system.slice/docker-0123.scope"),
        ),
        # Hybrid without a v1 devices hierarchy: the v2 hierarchy decides.
        ("1:name=systemd:/a\n0::/a/b\n", HYBRID_MOUNTINFO, DeviceCgroup(2, "/sys/fs/cgroup/unified/a/b")),
        # The top of a v1 devices hierarchy this view does not mount (systemd on v2 alone in a
        # container on a hybrid host): v2 decides.
        (
            "5:devices:/\n0::/system.slice/x.scope\n",
            V2_MOUNTINFO,
            DeviceCgroup(2, "/sys/fs/cgroup/system.slice/x.scope"),
        ),
        # The root cgroup is the mount point itself.
        ("0::/\n", V2_MOUNTINFO, DeviceCgroup(2, "/sys/fs/cgroup")),
        # A cgroup namespace: the mount shows the container's own cgroup as its root.
        (
            "0::/kubepods/pod1/c1/sub\n",
            "40 30 0:26 /kubepods/pod1/c1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
            DeviceCgroup(2, "/sys/fs/cgroup/sub"),
        ),
        # A mount whose root does not hold the cgroup is passed over for one that does.
        (
            "6:devices:/x/y\n",
            "40 30 0:32 /other /mnt/a rw - cgroup cgroup rw,devices\n"
            "41 30 0:32 /x /mnt/with\\040space rw - cgroup cgroup rw,devices\n",
            DeviceCgroup(1, "/mnt/with space/y"),
        ),
        # Unparsable and unrelated lines do not get in the way, nor does a ':' in a path.
        (
            "garbage\n1:net_cls:/\nx:devices:/no\n\n3:devices2:/no\n6:devices:/a:b\n",
            HYBRID_MOUNTINFO + "no separator here\n",
            DeviceCgroup(1, "/sys/fs/cgroup/devices/a:b"),
        ),
    ],
    ids=[
        "hybrid-v1",
        "v2-only",
        "hybrid-no-v1-devices",
        "v1-top-unmounted",
        "v2-root",
        "cgroupns",
        "second-mount",
        "malformed-lines",
    ],
)
def test_locate_device_cgroup(cgroup: str, mountinfo: str, expected: DeviceCgroup) -> None:
    assert locate_device_cgroup(cgroup, mountinfo) == expected


def test_parse_proc_cgroup_controllers() -> None:
    entries = parse_proc_cgroup(HYBRID_CGROUP)
    assert [(e.hierarchy, e.controllers, e.path) for e in entries][1:3] == [
        (5, ("net_cls", "net_prio"), "/"),
        (4, ("cpu", "cpuacct"), "/docker/0123abcd"),
    ]
    assert entries[-1].controllers == ()


@pytest.mark.parametrize(
    ("cgroup", "mountinfo", "message"),
    [
        ("6:devices:/../../user.slice\n", HYBRID_MOUNTINFO, "outside the visible cgroup tree"),
        ("0::/../sibling\n", V2_MOUNTINFO, "outside the visible cgroup tree"),
        ("1:net_cls:/\n1:name=systemd:/\n", HYBRID_MOUNTINFO, "cgroup subsystem devices not found"),
        ("6:devices:/docker/1\n", V2_MOUNTINFO, "no devices cgroup v1 mount shows cgroup /docker/1"),
        ("6:devices:/docker/1\n0::/docker/1\n", V2_MOUNTINFO, "no devices cgroup v1 mount shows cgroup /docker/1"),
        ("0::/a\n", "40 30 0:26 /b /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "no cgroup v2 mount shows cgroup /a"),
    ],
)
def test_locate_device_cgroup_refuses(cgroup: str, mountinfo: str, message: str) -> None:
    with pytest.raises(ContainerError, match=message):
        locate_device_cgroup(cgroup, mountinfo)


def test_find_device_cgroup_of_missing_process_names_it() -> None:
    with pytest.raises(ContainerError, match=r"^container error: container process 999999999 is gone$"):
        ContainerHandle.open(999999999)


class Prober:
    """A forked child that opens device nodes when asked and reports the errno (0: it opened)."""

    def __init__(self) -> None:
        req_r, self._req = os.pipe()
        self._resp, resp_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self._req)
            os.close(self._resp)
            code = 0
            try:
                with os.fdopen(req_r) as requests:
                    for line in requests:
                        path, mode = line.split()
                        try:
                            os.close(os.open(path, os.O_RDWR if mode == "rw" else os.O_RDONLY))
                            result = 0
                        except OSError as err:
                            result = err.errno
                        os.write(resp_w, f"{result}\n".encode())
            except BaseException:
                code = 1
            os._exit(code)
        os.close(req_r)
        os.close(resp_w)
        self._answers = os.fdopen(self._resp)

    def open(self, path: str, mode: str = "rw") -> int:
        os.write(self._req, f"{path} {mode}\n".encode())
        return int(self._answers.readline())

    def close(self) -> None:
        os.close(self._req)
        self._answers.close()
        os.waitpid(self.pid, 0)


@pytest.fixture
def prober() -> Iterator[Prober]:
    child = Prober()
    yield child
    child.close()


def _cgroup_dir(root: str) -> Iterator[str]:
    path = f"{root}/nvc-test-{secrets.token_hex(4)}"
    os.mkdir(path)
    try:
        yield path
    finally:
        os.rmdir(path)


@pytest.fixture
def v1_cgroup() -> Iterator[str]:
    yield from _cgroup_dir(V1_ROOT)


@pytest.fixture
def v2_cgroup() -> Iterator[str]:
    yield from _cgroup_dir(V2_ROOT)


def _enter(cgroup: str, child: Prober) -> None:
    with open(f"{cgroup}/cgroup.procs", "w") as f:
        f.write(str(child.pid))


CLONE_NEWCGROUP = 0x02000000


@pytest.mark.parametrize(
    ("mounted", "cgroup", "found"),
    [
        ("the hierarchy", "0::/{name}\n", True),
        ("the hierarchy", "0::/\n", True),
        ("the hierarchy", "4:devices:/a\n0::/{name}\n", False),  # v1 devices: mountinfo decides
        ("the hierarchy", "1:name=systemd:/a\n", False),  # no v2 line
        ("the hierarchy", "0::/../{name}\n", False),  # outside the reader's cgroup namespace
        ("the hierarchy, read from a cgroup namespace", "0::/{name}\n", False),
        ("a cgroup below its root", "0::/{name}\n", False),  # what a cgroup namespace mounts
        ("tmpfs", "0::/{name}\n", False),
        ("nothing", "0::/{name}\n", False),
    ],
)
def test_v2_cgroup_found_without_mountinfo_only_where_plain(
    tmp_path, v2_cgroup: str, mounted: str, cgroup: str, found: bool
) -> None:
    """Where a view has the whole v2 hierarchy at /sys/fs/cgroup, the cgroup is found there without
    mountinfo, and it is the process's own; anything less plain is left to mountinfo (None)."""
    if os.stat("/proc/self/ns/cgroup").st_ino != INIT_CGROUP_NS_INO:
        pytest.skip("the tests run in a cgroup namespace of their own: their cgroup paths are not whole")
    root = tmp_path / "root"
    (root / "sys/fs/cgroup").mkdir(parents=True)
    name = os.path.basename(v2_cgroup)
    text = cgroup.format(name=name)

    def look() -> object:
        target = str(root / "sys/fs/cgroup")
        if mounted.startswith("the hierarchy"):
            syscalls.mount(V2_ROOT, target, None, syscalls.MS_BIND)
        elif mounted == "a cgroup below its root":
            syscalls.mount(v2_cgroup, target, None, syscalls.MS_BIND)
        elif mounted == "tmpfs":
            syscalls.mount("tmpfs", target, "tmpfs", 0)
        if mounted.endswith("a cgroup namespace"):
            syscalls.unshare(CLONE_NEWCGROUP)
        fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
        cgroup = unified_at_default(text, fd)
        if cgroup is None:
            return None
        opened = open_in_root(fd, cgroup.path, os.O_RDONLY | os.O_DIRECTORY)
        st = os.fstat(opened)
        return [cgroup.version, cgroup.path, cgroup.root_fd == fd, [st.st_dev, st.st_ino]]

    seen = in_private_ns(look)
    if not found:
        assert seen is None
    else:
        path = "/sys/fs/cgroup" + text.strip()[3:].rstrip("/")
        st = os.stat(V2_ROOT + text.strip()[3:])
        assert seen == [2, path or "/sys/fs/cgroup", True, [st.st_dev, st.st_ino]]


# Fixture order matters: the cgroup is created first and removed last, after the child exited.
def test_v1_allow(v1_cgroup: str, prober: Prober) -> None:
    _enter(v1_cgroup, prober)
    with open(f"{v1_cgroup}/devices.deny", "w") as f:
        f.write("a")
    assert prober.open("/dev/null") == errno.EPERM

    with ContainerHandle.open(prober.pid) as handle:
        found = handle.device_cgroup()
        assert found.version == 1 and os.path.samefile(found.path, v1_cgroup)
        allow_devices(found, [DeviceRule("c", 1, 3, "rw"), DeviceRule("c", 1, 7, "r")])

    assert prober.open("/dev/null") == 0
    assert prober.open("/dev/full", "r") == 0
    assert prober.open("/dev/full", "rw") == errno.EPERM
    assert prober.open("/dev/zero") == errno.EPERM
    with open(f"{v1_cgroup}/devices.list") as f:
        assert f.read().split("\n")[:2] == ["c 1:3 rw", "c 1:7 r"]


def test_v1_allow_refused_by_parent_names_the_rule(v1_cgroup: str) -> None:
    with open(f"{v1_cgroup}/devices.deny", "w") as f:
        f.write("a")
    child = f"{v1_cgroup}/child"
    os.mkdir(child)
    try:  # a child cannot be granted what its parent lacks
        with pytest.raises(ContainerError, match=r"devices.allow: c 1:3 rw: Operation not permitted"):
            allow_devices(DeviceCgroup(1, child), [DeviceRule("c", 1, 3, "rw")])
    finally:
        os.rmdir(child)


def _attached(cgroup: str) -> tuple[int, list[int]]:
    fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return bpf.prog_query(fd, bpf.ATTACH_CGROUP_DEVICE)
    finally:
        os.close(fd)


def _attach_runtime_filter(cgroup: str, program: bytes, flags: int) -> None:
    """Stand in for the container runtime: attach its own device filter to the cgroup."""
    cgroup_fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    prog_fd = bpf.prog_load(bpf.PROG_TYPE_CGROUP_DEVICE, program, "Apache-2.0", "runtime")
    try:
        bpf.prog_attach(cgroup_fd, prog_fd, bpf.ATTACH_CGROUP_DEVICE, flags)
    finally:
        os.close(prog_fd)
        os.close(cgroup_fd)


@pytest.mark.parametrize("flags", [bpf.F_ALLOW_MULTI, 0], ids=["multi", "exclusive"])
def test_v2_allow_extends_the_runtime_filter(v2_cgroup: str, prober: Prober, flags: int) -> None:
    _attach_runtime_filter(v2_cgroup, build_filter([DeviceRule("c", 1, 3, "rw")]), flags)
    _enter(v2_cgroup, prober)
    assert prober.open("/dev/null") == 0
    assert prober.open("/dev/zero") == errno.EPERM
    (_, [runtime_id]) = _attached(v2_cgroup)

    allow_devices(DeviceCgroup(2, v2_cgroup), [DeviceRule("c", 1, 5, "rw"), DeviceRule("c", 1, 7, "r")])

    assert prober.open("/dev/zero") == 0
    assert prober.open("/dev/null") == 0  # the runtime's rule still applies
    assert prober.open("/dev/full", "r") == 0
    assert prober.open("/dev/full", "rw") == errno.EPERM
    assert prober.open("/dev/random", "r") == errno.EPERM  # 1:8: the runtime's default deny
    attach_flags, ids = _attached(v2_cgroup)
    assert attach_flags == flags and len(ids) == 1 and ids != [runtime_id], "the old filter must be replaced"


def test_v2_allow_twice_keeps_one_filter(v2_cgroup: str, prober: Prober) -> None:
    _attach_runtime_filter(v2_cgroup, build_filter([DeviceRule("c", 1, 3, "rw")]), bpf.F_ALLOW_MULTI)
    _enter(v2_cgroup, prober)
    allow_devices(DeviceCgroup(2, v2_cgroup), [DeviceRule("c", 1, 5, "rw")])
    allow_devices(DeviceCgroup(2, v2_cgroup), [DeviceRule("c", 1, 7, "rw")])
    assert [prober.open(f"/dev/{name}") for name in ("null", "zero", "full")] == [0, 0, 0]
    assert prober.open("/dev/random", "r") == errno.EPERM
    assert len(_attached(v2_cgroup)[1]) == 1


def test_v2_allow_without_runtime_filter_denies_the_rest(v2_cgroup: str, prober: Prober) -> None:
    _enter(v2_cgroup, prober)
    assert prober.open("/dev/null") == 0
    allow_devices(DeviceCgroup(2, v2_cgroup), [DeviceRule("c", 1, 5, "rw")])
    assert prober.open("/dev/zero") == 0
    assert prober.open("/dev/null") == errno.EPERM
    attach_flags, ids = _attached(v2_cgroup)
    assert attach_flags == bpf.F_ALLOW_MULTI and len(ids) == 1


def test_v2_filter_that_cannot_be_extended_is_left_in_place(v2_cgroup: str, prober: Prober) -> None:
    # A filter calling a helper (bpf_ktime_get_ns) comes back from the kernel with an address in it.
    helper_using = encode([Insn(JMP_CALL, imm=5), Insn(ALU64_MOV_K, 0, imm=0), Insn(JMP_EXIT)])
    _attach_runtime_filter(v2_cgroup, helper_using, bpf.F_ALLOW_MULTI)
    _enter(v2_cgroup, prober)
    before = _attached(v2_cgroup)
    with pytest.raises(ContainerError, match="cannot be extended"):
        allow_devices(DeviceCgroup(2, v2_cgroup), [DeviceRule("c", 1, 5, "rw")])
    assert _attached(v2_cgroup) == before
    assert prober.open("/dev/zero") == errno.EPERM
