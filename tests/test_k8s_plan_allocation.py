"""The device plugin's pure parts: what is advertised, preferred (the topology) and allocated, and
health bookkeeping.

No gRPC server or channel here (tests/harness/deviceplugin.py says why those run in a child process).
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from harness.k8splan import GIB, K8S
from harness.k8splan import gpu as _gpu
from nvc import config, containerenv
from nvc.containerenv.sharing import share_env
from nvc.errors import InputError
from nvc.k8s import resources
from nvc.k8s.health import Health
from nvc.model.devices import MigDevice
from nvc.plan.fromenv import gpu_request, parse_share_env

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = Path(sysconfig.get_path("scripts"))


# ---------------------------------------------------------------- what is advertised


def test_plan_whole_mig_and_shares() -> None:
    mig = (
        MigDevice(0, 1, 0, "MIG-a", 10 * GIB, name="NVIDIA A100 MIG 2g.10gb"),
        MigDevice(1, 2, 0, "MIG-b", 10 * GIB, name="NVIDIA A100 MIG 2g.10gb"),
        MigDevice(2, 3, 0, "MIG-c", 5 * GIB, name="NVIDIA A100 MIG 1g.5gb"),
    )
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


@pytest.mark.parametrize(
    ("k8s", "message"),
    [
        (K8S._replace(share_gpus=("7",)), "k8s.share-gpus: '7' is no GPU of this host"),
        (K8S._replace(share_gpus=("all",), share_slice="1Mi"), "k8s.share-slice: 1Mi cuts GPU-0 into 81920 units"),
        (K8S._replace(share_resource="nvidia.com/gpu"), "resource nvidia.com/gpu named twice"),
    ],
)
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


@pytest.mark.parametrize(
    ("free", "size", "must", "want"),
    [
        ((4, 2), 2, (), {"GPU-1": 2}),  # the tightest fit keeps GPU-0's four units together
        ((4, 2), 3, (), {"GPU-0": 3}),
        ((4, 2), 2, ("GPU-0::3",), {"GPU-0": 2}),  # the GPU already holding the container's units
        ((4, 2), 5, (), {"GPU-0": 4, "GPU-1": 1}),  # no GPU holds 5: the fewest GPUs
        ((1, 3, 3), 3, (), {"GPU-1": 3}),
    ],
)
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
    topology = {
        a: {b: near.get((min(a, b), max(a, b)), 50) for b in ("GPU-0", "GPU-1", "GPU-2", "GPU-3") if b != a}
        for a in ("GPU-0", "GPU-1", "GPU-2", "GPU-3")
    }
    assert resources.preferred(gpus, ["GPU-0", "GPU-2", "GPU-3"], [], 2, topology) == ["GPU-2", "GPU-3"]
    assert resources.preferred(gpus, ["GPU-0", "GPU-2", "GPU-3"], [], 2, {}) == ["GPU-0", "GPU-2"]  # by index
    assert resources.preferred(gpus, ["GPU-1", "GPU-2", "GPU-3"], ["GPU-1"], 2, topology)[0] == "GPU-1"


def test_preferred_counts_an_id_given_twice_once_and_refuses_more_than_offered() -> None:
    """Found by tests/fuzz/fuzz_device_plugin.py: a size over the IDs offered ended in a ValueError
    (min() of no GPU sets) with a topology, and an ID given twice could be picked twice."""
    gpus = resources.plan(tuple(_gpu(i) for i in range(3)), K8S)[0]
    topology = {a: {b: 10 for b in ("GPU-0", "GPU-1", "GPU-2") if b != a} for a in ("GPU-0", "GPU-1", "GPU-2")}
    for levels in (topology, {}):
        assert resources.preferred(gpus, ["GPU-1", "GPU-1", "GPU-2"], ["GPU-2", "GPU-2"], 2, levels) == [
            "GPU-2",
            "GPU-1",
        ]
        with pytest.raises(InputError, match="nvidia.com/gpu: 3 devices asked for, 2 offered"):
            resources.preferred(gpus, ["GPU-0", "GPU-2", "GPU-0"], [], 3, levels)
    share, available = _shares(2)
    with pytest.raises(InputError, match="3 devices asked for, 2 offered"):
        resources.preferred(share, available + available, [], 3, {})


# ---------------------------------------------------------------- Allocate


def test_allocate_refuses_a_unit_named_twice() -> None:
    """A share unit named twice would grant its memory twice (found by tests/fuzz/fuzz_device_plugin.py)."""
    share = resources.plan((_gpu(0, 8),), K8S._replace(share_gpus=("all",), share_slice="4Gi"))[1]
    with pytest.raises(InputError, match="nvc-py.io/gpu-share: device ID 'GPU-0::1' named twice"):
        resources.allocate(share, ["GPU-0::1", "GPU-0::0", "GPU-0::1"], K8S)


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
    answers = [
        resources.allocate(whole, ["GPU-0"], k8s),
        resources.allocate(share, ["GPU-2::0", "GPU-1::0", "GPU-1::1"], k8s),
    ]
    mounts = [{"destination": dest, "source": src} for answer in answers for dest, src, _ in answer.mounts]
    policy = containerenv.Policy(accept_volume_mounts=True, accept_envvar_when_unprivileged=False)
    asked = gpu_request({"NVIDIA_VISIBLE_DEVICES": "void"}, mounts, False, policy, [])
    assert [s.text for s in asked.selectors] == ["GPU-0", "GPU-1", "GPU-2"]
    request = parse_share_env(share_env({}, mounts, policy))
    assert request.memory == (("GPU-1", 4 * GIB), ("GPU-2", 2 * GIB))
    assert request.compute == (("GPU-1", 50), ("GPU-2", 25)) and request.weight == (("GPU-1", 2), ("GPU-2", 1))
    from nvc.plan.share import limits_text

    assert limits_text(request).splitlines()[2:] == [
        f"memory_limit.GPU-1={4 * GIB}",
        f"memory_limit.GPU-2={2 * GIB}",
        "compute_percent.GPU-1=50",
        "compute_percent.GPU-2=25",
        "compute_weight.GPU-1=2",
        "compute_weight.GPU-2=1",
    ]


def test_allocate_strategies_and_cdi() -> None:
    gpus = resources.plan((_gpu(0), _gpu(1)), K8S)[0]
    plain = resources.allocate(gpus, ["GPU-1", "GPU-0"], K8S)
    assert plain == resources.Answer({"NVIDIA_VISIBLE_DEVICES": "GPU-0,GPU-1"})
    mounted = resources.allocate(gpus, ["GPU-1"], K8S._replace(device_list_strategy="volume-mounts", cdi_devices=True))
    assert mounted == resources.Answer(
        {"NVIDIA_VISIBLE_DEVICES": "void"},
        (("/var/run/nvidia-container-devices/GPU-1", "/dev/null", True),),
        ("nvidia.com/gpu=GPU-1",),
    )
    read_back = gpu_request(
        mounted.envs,
        [{"destination": dest, "source": src} for dest, src, _ in mounted.mounts],
        False,
        containerenv.Policy(accept_volume_mounts=True),
    )
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
    assert never.xid("GPU-0", 13, 0) and never.due(10**9) == []


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
        return {
            "nvmlDeviceGetCount": lambda: 3,
            "nvmlDeviceGetHandleByIndex": lambda i: i,
            "nvmlDeviceGetUUID": lambda h: f"GPU-{h}",
            "nvmlDeviceGetPciInfo": lambda h: self.Pci(h + 1),
        }[name](*args)

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
    assert levels == {
        "GPU-0": {"GPU-1": -2, "GPU-2": 50},
        "GPU-1": {"GPU-0": -2, "GPU-2": 50},
        "GPU-2": {"GPU-0": 50, "GPU-1": 50},
    }
    gpus = resources.plan(tuple(_gpu(i) for i in range(3)), K8S)[0]
    assert resources.preferred(gpus, ["GPU-2", "GPU-1", "GPU-0"], [], 2, levels) == ["GPU-0", "GPU-1"]
