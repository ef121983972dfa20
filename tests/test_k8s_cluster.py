"""The device plugin (``nvc-py k8s device-plugin``) on a real kubelet: the one-node test cluster
(tests/harness/k8scluster.py: Kubernetes and containerd 2 at pinned releases, the fake two-GPU machine as
the node's GPUs, every pod run through nvc-py-runtime and its hook).

Here: pods asking ``nvidia.com/gpu``, a MIG profile and ``nvc-py.io/gpu-share`` are scheduled and see, from
inside, exactly their GPU and limits; a pod asking for none gets none under the volume-mounts strategy;
the plugin registers again after a kubelet restart and after its own, and a running pod keeps its GPU;
a GPU made unhealthy by an XID is no longer allocated. The kubelet stand-in's tests
(test_k8s_allocation.py, test_k8s_health.py) cover the plugin's answers in detail, faster.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.deviceplugin import XID_FILE, PluginRun
from harness.fakegpus import A100, H100, MIG_3G, uuids
from harness.k8scluster import IMAGE, NODE, Cluster, wait_until

GIB = 1 << 30
REPO = Path(__file__).resolve().parent.parent
# The node configuration docs/kubernetes.md installs: volume mounts believed, an unprivileged pod's own env not.
NODE_CONFIG = (REPO / "deploy/config.yaml").read_text()
SHOW = [
    "sh",
    "-c",
    "nvidia-smi -L 2>&1; ls /dev | grep '^nvidia[0-9]' || true; "
    "grep -h memory_limit /var/run/nvc-share/limits 2>/dev/null || true",
]
SLEEP = ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait $!"]


@pytest.fixture
def plugin(k8s_cluster: Cluster, tmp_path: Path) -> Iterator[Callable[..., PluginRun]]:
    """start(k8s options): nvc-py configured as deploy/config.yaml with ``options`` added to its ``k8s:``
    section, the installed plugin started in the node and registered with its kubelet; every plugin
    stopped at the end (status 0), the configuration reset."""
    runs: list[PluginRun] = []

    def start(**options: str) -> PluginRun:
        assert NODE_CONFIG.rstrip().endswith("device-list-strategy: volume-mounts")  # k8s: is its last section
        k8s_cluster.configure_nvc(
            NODE_CONFIG + "".join(f"  {key.replace('_', '-')}: {value}\n" for key, value in options.items())
        )
        run = PluginRun(
            k8s_cluster.nvc_config,
            k8s_cluster.device_plugin_dir,
            tmp_path / f"plugin{len(runs)}.log",
            wrap=k8s_cluster.node_command,
        )
        runs.append(run)
        run.wait_log(r"registered nvidia\.com/gpu", timeout=30)
        return run

    yield start
    for run in runs:
        assert run.stop() == 0, run.text()
    k8s_cluster.configure_nvc("")


def _pod(
    namespace: str, name: str, command: list[str], limits: dict[str, int], env: dict[str, str] | None = None
) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "command": command,
                    "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
                    "resources": {"limits": {k: str(v) for k, v in limits.items()}},
                }
            ],
        },
    }


def _allocatable(cluster: Cluster, resource: str, count: int, timeout: float = 60) -> None:
    """Wait for the node to offer ``count`` of ``resource`` (the kubelet counts healthy devices only)."""

    def offered() -> bool:
        return cluster.get("node", NODE)["status"].get("allocatable", {}).get(resource) == str(count)

    wait_until(f"{count} {resource} allocatable", offered, timeout)


def _unschedulable(cluster: Cluster, namespace: str, name: str) -> str:
    """The scheduler's reason for leaving the pod Pending."""

    def reason() -> str | None:
        for condition in cluster.pod(namespace, name).get("status", {}).get("conditions", []):
            if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
                return condition.get("message", "")
        return None

    return wait_until("the scheduler's reason", reason, 60)


def _devices(out: str) -> set[str]:
    return {word for word in out.split() if word.startswith("nvidia") and word[6:].isdigit()}


def test_pods_see_their_gpu_their_mig_device_and_none_when_they_ask_none(k8s_cluster: Cluster, plugin) -> None:
    """The H100 as nvidia.com/gpu, the A100's 3g.20gb MIG device as its profile's resource: each pod sees that
    device only; a pod asking for no GPU whose own env says all (as CUDA images do) gets none."""
    plugin()
    _allocatable(k8s_cluster, "nvidia.com/mig-3g.20gb", 1)
    with k8s_cluster.namespace("plugin") as ns:
        k8s_cluster.apply(
            _pod(ns, "gpu", SHOW, {"nvidia.com/gpu": 1}),
            _pod(ns, "mig", SHOW, {"nvidia.com/mig-3g.20gb": 1}),
            _pod(ns, "none", SHOW, {}, {"NVIDIA_VISIBLE_DEVICES": "all"}),
        )
        seen = {}
        for name in ("gpu", "mig", "none"):
            k8s_cluster.wait_phase(ns, name, "Succeeded")
            seen[name] = k8s_cluster.logs(ns, name)
    assert uuids(seen["gpu"]) == [H100] and _devices(seen["gpu"]) == {"nvidia0"}, seen["gpu"]
    # nvidia-smi -L lists a MIG device under its GPU: the A100 and that MIG device, not the other one
    assert uuids(seen["mig"]) == [A100, MIG_3G] and _devices(seen["mig"]) == {"nvidia1"}, seen["mig"]
    assert uuids(seen["none"]) == [] and _devices(seen["none"]) == set(), seen["none"]


def test_a_pod_sees_the_memory_limit_of_its_gpu_shares(k8s_cluster: Cluster, plugin) -> None:
    """The H100 shared in 8 GiB units: a pod asking 2 sees the H100 and a 16 GiB limit, not the limit its own
    env claims."""
    plugin(share_gpus=f"[{H100}]", share_slice="8Gi")
    _allocatable(k8s_cluster, "nvc-py.io/gpu-share", 10)
    _allocatable(k8s_cluster, "nvidia.com/gpu", 0)  # a shared GPU is no whole one
    with k8s_cluster.namespace("plugin") as ns:
        own = {f"NVC_SHARE_MEMORY_LIMIT_{H100}": str(64 * GIB)}
        k8s_cluster.apply(_pod(ns, "share", SHOW, {"nvc-py.io/gpu-share": 2}, own))
        k8s_cluster.wait_phase(ns, "share", "Succeeded")
        out = k8s_cluster.logs(ns, "share")
    assert uuids(out) == [H100] and str(16 * GIB) in out and str(64 * GIB) not in out, out


def _supports_user_namespaces(cluster: Cluster) -> bool:
    """Whether the node's default runtime handler says it supports user namespaces (containerd 2 does
    for a runc whose ``runc features`` show ``user`` namespaces and idmapped mounts)."""
    handlers = cluster.get("node", NODE)["status"].get("runtimeHandlers", [])
    return any(h.get("name", "") == "" and h.get("features", {}).get("userNamespaces") for h in handlers)


def _sandbox_failure(cluster: Cluster, namespace: str) -> str:
    """The kubelet's reason for not creating a pod sandbox in ``namespace`` (its event's message)."""

    def message() -> str | None:
        events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json"))["items"]
        return next((e["message"] for e in events if e.get("reason") == "FailedCreatePodSandBox"), None)

    return wait_until("FailedCreatePodSandBox event", message, 60)


def _runc_without_idmap() -> str:
    """What the node's runc (nvc-py-runtime's) is and says of idmapped mounts."""
    version = subprocess.run(["runc", "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    linux = json.loads(subprocess.run(["runc", "features"], capture_output=True, text=True).stdout or "{}").get(
        "linux", {}
    )
    idmap = (linux.get("mountExtensions") or {}).get("idmap")
    return f"{' '.join(version) or 'runc'}, whose `runc features` give linux.mountExtensions.idmap: {idmap}"


def test_a_pod_without_host_users_sees_its_gpu(k8s_cluster: Cluster, plugin) -> None:
    """A GPU pod with ``hostUsers: false`` (its own user namespace, #51): the H100, its node and libcuda in
    its ld cache, and a uid map that is not the host's identity map. Skipped, with the kubelet's own
    reason, where containerd says its runtime cannot give a pod a user namespace."""
    plugin()
    _allocatable(k8s_cluster, "nvidia.com/gpu", 1)
    show = [SHOW[0], SHOW[1], SHOW[2] + "; ldconfig -p | grep -o 'libcuda.so.1 (.*'; cat /proc/self/uid_map"]
    pod = _pod("", "userns", show, {"nvidia.com/gpu": 1})
    pod["spec"]["hostUsers"] = False
    with k8s_cluster.namespace("userns") as ns:
        pod["metadata"]["namespace"] = ns
        k8s_cluster.apply(pod)
        if not _supports_user_namespaces(k8s_cluster):
            pytest.skip(
                f"kubelet: {_sandbox_failure(k8s_cluster, ns)}: containerd 2.2 reports user namespaces only for a "
                "runtime whose `runc features` list the user namespace and idmapped mounts "
                f"(linux.mountExtensions.idmap, runc 1.2 and later); the node's runc is {_runc_without_idmap()}. "
                "A hostUsers: false pod needs runc 1.2 or later as nvc-py-runtime's runc, and on this test node "
                "a /proc with nothing mounted over it: with runc 1.2.6 the kubelet accepts the pod, and runc "
                "cannot mount the pod's fresh /proc in its user namespace (EPERM) while the fake driver's "
                "/proc/driver/nvidia and /proc/devices and the kubelet's /proc/sys files cover parts of the node's"
            )
        k8s_cluster.wait_phase(ns, "userns", "Succeeded")
        out = k8s_cluster.logs(ns, "userns")
    assert uuids(out) == [H100] and _devices(out) == {"nvidia0"}, out
    assert "libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1" in out, out
    uid_map = [line.split() for line in out.splitlines() if line.split()[:1] == ["0"]]
    assert len(uid_map) == 1 and uid_map[0] != ["0", "0", "4294967295"], out


def test_restarts_of_the_kubelet_and_the_plugin_keep_a_running_pod_and_its_gpu(
    k8s_cluster: Cluster, plugin, tmp_path: Path
) -> None:
    """A pod holding the H100 runs on, with the same container, through a kubelet restart (the plugin
    registers with the new kubelet) and a plugin restart; the GPU stays its own: a second pod asking for one
    is left Pending."""
    first = plugin()
    _allocatable(k8s_cluster, "nvidia.com/gpu", 1)
    with k8s_cluster.namespace("plugin") as ns:
        k8s_cluster.apply(_pod(ns, "holds", SLEEP, {"nvidia.com/gpu": 1}))
        (before,) = k8s_cluster.wait_phase(ns, "holds", "Running")["status"]["containerStatuses"]

        k8s_cluster.restart_kubelet()
        wait_until("registration with the new kubelet", lambda: first.text().count("registered nvidia.com/gpu") > 1, 60)
        first.stop()
        plugin()
        _allocatable(k8s_cluster, "nvidia.com/gpu", 1)

        (after,) = k8s_cluster.wait_phase(ns, "holds", "Running")["status"]["containerStatuses"]
        assert after["containerID"] == before["containerID"] and after["restartCount"] == 0, after
        k8s_cluster.apply(_pod(ns, "waits", SLEEP, {"nvidia.com/gpu": 1}))
        assert "Insufficient nvidia.com/gpu" in _unschedulable(k8s_cluster, ns, "waits")


def test_a_gpu_an_xid_made_unhealthy_is_not_allocated(k8s_cluster: Cluster, plugin) -> None:
    """A critical XID (79) on the H100 through the fake NVML's events: the node offers no nvidia.com/gpu and a
    pod asking for one stays Pending; the A100's MIG devices are still offered."""
    xids = k8s_cluster.fake.root / XID_FILE
    made = next(p for p in reversed(xids.parents) if not p.exists())  # the first directory made here
    xids.parent.mkdir(parents=True)
    xids.write_text("")
    xids.chmod(0o644)  # read by the driver helper, which runs as nobody
    try:
        run = plugin(xid_recovery="0")
        _allocatable(k8s_cluster, "nvidia.com/gpu", 1)
        with xids.open("a") as f:
            f.write(f"{H100} 79\n")
        run.wait_log(f"health: XID 79 on {H100}: unhealthy")
        _allocatable(k8s_cluster, "nvidia.com/gpu", 0)
        _allocatable(k8s_cluster, "nvidia.com/mig-3g.20gb", 1)
        with k8s_cluster.namespace("plugin") as ns:
            k8s_cluster.apply(_pod(ns, "waits", SLEEP, {"nvidia.com/gpu": 1}))
            assert "Insufficient nvidia.com/gpu" in _unschedulable(k8s_cluster, ns, "waits")
    finally:
        shutil.rmtree(made)  # the fake driver is the session's: leave it as it was


def test_a_stopped_cluster_leaves_nothing_behind(
    k8s_cluster: Cluster, fake_2gpu, rootfs_cache, tmp_path_factory: pytest.TempPathFactory, session_dir: str
) -> None:
    """A second cluster, stopped while a pod of its runs: none of its processes (its programs, the pod's
    container, the shim) runs on, and no mount, cgroup or host iptables rule of it is left (what the
    fixture's teardown checks of the session's cluster at the end)."""
    other = Cluster(tmp_path_factory.mktemp("k8s-other"), k8s_cluster.bin, fake_2gpu, rootfs_cache, session_dir)
    try:
        other.boot()
        other.kubectl("create", "namespace", "left")
        wait_until(
            "default ServiceAccount", lambda: other.kubectl("get", "sa", "default", "-n", "left", check=False), 30
        )
        other.apply(_pod("left", "runs", SLEEP, {}))
        other.wait_phase("left", "runs", "Running")
        running = other.node_processes()
        names = {Path(f"/proc/{pid}/comm").read_text().strip() for pid, _ in running}
        assert {"kubelet", "containerd", "containerd-shim", "sleep"} <= names, names
    finally:
        left = other.stop()
    assert left == []
    assert other.node_processes() == set()
