"""The device plugin's pure parts and its surroundings: the API's field numbers, the generated code, what
is advertised, preferred and allocated, health bookkeeping, the k8s: configuration, --help, the manifests.

No gRPC server or channel here (tests/test_k8s.py says why those run in a child process).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from nvc import config
from nvc.devices import Gpu, MigDevice
from nvc.errors import InputError
from nvc.k8s import resources
from nvc.k8s.health import Health
from nvc import containerenv
from nvc.containerenv.gpus import gpu_request
from nvc.containerenv.sharing import parse_share_env, share_env

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = Path(sysconfig.get_path("scripts"))
GIB = 1 << 30
K8S = config.K8s()


def _gpu(index: int, memory_gib: int = 80, mig: tuple[MigDevice, ...] = ()) -> Gpu:
    return Gpu(index, index, "NVIDIA H100", "Nvidia", f"GPU-{index}", f"00000000:{index + 1:02X}:00.0", "9.0",
               memory_gib * GIB, bool(mig), mig)


# ---------------------------------------------------------------- the API, as the kubelet documents it

# (message, field) -> number, from k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto
DOCUMENTED = {
    ("RegisterRequest", "version"): 1, ("RegisterRequest", "endpoint"): 2, ("RegisterRequest", "resource_name"): 3,
    ("RegisterRequest", "options"): 4,
    ("DevicePluginOptions", "pre_start_required"): 1, ("DevicePluginOptions", "get_preferred_allocation_available"): 2,
    ("ListAndWatchResponse", "devices"): 1, ("TopologyInfo", "nodes"): 1, ("NUMANode", "ID"): 1,
    ("Device", "ID"): 1, ("Device", "health"): 2, ("Device", "topology"): 3,
    ("PreStartContainerRequest", "devices_ids"): 1,
    ("PreferredAllocationRequest", "container_requests"): 1,
    ("ContainerPreferredAllocationRequest", "available_deviceIDs"): 1,
    ("ContainerPreferredAllocationRequest", "must_include_deviceIDs"): 2,
    ("ContainerPreferredAllocationRequest", "allocation_size"): 3,
    ("PreferredAllocationResponse", "container_responses"): 1, ("ContainerPreferredAllocationResponse", "deviceIDs"): 1,
    ("AllocateRequest", "container_requests"): 1, ("ContainerAllocateRequest", "devices_ids"): 1,
    ("AllocateResponse", "container_responses"): 1,
    ("ContainerAllocateResponse", "envs"): 1, ("ContainerAllocateResponse", "mounts"): 2,
    ("ContainerAllocateResponse", "devices"): 3, ("ContainerAllocateResponse", "annotations"): 4,
    ("ContainerAllocateResponse", "cdi_devices"): 5, ("CDIDevice", "name"): 1,
    ("Mount", "container_path"): 1, ("Mount", "host_path"): 2, ("Mount", "read_only"): 3,
    ("DeviceSpec", "container_path"): 1, ("DeviceSpec", "host_path"): 2, ("DeviceSpec", "permissions"): 3,
}
METHODS = {"v1beta1.Registration": ["Register"],
           "v1beta1.DevicePlugin": ["GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate",
                                    "PreStartContainer"]}


def test_messages_and_services_are_the_documented_ones() -> None:
    from nvc.k8s import api_pb2

    found = {(name, field.name): field.number for name, message in api_pb2.DESCRIPTOR.message_types_by_name.items()
             for field in message.fields}
    assert found == DOCUMENTED
    services = api_pb2.DESCRIPTOR.services_by_name.values()
    assert {s.full_name: [m.name for m in s.methods] for s in services} == METHODS
    stream = api_pb2.DESCRIPTOR.services_by_name["DevicePlugin"].methods_by_name["ListAndWatch"]
    assert stream.server_streaming and not stream.client_streaming


def test_generated_code_is_what_api_proto_gives(tmp_path: Path) -> None:
    """api_pb2*.py are protoc's output for api.proto as committed (`make k8s-api` regenerates them)."""
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{REPO}", f"--python_out={tmp_path}",
                    f"--grpc_python_out={tmp_path}", str(REPO / "nvc/k8s/api.proto")], check=True)
    for name in ("api_pb2.py", "api_pb2_grpc.py"):
        assert (tmp_path / "nvc/k8s" / name).read_text() == (REPO / "nvc/k8s" / name).read_text(), name


# ---------------------------------------------------------------- what is advertised

def test_plan_whole_mig_and_shares() -> None:
    mig = (MigDevice(0, 1, 0, "MIG-a", 10 * GIB, name="NVIDIA A100 MIG 2g.10gb"),
           MigDevice(1, 2, 0, "MIG-b", 10 * GIB, name="NVIDIA A100 MIG 2g.10gb"),
           MigDevice(2, 3, 0, "MIG-c", 5 * GIB, name="NVIDIA A100 MIG 1g.5gb"))
    gpus = (_gpu(0), _gpu(1, 40, mig), _gpu(2, 48))
    k8s = K8S._replace(share_gpus=("GPU-2",), share_slice="16Gi")
    planned = {r.name: r for r in resources.plan(gpus, k8s, numa=lambda bus: 1 if bus.endswith("01:00.0") else None)}
    assert [u.id for u in planned["nvidia.com/gpu"].units] == ["GPU-0"]
    assert planned["nvidia.com/gpu"].units[0].numa == 1
    assert [u.id for u in planned["nvidia.com/mig-2g.10gb"].units] == ["MIG-a", "MIG-b"]
    assert [u.id for u in planned["nvidia.com/mig-1g.5gb"].units] == ["MIG-c"]
    assert [u.id for u in planned["nvc-py.io/gpu-share"].units] == ["GPU-2::0", "GPU-2::1", "GPU-2::2"]
    assert max(len(u.id) for r in planned.values() for u in r.units) <= resources.MAX_ID
    assert planned["nvc-py.io/gpu-share"].socket == "nvc-py-nvc-py.io_gpu-share.sock"


@pytest.mark.parametrize(("k8s", "message"), [
    (K8S._replace(share_gpus=("7",)), "k8s.share-gpus: '7' is no GPU of this host"),
    (K8S._replace(share_gpus=("all",), share_slice="1Mi"), "k8s.share-slice: 1Mi cuts GPU-0 into 81920 units"),
    (K8S._replace(share_resource="nvidia.com/gpu"), "resource nvidia.com/gpu named twice"),
])
def test_plan_refuses_what_cannot_be_advertised(k8s: config.K8s, message: str) -> None:
    with pytest.raises(InputError, match=message):
        resources.plan((_gpu(0),), k8s)


def test_a_mig_device_without_a_profile_is_left_out_with_a_line() -> None:
    said: list[str] = []
    gpus = (_gpu(0, 40, (MigDevice(0, 1, 0, "MIG-a", name=None),)),)
    assert [r.name for r in resources.plan(gpus, K8S, warn=said.append)] == ["nvidia.com/gpu", "nvc-py.io/gpu-share"]
    assert said == ["MIG device MIG-a of GPU-0: NVML names no profile (None); not advertised"]
    assert resources.mig_profile("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me") == "1g.10gb+me"


# ---------------------------------------------------------------- GetPreferredAllocation

def _shares(*free: int) -> tuple[resources.Resource, list[str]]:
    gpus = tuple(_gpu(i, 8) for i in range(len(free)))
    share = resources.plan(gpus, K8S._replace(share_gpus=("all",)))[1]
    available = [u.id for u in share.units if int(u.id.rpartition("::")[2]) < free[u.gpu_index]]
    return share, available


@pytest.mark.parametrize(("free", "size", "must", "want"), [
    ((4, 2), 2, (), {"GPU-1": 2}),              # the tightest fit keeps GPU-0's four units together
    ((4, 2), 3, (), {"GPU-0": 3}),
    ((4, 2), 2, ("GPU-0::3",), {"GPU-0": 2}),   # the GPU already holding the container's units
    ((4, 2), 5, (), {"GPU-0": 4, "GPU-1": 1}),  # no GPU holds 5: the fewest GPUs
    ((1, 3, 3), 3, (), {"GPU-1": 3}),
])
def test_shares_come_from_one_gpu(free: tuple[int, ...], size: int, must: tuple[str, ...], want: dict) -> None:
    share, available = _shares(*free)
    picked = resources.preferred(share, available, list(must), size, {})
    assert len(picked) == size and set(must) <= set(picked) and set(picked) <= set(available)
    got: dict[str, int] = {}
    for unit in share.by_id(picked):
        got[unit.gpu] = got.get(unit.gpu, 0) + 1
    assert got == want


def test_whole_gpus_closest_by_topology() -> None:
    gpus = resources.plan(tuple(_gpu(i) for i in range(4)), K8S)[0]
    near = {("GPU-0", "GPU-1"): 10, ("GPU-2", "GPU-3"): 10}
    topology = {a: {b: near.get((min(a, b), max(a, b)), 50) for b in ("GPU-0", "GPU-1", "GPU-2", "GPU-3") if b != a}
                for a in ("GPU-0", "GPU-1", "GPU-2", "GPU-3")}
    assert resources.preferred(gpus, ["GPU-0", "GPU-2", "GPU-3"], [], 2, topology) == ["GPU-2", "GPU-3"]
    assert resources.preferred(gpus, ["GPU-0", "GPU-2", "GPU-3"], [], 2, {}) == ["GPU-0", "GPU-2"]  # by index
    assert resources.preferred(gpus, ["GPU-1", "GPU-2", "GPU-3"], ["GPU-1"], 2, topology)[0] == "GPU-1"


# ---------------------------------------------------------------- Allocate

def test_shares_on_two_gpus_get_per_device_limits_the_hook_reads() -> None:
    share = resources.plan((_gpu(0, 8), _gpu(1, 8)), K8S._replace(share_gpus=("all",), share_slice="2Gi"))[1]
    answer = resources.allocate(share, ["GPU-1::0", "GPU-0::0", "GPU-0::1", "GPU-0::2"], K8S)
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-0,GPU-1"  # the container's order: host order
    request = parse_share_env(answer.envs)  # as the hook reads the container's env
    assert request.memory == (("GPU-0", 6 * GIB), ("GPU-1", 2 * GIB))
    assert request.compute == (("GPU-0", 75), ("GPU-1", 25)) and request.weight == (("GPU-0", 3), ("GPU-1", 1))


def test_a_whole_gpu_beside_shares_of_two_others_keeps_every_limit_on_its_own_gpu() -> None:
    """One container given a whole GPU (one resource) and shares of two other GPUs (another): the
    share's limits are keyed by UUID, so none lands on the whole GPU, which the container numbers
    first (a limit numbered by its position in the share's allocation did: the whole GPU got it)."""
    k8s = K8S._replace(share_gpus=("1", "2"), share_slice="2Gi", device_list_strategy="volume-mounts")
    whole, share = resources.plan((_gpu(0, 8), _gpu(1, 8), _gpu(2, 8)), k8s)[:2]
    answers = [resources.allocate(whole, ["GPU-0"], k8s),
               resources.allocate(share, ["GPU-2::0", "GPU-1::0", "GPU-1::1"], k8s)]
    mounts = [{"destination": dest, "source": src} for answer in answers for dest, src, _ in answer.mounts]
    policy = containerenv.Policy(accept_volume_mounts=True, accept_envvar_when_unprivileged=False)
    asked = gpu_request({"NVIDIA_VISIBLE_DEVICES": "void"}, mounts, False, policy, [])
    assert [s.text for s in asked.selectors] == ["GPU-0", "GPU-1", "GPU-2"]
    request = parse_share_env(share_env({}, mounts, policy))
    assert request.memory == (("GPU-1", 4 * GIB), ("GPU-2", 2 * GIB))
    assert request.compute == (("GPU-1", 50), ("GPU-2", 25)) and request.weight == (("GPU-1", 2), ("GPU-2", 1))
    from nvc.plan.share import limits_text

    assert limits_text(request).splitlines()[2:] == [
        f"memory_limit.GPU-1={4 * GIB}", f"memory_limit.GPU-2={2 * GIB}", "compute_percent.GPU-1=50",
        "compute_percent.GPU-2=25", "compute_weight.GPU-1=2", "compute_weight.GPU-2=1"]


def test_allocate_strategies_and_cdi() -> None:
    gpus = resources.plan((_gpu(0), _gpu(1)), K8S)[0]
    plain = resources.allocate(gpus, ["GPU-1", "GPU-0"], K8S)
    assert plain == resources.Answer({"NVIDIA_VISIBLE_DEVICES": "GPU-0,GPU-1"})
    mounted = resources.allocate(gpus, ["GPU-1"], K8S._replace(device_list_strategy="volume-mounts", cdi_devices=True))
    assert mounted == resources.Answer({"NVIDIA_VISIBLE_DEVICES": "void"},
                                       (("/var/run/nvidia-container-devices/GPU-1", "/dev/null", True),),
                                       ("nvidia.com/gpu=GPU-1",))
    read_back = gpu_request(mounted.envs, [{"destination": dest, "source": src} for dest, src, _ in mounted.mounts],
                            False, containerenv.Policy(accept_volume_mounts=True))
    assert [s.text for s in read_back.selectors] == ["GPU-1"]  # the hook reads the plugin's mounts


def test_share_limits_travel_as_mounts_the_hook_believes_over_the_env() -> None:
    share = resources.plan((_gpu(0, 8),), K8S._replace(share_gpus=("all",), share_slice="2Gi"))[1]
    answer = resources.allocate(share, ["GPU-0::0", "GPU-0::1"], K8S._replace(device_list_strategy="volume-mounts"))
    assert answer.envs == {"NVIDIA_VISIBLE_DEVICES": "void"}
    mounts = [{"destination": dest, "source": src} for dest, src, _ in answer.mounts]
    pod_env = {"NVC_SHARE_MEMORY_LIMIT": "1Ti", "NVC_SHARE_WEIGHT": "1000"}  # the pod's own, after the plugin's
    accepting = containerenv.Policy(accept_volume_mounts=True)
    request = parse_share_env(share_env(pod_env, mounts, accepting))
    assert request.memory == (("GPU-0", 4 * GIB),) and request.weight == (("GPU-0", 2),)
    # a hook that does not accept volume mounts reads the env, as without a plugin
    assert parse_share_env(share_env(pod_env, mounts, containerenv.Policy())).memory == (("", 1024 * GIB),)
    # only /dev/null mounts count: a volume the pod mounts there itself is not a plugin's answer
    own = [{"destination": containerenv.SHARE_VOLUME_DIR + "NVC_SHARE_MEMORY_LIMIT=1Ti", "source": "/tmp/x"}]
    assert share_env(pod_env, own, accepting) is pod_env


# ---------------------------------------------------------------- health

def test_health_marks_clears_and_waits_for_nvml() -> None:
    health = Health(config.APPLICATION_XIDS, 10)
    gpu, mig = resources.Unit("GPU-0", "GPU-0", "GPU-0", 0), resources.Unit("MIG-a", "MIG-a", "GPU-0", 0)
    assert not health.xid("GPU-0", 13, 0) and health.healthy(gpu)
    assert health.xid("MIG-a", 48, 0) and not health.healthy(mig) and health.healthy(gpu)
    assert health.xid("GPU-0", 79, 5) and not health.healthy(gpu) and not health.healthy(mig)  # all on the GPU
    assert health.due(9) == [] and health.due(10) == ["MIG-a"]
    assert health.checked("MIG-a", True, 10) and health.due(14) == []
    assert not health.checked("GPU-0", False, 15) and health.due(24) == [] and health.due(25) == ["GPU-0"]
    assert not health.healthy(mig)  # its GPU is still unhealthy
    never = Health((), 0)
    assert never.xid("GPU-0", 13, 0) and never.due(10 ** 9) == []


# ---------------------------------------------------------------- configuration, command line, manifests

def test_k8s_section_is_validated_and_shown(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("k8s:\n  share-gpus: [0, GPU-x]\n  share-slice: 4Gi\n  ignored-xids: [13, 43]\n"
                    "  device-list-strategy: volume-mounts\n  xid-recovery: 0\n")
    shown = subprocess.run([str(SCRIPTS / "nvc-py"), "config", "show", "--file", str(path)], check=True,
                           capture_output=True, text=True).stdout
    k8s = yaml.safe_load(shown)["k8s"]
    assert k8s == {"device-plugin-dir": "/var/lib/kubelet/device-plugins", "gpu-resource": "nvidia.com/gpu",
                   "mig-resource-prefix": "nvidia.com/mig-", "share-resource": "nvc-py.io/gpu-share",
                   "share-gpus": ["0", "GPU-x"], "share-slice": "4Gi", "share-compute": "proportional",
                   "share-weight": True, "device-list-strategy": "volume-mounts", "cdi-devices": False,
                   "ignored-xids": [13, 43], "xid-recovery": 0, "nvml-retry": 30}


def test_the_deployed_node_config_gives_no_gpu_to_a_pod_that_asked_for_none() -> None:
    """deploy/config.yaml: the plugin answers by volume mounts and the hook believes only those for
    unprivileged containers, so a CUDA image's NVIDIA_VISIBLE_DEVICES=all selects nothing."""
    from nvc.hook import prestart

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
    from nvc.hook import prestart

    node = config.parse((DEPLOY / "config.yaml").read_text(), str(DEPLOY / "config.yaml"))
    policy = prestart.policy(node)
    warnings: list[str] = []
    assert gpu_request({"CUDA_VERSION": "12.0"}, [], False, policy, warnings) is None
    assert warnings == ["CUDA_VERSION (a legacy image's default of all GPUs) ignored: unprivileged container "
                        "and accept-envvar-when-unprivileged is false"]
    assert gpu_request({"CUDA_VERSION": "12.0", "NVIDIA_IMEX_CHANNELS": "0,1"}, [], False, policy, []) is None
    gpu = resources.plan((_gpu(0),), node.k8s)[0]
    answer = resources.allocate(gpu, ["GPU-0"], node.k8s)
    mounts = [{"destination": dest, "source": src} for dest, src, _ in answer.mounts]
    warnings.clear()
    asked = gpu_request({**answer.envs, "NVIDIA_IMEX_CHANNELS": "0,1", "CUDA_VERSION": "12.0"}, mounts,
                        False, policy, warnings)
    assert [s.text for s in asked.selectors] == ["GPU-0"] and asked.imex_channels == ()
    assert warnings == ["NVIDIA_IMEX_CHANNELS ignored: unprivileged container and accept-envvar-when-unprivileged "
                        "is false"]
    imex = [*mounts, {"destination": "/var/run/nvidia-container-devices/imex/1", "source": "/dev/null"}]
    assert gpu_request(answer.envs, imex, False, policy, []).imex_channels == (1,)
    privileged = gpu_request({"CUDA_VERSION": "12.0", "NVIDIA_IMEX_CHANNELS": "0,1"}, [], True, policy)
    assert [s.text for s in privileged.selectors] == ["all"] and privileged.imex_channels == (0, 1)


@pytest.mark.parametrize(("text", "message"), [
    ("k8s: {share-slice: [1]}", "k8s.share-slice: expected a size"),
    ("k8s: {gpu-resource: gpu}", "k8s.gpu-resource: expected an extended resource name"),
    ("k8s: {ignored-xids: [x]}", "k8s.ignored-xids: expected a list of XID numbers"),
    ("k8s: {nvml-retry: 0}", "k8s.nvml-retry: expected a whole number of seconds \\(1 or more\\)"),
    ("k8s: {kubelet: x}", "k8s.kubelet: unknown key"),
])
def test_k8s_section_errors_name_the_key(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        config.parse(text + "\n", "/etc/nvc-py/config.yaml")


def test_a_bad_share_slice_stops_the_plugin_at_once(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("k8s: {share-slice: lots}\n")
    result = subprocess.run([str(SCRIPTS / "nvc-py"), "k8s", "device-plugin", "--config", str(path),
                             "--device-plugin-dir", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert (result.returncode, result.stderr) == (2, "nvc-py: input error: k8s.share-slice='lots': not a size "
                                                     "(positive decimal bytes, optionally with K, M, G, T, Ki, Mi, "
                                                     "Gi or Ti)\n")


def test_without_a_kubelet_directory_it_stops_at_once_and_makes_none(tmp_path: Path) -> None:
    """No kubelet on the host (its device plugin directory missing): one line, status 2, and no
    directory made in the kubelet's place (it used to make the directory and wait for a kubelet)."""
    missing = tmp_path / "kubelet" / "device-plugins"
    config = tmp_path / "config.yaml"
    config.write_text(f"k8s: {{device-plugin-dir: {missing}}}\n")
    for argv in (["--config", str(config)], ["--device-plugin-dir", str(missing)]):
        result = subprocess.run([str(SCRIPTS / "nvc-py"), "k8s", "device-plugin", *argv], capture_output=True,
                                text=True, timeout=30)
        assert (result.returncode, result.stdout) == (2, ""), result.stderr
        assert result.stderr == (f"nvc-py: input error: {missing}: no such directory: is a kubelet running on this "
                                 "host? (it makes it; another kubelet --root-dir: --device-plugin-dir)\n")
        assert not (tmp_path / "kubelet").exists()


def _help(*command: str) -> str:
    return subprocess.run([str(SCRIPTS / "nvc-py"), *(command or ("k8s", "device-plugin")), "--help"], check=True,
                          capture_output=True, text=True).stdout


def test_help_documents_every_flag() -> None:
    from nvc.k8s.command import device_plugin

    text = " ".join(_help().split())
    for param in device_plugin.params:
        assert param.help and all(opt in text for opt in param.opts), param.name
        assert " ".join(param.help.split())[:40] in text, param.name


DEPLOY = REPO / "deploy"


def _flags(argv: list[str]) -> list[str]:
    return [arg.partition("=")[0] for arg in argv if arg.startswith("--")]


# The part of the Kubernetes API the DaemonSet uses (apps/v1 DaemonSet, core/v1 PodSpec), as its
# reference documents it: a dict lists the fields allowed, a list holds items of one shape, a tuple
# the values allowed, a type the type.
_LABELS = {str: str}
_META = {"name": str, "namespace": str, "labels": _LABELS}
_CONTAINER = {
    "name": str, "image": str, "command": [str], "args": [str], "securityContext": {"privileged": bool},
    "ports": [{"name": str, "containerPort": int, "protocol": ("TCP", "UDP", "SCTP")}],
    "resources": {"requests": {"cpu": str, "memory": str}, "limits": {"cpu": str, "memory": str}},
    "volumeMounts": [{"name": str, "mountPath": str, "readOnly": bool,
                      "mountPropagation": ("None", "HostToContainer", "Bidirectional")}],
}
_POD = {
    "priorityClassName": str, "hostNetwork": bool, "containers": [_CONTAINER],
    "tolerations": [{"key": str, "operator": ("Exists", "Equal"), "value": str,
                     "effect": ("NoSchedule", "PreferNoSchedule", "NoExecute")}],
    "volumes": [{"name": str, "hostPath": {"path": str, "type": ("", "Directory", "DirectoryOrCreate", "File",
                                                                 "FileOrCreate", "Socket")}}],
}
_DAEMONSET = {
    "apiVersion": ("apps/v1",), "kind": ("DaemonSet",), "metadata": _META,
    "spec": {"selector": {"matchLabels": _LABELS}, "updateStrategy": {"type": ("RollingUpdate", "OnDelete")},
             "template": {"metadata": _META, "spec": _POD}},
}


def _schema_problems(value: object, schema: object, path: str = "") -> list[str]:
    if isinstance(schema, dict) and set(schema) == {str}:
        ok = isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        return [] if ok else [f"{path}: want a map of strings"]
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return [f"{path}: want an object"]
        problems: list[str] = []
        for key, item in value.items():
            problems += (_schema_problems(item, schema[key], f"{path}.{key}") if key in schema
                         else [f"{path}.{key}: unknown field"])
        return problems
    if isinstance(schema, list):
        if not isinstance(value, list):
            return [f"{path}: want a list"]
        return [p for i, item in enumerate(value) for p in _schema_problems(item, schema[0], f"{path}[{i}]")]
    if isinstance(schema, tuple):
        return [] if value in schema else [f"{path}: {value!r} not one of {schema}"]
    return [] if isinstance(value, schema) else [f"{path}: want {schema.__name__}"]  # type: ignore[union-attr]


def test_daemonset_manifest_validates() -> None:
    """Against the API's fields and types for what it uses (always), and with kubectl where one is
    installed: kubectl decodes it into its typed object (no API server: `set env --local`), and a field
    it does not know, or of the wrong type, is missing from its output or fails. The plugin's command
    line uses only flags the plugin documents."""
    manifest = DEPLOY / "kubernetes/nvc-py-device-plugin.yaml"
    original = yaml.safe_load(manifest.read_text())
    assert _schema_problems(original, _DAEMONSET) == []
    template = original["spec"]["template"]
    assert original["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    plugin, exporter = template["spec"]["containers"]
    for container in (plugin, exporter):
        assert {m["name"] for m in container["volumeMounts"]} <= {v["name"] for v in template["spec"]["volumes"]}
    kubectl = shutil.which("kubectl")
    if kubectl is not None:
        typed = subprocess.run([kubectl, "set", "env", "--local", "-f", str(manifest), "NVC_PY_CHECKED=1", "-o",
                                "json"], check=True, capture_output=True, text=True).stdout
        assert _missing(original, json.loads(typed)) == []
    command = plugin["command"] + plugin.get("args", [])
    assert command[:5] == ["chroot", "/host", "/usr/local/bin/nvc-py", "k8s", "device-plugin"]
    assert set(_flags(command)) <= set(_help().split())
    command = exporter["command"]
    assert command[:4] == ["chroot", "/host", "/usr/local/bin/nvc-py", "exporter"]
    assert set(_flags(command)) <= set(_help("exporter").split())
    port = command[command.index("--listen") + 1].rpartition(":")[2]
    assert exporter["ports"] == [{"name": "metrics", "containerPort": int(port), "protocol": "TCP"}]
    assert template["spec"]["hostNetwork"] is True  # the hook server's socket is the node's network namespace's
    for container in (plugin, exporter):
        assert container["securityContext"]["privileged"] is True
        assert "/host" in {m["mountPath"] for m in container["volumeMounts"]}


def test_the_schema_check_finds_what_kubectl_would_refuse() -> None:
    manifest = yaml.safe_load((DEPLOY / "kubernetes/nvc-py-device-plugin.yaml").read_text())
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["volumeMount"] = container.pop("volumeMounts")                 # a misspelt field
    container["securityContext"]["privileged"] = "yes"                      # a wrong type
    manifest["spec"]["updateStrategy"]["type"] = "Rolling"                  # a value it does not take
    assert sorted(_schema_problems(manifest, _DAEMONSET)) == [
        ".spec.template.spec.containers[0].securityContext.privileged: want bool",
        ".spec.template.spec.containers[0].volumeMount: unknown field",
        ".spec.updateStrategy.type: 'Rolling' not one of ('RollingUpdate', 'OnDelete')"]


def _missing(original: object, decoded: object, path: str = "") -> list[str]:
    """Paths of ``original`` that ``decoded`` lacks or has otherwise (typed decoding drops unknown fields)."""
    if isinstance(original, dict):
        if not isinstance(decoded, dict):
            return [path]
        return [p for key, value in original.items() for p in _missing(value, decoded.get(key), f"{path}.{key}")]
    if isinstance(original, list):
        if not isinstance(decoded, list) or len(decoded) != len(original):
            return [path]
        return [p for i, value in enumerate(original) for p in _missing(value, decoded[i], f"{path}[{i}]")]
    return [] if original == decoded else [path]


def test_systemd_unit_runs_the_plugin_with_documented_flags() -> None:
    unit = (DEPLOY / "systemd/nvc-py-device-plugin.service").read_text()
    (exec_start,) = [line.partition("=")[2].split() for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert exec_start[:3] == ["/usr/lib/nvc-py/nvc-py", "k8s", "device-plugin"]
    assert set(_flags(exec_start)) <= set(_help().split())
    assert "Restart=always" in unit and "After=kubelet.service" in unit


def test_the_cli_loads_no_grpc_until_the_plugin_runs() -> None:
    """`nvc-py k8s --help` (and every other command) imports the k8s group only: no gRPC, no protobuf."""
    launcher = Path("/usr/lib/nvc-py/nvc-py-python")
    interpreter = launcher.read_text().splitlines()[0][2:].split(" ", 1)[0]
    result = subprocess.run([interpreter, "-IS", "-X", "importtime", str(launcher), "k8s", "--help"],
                            capture_output=True, text=True, check=True)
    assert "device-plugin" in result.stdout
    imported = {line.rpartition("|")[2].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "nvc.k8s.command" in imported
    assert not {name for name in imported if name.split(".")[0] in ("grpc", "google") or name in
                ("nvc.k8s.service", "nvc.k8s.daemon", "nvc.k8s.resources")}


class _Nvml:
    """Just the NVML calls topology() makes, answering for 3 GPUs: 0 and 1 joined by 2 NVLinks, and
    PCI levels 20 (0-1), 50 (0-2, 1-2). Only what a fake driver cannot show here (it has no NVLink)."""

    class NVMLError(Exception):
        pass

    NVML_NVLINK_MAX_LINKS = 4
    NVML_FEATURE_ENABLED = 1
    LINKS = {(0, 0): 1, (0, 1): 1, (1, 0): 0, (1, 1): 0}  # (GPU, link) -> peer

    class Pci:
        def __init__(self, bus: int) -> None:
            self.domain, self.bus, self.device = 0, bus, 0

    def __init__(self) -> None:
        self.nvml = self

    def call(self, name: str, *args: object) -> object:
        return {"nvmlDeviceGetCount": lambda: 3, "nvmlDeviceGetHandleByIndex": lambda i: i,
                "nvmlDeviceGetUUID": lambda h: f"GPU-{h}", "nvmlDeviceGetPciInfo": lambda h: self.Pci(h + 1)}[name](*args)

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return 20 if {a, b} == {0, 1} else 50

    def nvmlDeviceGetNvLinkState(self, gpu: int, link: int) -> int:
        if (gpu, link) not in self.LINKS:
            raise self.NVMLError("no such link")
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, gpu: int, link: int) -> object:
        return self.Pci(self.LINKS[gpu, link] + 1)


def test_topology_counts_nvlinks_before_pci_levels() -> None:
    from nvc.rpc.nvml_events import topology

    levels = topology(_Nvml())
    assert levels == {"GPU-0": {"GPU-1": -2, "GPU-2": 50}, "GPU-1": {"GPU-0": -2, "GPU-2": 50},
                      "GPU-2": {"GPU-0": 50, "GPU-1": 50}}
    gpus = resources.plan(tuple(_gpu(i) for i in range(3)), K8S)[0]
    assert resources.preferred(gpus, ["GPU-2", "GPU-1", "GPU-0"], [], 2, levels) == ["GPU-0", "GPU-1"]
