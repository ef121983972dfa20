"""``nvc-py configure`` end to end against the fake driver: runc containers with a prestart hook,
real mount namespaces, real device cgroups (v1 and the v2 unified hierarchy), real ldconfig.

Test double: the GPUs are the fake driver's; nothing here is a GPU result.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness.bundle import make_bundle
from harness.configurehook import NVC, PROBE
from harness.configurehook import hook as _hook
from harness.configurehook import paths as _tree
from harness.configurehook import run as _run
from harness.processes import children as _children
from harness.standins import shared_target_process, target_process  # noqa: F401  (fixtures)

GPU0 = "GPU-4f6a2c1e-8b3d-5e7f-9a1b-2c3d4e5f6a7b"
GPU1 = "GPU-0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6"
MIG_1_1 = "MIG-5a6b7c8d-9e0f-5a1b-8c2d-3e4f5a6b7c8d"  # GPU 1, GI 1 / CI 0
V2_ROOT = "/sys/fs/cgroup/unified"


def test_runc_container_gets_the_selected_gpu(active_2gpu, debian_rootfs, runc, tmp_path):
    fake = active_2gpu
    hook = _hook(tmp_path, fake, debian_rootfs, "--device=0 --compute --utility")
    script = (
        f"{PROBE}; ls /usr/lib/x86_64-linux-gnu/ | grep -c 580.95.05; ldconfig -p | grep -E 'lib(cuda|nvidia-ml).so.1 '; "
        "nvidia-smi -L; ls /proc/driver/nvidia/gpus; grep ModifyDeviceFiles /proc/driver/nvidia/params; "
        "ls /dev | grep nvidia; probe /dev/nvidia0; readlink /usr/lib/x86_64-linux-gnu/libcuda.so; "
        "touch /proc/driver/nvidia/x 2>&1 | grep -o 'Read-only file system'; "
        "grep -E 'libcuda.so.580| /dev/nvidia0 ' /proc/self/mountinfo | cut -d' ' -f5,6"
    )

    out = [line.strip() for line in _run(runc, tmp_path, debian_rootfs, hook, script).stdout.splitlines()]

    assert int(out[0]) == 15  # 3 utility + 12 compute libraries
    assert "libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1" in out[1:3]
    assert "libnvidia-ml.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1" in out[1:3]
    assert [line for line in out if line.startswith("GPU ")] == [f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {GPU0})"]
    assert out[4:6] == ["0000:3b:00.0", "ModifyDeviceFiles: 0"]
    assert out[6:10] == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidiactl"]
    assert out[10:12] == ["/dev/nvidia0 open", "libcuda.so.1"]  # the v1 rule nvc-py added lets it open
    assert out[12] == "Read-only file system"  # the /proc/driver/nvidia tmpfs is sealed
    assert sorted(out[13:]) == [
        "/dev/nvidia0 rw,nosuid,noexec,relatime",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05 ro,nosuid,nodev,relatime",
    ]


def test_runc_container_gets_mig_device_and_its_caps(active_2gpu, lib64_rootfs, runc, tmp_path):
    fake = active_2gpu
    hook = _hook(tmp_path, fake, lib64_rootfs, f"--device={MIG_1_1} --utility --imex-channel=1")
    script = (
        "nvidia-smi -L; ls /proc/driver/nvidia/gpus; find /proc/driver/nvidia/capabilities -type f; "
        "ls /dev/nvidia-caps; ls /usr/lib64 | grep -c 580.95.05; ls /dev/nvidia-caps-imex-channels"
    )

    out = [line.strip() for line in _run(runc, tmp_path, lib64_rootfs, hook, script).stdout.splitlines()]

    gi, ci = 1 * 135 + 1 * 9 + 3, 1 * 135 + 1 * 9 + 3 + 1  # the fake's mig-minors numbering for gpu1/gi1
    assert out[0] == f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {GPU1})"
    assert MIG_1_1 in out[1] and len([line for line in out if "MIG-" in line]) == 1
    assert out[2] == "0000:86:00.0"
    assert sorted(out[3:5]) == [
        "/proc/driver/nvidia/capabilities/gpu1/mig/gi1/access",
        "/proc/driver/nvidia/capabilities/gpu1/mig/gi1/ci0/access",
    ]
    assert out[5:7] == sorted([f"nvidia-cap{gi}", f"nvidia-cap{ci}"])
    assert out[7:] == ["3", "channel1"]  # utility libraries only; the IMEX channel asked for


V2_HOOK_PY = """
import json, os, subprocess, sys
sys.path.insert(0, {tests!r})
from nvc.apply import bpf
from nvc.plan.devfilter import DeviceRule, build_filter
pid = json.load(sys.stdin)["pid"]
lines = open(f"/proc/{{pid}}/cgroup").read().splitlines()
path = {v2!r} + next(l.split(":", 2)[2] for l in lines if l.startswith("0::"))
# Stand in for a v2 runtime: its own filter (any mknod, /dev/null, /dev/zero), attached first.
runtime = build_filter([DeviceRule("c", None, None, "m"), DeviceRule("c", 1, 3, "rwm"), DeviceRule("c", 1, 5, "rwm")])
cgroup_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
prog = bpf.prog_load(bpf.PROG_TYPE_CGROUP_DEVICE, runtime, "Apache-2.0", "runtime")
bpf.prog_attach(cgroup_fd, prog, bpf.ATTACH_CGROUP_DEVICE, bpf.F_ALLOW_MULTI)
# Show nvc-py a v2-only host: /proc/PID/cgroup without the v1 lines, in a private mount namespace.
fake = {tmp!r} + "/cgroup"
open(fake, "w").write("".join(l + "\\n" for l in lines if l.startswith("0::")))
cmd = f"mount --bind {{fake}} /proc/{{pid}}/cgroup && exec {nvc} --root {root} configure --pid {{pid}} --device=0 --utility {rootfs}"
rc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", cmd], stderr=open({log!r}, "a")).returncode
_, ids = bpf.prog_query(cgroup_fd, bpf.ATTACH_CGROUP_DEVICE)
open({tmp!r} + "/attached", "w").write(json.dumps(ids))
sys.exit(rc)
"""


def test_v2_device_filter_lets_only_the_selected_gpu_open(active_2gpu, debian_rootfs, runc, tmp_path):
    fake = active_2gpu
    script = tmp_path / "hook.py"
    script.write_text(
        V2_HOOK_PY.format(
            tests=str(Path(__file__).parent),
            v2=V2_ROOT,
            tmp=str(tmp_path),
            nvc=NVC,
            root=fake.root,
            rootfs=debian_rootfs,
            log=str(tmp_path / "hook.log"),
        )
    )
    hook = {
        "path": sys.executable,
        "args": [sys.executable, str(script)],
        "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
    }
    bundle_args = {"cgroups_path": f"/nvc-test-{os.getpid()}-{tmp_path.name}"}
    # The v1 devices cgroup lets every NVIDIA node through: the v2 filter alone decides here.
    probe = f"{PROBE}; mknod /dev/nvidia1 c 195 1; probe /dev/nvidia0; probe /dev/nvidia1; probe /dev/null"
    bundle = make_bundle(
        tmp_path / "bundle", debian_rootfs, ["sh", "-c", probe], hooks={"prestart": [hook]}, **bundle_args
    )
    config = json.loads((bundle / "config.json").read_text())
    config["linux"]["resources"]["devices"].append({"allow": True, "type": "c", "major": 195, "access": "rwm"})
    (bundle / "config.json").write_text(json.dumps(config))

    result = runc.create_start(bundle)

    log = tmp_path / "hook.log"
    assert result.returncode == 0, result.stderr + (log.read_text() if log.exists() else "")
    assert result.stdout.splitlines() == ["/dev/nvidia0 open", "/dev/nvidia1 denied", "/dev/null open"]
    assert len(json.loads((tmp_path / "attached").read_text())) == 1  # nvc-py's filter replaced the runtime's


FIRMWARE = "usr/lib/firmware/nvidia/580.95.05/gsp_ga10x.bin"  # mounted after every library and binary


@pytest.mark.parametrize(
    ("step", "args", "code", "message"),
    [
        (
            "ldconfig",
            ["--ldconfig=@/nonexistent/ldconfig"],
            10,
            "ldcache error: open failed: /nonexistent/ldconfig: No such file or directory",
        ),
        (
            "mount",
            [],
            9,
            "mount error: refusing to mount over /lib/firmware/nvidia/580.95.05/gsp_ga10x.bin: it is a directory",
        ),
    ],
)
def test_failure_midway_leaves_nothing_mounted_or_created(
    active_2gpu, debian_rootfs, target_process, step, args, code, message
):
    if step == "mount":  # the image has a directory where the last driver file goes
        (debian_rootfs / FIRMWARE).mkdir(parents=True)
    shutil.rmtree(debian_rootfs / "usr/bin")  # made again by the mounts, then removed by the rollback
    before = _tree(debian_rootfs)
    mounts_before = Path(f"/proc/{target_process}/mountinfo").read_text()

    result = subprocess.run(
        [
            NVC,
            "--root",
            str(active_2gpu.root),
            "configure",
            f"--pid={target_process}",
            "--device=all",
            "--compute",
            "--utility",
            *args,
            str(debian_rootfs),
        ],
        capture_output=True,
        text=True,
    )

    assert (result.returncode, result.stderr) == (code, f"nvc-py: {message}\n")
    assert Path(f"/proc/{target_process}/mountinfo").read_text() == mounts_before
    assert _tree(debian_rootfs) == before


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (["--device=7"], "device error: 7: unknown device", 6),
        (["--device=GPU-nope"], "device error: GPU-nope: unknown device", 6),
        (
            ["--device=0", "--require=cuda>=14.0"],
            "requirement error: unsatisfied condition: cuda>=14.0, please "
            "update your driver to a newer version, or use an earlier cuda container",
            7,
        ),
        (
            ["--device=1:0", "--mig-config=all"],
            "input error: cannot enable mig-config with specific MIG devices selected",
            2,
        ),
        (["--device=0", "--imex-channel=1048576"], "input error: 1048576: unsupported IMEX channel value", 2),
    ],
)
def test_bad_requests_change_nothing(active_2gpu, debian_rootfs, target_process, args, message, code):
    mounts_before = Path(f"/proc/{target_process}/mountinfo").read_text()
    before = _tree(debian_rootfs)

    result = subprocess.run(
        [
            NVC,
            "--root",
            str(active_2gpu.root),
            "configure",
            f"--pid={target_process}",
            *args,
            "--utility",
            str(debian_rootfs),
        ],
        capture_output=True,
        text=True,
    )

    assert (result.returncode, result.stderr) == (code, f"nvc-py: {message}\n")
    assert Path(f"/proc/{target_process}/mountinfo").read_text() == mounts_before
    assert _tree(debian_rootfs) == before


@pytest.mark.parametrize("rootfs", ["relative/path", "/", "//"])
def test_rootfs_must_be_absolute_and_not_slash(rootfs):
    result = subprocess.run([NVC, "configure", "--dry-run", rootfs], capture_output=True, text=True)
    assert result.returncode == 2 and "invalid rootfs directory" in result.stderr


def test_container_helper_keeps_only_the_mount_capabilities():
    from nvc.rpc.container_service import open_container

    with open_container(5.0) as client:
        status = Path(f"/proc/{client.helper.pid}/status").read_text()
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    # CHOWN 0, DAC_OVERRIDE 1, DAC_READ_SEARCH 2, FOWNER 3, SYS_CHROOT 18, SYS_PTRACE 19, SYS_ADMIN 21
    kept = sum(1 << bit for bit in (0, 1, 2, 3, 18, 19, 21))
    assert (int(fields["CapPrm"], 16), int(fields["CapBnd"], 16)) == (kept, kept)
    assert (int(fields["CapEff"], 16), int(fields["CapInh"], 16)) == (0, 0)  # raised per step only
    assert fields["NoNewPrivs"].strip() == "1"
    assert fields["Name"].strip() == "nvc:[container]"


def test_mig_config_gives_the_whole_capability_trees(active_2gpu, debian_rootfs, runc, tmp_path):
    hook = _hook(tmp_path, active_2gpu, debian_rootfs, "--device=1 --utility --mig-config=all --mig-monitor=all")
    script = (
        f"{PROBE}; nvidia-smi -L; ls /proc/driver/nvidia/capabilities/mig; ls /dev/nvidia-caps | wc -l; "
        "probe /dev/nvidia-caps/nvidia-cap1"
    )

    out = [line.strip() for line in _run(runc, tmp_path, debian_rootfs, hook, script).stdout.splitlines()]

    assert out[0] == f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {GPU1})"
    assert len([line for line in out if line.startswith("MIG ")]) == 2  # every MIG device of the GPU
    assert out[3:] == ["config", "monitor", "6", "/dev/nvidia-caps/nvidia-cap1 open"]


def test_local_nvidia_layout_lands_in_the_container_lib_and_bin_dirs(active_local_nvidia, lib64_rootfs, target_process):
    """A driver under /usr/local/nvidia (the H100 machine's layout): libraries go to the container's
    lib dir, binaries to /usr/bin, and the container's own ld cache learns them."""
    rootfs = lib64_rootfs
    result = subprocess.run(
        [
            NVC,
            "--root",
            str(active_local_nvidia.root),
            "configure",
            f"--pid={target_process}",
            "--device=0",
            "--compute",
            "--utility",
            str(rootfs),
        ],
        capture_output=True,
        text=True,
    )
    assert (result.returncode, result.stderr) == (0, "")

    def inside(*cmd: str) -> str:
        return subprocess.run(
            ["nsenter", "-t", str(target_process), "-m", *cmd], check=True, capture_output=True, text=True
        ).stdout

    mounts = [line.split()[4] for line in inside("cat", "/proc/self/mountinfo").splitlines()]
    assert f"{rootfs}/usr/lib64/libcuda.so.580.159.04" in mounts and f"{rootfs}/usr/bin/nvidia-smi" in mounts
    cache = inside("ldconfig", "-p", "-C", f"{rootfs}/etc/ld.so.cache")
    assert "libcuda.so.1 (libc6,x86-64) => /usr/lib64/libcuda.so.1" in cache
    assert not (rootfs / "usr/local/nvidia").exists()


def test_mounts_on_a_shared_mount_are_refused(active_2gpu, debian_rootfs, shared_target_process):
    """Under shared propagation each mount would also appear in the peers' namespaces (the host's)."""
    mounts_before = Path(f"/proc/{shared_target_process}/mountinfo").read_text()
    before = _tree(debian_rootfs)

    result = subprocess.run(
        [
            NVC,
            "--root",
            str(active_2gpu.root),
            "configure",
            f"--pid={shared_target_process}",
            "--device=0",
            "--utility",
            str(debian_rootfs),
        ],
        capture_output=True,
        text=True,
    )

    assert result.returncode == 9 and "its mount is shared" in result.stderr, result.stderr
    assert Path(f"/proc/{shared_target_process}/mountinfo").read_text() == mounts_before
    assert _tree(debian_rootfs) == before


@pytest.mark.parametrize("mode", ["ldconfig", "mount"])
def test_cuda_compat_libraries_of_the_image(active_2gpu, debian_rootfs, target_process, mode):
    """A newer libcuda in the image's /usr/local/cuda/compat: put first in the ld cache (default), or
    bind-mounted into the lib dir when asked (mount mode)."""
    compat = debian_rootfs / "usr/local/cuda/compat"
    compat.mkdir(parents=True)
    shutil.copy(active_2gpu.lib_dir / "libcuda.so.580.95.05", compat / "libcuda.so.590.10.01")
    result = subprocess.run(
        [
            NVC,
            "--root",
            str(active_2gpu.root),
            "configure",
            f"--pid={target_process}",
            "--device=0",
            "--compute",
            f"--cuda-compat-mode={mode}",
            str(debian_rootfs),
        ],
        capture_output=True,
        text=True,
    )
    assert (result.returncode, result.stderr) == (0, "")

    def inside(*cmd: str) -> str:
        return subprocess.run(
            ["nsenter", "-t", str(target_process), "-m", *cmd], check=True, capture_output=True, text=True
        ).stdout

    mounts = {line.split()[4] for line in inside("cat", "/proc/self/mountinfo").splitlines()}
    cache = [
        line.strip()
        for line in inside("ldconfig", "-p", "-C", f"{debian_rootfs}/etc/ld.so.cache").splitlines()
        if line.strip().startswith("libcuda.so.1 ")
    ]
    mounted = f"{debian_rootfs}/usr/lib/x86_64-linux-gnu/libcuda.so.590.10.01"
    if mode == "ldconfig":
        assert mounted not in mounts
        assert cache[0] == "libcuda.so.1 (libc6,x86-64) => /usr/local/cuda/compat/libcuda.so.1"
    else:
        assert mounted in mounts


def test_dry_run_prints_the_plan_and_changes_nothing(active_2gpu, debian_rootfs):
    before = _tree(debian_rootfs)
    mounts_before = Path("/proc/self/mountinfo").read_text()

    result = subprocess.run(
        [NVC, "--root", str(active_2gpu.root), "configure", "--dry-run", "--device=1", "--utility", str(debian_rootfs)],
        capture_output=True,
        text=True,
    )

    assert (result.returncode, result.stderr) == (0, "")
    lines = result.stdout.splitlines()
    assert lines[0] == f"rootfs  {debian_rootfs} (standalone, owner 0:0)"
    assert f"bind    device    {active_2gpu.root}/dev/nvidia1 -> /dev/nvidia1 [c 195:1, nosuid,noexec]" in lines
    assert lines[-1] == "ldconfig @/sbin/ldconfig /usr/lib/x86_64-linux-gnu"
    assert not [line for line in lines if line.startswith("cgroup")]  # standalone: no container cgroup
    assert _tree(debian_rootfs) == before and Path("/proc/self/mountinfo").read_text() == mounts_before


def test_load_kmods_is_a_step_of_the_plan(active_2gpu, debian_rootfs, target_process):
    """--load-kmods makes the nodes the driver root lacks as the plan's first step: --dry-run shows
    them and makes nothing; the real run makes them before the container gets them."""
    node = active_2gpu.root / "dev/nvidia-uvm-tools"
    st = node.stat()
    node.unlink()
    try:
        argv = [
            NVC,
            "--root",
            str(active_2gpu.root),
            "--load-kmods",
            "configure",
            "--device=0",
            "--compute",
            "--no-cgroups",
        ]
        result = subprocess.run([*argv, "--dry-run", str(debian_rootfs)], capture_output=True, text=True)
        assert (result.returncode, result.stderr) == (0, "")
        lines = result.stdout.splitlines()
        made = (
            f"mknod   host      {node} c {os.major(st.st_rdev)}:{os.minor(st.st_rdev)} "
            f"mode {stat.S_IMODE(st.st_mode):o}"
        )
        assert lines[0] == made, lines
        assert (
            f"bind    device    {node} -> /dev/nvidia-uvm-tools [c {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}, nosuid,noexec]"
            in lines
        )
        assert not node.exists()
        result = subprocess.run([*argv, f"--pid={target_process}", str(debian_rootfs)], capture_output=True, text=True)
        assert (result.returncode, result.stderr) == (0, "")
        assert node.is_char_device() and node.stat().st_rdev == st.st_rdev
        assert f" {debian_rootfs}/dev/nvidia-uvm-tools " in Path(f"/proc/{target_process}/mountinfo").read_text()
    finally:
        if not node.exists():
            os.mknod(node, stat.S_IFCHR | stat.S_IMODE(st.st_mode), st.st_rdev)


def test_a_request_the_plan_refuses_leaves_no_helper_behind(active_2gpu, debian_rootfs, target_process):
    """configure forks its container helper before it plans, so that the two overlap; a request the
    plan refuses (no GPU 7 on this machine) ends that helper too, reaped, with nothing mounted."""
    from nvc.config.options import GlobalOptions
    from nvc.errors import NvcError
    from nvc.pipeline import configure
    from nvc.plan.request import from_flags

    glob = GlobalOptions(str(active_2gpu.root), "/etc/ld.so.cache", (0, 0), False)
    before, mounts = _children(), Path(f"/proc/{target_process}/mountinfo").read_text()
    with pytest.raises(NvcError, match="7"):
        configure.configure(glob, from_flags(str(debian_rootfs), target_process, ("7",), ("compute",)))
    assert _children() == before
    assert Path(f"/proc/{target_process}/mountinfo").read_text() == mounts
    # the same helper, handed a plan, mounts it and is gone afterwards too
    configure.configure(glob, from_flags(str(debian_rootfs), target_process, ("0",), ("compute",), no_cgroups=True))
    assert _children() == before
    assert f" {debian_rootfs}/dev/nvidia0 " in Path(f"/proc/{target_process}/mountinfo").read_text()


def test_a_device_cgroup_failing_beside_ldconfig_leaves_nothing(
    active_2gpu, debian_rootfs, target_process, monkeypatch
):
    """The device cgroup is programmed while ldconfig runs and the helper mounts what ldconfig does not
    read; where the cgroup fails, ldconfig is stopped and everything is undone: no mount, no file made,
    the image's ld cache as it was, and the cgroup's error is the one told."""
    from nvc.apply import cgroups
    from nvc.config.options import GlobalOptions
    from nvc.errors import ContainerError
    from nvc.pipeline import configure
    from nvc.plan.request import from_flags

    def refused(cgroup: cgroups.DeviceCgroup, rules: object) -> None:
        raise ContainerError(f"cannot attach device filter to {cgroup.path}: Operation not permitted")

    monkeypatch.setattr(cgroups, "allow_devices", refused)
    cache = debian_rootfs / "etc" / "ld.so.cache"
    before, cached = _tree(debian_rootfs), cache.read_bytes()
    mounts = Path(f"/proc/{target_process}/mountinfo").read_text()
    glob = GlobalOptions(str(active_2gpu.root), "/etc/ld.so.cache", (0, 0), False)
    with pytest.raises(ContainerError, match="cannot attach device filter to .*: Operation not permitted"):
        configure.configure(glob, from_flags(str(debian_rootfs), target_process, ("0",), ("compute", "utility")))
    assert Path(f"/proc/{target_process}/mountinfo").read_text() == mounts
    assert _tree(debian_rootfs) == before
    assert cache.read_bytes() == cached


def test_a_plan_whose_ldconfig_does_not_run_is_mounted_in_one_call(tmp_path: Path) -> None:
    """``before_ldconfig`` splits the mounts only around a run of ldconfig: without one, the helper's
    first call mounts them all (none is left for a call that never comes). Standalone, a plain root."""
    from nvc.plan.mountplan import RO
    from nvc.plan.operations import Bind, Plan
    from nvc.rpc.container_service import open_container

    rootfs = tmp_path / "rootfs"
    (rootfs / "usr" / "bin").mkdir(parents=True)
    sources = [tmp_path / name for name in ("libx.so.1", "tool")]
    for source in sources:
        source.write_bytes(b"")
    binds = tuple(Bind(str(s), f"/usr/bin/{s.name}", int(RO)) for s in sources)
    plan = Plan(str(rootfs), None, (0, 0), binds, ldconfig=None, before_ldconfig=1)
    mounts = Path("/proc/self/mountinfo").read_text()
    with open_container(5.0) as client:
        client.mount(plan, None)()
        mounted = Path("/proc/self/mountinfo").read_text()
        assert all(f" {rootfs}/usr/bin/{s.name} " in mounted for s in sources), mounted  # in the one call
        assert client.rollback() == []
    assert Path("/proc/self/mountinfo").read_text() == mounts


def test_a_plan_where_proc_answers_imports_no_nvml_client_nor_drm(active_2gpu, debian_rootfs, monkeypatch):
    """A start without a server imports what its plan uses: GPU 0 with compute and utility needs neither
    the NVML helper's client (/proc answers) nor the DRM module (no graphics). Each is blocked here, so
    importing it fails; graphics, which needs the DRM module, shows the block holds."""
    import nvc.discover
    import nvc.rpc
    from nvc.config.options import GlobalOptions
    from nvc.pipeline import configure
    from nvc.plan.request import from_flags

    for package, name in ((nvc.rpc, "driver_service"), (nvc.discover, "drm")):
        monkeypatch.delattr(package, name, raising=False)
        monkeypatch.setitem(sys.modules, f"{package.__name__}.{name}", None)
    glob = GlobalOptions(str(active_2gpu.root), "/etc/ld.so.cache", (0, 0), False)
    plan = configure.dry_plan(glob, from_flags(str(debian_rootfs), None, ("0",), ("compute", "utility")))
    assert "/dev/nvidia0" in {getattr(op, "target", None) for op in plan.operations}
    with pytest.raises(ImportError, match="nvc.discover.drm"):
        configure.dry_plan(glob, from_flags(str(debian_rootfs), None, ("0",), ("graphics",)))
