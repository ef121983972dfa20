"""GPU sharing through a container's start: the sharing files as steps of configure's plan, the hook
putting the shim into runc containers and removing their files at poststop, and two weighted podman
containers sharing the fake GPU by weight.
Test double only: nothing here is a GPU result.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from harness.hookfixtures import default_run_dir, fake_driver_config, oci_hooks, setup_dir  # noqa: F401  (fixtures)
from harness.sharedirs import mountpoints as _mountpoints
from harness.shim import GIB, WAITS_LOG  # noqa: F401  (fixtures)
from harness.standins import target_process  # noqa: F401  (fixture)
from nvc.apply import sharefiles
from nvc.commands import sharestatus
from nvc.containerenv import sharing
from nvc.plan import fromenv, share

T = TypeVar("T")


# ---------------------------------------------------------------- steps of the container's plan


def _state(run_dir: Path) -> list[str]:
    """What ``run_dir`` holds but the discoveries kept there (nvc.discover.keptfiles): what a dry run
    found is kept for the next call, a cache and no step of the plan."""
    from nvc.discover import keptfiles

    return sorted(str(p) for p in run_dir.rglob("*") if not str(p).startswith(keptfiles.DIRECTORY))


def test_sharing_files_are_steps_of_the_plan(default_run_dir, active_2gpu, make_rootfs, target_process):
    """configure's plan has the sharing files as host steps, before the container's: the dry run
    prints them and makes nothing; applying makes them, then the mounts that show them in the
    container; a later step failing removes them again."""
    from nvc.config.options import GlobalOptions
    from nvc.errors import MountError
    from nvc.pipeline import configure
    from nvc.pipeline.apply import apply, ldcache
    from nvc.plan.request import HostMount, from_flags

    debian_rootfs = make_rootfs("debian", name="share-plan-rootfs")  # its own: the mount targets stay in it
    glob = GlobalOptions(str(active_2gpu.root), "/etc/ld.so.cache", (0, 0), False)
    asked = fromenv.parse_share_env({"NVC_SHARE_MEMORY_LIMIT": "1Gi", "NVC_SHARE_COMPUTE": "50"})
    req = from_flags(
        str(debian_rootfs), target_process, devices=("0",), capabilities=("compute", "utility"), no_cgroups=True
    )._replace(sharing=asked, container_id="ctr-plan")
    where, sched = f"{share.STATE_DIR}/ctr-plan", f"{share.sched_dir_for(share.STATE_DIR)}/ctr-plan"
    host_mounts = Path("/proc/self/mountinfo").read_text()
    listing_before = _state(default_run_dir)

    plan = configure.dry_plan(glob, req)

    def apply_all(plan) -> None:
        with configure.container(req) as ctr, apply(plan, ctr.handle) as applied:
            ldcache(applied)

    lines = plan.text().splitlines()
    assert lines[:4] == [
        f"mkdir   host      {where}",
        f"write   host      {where}/owner (the container's bundle and process)",
        f"tmpfs   host      {where}/shared (limits, region)",
        f"write   host      {where}/shared/limits ({len(plan.share.limits)} bytes: "
        "'# written by nvc-py for container ctr-pl'…)",
    ]
    assert lines[4].startswith(f"write   host      {where}/ld.so.preload (")
    assert "bytes: '/usr/lib/nvc-share/libnvc-share.so'…)" in lines[4]
    granted = f"{share.sched_dir_for(share.STATE_DIR)}/.granted/ctr-plan"
    assert lines[5:8] == [
        f"write   host      {granted} (its granted compute limits)",
        f"write   host      {sched} (scheduler file)",
        f"rootfs  {debian_rootfs} (pid {target_process}, owner 0:0)",
    ]
    assert f"bind    extra     {share.HOST_LIBRARY} -> {sharing.CONTAINER_LIBRARY} [rdonly,nosuid,nodev]" in lines
    assert f"bind    extra     {where}/shared -> {sharing.CONTAINER_DIR} [nosuid,nodev]" in lines
    assert "memory_limit=1073741824\ncompute_percent=50\n" in plan.share.limits
    # the dry run changed nothing on the host
    assert _state(default_run_dir) == listing_before
    assert Path("/proc/self/mountinfo").read_text() == host_mounts

    missing = HostMount(str(default_run_dir / "no-such-file"), "/opt/missing")
    try:
        with pytest.raises(MountError, match="no-such-file"):  # a mount in the container fails: all undone
            apply_all(configure.dry_plan(glob, req._replace(extra_mounts=(missing,))))
        assert not os.path.lexists(where) and not os.path.lexists(sched) and not os.path.lexists(granted)
        assert not any(m.startswith(share.STATE_DIR) for m in _mountpoints())

        apply_all(plan)
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
        sharefiles.remove("ctr-plan")  # poststop's part: both scheduler files go, the tmpfs stays
        assert not os.path.lexists(sched) and not os.path.lexists(granted)
    finally:
        sharefiles.remove("ctr-plan")
    assert not os.path.lexists(where) and not os.path.lexists(sched) and not os.path.lexists(granted)


# ---------------------------------------------------------------- through the hook, in a runc container


def test_hook_injects_the_shim_into_a_runc_container(
    default_run_dir, fake_2gpu, runc, debian_rootfs, make_rootfs, tmp_path
):
    """A container asking for 4 GiB gets the shim preloaded, a limits file it cannot change even as
    root, a full tmpfs of its own as shared directory (root and uid 1000 alike write nothing more
    there), and NVML (the fake nvidia-smi) reporting the limit; poststop unmounts and removes its
    directory, following nothing the container planted; junk limits, or a FIFO as the image's ld.so.preload, refuse the start and leave
    nothing behind (the FIFO never opened)."""
    from harness.bundle import make_bundle

    hooks = oci_hooks(fake_driver_config(tmp_path / "config.yaml", fake_2gpu.root))
    fill = (
        "stat -f -c 'free %f' /var/run/nvc-share; dd if=/dev/zero of=/var/run/nvc-share/region bs=64k "
        "count=1000 oflag=append conv=notrunc 2>&1 | grep -o 'No space left on device'; "
        "touch /var/run/nvc-share/x 2>&1 | grep -o -e 'No space left on device' -e 'Permission denied'"
    )
    script = (
        "head -1 /etc/ld.so.preload; cat /var/run/nvc-share/limits | grep memory_limit; "
        "(echo memory_limit=80Gi >> /var/run/nvc-share/limits) 2>/dev/null || echo read-only; "
        f"nvidia-smi --query-gpu=memory.total --format=csv,noheader; {fill}; "
        "rm /var/run/nvc-share/region && ln -s /etc /var/run/nvc-share/region && echo planted"
    )
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "NVC_SHARE_MEMORY_LIMIT": "4Gi"}
    bundle = make_bundle(tmp_path / "ok", debian_rootfs, ["sh", "-c", script], env=env, hooks=hooks)
    result = runc.create_start(bundle, container_id="nvc-share-ok")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        sharing.CONTAINER_LIBRARY,
        f"memory_limit={4 * GIB}",
        "read-only",
        "4096 MiB",
        "free 0",
        "No space left on device",
        "No space left on device",
        "planted",
    ]
    assert "nvc-share" not in result.stderr  # the shim used the hook's region as it is
    runc.delete("nvc-share-ok")  # poststop: the planted symlink is not followed
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
    enabled.write_text(
        f"root: {fake_2gpu.root}\nload-kmods: false\nlog: {{file: {tmp_path / 'hook.log'}}}\n"
        "sharing: {enabled: true, device-memory-limit: 2g}\n"
    )
    host_hooks = {stage: [{**h, "env": [f"NVC_PY_CONFIG={enabled}"]} for h in hs] for stage, hs in hooks.items()}
    plain = make_bundle(
        tmp_path / "plain",
        debian_rootfs,
        ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader"],
        env={"NVIDIA_VISIBLE_DEVICES": "0"},
        hooks=host_hooks,
    )
    result = runc.create_start(plain, container_id="nvc-share-default")
    assert (result.returncode, result.stdout) == (0, "2048 MiB\n"), result.stderr

    bad = make_bundle(
        tmp_path / "bad", debian_rootfs, ["true"], env={**env, "NVC_SHARE_MEMORY_LIMIT": "lots"}, hooks=hooks
    )
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
        assert writer.poll() is None  # the hook never opened it
        assert "/etc/ld.so.preload in " in result.stderr and "is a FIFO, not a regular file" in result.stderr
    finally:
        writer.kill()
        writer.wait()
    assert os.listdir(share.STATE_DIR) == []


def test_poststop_removes_only_the_sharing_files_of_the_container_that_stopped(
    default_run_dir, fake_2gpu, runc, debian_rootfs, make_rootfs, tmp_path
):
    """Finding 7: a GPU-less container with the same id under another runtime root stops while the
    sharing container runs: its poststop leaves the running container's directory and scheduler
    file alone (prestart recorded their owner: bundle and process). The right poststop removes them."""
    from harness.bundle import make_bundle
    from harness.runtime import Runc

    hooks = oci_hooks(fake_driver_config(tmp_path / "config.yaml", fake_2gpu.root))
    cid = "nvc-share-same-id"
    gpu = make_bundle(
        tmp_path / "gpu",
        debian_rootfs,
        ["sleep", "60"],
        hooks=hooks,
        env={"NVIDIA_VISIBLE_DEVICES": "0", "NVC_SHARE_COMPUTE": "50"},
    )
    plain = make_bundle(tmp_path / "plain", make_rootfs("debian", name="plain-rootfs"), ["true"], hooks=hooks)
    where, sched = Path(share.STATE_DIR) / cid, Path(share.sched_dir_for(share.STATE_DIR)) / cid
    try:
        with open(tmp_path / "create.log", "w") as log:
            created = subprocess.run(
                ["runc", "--root", str(runc.state_root), "create", "--bundle", str(gpu), cid],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                timeout=60,
            )
        assert created.returncode == 0, (tmp_path / "create.log").read_text()
        assert (where / "shared" / "limits").exists() and sched.exists()
        other = Runc(tmp_path / "other-runtime-root").run(plain, container_id=cid)
        assert other.returncode == 0, other.stderr
        assert (where / "shared" / "limits").exists() and sched.exists()  # not the stopped one's
        runc.delete(cid)
        assert not where.exists() and not sched.exists()
    finally:
        runc.delete(cid)


# ---------------------------------------------------------------- two weighted containers, through the hook


def test_two_weighted_containers_share_the_gpu_by_weight(
    default_run_dir, active_2gpu, podman, setup_dir, programs, tmp_path
):
    """Two podman containers through the hook, weights 1 and 3 (and each its own 2 GiB budget), busy
    with 1 ms kernels of the fake GPU at the same time, the weight-3 one waiting 1 ms on its host after
    each (busy half the time, under its three quarters): it runs free (400 kernels in ~0.8 s) while the
    weight-1 one, over its quarter, is held while the other has work (300 kernels in ~0.6 s, not 0.3:
    test_share_native_compute.py's tenant tests), as the shim's own log of its waits says. Each sees every scheduled container's file and granted weight
    read-only and writes only its own file; neither can change its limits file; nvc-py share status shows weight, cap and share.
    (Each process's fake GPU is its own: only the scheduler can make one container wait for the other.)
    A run whose measured shares miss runs once more: what else the 2-CPU test host runs stretches the
    weight-3 one's host gaps (its 400 kernels and gaps took 1.09 s once in a full suite, its share of the
    last 200 ms 25.8 %), and both runs must miss to fail."""
    # Both started (each one's scheduler file made by its hook) before either looks at the peers.
    script = (
        "touch /barrier/$HOSTNAME; while [ $(ls /barrier | wc -l) -lt 2 ]; do sleep 0.02; done; "
        "for f in /var/run/nvc-share-peers/*; do (printf x >> $f) 2>&1 | grep -o 'Read-only file system'; "
        "done; (echo compute_weight=1000 >> /var/run/nvc-share/limits) 2>&1 | grep -o 'Read-only file system'; "
        "echo $(grep -h '^compute_weight=' /var/run/nvc-share-peers/.granted/* | sort); "
        "(echo compute_weight=1000 >> /var/run/nvc-share-peers/.granted/x) 2>&1 | grep -o 'Read-only file system'; "
        "cuda_probe init ctx 0 $WORK"
    )
    envs = {
        weight: {"NVC_SHARE_MEMORY_LIMIT": "2Gi", "WORK": work, "NVC_SHARE_LOG": "2"}
        for weight, work in ((1, "launch 300 264 128 sync"), (3, "steps 400 264 128 1000"))
    }

    def busy_for_a_while() -> list[sharestatus.ContainerShare]:
        time.sleep(0.3)  # both busy for a while: the share is measured
        return sharestatus.status()

    for attempt in range(2):
        barrier = tmp_path / f"barrier-{attempt}"  # each run's own
        barrier.mkdir()
        results, status = _at_once(podman, setup_dir, programs, barrier, script, envs, [], busy_for_a_while)
        walls = {}
        for weight, result in results.items():
            assert result.returncode == 0, result.stderr
            lines = result.stdout.splitlines()
            assert lines[:3] == ["Read-only file system"] * 3, lines  # both scheduler files, the limits file
            # both containers' granted weights, beside the files, read-only
            assert lines[3:5] == ["compute_weight=1 compute_weight=3", "Read-only file system"], lines
            probe = [line.split() for line in lines[5:]]
            walls[weight] = sum(int(line[2]) for line in probe[2:]) / 1e6
        # the scheduler's own account of what held each (a wall time also holds the CPU's noise)
        held = {weight: float(WAITS_LOG.search(result.stderr).group(5)) for weight, result in results.items()}
        print(f"walls {walls}, ms waited for the other's share {held}")
        assert held[3] <= 20 and held[1] >= 100, held
        assert walls[1] >= 0.35 and walls[3] >= 0.75, walls  # the weight-1 one was held (free: 0.3 s)
        by_weight = {d.weight: d for c in status for d in c.devices}
        assert set(by_weight) == {1, 3}, status
        assert all(d.compute_percent == 100 for d in by_weight.values())
        shares = {w: d.share_percent for w, d in by_weight.items()}
        print(f"measured shares {shares}")
        if shares[1] is not None and shares[3] is not None and 30 <= shares[3] <= 70:
            break
    # each one's work over the last 200 ms: the weight-3 one's kernels half the time, the other's in its gaps
    assert shares[1] is not None and shares[3] is not None and 30 <= shares[3] <= 70, shares
    assert not os.listdir(share.STATE_DIR)  # poststop removed both


def _at_once(
    podman,
    setup_dir: Path,
    programs: dict[str, Path],
    barrier: Path,
    script: str,
    envs: dict[int, dict[str, str]],
    mounts: list[str],
    during: Callable[[], T],
) -> tuple[dict[int, subprocess.CompletedProcess[str]], T]:
    """Podman containers through the hook, one per weight with its env (on GPU 0, 1 ms fake kernels),
    started at once with cuda_probe and the barrier directory mounted; `during` runs once all are past
    the barrier. Returns their results and what `during` returned."""
    import threading

    image = podman.image()
    results: dict[int, subprocess.CompletedProcess[str]] = {}

    def run(weight: int) -> None:
        env = {
            "NVIDIA_VISIBLE_DEVICES": "0",
            "NVC_SHARE_WEIGHT": str(weight),
            "FAKE_CUDA_KERNEL_US": "1000",
            "FAKE_CUDA_CONTEXT_MIB": "0",
            **envs[weight],
        }
        results[weight] = podman.run(
            image,
            ["sh", "-c", script],
            env=env,
            hooks_dirs=[setup_dir / "hooks.d"],
            extra_args=[
                "-v",
                f"{programs['cuda_probe']}:/usr/local/bin/cuda_probe:ro",
                "-v",
                f"{barrier}:/barrier",
                *mounts,
            ],
            timeout=120,
        )

    threads = [threading.Thread(target=run, args=(weight,)) for weight in envs]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while len(list(barrier.iterdir())) < len(envs) and time.monotonic() < deadline:
        time.sleep(0.05)
    seen = during()
    for thread in threads:
        thread.join(timeout=120)
    return results, seen


def test_two_weighted_containers_on_one_time_sliced_gpu_get_it_by_weight(
    default_run_dir, active_2gpu, podman, setup_dir, programs, tmp_path
):
    """Two podman containers through the hook, weights 1 and 3 in their env, on one fake GPU that
    time-slices between their processes (FAKE_CUDA_SHARED_GPU, its file mounted in both), 1200 and 800
    kernels of 1 ms back to back from one moment: while both run the weight-3 one gets 75 % of the work
    (±5), then the other the whole GPU, so the 2000 kernels take no longer than 2 s, within 5 %."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    gpu = tmp_path / "gpu"
    gpu.touch()
    script = "touch /barrier/$HOSTNAME; while [ $(ls /barrier | wc -l) -lt 2 ]; do sleep 0.01; done; cuda_probe init ctx 0 $WORK"
    envs = {
        weight: {"WORK": f"launch {n} 264 128 sync", "FAKE_CUDA_SHARED_GPU": "/fake-gpu"}
        for weight, n in ((1, 1200), (3, 800))
    }
    results, _ = _at_once(podman, setup_dir, programs, barrier, script, envs, ["-v", f"{gpu}:/fake-gpu"], lambda: None)
    walls = {}
    for weight, result in results.items():
        assert result.returncode == 0, result.stderr
        walls[weight] = sum(int(line.split()[2]) for line in result.stdout.splitlines()[2:]) / 1e6
    light_kernels = 1200 - (walls[1] - walls[3]) * 1000  # done while the heavy one ran (then alone, 1 ms each)
    part = 100 * light_kernels / (light_kernels + 800)
    print(f"walls {walls}: the light one's part {part:.1f} %")
    assert abs(part - 25) <= 5 and walls[1] <= 2.1, (part, walls)
