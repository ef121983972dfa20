"""The Kubernetes device plugin (``nvc-py k8s device-plugin``) against a kubelet stand-in, on the fake driver.

The stand-in (tests/harness/kubelet.py) speaks the kubelet's side of the v1beta1 gRPC API on a
temporary kubelet.sock; the plugin runs as the installed ``nvc-py`` in this test's private mount
namespace, where the fake driver (a test double: 2 GPUs, the A100 with 2 MIG devices) is shown at
the real /proc and /dev paths.

Here: whole GPUs, MIG devices and shares advertised and allocated, and what a container gets
through containerd and nvc-py-runtime.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.deviceplugin import GIB, GPUS3, in_child, kubelet, plugin_dir, run_plugin  # noqa: F401  (fixtures)
from harness.fakegpus import A100, H100, MIG_2G, MIG_3G
from harness.fakegpus import uuids as _uuids
from harness.installed import SCRIPTS


def _whole_and_mig(directory: Path) -> None:
    with kubelet(directory) as node:
        gpu = node.plugin("nvidia.com/gpu")
        assert gpu.options.get_preferred_allocation_available and not gpu.options.pre_start_required
        assert gpu.devices() == {H100: "Healthy"}
        assert node.plugin("nvidia.com/mig-2g.10gb").devices() == {MIG_2G: "Healthy"}
        assert node.plugin("nvidia.com/mig-3g.20gb").devices() == {MIG_3G: "Healthy"}
        assert node.plugin("nvc-py.io/gpu-share").devices() == {}
        assert {r.version for r in node.registrations} == {"v1beta1"}
        assert {r.endpoint for r in node.registrations} == {
            "nvc-py-nvidia.com_gpu.sock",
            "nvc-py-nvidia.com_mig-2g.10gb.sock",
            "nvc-py-nvidia.com_mig-3g.20gb.sock",
            "nvc-py-nvc-py.io_gpu-share.sock",
        }
        (answer,) = gpu.allocate([H100])
        assert dict(answer.envs) == {"NVIDIA_VISIBLE_DEVICES": H100}
        assert [d.name for d in answer.cdi_devices] == [f"nvidia.com/gpu={H100}"]
        (mig,) = node.plugin("nvidia.com/mig-3g.20gb").allocate([MIG_3G])
        assert dict(mig.envs) == {"NVIDIA_VISIBLE_DEVICES": MIG_3G}
        with pytest.raises(Exception, match="unknown device ID 'GPU-nope'"):
            gpu.allocate(["GPU-nope"])


def test_whole_gpus_and_mig_devices(active_2gpu, plugin_dir: Path, run_plugin) -> None:
    """Registration, capacity and Allocate answers: the H100 as nvidia.com/gpu by UUID, each MIG profile of
    the A100 as a resource of its own (the MIG-enabled A100 is no whole GPU), no share units."""
    run = run_plugin(active_2gpu.root, "{cdi-devices: true}")
    in_child(_whole_and_mig, plugin_dir)
    run.wait_log(r"registered nvidia\.com/gpu \(1 devices\)")


# ---------------------------------------------------------------- shares, through containerd and nvc-py-runtime


def _shares(directory: Path) -> dict[str, str]:
    with kubelet(directory) as node:
        share = node.plugin("nvc-py.io/gpu-share")
        units = sorted(share.devices(), key=lambda unit: int(unit.rpartition("::")[2]))
        assert units == [f"{H100}::{k}" for k in range(10)]  # 80 GiB in 8 GiB slices
        assert node.plugin("nvidia.com/gpu").devices() == {}  # a shared GPU is not also a whole one
        assert share.preferred(units[::-1], 3, must=[units[4]])[0] == units[4]
        first, second, third = share.allocate(units[:2], units[2:9], units[9:])
        limits = [int(answer.envs[f"NVC_SHARE_MEMORY_LIMIT_{H100}"]) for answer in (first, second, third)]
        assert limits == [16 * GIB, 56 * GIB, 8 * GIB] and sum(limits) == 80 * GIB  # never more than the GPU has
        assert [answer.envs[f"NVC_SHARE_COMPUTE_{H100}"] for answer in (first, second, third)] == ["20", "70", "10"]
        assert [answer.envs[f"NVC_SHARE_WEIGHT_{H100}"] for answer in (first, second, third)] == ["2", "7", "1"]
        with pytest.raises(Exception, match="unknown device ID"):
            share.allocate([H100])
        return dict(first.envs)


def _ctr_wrapper(tmp_path: Path, config: Path) -> Path:
    wrapper = tmp_path / "runtime.sh"  # containerd hands shims no environment of our choosing
    wrapper.write_text(f'#!/bin/sh\nNVC_PY_CONFIG={config} exec {SCRIPTS / "nvc-py-runtime"} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


SEE = [
    "sh",
    "-c",
    "nvidia-smi -L 2>&1; grep -h -e memory_limit -e compute_ /var/run/nvc-share/limits 2>/dev/null; "
    "nvidia-smi --query-gpu=memory.total --format=csv,noheader 2>/dev/null; "
    "ls /dev/nvidia-caps-imex-channels 2>/dev/null; true",
]


def _in_containers(tmp_path: Path, rootfs_cache, *runs: tuple[str, dict[str, str], list]) -> list:
    """SEE's output in a real container (containerd, `ctr`, nvc-py-runtime with tmp_path's config) per
    (name, env, mounts as an Allocate answers them) of ``runs``."""
    from harness.containerd import Containerd

    wrapper = _ctr_wrapper(tmp_path, tmp_path / "config.yaml")
    daemon = Containerd(tmp_path / "containerd", rootfs_cache)
    try:
        image = daemon.image()
        results = []
        for name, env, mounts in runs:
            binds = [f"--mount=type=bind,src={host},dst={ctr},options=rbind:ro" for ctr, host, _ in mounts]
            result = daemon.run(image, name, SEE, env=env, extra_args=binds, runc_binary=str(wrapper))
            assert result.returncode == 0, result.stderr
            results.append(result.stdout)
        return results
    finally:
        daemon.stop()


def _answered(answer) -> list:
    """An Allocate answer's env and mounts, as plain values a forked child can return."""
    return [dict(answer.envs), [(m.container_path, m.host_path, m.read_only) for m in answer.mounts]]


def test_shares_accounting_and_a_container_with_the_allocated_share(
    active_2gpu, plugin_dir: Path, run_plugin, rootfs_cache, tmp_path: Path
) -> None:
    """The H100 shared in 8 GiB units: the units of all containers add up to its memory; one container's
    Allocate env, given to a real container (containerd, `ctr`, nvc-py-runtime), shows it exactly that GPU,
    the memory budget (the fake nvidia-smi through the shim reports it), compute cap and weight."""
    run = run_plugin(active_2gpu.root, "{share-gpus: [0], share-slice: 8Gi}")
    envs = in_child(_shares, plugin_dir)
    assert envs == {
        "NVIDIA_VISIBLE_DEVICES": H100,
        f"NVC_SHARE_MEMORY_LIMIT_{H100}": str(16 * GIB),
        f"NVC_SHARE_COMPUTE_{H100}": "20",
        f"NVC_SHARE_WEIGHT_{H100}": "2",
    }
    (seen,) = _in_containers(tmp_path, rootfs_cache, ("nvc-k8s-share", envs, []))
    assert _uuids(seen) == [H100]
    assert seen.splitlines()[1:] == [
        f"memory_limit.{H100}={16 * GIB}",
        f"compute_percent.{H100}=20",
        f"compute_weight.{H100}=2",
        "16384 MiB",
    ]
    run.wait_log(rf"Allocate nvc-py\.io/gpu-share \[.*\]: NVC_SHARE_COMPUTE_{H100}=20")


def _share_mounts(directory: Path) -> list:
    with kubelet(directory) as node:
        share = node.plugin("nvc-py.io/gpu-share")
        (answer,) = share.allocate(sorted(share.devices(), key=lambda unit: int(unit.rpartition("::")[2]))[:2])
        return _answered(answer)


def test_a_pods_own_env_cannot_replace_its_share_limits(
    active_2gpu, plugin_dir: Path, run_plugin, rootfs_cache, tmp_path: Path
) -> None:
    """The kubelet puts a device plugin's env before the pod's own and the runtime keeps the last, so
    limits passed as env are the pod's to replace. With volume mounts the limits travel as /dev/null
    mounts the hook reads instead of the env: a pod setting NVC_SHARE_MEMORY_LIMIT=1Ti and a 100 %
    compute share for itself still gets its 16 GiB, 20 % and weight 2."""
    run_plugin(
        active_2gpu.root,
        "{share-gpus: [0], share-slice: 8Gi, device-list-strategy: volume-mounts}\n"
        "accept-volume-mounts: true\naccept-envvar-when-unprivileged: false",
    )
    envs, mounts = in_child(_share_mounts, plugin_dir)
    assert envs == {"NVIDIA_VISIBLE_DEVICES": "void"}
    share_dir = "/var/run/nvidia-container-devices/share/"
    assert sorted(mounts) == [
        (f"/var/run/nvidia-container-devices/{H100}", "/dev/null", True),
        (f"{share_dir}NVC_SHARE_COMPUTE_{H100}=20", "/dev/null", True),
        (f"{share_dir}NVC_SHARE_MEMORY_LIMIT_{H100}={16 * GIB}", "/dev/null", True),
        (f"{share_dir}NVC_SHARE_WEIGHT_{H100}=2", "/dev/null", True),
    ]
    hostile = {**envs, "NVC_SHARE_MEMORY_LIMIT": "1Ti", f"NVC_SHARE_COMPUTE_{H100}": "100"}
    (seen,) = _in_containers(tmp_path, rootfs_cache, ("nvc-k8s-share-mounts", hostile, mounts))
    assert _uuids(seen) == [H100]
    assert seen.splitlines()[1:] == [
        f"memory_limit.{H100}={16 * GIB}",
        f"compute_percent.{H100}=20",
        f"compute_weight.{H100}=2",
        "16384 MiB",
    ]


def _volume_mounts(directory: Path) -> list:
    with kubelet(directory) as node:
        (answer,) = node.plugin("nvidia.com/mig-3g.20gb").allocate([MIG_3G])
        return _answered(answer)


def test_volume_mounts_strategy_and_a_pod_asking_for_no_gpu(
    active_2gpu, plugin_dir: Path, run_plugin, rootfs_cache, tmp_path: Path
) -> None:
    """The void policy: with device-list-strategy volume-mounts the plugin answers /dev/null mounts and
    NVIDIA_VISIBLE_DEVICES=void; a hook that accepts volume mounts and ignores the variable in
    unprivileged containers gives the allocated MIG device, and nothing to a pod that asked for no GPU
    although its image says NVIDIA_VISIBLE_DEVICES=all."""
    run_plugin(
        active_2gpu.root,
        "{device-list-strategy: volume-mounts}\naccept-volume-mounts: true\naccept-envvar-when-unprivileged: false",
    )
    envs, mounts = in_child(_volume_mounts, plugin_dir)
    assert envs == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert mounts == [(f"/var/run/nvidia-container-devices/{MIG_3G}", "/dev/null", True)]
    mig, none, legacy, imex = _in_containers(
        tmp_path,
        rootfs_cache,
        ("nvc-k8s-mig", envs, mounts),
        ("nvc-k8s-none", {"NVIDIA_VISIBLE_DEVICES": "all"}, []),
        ("nvc-k8s-legacy", {"CUDA_VERSION": "12.0"}, []),
        ("nvc-k8s-imex", {**envs, "NVIDIA_IMEX_CHANNELS": "0,1"}, mounts),
    )
    assert _uuids(mig) == [A100, MIG_3G]
    assert "nvidia-smi: not found" in none, none
    # a legacy CUDA image's default of all GPUs, and IMEX channels a pod asks for itself, pass the same policy
    assert "nvidia-smi: not found" in legacy, legacy
    assert _uuids(imex) == [A100, MIG_3G] and "channel" not in imex, imex


def _whole_and_shares(directory: Path) -> list:
    with kubelet(directory) as node:
        (whole,) = node.plugin("nvidia.com/gpu").allocate([GPUS3[0]])
        (shares,) = node.plugin("nvc-py.io/gpu-share").allocate([f"{GPUS3[2]}::0", f"{GPUS3[1]}::0", f"{GPUS3[1]}::1"])
        return [_answered(whole), _answered(shares)]


def test_a_whole_gpu_beside_shares_of_two_others_in_one_container(
    active_3gpu, plugin_dir: Path, run_plugin, rootfs_cache, tmp_path: Path
) -> None:
    """A pod asking for one whole GPU and shares of two others: each share's limit lands on its own GPU
    (keyed by UUID end to end: plugin, hook, limits file, shim), the whole GPU stays unlimited although
    the container numbers it first."""
    run_plugin(
        active_3gpu.root,
        "{share-gpus: [1, 2], share-slice: 8Gi, device-list-strategy: volume-mounts}\n"
        "accept-volume-mounts: true\naccept-envvar-when-unprivileged: false",
    )
    (whole_envs, whole_mounts), (share_envs, share_mounts) = in_child(_whole_and_shares, plugin_dir)
    assert whole_envs == share_envs == {"NVIDIA_VISIBLE_DEVICES": "void"}
    (seen,) = _in_containers(tmp_path, rootfs_cache, ("nvc-k8s-mixed", whole_envs, [*whole_mounts, *share_mounts]))
    assert _uuids(seen) == list(GPUS3)
    gpu1, gpu2 = GPUS3[1:]
    assert seen.splitlines()[3:] == [
        f"memory_limit.{gpu1}={16 * GIB}",
        f"memory_limit.{gpu2}={8 * GIB}",
        f"compute_percent.{gpu1}=20",
        f"compute_percent.{gpu2}=10",
        f"compute_weight.{gpu1}=2",
        f"compute_weight.{gpu2}=1",
        "81920 MiB",
        "16384 MiB",
        "8192 MiB",
    ]
