"""The mount planner (pure): which files, nodes, /proc contents and cgroup rules a container gets.

No root and no driver needed: host and container facts are plain records here.
"""

from __future__ import annotations

import os

import pytest

from nvc.discover.driver import DriverFiles
from nvc.errors import DeviceError, InputError
from nvc.model.devices import Gpu, MigDevice
from nvc.plan import mountplan
from nvc.plan.devfilter import DeviceRule
from nvc.plan.mountplan import Bind, ContainerFacts, HostFacts, HostMount, MakeDir, Seal, Symlink, Tmpfs, WriteFile
from nvc.plan.request import Request, ShareRequest, check, from_flags
from nvc.plan.selection import Selection

R = "/drv"  # driver root
V = "580.95.05"
LIB = f"{R}/usr/lib/x86_64-linux-gnu"
LIB32 = f"{R}/usr/lib/i386-linux-gnu"
LIBS = tuple(
    f"{LIB}/{name}.so.{V}"
    for name in (
        "libnvidia-ml",
        "libnvidia-cfg",
        "libcuda",
        "libnvidia-ptxjitcompiler",
        "libnvidia-encode",
        "libnvidia-opticalflow",
        "libnvcuvid",
        "libnvidia-glcore",
        "libGLX_nvidia",
        "libEGL_nvidia",
        "libnvidia-ngx",
    )
)
FILES = DriverFiles(
    version=V,
    libraries=LIBS,
    libraries32=(f"{LIB32}/libcuda.so.{V}", f"{LIB32}/libnvidia-ml.so.{V}"),
    binaries=(f"{R}/usr/bin/nvidia-smi", f"{R}/usr/bin/nvidia-cuda-mps-control"),
    firmwares=(f"{R}/lib/firmware/nvidia/{V}/gsp_ga10x.bin",),
    persistenced_socket=f"{R}/var/run/nvidia-persistenced/socket",
    fabricmanager_socket=None,
    mps_pipe_dir=f"{R}/tmp/nvidia-mps",
)
MAJORS = {"nvidia": 195, "nvidia-uvm": 238, "nvidia-caps": 241, "nvidia-caps-imex-channels": 242}
MIG = MigDevice(
    0,
    1,
    0,
    "MIG-aaaa",
    gi_caps_path="/proc/driver/nvidia/capabilities/gpu1/mig/gi1/access",
    ci_caps_path="/proc/driver/nvidia/capabilities/gpu1/mig/gi1/ci0/access",
    gi_caps_minor=147,
    ci_caps_minor=148,
)
GPU0 = Gpu(0, 0, "H100", "Nvidia", "GPU-0", "00000000:3B:00.0", "9.0")
GPU1 = Gpu(1, 1, "A100", "Nvidia", "GPU-1", "00000000:86:00.0", "8.0", mig_enabled=True, mig_devices=(MIG,))
MIG_MINORS = {
    "config": 1,
    "monitor": 2,
    "gpu1/gi1/access": 147,
    "gpu1/gi1/ci0/access": 148,
    "gpu1/gi2/access": 156,
    "gpu0/gi1/access": 12,
}
NODES = {
    "/dev/nvidiactl": f"{R}/dev/nvidiactl",
    "/dev/nvidia-uvm": f"{R}/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools": f"{R}/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset": f"{R}/dev/nvidia-modeset",
    "/dev/nvidia0": f"{R}/dev/nvidia0",
    "/dev/nvidia1": f"{R}/dev/nvidia1",
    "/dev/nvidia-caps/nvidia-cap1": f"{R}/dev/nvidia-caps/nvidia-cap1",
    "/dev/nvidia-caps/nvidia-cap147": f"{R}/dev/nvidia-caps/nvidia-cap147",
    "/dev/nvidia-caps/nvidia-cap148": f"{R}/dev/nvidia-caps/nvidia-cap148",
    "/dev/nvidia-caps-imex-channels/channel3": f"{R}/dev/nvidia-caps-imex-channels/channel3",
}
HOST = HostFacts(
    root=R,
    files=FILES,
    majors=MAJORS,
    nodes=NODES,
    proc_files={"params": "EnableMSI: 1\nModifyDeviceFiles: 1\nDeviceFileMode: 438\n", "version": "NVRM version: x\n"},
    proc_gpu_dirs={
        "00000000:3B:00.0": "/proc/driver/nvidia/gpus/0000:3b:00.0",
        "00000000:86:00.0": "/proc/driver/nvidia/gpus/0000:86:00.0",
    },
    mig_minors=MIG_MINORS,
)
DEBIAN = ContainerFacts((1000, 1000), "/usr/lib/x86_64-linux-gnu", "/usr/lib/i386-linux-gnu", "/proc/driver/nvidia")


def _plan(caps=("compute", "utility"), gpus=(GPU0,), migs=(), container=DEBIAN, host=HOST, **opts):
    request = Request(rootfs="/rootfs", pid=42, capabilities=frozenset(caps), **opts)
    return mountplan.build(host, container, Selection(tuple(gpus), tuple(migs)), request)


def _binds(plan, what):
    return [op for op in plan.operations if isinstance(op, Bind) and op.what == what]


def _names(binds):
    return {os.path.basename(b.target) for b in binds}


def test_compute_utility_libraries_binaries_and_nodes():
    plan = _plan()
    assert _names(_binds(plan, "library")) == {
        f"{n}.so.{V}" for n in ("libnvidia-ml", "libnvidia-cfg", "libcuda", "libnvidia-ptxjitcompiler")
    }
    assert all(b.target.startswith("/usr/lib/x86_64-linux-gnu/") for b in _binds(plan, "library"))
    assert {b.target for b in _binds(plan, "binary")} == {"/usr/bin/nvidia-smi", "/usr/bin/nvidia-cuda-mps-control"}
    devices = _binds(plan, "device")
    assert [b.target for b in devices] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0"]
    assert devices[-1].rdev == os.makedev(195, 0) and devices[-1].source == f"{R}/dev/nvidia0"
    assert plan.cgroup_rules == (
        DeviceRule("c", 195, 255, "rw"),
        DeviceRule("c", 238, 0, "rw"),
        DeviceRule("c", 238, 1, "rw"),
        DeviceRule("c", 195, 0, "rw"),
    )
    assert (plan.ldconfig, plan.ldconfig_dirs) == ("@/sbin/ldconfig", ("/usr/lib/x86_64-linux-gnu",))
    assert plan.owner == (1000, 1000)


def test_mount_flags():
    plan = _plan()
    ro = int(mountplan.RO)
    assert {b.attrs for b in _binds(plan, "library") + _binds(plan, "binary")} == {ro}
    assert {b.attrs for b in _binds(plan, "firmware")} == {int(mountplan.RO_NOEXEC)}
    assert {(b.target, b.attrs, b.kind) for b in _binds(plan, "ipc")} == {
        ("/var/run/nvidia-persistenced/socket", int(mountplan.IPC), "file"),
        ("/tmp/nvidia-mps", int(mountplan.IPC), "dir"),
    }
    assert {b.attrs for b in _binds(plan, "device")} == {int(mountplan.DEVICE)}


def test_utility_alone_has_no_uvm_no_compute_files():
    plan = _plan(caps=("utility",))
    assert _names(_binds(plan, "library")) == {f"libnvidia-ml.so.{V}", f"libnvidia-cfg.so.{V}"}
    assert [b.target for b in _binds(plan, "device")] == ["/dev/nvidiactl", "/dev/nvidia0"]
    assert [b.target for b in _binds(plan, "ipc")] == ["/var/run/nvidia-persistenced/socket"]
    assert not [op for op in plan.operations if isinstance(op, Symlink)]


def test_video_brings_compute_libraries_and_display_the_modeset_node():
    video = _names(_binds(_plan(caps=("video",)), "library"))
    assert {f"libcuda.so.{V}", f"libnvidia-encode.so.{V}", f"libnvcuvid.so.{V}"} <= video
    assert "/dev/nvidia-uvm" not in {b.target for b in _binds(_plan(caps=("video",)), "device")}
    display = _plan(caps=("display",))
    assert "/dev/nvidia-modeset" in {b.target for b in _binds(display, "device")}
    assert {f"libGLX_nvidia.so.{V}", f"libnvidia-glcore.so.{V}"} <= _names(_binds(display, "library"))


def test_library_symlinks():
    plan = _plan(caps=("compute", "video", "graphics"))
    links = {op.target: op.link_to for op in plan.operations if isinstance(op, Symlink)}
    d = "/usr/lib/x86_64-linux-gnu"
    assert links == {
        f"{d}/libcuda.so": "libcuda.so.1",
        f"{d}/libnvidia-opticalflow.so": "libnvidia-opticalflow.so.1",
        f"{d}/libGLX_indirect.so.0": f"libGLX_nvidia.so.{V}",
    }


def test_compat32_goes_to_the_32_bit_dir_and_into_ldconfig():
    lib64 = DEBIAN._replace(lib_dir="/usr/lib64", lib32_dir="/usr/lib")
    plan = _plan(caps=("compute", "compat32"), container=lib64)
    assert [b.target for b in _binds(plan, "library32")] == [f"/usr/lib/libcuda.so.{V}"]
    assert plan.ldconfig_dirs == ("/usr/lib64", "/usr/lib")
    assert not _binds(_plan(caps=("compute",)), "library32")


def test_proc_tmpfs_holds_params_version_and_selected_gpus_only():
    plan = _plan(gpus=(GPU1,))
    proc = [
        op
        for op in plan.operations
        if isinstance(op, (Tmpfs, MakeDir, WriteFile, Seal)) or (isinstance(op, Bind) and op.what == "proc")
    ]
    assert [type(op).__name__ for op in proc] == ["Tmpfs", "WriteFile", "WriteFile", "MakeDir", "Bind", "Seal"]
    assert proc[0].target == proc[-1].target == "/proc/driver/nvidia"
    params = proc[1]
    assert params.target == "/proc/driver/nvidia/params"
    assert params.content == "EnableMSI: 1\nModifyDeviceFiles: 0\nDeviceFileMode: 438\n"
    assert (proc[4].source, proc[4].target, proc[4].kind) == (
        "/proc/driver/nvidia/gpus/0000:86:00.0",
        "/proc/driver/nvidia/gpus/0000:86:00.0",
        "dir",
    )


def test_proc_tmpfs_where_the_container_lacks_the_driver_dir():
    on_driver = _plan(container=DEBIAN._replace(proc_mountpoint="/proc/driver"))
    assert on_driver.operations[[type(op) for op in on_driver.operations].index(Tmpfs) + 1] == MakeDir(
        "/proc/driver/nvidia"
    )
    none = _plan(container=DEBIAN._replace(proc_mountpoint=None))
    assert not [op for op in none.operations if isinstance(op, (Tmpfs, WriteFile, Seal))]


def test_params_without_modify_device_files_gets_the_line():
    assert mountplan.params_without_device_files("A: 1") == "A: 1\nModifyDeviceFiles: 0\n"


def test_mig_device_brings_its_access_files_caps_nodes_and_rules():
    plan = _plan(caps=("utility",), gpus=(GPU1,), migs=((GPU1, MIG),))
    mig = _binds(plan, "mig")
    assert [(b.target, b.kind) for b in mig] == [
        ("/dev/nvidia-caps/nvidia-cap147", "device"),
        ("/dev/nvidia-caps/nvidia-cap148", "device"),
        ("/proc/driver/nvidia/capabilities/gpu1/mig/gi1/access", "file"),
        ("/proc/driver/nvidia/capabilities/gpu1/mig/gi1/ci0/access", "file"),
    ]
    assert mig[0].rdev == os.makedev(241, 147)
    assert DeviceRule("c", 241, 147, "rw") in plan.cgroup_rules and DeviceRule("c", 241, 148, "rw") in plan.cgroup_rules


def test_mig_config_binds_the_capability_trees_and_allows_every_minor_of_the_gpu():
    plan = _plan(caps=("utility",), gpus=(GPU1,), migs=((GPU1, MIG),), mig_config=True)
    mig = _binds(plan, "mig")
    assert [(b.source, b.target, b.kind) for b in mig] == [
        (f"{R}/dev/nvidia-caps", "/dev/nvidia-caps", "dir"),
        ("/proc/driver/nvidia/capabilities", "/proc/driver/nvidia/capabilities", "dir"),
    ]
    caps_rules = {r.minor for r in plan.cgroup_rules if r.major == 241}
    assert caps_rules == {147, 148, 156, 1}  # gpu1's minors and config; not gpu0's, not monitor


def test_imex_channels():
    plan = _plan(imex_channels=(3,))
    assert [(b.target, b.rdev) for b in _binds(plan, "imex")] == [
        ("/dev/nvidia-caps-imex-channels/channel3", os.makedev(242, 3))
    ]
    assert DeviceRule("c", 242, 3, "rw") in plan.cgroup_rules
    with pytest.raises(DeviceError, match="channel4: no such device node"):
        _plan(imex_channels=(4,))


def test_missing_gpu_node_is_a_device_error():
    host = HOST._replace(nodes={k: v for k, v in NODES.items() if k != "/dev/nvidia0"})
    with pytest.raises(DeviceError, match=r"/dev/nvidia0: no such device node under /drv"):
        _plan(host=host)


def test_no_devbind_and_no_cgroups():
    plan = _plan(no_devbind=True)
    assert not _binds(plan, "device") and len(plan.cgroup_rules) == 4
    assert not _plan(no_cgroups=True).cgroup_rules


def test_no_device_still_gets_control_nodes_and_driver_files():
    plan = _plan(gpus=())
    assert [b.target for b in _binds(plan, "device")] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert not [op for op in plan.operations if isinstance(op, MakeDir)]
    assert _binds(plan, "library")


@pytest.mark.parametrize(
    ("lib", "ldconfig_mode", "mount_mode"),
    [("libcuda.so.560.35.03", True, True), ("libcuda.so.550.90.07", False, False), ("libcuda.so.535.1", False, True)],
)
def test_cuda_compat_filter(lib, ldconfig_mode, mount_mode):  # the reference's vectors (driver 550.54.15)
    libs = (f"/usr/local/cuda/compat/{lib}",)
    assert bool(mountplan.compat_libraries(libs, "550.54.15", "ldconfig")) == ldconfig_mode
    assert bool(mountplan.compat_libraries(libs, "550.54.15", "mount")) == mount_mode


def test_cuda_compat_modes():
    container = DEBIAN._replace(compat_libs=("/usr/local/cuda/compat/libcuda.so.590.1.2",))
    assert _plan(container=container).ldconfig_dirs == ("/usr/local/cuda/compat", "/usr/lib/x86_64-linux-gnu")
    assert _plan(container=container, cuda_compat_mode="disabled").ldconfig_dirs == ("/usr/lib/x86_64-linux-gnu",)
    mounted = _plan(container=container, cuda_compat_mode="mount")
    assert [(b.source, b.target, b.in_rootfs) for b in _binds(mounted, "compat")] == [
        ("/usr/local/cuda/compat/libcuda.so.590.1.2", "/usr/lib/x86_64-linux-gnu/libcuda.so.590.1.2", True)
    ]
    assert not _binds(_plan(container=container), "compat")  # image files are never mounted by default


def test_extra_mounts_come_last():
    extra = (
        HostMount("/run/nvc/share/c1", "/etc/nvc-share", directory=True),
        HostMount("/x/l.so", "/usr/lib/l.so", readonly=False),
    )
    plan = _plan(extra_mounts=extra)
    assert plan.operations[-2:] == (
        Bind("/run/nvc/share/c1", "/etc/nvc-share", int(mountplan.RO), "dir", "extra"),
        Bind("/x/l.so", "/usr/lib/l.so", int(mountplan.RO & ~mountplan.MountAttr.RDONLY), "file", "extra"),
    )
    with pytest.raises(InputError, match="must be absolute"):
        _plan(extra_mounts=(HostMount("rel", "/x"),))


def _ldconfig_takes(path: str) -> bool:
    """Whether ldconfig could take the file at ``path`` for a library: it looks only at names that
    start with lib or ld- and hold .so, and its sandbox hides /dev and /proc."""
    name = os.path.basename(path)
    hidden = path.startswith(("/dev/", "/proc/"))
    return not hidden and name.startswith(("lib", "ld-")) and ".so" in name


def test_ldconfig_starts_once_the_libraries_and_their_links_are_made():
    """The plan puts first what ldconfig reads (libraries, loader files, their links) and says how many
    operations that is; ldconfig runs beside the rest, none of which it could take for a library."""
    plan = _plan(caps=("compute", "utility", "compat32"), migs=((GPU1, MIG),), imex_channels=(3,))
    read, rest = plan.operations[: plan.before_ldconfig], plan.operations[plan.before_ldconfig :]
    assert {op.what for op in read if isinstance(op, Bind)} == {"library", "library32"}
    assert any(isinstance(op, Symlink) for op in read) and not any(isinstance(op, Symlink) for op in rest)
    unread = {"binary", "ipc", "firmware", "device", "mig", "imex", "proc"}
    assert {op.what for op in rest if isinstance(op, Bind)} == unread
    assert {type(op) for op in rest} >= {Tmpfs, WriteFile, Seal}
    assert not [op.target for op in rest if _ldconfig_takes(op.target)]
    assert [op for op in _plan().operations if isinstance(op, Bind) and op.what == "library"] == list(
        _plan().operations[: len(_binds(_plan(), "library"))]
    )  # the libraries lead
    # an extra mount may land in a library directory: ldconfig waits for every operation
    assert _plan(extra_mounts=(HostMount("/x/l.so", "/usr/lib/l.so"),)).before_ldconfig is None
    assert _plan(caps=()).before_ldconfig is None  # no library, no ldconfig
    assert _plan(ldconfig=None).before_ldconfig is None


def test_sharing_files_are_mounted_by_the_plan_after_the_requests_own():
    """The plan takes the sharing files' mounts from the planned files (nvc.plan.share.mounts), after the
    request's extra mounts: nothing adds them to the request after discovery (request -> plan, one way)."""
    from nvc.plan import share

    files = share.files(ShareRequest(memory=(("", 1 << 30),)), "c1", "", library="/lib/shim.so", state_dir="/st")
    request = Request(
        rootfs="/rootfs",
        pid=42,
        capabilities=frozenset({"compute"}),
        extra_mounts=(HostMount("/x/l.so", "/usr/lib/l.so"),),
        sharing=ShareRequest(),
    )
    plan = mountplan.build(HOST, DEBIAN, Selection((GPU0,), ()), request, files)
    assert [(b.source, b.target) for b in _binds(plan, "extra")] == [
        ("/x/l.so", "/usr/lib/l.so"),
        ("/lib/shim.so", "/usr/lib/nvc-share/libnvc-share.so"),
        ("/st/c1/shared", "/var/run/nvc-share"),
        ("/st/c1/shared/limits", "/var/run/nvc-share/limits"),
        ("/st/c1/ld.so.preload", "/etc/ld.so.preload"),
    ]
    assert plan.share == files


def test_no_capability_means_no_library_and_no_ldconfig():
    plan = _plan(caps=())
    assert not _binds(plan, "library") and plan.ldconfig is None


def test_wire_round_trip_and_text():
    plan = _plan(caps=("compute", "utility", "video"), gpus=(GPU1,), migs=((GPU1, MIG),), imex_channels=(3,))
    assert mountplan.Plan.from_wire(plan.to_wire()) == plan
    text = plan.text()
    assert text.startswith("rootfs  /rootfs (pid 42, owner 1000:1000)\n")
    assert f"bind    device    {R}/dev/nvidia1 -> /dev/nvidia1 [c 195:1, nosuid,noexec]\n" in text
    assert "cgroup  allow     c 241:147 rw\n" in text
    assert text.endswith("ldconfig @/sbin/ldconfig /usr/lib/x86_64-linux-gnu\n")


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"rootfs": "rel"}, InputError, "invalid rootfs directory"),
        ({"rootfs": "/"}, InputError, "invalid rootfs directory"),
        ({"capabilities": frozenset({"compute", "gpu"})}, InputError, "unknown driver capability: gpu"),
        ({"devices": ("0,bogus",)}, DeviceError, "bogus: unknown device"),
        ({"devices": ("MIG-x",), "mig_monitor": "all"}, InputError, "cannot enable mig-monitor with specific MIG"),
        ({"mig_config": "0"}, InputError, "only 'all'"),
        ({"requirements": ("cuda>=x",)}, InputError, "invalid"),
        ({"cuda_compat_mode": "sometimes"}, InputError, "invalid cuda compat mode"),
        ({"ldconfig": "sbin/ldconfig"}, InputError, "invalid ldconfig path"),
        ({"imex_channels": ("1,x",)}, InputError, "x: unsupported IMEX channel value"),
    ],
)
def test_validate_refuses_bad_requests(changes, error, message):
    with pytest.raises(error, match=message):
        from_flags(**{"rootfs": "/rootfs", "pid": 1, "devices": ("all",), **changes})


def test_validate_none_selects_nothing_and_standalone_skips_cgroups():
    checked = from_flags(rootfs="/rootfs", pid=None, devices=("none",))
    assert checked.selectors == () and checked.no_cgroups


def test_a_request_made_elsewhere_is_held_to_the_same_rules():
    """The hook's request (parsed from a spec, its rootfs and pid added) passes the flags' checks too."""
    with pytest.raises(InputError, match=r"^input error: \(empty\): invalid rootfs directory"):
        check(Request())
    mig = from_flags(rootfs="/rootfs", pid=1, devices=("MIG-x",))
    with pytest.raises(InputError, match="cannot enable mig-config with specific MIG"):
        check(mig._replace(mig_config=True))
    with pytest.raises(InputError, match="invalid cuda compat mode"):
        check(mig._replace(cuda_compat_mode="never"))
    assert check(Request(rootfs="/rootfs")).no_cgroups and not check(Request(rootfs="/rootfs", pid=3)).no_cgroups
