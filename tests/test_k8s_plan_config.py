"""The device plugin's k8s: configuration: validated and shown, the deployed node configuration, errors
naming the key, and what stops the plugin at once.

No gRPC server or channel here (tests/harness/deviceplugin.py says why those run in a child process).
"""

from __future__ import annotations

import subprocess
import sysconfig
from pathlib import Path

import pytest
import yaml

from harness.k8splan import gpu as _gpu
from nvc import config
from nvc.errors import InputError
from nvc.k8s import resources
from nvc.plan.fromenv import gpu_request

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = Path(sysconfig.get_path("scripts"))
DEPLOY = REPO / "deploy"


# ---------------------------------------------------------------- configuration, command line, manifests


def test_k8s_section_is_validated_and_shown(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "k8s:\n  share-gpus: [0, GPU-x]\n  share-slice: 4Gi\n  ignored-xids: [13, 43]\n"
        "  device-list-strategy: volume-mounts\n  xid-recovery: 0\n"
    )
    shown = subprocess.run(
        [str(SCRIPTS / "nvc-py"), "config", "show", "--file", str(path)], check=True, capture_output=True, text=True
    ).stdout
    k8s = yaml.safe_load(shown)["k8s"]
    assert k8s == {
        "device-plugin-dir": "/var/lib/kubelet/device-plugins",
        "gpu-resource": "nvidia.com/gpu",
        "mig-resource-prefix": "nvidia.com/mig-",
        "share-resource": "nvc-py.io/gpu-share",
        "share-gpus": ["0", "GPU-x"],
        "share-slice": "4Gi",
        "share-compute": "proportional",
        "share-weight": True,
        "share-backend": "timeslice",
        "device-list-strategy": "volume-mounts",
        "cdi-devices": False,
        "ignored-xids": [13, 43],
        "xid-recovery": 0,
        "nvml-retry": 30,
    }


def test_the_deployed_node_config_gives_no_gpu_to_a_pod_that_asked_for_none() -> None:
    """deploy/config.yaml: the plugin answers by volume mounts and the hook believes only those for
    unprivileged containers, so a CUDA image's NVIDIA_VISIBLE_DEVICES=all selects nothing."""
    from nvc.hook.oci import prestart

    node = config.parse((DEPLOY / "config.yaml").read_text(), str(DEPLOY / "config.yaml"))
    assert node.k8s.device_list_strategy == "volume-mounts"
    policy = prestart.policy(node)
    assert gpu_request({"NVIDIA_VISIBLE_DEVICES": "all"}, [], False, policy, []) is None
    gpu = resources.plan((_gpu(0),), node.k8s)[0]
    answer = resources.allocate(gpu, ["GPU-0"], node.k8s)
    mounts = [{"destination": dest, "source": src} for dest, src, _ in answer.mounts]
    asked = gpu_request({**answer.envs, "NVIDIA_VISIBLE_DEVICES": "all"}, mounts, False, policy, [])
    assert [s.text for s in asked.selectors] == ["GPU-0"]


def test_the_deployed_node_config_applies_its_policy_to_every_device_granting_default_and_variable() -> None:
    """deploy/config.yaml: a legacy CUDA image's default of every GPU (CUDA_VERSION, no
    NVIDIA_VISIBLE_DEVICES) passes the same policy as the variable, and so do IMEX channels asked
    for in a pod's own env, with an allocation (volume mounts) or without one."""
    from nvc.hook.oci import prestart

    node = config.parse((DEPLOY / "config.yaml").read_text(), str(DEPLOY / "config.yaml"))
    policy = prestart.policy(node)
    warnings: list[str] = []
    assert gpu_request({"CUDA_VERSION": "12.0"}, [], False, policy, warnings) is None
    assert warnings == [
        "CUDA_VERSION (a legacy image's default of all GPUs) ignored: unprivileged container "
        "and accept-envvar-when-unprivileged is false"
    ]
    assert gpu_request({"CUDA_VERSION": "12.0", "NVIDIA_IMEX_CHANNELS": "0,1"}, [], False, policy, []) is None
    gpu = resources.plan((_gpu(0),), node.k8s)[0]
    answer = resources.allocate(gpu, ["GPU-0"], node.k8s)
    mounts = [{"destination": dest, "source": src} for dest, src, _ in answer.mounts]
    warnings.clear()
    asked = gpu_request(
        {**answer.envs, "NVIDIA_IMEX_CHANNELS": "0,1", "CUDA_VERSION": "12.0"}, mounts, False, policy, warnings
    )
    assert [s.text for s in asked.selectors] == ["GPU-0"] and asked.imex_channels == ()
    assert warnings == [
        "NVIDIA_IMEX_CHANNELS ignored: unprivileged container and accept-envvar-when-unprivileged is false"
    ]
    imex = [*mounts, {"destination": "/var/run/nvidia-container-devices/imex/1", "source": "/dev/null"}]
    assert gpu_request(answer.envs, imex, False, policy, []).imex_channels == (1,)
    privileged = gpu_request({"CUDA_VERSION": "12.0", "NVIDIA_IMEX_CHANNELS": "0,1"}, [], True, policy)
    assert [s.text for s in privileged.selectors] == ["all"] and privileged.imex_channels == (0, 1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("k8s: {share-slice: [1]}", "k8s.share-slice: expected a size"),
        ("k8s: {gpu-resource: gpu}", "k8s.gpu-resource: expected an extended resource name"),
        ("k8s: {ignored-xids: [x]}", "k8s.ignored-xids: expected a list of XID numbers"),
        ("k8s: {nvml-retry: 0}", "k8s.nvml-retry: expected a whole number of seconds \\(1 or more\\)"),
        ("k8s: {kubelet: x}", "k8s.kubelet: unknown key"),
    ],
)
def test_k8s_section_errors_name_the_key(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        config.parse(text + "\n", "/etc/nvc-py/config.yaml")


def test_a_bad_share_slice_stops_the_plugin_at_once(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("k8s: {share-slice: lots}\n")
    result = subprocess.run(
        [str(SCRIPTS / "nvc-py"), "k8s", "device-plugin", "--config", str(path), "--device-plugin-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (result.returncode, result.stderr) == (
        2,
        "nvc-py: input error: k8s.share-slice='lots': not a size "
        "(positive decimal bytes, optionally with K, M, G, T, Ki, Mi, "
        "Gi or Ti)\n",
    )


def test_without_a_kubelet_directory_it_stops_at_once_and_makes_none(tmp_path: Path) -> None:
    """No kubelet on the host (its device plugin directory missing): one line, status 2, and no
    directory made in the kubelet's place (it used to make the directory and wait for a kubelet)."""
    missing = tmp_path / "kubelet" / "device-plugins"
    config = tmp_path / "config.yaml"
    config.write_text(f"k8s: {{device-plugin-dir: {missing}}}\n")
    for argv in (["--config", str(config)], ["--device-plugin-dir", str(missing)]):
        result = subprocess.run(
            [str(SCRIPTS / "nvc-py"), "k8s", "device-plugin", *argv], capture_output=True, text=True, timeout=30
        )
        assert (result.returncode, result.stdout) == (2, ""), result.stderr
        assert result.stderr == (
            f"nvc-py: input error: {missing}: no such directory: is a kubelet running on this "
            "host? (it makes it; another kubelet --root-dir: --device-plugin-dir)\n"
        )
        assert not (tmp_path / "kubelet").exists()
