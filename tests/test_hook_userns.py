"""GPU containers with a user namespace (runc and crun specs with uid/gid mappings, rootful podman's
--userns modes) on the fake driver: the container gets the same nodes, libraries and ld cache as
without one, and what nvc-py makes inside belongs to the container's root as the container sees it.

The container's /dev is a tmpfs of its user namespace (runc's and crun's default mounts): host
root, unmapped there, can create nothing in it (EOVERFLOW), so the hook's steps inside run as the
container's root in that namespace (docs/security.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from harness.bundle import make_bundle, reachable_from_userns
from harness.fakegpus import DRIVER_VERSION, H100, uuids
from harness.hookfixtures import default_run_dir, setup_dir  # noqa: F401  (fixtures)
from harness.idmap import idmapped
from harness.installed import SCRIPTS
from harness.runtime import Runc
from nvc.containerenv import sharing
from nvc.plan import share

HOST_ID, SIZE = 100000, 65536  # the mapped range: uid and gid 0 inside are host 100000
# What the container shows: its GPU, its nodes, the ld cache's driver entries, and the owner (as
# the container sees it) of what nvc-py made: the cache and the /proc/driver/nvidia tmpfs.
CHECK = (
    "nvidia-smi -L 2>&1; ls /dev | grep '^nvidia'; ldconfig -p | grep -o 'libcuda.so.1 (.*'; "
    "stat -c 'owner %u:%g %n' /etc/ld.so.cache /proc/driver/nvidia; id -u"
)
SEEN = ["nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidiactl"]


def _hook(setup_dir: Path) -> dict:
    return {
        "path": str(SCRIPTS / "nvc-py-hook"),
        "args": ["nvc-py-hook", "prestart"],
        "env": [f"NVC_PY_CONFIG={setup_dir / 'config.yaml'}"],
    }


def _runtime(name: str, tmp_path: Path, rootfs: Path) -> Runc:
    """``name`` with a private state dir; skipped where it is missing or cannot run a plain container
    here (crun 1.8 refuses a host with cgroups v1 and v2 mounted side by side)."""
    binary = shutil.which(name)
    if binary is None:
        pytest.skip(f"{name} is not installed")
    runtime = Runc(tmp_path / "state", binary)
    plain = runtime.run(make_bundle(tmp_path / "plain", rootfs, ["true"]))
    if plain.returncode != 0:
        pytest.skip(f"{name} cannot run a container on this host: {plain.stderr.strip()[:200]}")
    return runtime


def _userns_bundle(
    dir: Path, rootfs: Path, args: list[str], setup_dir: Path, env: dict[str, str] | None = None
) -> Path:
    """A bundle with a user namespace (0 -> 100000, 65536) and the runtime's /dev tmpfs; /proc and /sys
    binds of this process's (make_bundle's ``host_proc_sys``: the fake driver's mounts over them)."""
    reachable_from_userns(rootfs)
    return make_bundle(
        dir,
        rootfs,
        args,
        env={"NVIDIA_VISIBLE_DEVICES": "0", **(env or {})},
        hooks={"prestart": [_hook(setup_dir)], "poststop": [{**_hook(setup_dir), "args": ["nvc-py-hook", "poststop"]}]},
        id_map=(HOST_ID, SIZE),
        host_proc_sys=True,
    )


def _chown_to_mapped_range(rootfs: Path) -> None:
    subprocess.run(["chown", "-R", "-h", f"{HOST_ID}:{HOST_ID}", str(rootfs)], check=True)


@pytest.mark.parametrize("runtime_name", ["runc", "crun"])
def test_userns_container_gets_gpu_owned_by_its_root(
    active_2gpu, runtime_name: str, debian_rootfs: Path, setup_dir: Path, tmp_path: Path
) -> None:
    """uid/gid maps 0 -> 100000 (65536), /dev a tmpfs, the rootfs owned by the mapped range: GPU 0, its
    nodes, the driver's libraries in the ld cache; the cache and /proc/driver/nvidia belong to uid 0
    inside (host 100000 outside), and the hook's own files on the host are unchanged."""
    runtime = _runtime(runtime_name, tmp_path, debian_rootfs)
    _chown_to_mapped_range(debian_rootfs)
    bundle = _userns_bundle(tmp_path / "bundle", debian_rootfs, ["sh", "-c", CHECK], setup_dir)
    result = runtime.create_start(bundle)
    assert result.returncode == 0, result.stderr
    assert uuids(result.stdout) == [H100]
    lines = result.stdout.splitlines()
    assert [line for line in lines if line.startswith("nvidia")] == SEEN, result.stdout
    assert any(
        line.startswith("libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1") for line in lines
    ), result.stdout
    assert "owner 0:0 /etc/ld.so.cache" in lines and "owner 0:0 /proc/driver/nvidia" in lines, result.stdout
    assert lines[-1] == "0"
    cache = (debian_rootfs / "etc/ld.so.cache").stat()
    assert (cache.st_uid, cache.st_gid) == (HOST_ID, HOST_ID)


@pytest.mark.parametrize(
    ("runtime_name", "dev"),
    [("runc", "tmpfs"), ("crun", "tmpfs"), ("runc", "rootfs's")],
    ids=["runc", "crun", "no-dev-tmpfs"],
)
def test_userns_container_on_a_host_root_rootfs_is_refused_in_one_line(
    active_2gpu, runtime_name: str, dev: str, debian_rootfs: Path, setup_dir: Path, tmp_path: Path
) -> None:
    """The same container on a rootfs owned by host root (no idmapped mount): its own root cannot write
    its rootfs, nor can nvc-py's steps that run as that root. The start fails with one line naming the
    user namespace and what to do, on the runtime's stderr (not only in the hook log); nothing is
    left in the rootfs. Also with the rootfs's own /dev, no tmpfs over it (#51's fourth row, once an
    ldcache error without ldconfig's line)."""
    runtime = _runtime(runtime_name, tmp_path, debian_rootfs)
    if dev != "tmpfs":  # the runtime makes its nodes and mount points in /dev as the container's root
        (debian_rootfs / "dev").mkdir(exist_ok=True)
        os.chown(debian_rootfs / "dev", HOST_ID, HOST_ID)
    before = sorted(str(p.relative_to(debian_rootfs)) for p in debian_rootfs.rglob("*"))
    bundle = _userns_bundle(tmp_path / "bundle", debian_rootfs, ["sh", "-c", CHECK], setup_dir)
    if dev != "tmpfs":
        config = json.loads((bundle / "config.json").read_text())
        config["mounts"] = [m for m in config["mounts"] if m["destination"] != "/dev"]
        (bundle / "config.json").write_text(json.dumps(config))
    result = runtime.create_start(bundle)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if "nvc-py-hook:" in line]
    assert len(lines) == 1, result.stderr
    first = f"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{DRIVER_VERSION}"  # the plan's first mount
    assert f"nvc-py-hook: mount error: cannot mount on {first}: " in lines[0], lines[0]
    assert (
        f"the container's root (host uid {HOST_ID}) cannot write there in its user namespace: the rootfs is "
        "owned by a host uid that namespace does not map; give the container a rootfs owned by the "
        "container's user namespace (chown it to its mapped range, or an idmapped mount)"
    ) in lines[0], lines[0]
    last = json.loads((setup_dir / "hook.log").read_text().splitlines()[-1])
    assert last["outcome"] == "error" and "user namespace" in last["error"]
    left = {str(p.relative_to(debian_rootfs)) for p in debian_rootfs.rglob("*")} - set(before)
    # the runtime's own /dev nodes and links stay where /dev is the rootfs's; nothing of nvc-py's
    assert all(p.startswith("dev/") and "nvidia" not in p for p in left) and (dev != "tmpfs" or not left), left


def test_userns_container_on_an_idmapped_host_root_rootfs_gets_gpu(
    active_2gpu, runc: Runc, debian_rootfs: Path, setup_dir: Path, tmp_path: Path
) -> None:
    """The rootfs owned by host root, given to the container through an idmapped mount (on-disk 0 shown
    as 100000, the container's root): the same GPU, nodes and ld cache, what nvc-py made the
    container root's inside, and host root's on disk."""
    shown = tmp_path / "idmapped"
    shown.mkdir()
    reachable_from_userns(debian_rootfs)
    with idmapped(debian_rootfs, shown, HOST_ID, SIZE):
        bundle = _userns_bundle(tmp_path / "bundle", shown, ["sh", "-c", CHECK], setup_dir)
        result = runc.create_start(bundle)
    assert result.returncode == 0, result.stderr
    assert uuids(result.stdout) == [H100]
    lines = result.stdout.splitlines()
    assert [line for line in lines if line.startswith("nvidia")] == SEEN, result.stdout
    assert any(line.startswith("libcuda.so.1 (libc6,x86-64) => ") for line in lines), result.stdout
    assert "owner 0:0 /etc/ld.so.cache" in lines and "owner 0:0 /proc/driver/nvidia" in lines, result.stdout
    cache = (debian_rootfs / "etc/ld.so.cache").stat()
    assert (cache.st_uid, cache.st_gid) == (0, 0)


def test_a_user_namespace_that_maps_no_root_is_refused_in_one_line(
    active_2gpu, fake_2gpu, debian_rootfs: Path, tmp_path: Path
) -> None:
    """`nvc-py configure --pid` of a process whose user namespace maps uids 1.. but not 0 (runc refuses
    such a spec itself; podman's `--userns=nomap` leaves the user's own uid out): one line naming that
    namespace and what to do, nothing made in the rootfs."""
    _chown_to_mapped_range(debian_rootfs)
    reachable_from_userns(debian_rootfs)
    before = sorted(str(p.relative_to(debian_rootfs)) for p in debian_rootfs.rglob("*"))
    holder = subprocess.Popen(["unshare", "--user", "--mount", "--propagation", "private", "sleep", "60"])
    try:
        while os.readlink(f"/proc/{holder.pid}/ns/user") == os.readlink("/proc/self/ns/user"):
            time.sleep(0.005)
        for name in ("uid_map", "gid_map"):
            Path(f"/proc/{holder.pid}/{name}").write_text(f"1 {HOST_ID + 1} {SIZE - 1}\n")
        result = subprocess.run(
            [str(SCRIPTS / "nvc-py"), "--root", str(fake_2gpu.root), "configure", "--pid", str(holder.pid)]
            + ["--device=0", "--compute", "--utility", "--no-cgroups", str(debian_rootfs)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode != 0 and len(result.stderr.splitlines()) == 1, result.stderr
    assert (
        f"the user namespace of container process {holder.pid} maps no root (uid and gid 0): nvc-py makes the "
        "container's files as its root; map 0 inside (podman: not --userns=nomap)"
    ) in result.stderr, result.stderr
    assert sorted(str(p.relative_to(debian_rootfs)) for p in debian_rootfs.rglob("*")) == before


def test_userns_ldconfig_failure_carries_ldconfigs_own_line(
    active_2gpu, runc: Runc, debian_rootfs: Path, setup_dir: Path, tmp_path: Path
) -> None:
    """The rootfs owned by the mapped range but its /etc by host root: every mount works, ldconfig
    (the container's root) cannot write its cache, and the error says what ldconfig said. The image
    has OpenCL's vendors directory, where compute's nvidia.icd goes (none could be made in that /etc)."""
    (debian_rootfs / "etc/OpenCL/vendors").mkdir(parents=True, exist_ok=True)
    _chown_to_mapped_range(debian_rootfs)
    os.chown(debian_rootfs / "etc", 0, 0)
    bundle = _userns_bundle(tmp_path / "bundle", debian_rootfs, ["true"], setup_dir)
    result = runc.create_start(bundle)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if "nvc-py-hook:" in line]
    assert (
        len(lines) == 1
        and "nvc-py-hook: ldcache error: process /sbin/ldconfig failed with error code: 1: "
        "/sbin/ldconfig: Can't create temporary cache file /etc/ld.so.cache~: Permission denied"
        in lines[0]
    ), result.stderr


def test_userns_container_shares_the_gpu_within_its_limit(
    default_run_dir, active_2gpu, runc: Runc, debian_rootfs: Path, setup_dir: Path, tmp_path: Path
) -> None:
    """A sharing container (NVC_SHARE_MEMORY_LIMIT=4Gi) with a user namespace: the shim preloaded, its
    limits file read-only even to the container's root, NVML (the fake nvidia-smi) reporting the limit."""
    _chown_to_mapped_range(debian_rootfs)
    script = (
        "head -1 /etc/ld.so.preload; grep memory_limit /var/run/nvc-share/limits; "
        "(echo memory_limit=80Gi >> /var/run/nvc-share/limits) 2>/dev/null || echo read-only; "
        "nvidia-smi --query-gpu=memory.total --format=csv,noheader"
    )
    bundle = _userns_bundle(
        tmp_path / "bundle", debian_rootfs, ["sh", "-c", script], setup_dir, env={"NVC_SHARE_MEMORY_LIMIT": "4Gi"}
    )
    result = runc.create_start(bundle)  # deleted after: poststop removes the sharing files
    assert result.returncode == 0, result.stderr
    assert os.listdir(share.STATE_DIR) == []
    assert result.stdout.splitlines() == [
        sharing.CONTAINER_LIBRARY,
        f"memory_limit={4 << 30}",
        "read-only",
        "4096 MiB",
    ], result.stdout


# podman --userns modes as root: podman's arguments -> the uid_map line the container shows. /proc is a
# bind of this process's, as in the bundles above (the fake driver's mounts over it).
PODMAN_MODES = [
    (["--uidmap", f"0:{HOST_ID}:{SIZE}", "--gidmap", f"0:{HOST_ID}:{SIZE}"], f"0 {HOST_ID} {SIZE}"),
    (["--userns=auto"], "0 200000 1024"),
]


@pytest.mark.parametrize(("args", "uid_map"), PODMAN_MODES, ids=["uidmap", "auto"])
def test_podman_userns_modes(
    active_2gpu, podman, setup_dir: Path, tmp_path: Path, args: list[str], uid_map: str
) -> None:
    """Rootful podman with a user namespace and nvc-py's hooks.d: GPU 0, its nodes and ld cache, the
    cache and /proc/driver/nvidia the container root's. `--userns=auto` takes its range from the user
    `containers` in /etc/subuid (here a file of the test's, seen there by podman alone)."""
    subids = tmp_path / "subids"
    subids.write_text("containers:200000:131072\n")
    result = podman.run(
        podman.image(),
        ["sh", "-c", CHECK + "; cat /proc/self/uid_map"],
        env={"NVIDIA_VISIBLE_DEVICES": "0"},
        extra_args=[*args, "-v", "/proc:/proc:rbind"],
        hooks_dirs=[setup_dir / "hooks.d"],
        subids=subids,
    )
    assert result.returncode == 0, result.stderr
    assert uuids(result.stdout) == [H100]
    lines = result.stdout.splitlines()
    assert [line for line in lines if line.startswith("nvidia")] == SEEN, result.stdout
    assert "owner 0:0 /etc/ld.so.cache" in lines and "owner 0:0 /proc/driver/nvidia" in lines, result.stdout
    assert lines[-2] == "0" and lines[-1].split() == uid_map.split(), result.stdout
    last = json.loads((setup_dir / "hook.log").read_text().splitlines()[-1])
    assert last["outcome"] == "configured" and last["devices"] == ["0"]


def test_podman_uidmap_with_the_cdi_spec(active_2gpu, fake_2gpu, podman, setup_dir: Path, tmp_path: Path) -> None:
    """Rootful podman `--uidmap` through nvc-py's CDI spec instead of its hook: its createContainer hooks
    run in the container's user namespace, so the link and the ld cache they make are the container
    root's there."""
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    reachable_from_userns(setup_dir / "config.yaml")  # read by the hooks, in the container's namespace
    subprocess.run(
        [str(SCRIPTS / "nvc-py"), "--root", str(fake_2gpu.root), "cdi", "generate"]
        + ["--output", str(spec_dir / "nvidia.yaml"), "--config", str(setup_dir / "config.yaml")],
        check=True,
        capture_output=True,
    )
    check = (
        "nvidia-smi -L 2>&1; ldconfig -p | grep -o 'libcuda.so.1 (.*'; "
        "stat -c 'owner %u:%g %n' /etc/ld.so.cache /usr/lib/x86_64-linux-gnu/libcuda.so; cat /proc/self/uid_map"
    )
    result = podman.run(
        podman.image(),
        ["sh", "-c", check],
        extra_args=[*PODMAN_MODES[0][0], "-v", "/proc:/proc:rbind", "--device", "nvidia.com/gpu=0"],
        cdi_spec_dir=spec_dir,
    )
    assert result.returncode == 0, result.stderr
    assert uuids(result.stdout) == [H100]
    lines = result.stdout.splitlines()
    assert any(line.startswith("libcuda.so.1 (libc6,x86-64) => ") for line in lines), result.stdout
    assert "owner 0:0 /etc/ld.so.cache" in lines, result.stdout
    assert "owner 0:0 /usr/lib/x86_64-linux-gnu/libcuda.so" in lines, result.stdout
    assert lines[-1].split() == PODMAN_MODES[0][1].split(), result.stdout


@pytest.mark.parametrize("mode", ["keep-id", "nomap"])
def test_podman_rootless_only_userns_modes_are_podmans_refusal(active_2gpu, podman, setup_dir: Path, mode: str) -> None:
    """`--userns=keep-id` and `--userns=nomap` are rootless podman's: podman refuses them for root
    before any hook runs (docs/engines.md says what rootless podman can use instead: CDI)."""
    log = setup_dir / "hook.log"
    before = log.read_text() if log.exists() else ""
    result = podman.run(
        podman.image(),
        ["true"],
        env={"NVIDIA_VISIBLE_DEVICES": "0"},
        extra_args=[f"--userns={mode}"],
        hooks_dirs=[setup_dir / "hooks.d"],
    )
    assert result.returncode == 125 and f"{mode} is only supported in rootless mode" in result.stderr, result.stderr
    assert (log.read_text() if log.exists() else "") == before


def test_a_spec_joining_another_mount_namespace_is_refused_in_one_line(
    active_2gpu, runc: Runc, debian_rootfs: Path, setup_dir: Path, tmp_path: Path
) -> None:
    """A GPU container whose spec joins an existing process's mount namespace (linux.namespaces[].path):
    one line naming it, not the rootfs's open failure; the hook has nothing to say about the same spec
    asking for no GPU."""
    holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "60"])
    try:
        while os.readlink(f"/proc/{holder.pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt"):
            time.sleep(0.005)
        outcomes = {}
        for name, env in (("gpu", {"NVIDIA_VISIBLE_DEVICES": "0"}), ("plain", {})):
            bundle = make_bundle(
                tmp_path / name, debian_rootfs, ["true"], env=env, hooks={"prestart": [_hook(setup_dir)]}
            )
            config = json.loads((bundle / "config.json").read_text())
            for entry in config["linux"]["namespaces"]:
                if entry["type"] == "mount":
                    entry["path"] = f"/proc/{holder.pid}/ns/mnt"
            (bundle / "config.json").write_text(json.dumps(config))
            outcomes[name] = runc.create_start(bundle)
    finally:
        holder.kill()
        holder.wait()
    lines = [line for line in outcomes["gpu"].stderr.splitlines() if "nvc-py-hook:" in line]
    assert outcomes["gpu"].returncode != 0 and len(lines) == 1, outcomes["gpu"].stderr
    assert (
        f"nvc-py-hook: container error: the container joins the mount namespace '/proc/{holder.pid}/ns/mnt' "
        "of another process (linux.namespaces): nvc-py configures only a container with a mount namespace "
        "of its own; give it one, or ask for no GPU"
    ) in lines[0], lines[0]
    assert "nvc-py-hook" not in outcomes["plain"].stderr
