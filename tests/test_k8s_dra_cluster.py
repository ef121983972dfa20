"""The DRA driver (``nvc-py k8s dra-driver``) in the one-node test cluster (tests/harness/k8scluster.py:
Kubernetes and containerd 2, which injects CDI devices, at pinned releases; the fake two-GPU machine as
the node's GPUs; every pod run through nvc-py-runtime and its hook).

Here: a pod whose claim comes from a ResourceClaimTemplate with a CEL selector runs with that GPU and
only it; two pods sharing one claim with a memory limit each see the limit; a claim no device satisfies
leaves its pod Pending with the scheduler's reason; deleting a pod unprepares its claim (its CDI spec
goes). The API server stand-in's tests (test_k8s_dra.py) cover the rest, faster.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("harness.k8scluster", reason="the one-node cluster fixture (branch k8s) is not here")

from harness.dra import DRIVER, DriverRun  # noqa: E402
from harness.fakegpus import H100, uuids  # noqa: E402
from harness.k8scluster import IMAGE, NODE, Cluster, wait_until  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
GIB = 1 << 30
SHOW = [
    "sh",
    "-c",
    "nvidia-smi -L 2>&1; ls /dev | grep '^nvidia[0-9]' || true; "
    "grep -h memory_limit /var/run/nvc-share/limits 2>/dev/null || true",
]
SLEEP = ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait $!"]
H100_CEL = f'device.attributes["{DRIVER}"].productName.startsWith("NVIDIA H100")'


@pytest.fixture
def dra(k8s_cluster: Cluster, tmp_path: Path) -> Iterator[DriverRun]:
    """The installed driver on the cluster's kubelet (nvc-py's configuration: volume mounts accepted),
    its DeviceClasses applied and its ResourceSlice published; stopped at the end."""
    k8s_cluster.configure_nvc("accept-volume-mounts: true\nk8s: {device-list-strategy: volume-mounts}\n")
    k8s_cluster.kubectl("apply", "-f", str(REPO / "deploy/kubernetes/nvc-py-dra-deviceclasses.yaml"))
    run = DriverRun(
        k8s_cluster.nvc_config,
        k8s_cluster.kubelet_dir,
        k8s_cluster.cdi_dir,
        k8s_cluster.kubeconfig,
        tmp_path / "dra-driver.log",
        node=NODE,
        wrap=k8s_cluster.node_command,
    )
    run.wait_log(rf"the kubelet registered {DRIVER}", timeout=60)
    wait_until("the node's ResourceSlice", lambda: k8s_cluster.get("resourceslices")["items"], 60)
    yield run
    assert run.stop() == 0, run.text()
    k8s_cluster.configure_nvc("")


def _pod(namespace: str, name: str, command: list[str], claim: dict[str, str]) -> dict:
    """A pod with one claim, ``claim``: {"resourceClaimTemplateName": …} or {"resourceClaimName": …}."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False,
            "resourceClaims": [{"name": "gpu", **claim}],
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "command": command,
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def _claim_spec(expression: str, config: list[dict] | None = None) -> dict:
    return {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {"deviceClassName": DRIVER, "selectors": [{"cel": {"expression": expression}}]},
                }
            ],
            **({"config": config} if config else {}),
        }
    }


def _template(namespace: str, name: str, expression: str) -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": _claim_spec(expression)},
    }


def _spec_files(cluster: Cluster) -> list[str]:
    return sorted(p.name for p in cluster.cdi_dir.glob(f"{DRIVER}-claim_*.json"))


def test_a_template_claim_gets_the_gpu_its_cel_selects_and_goes_with_its_pod(
    k8s_cluster: Cluster, dra: DriverRun
) -> None:
    """The H100 by its product name: the pod sees it and nothing else; its claim's CDI spec is there while
    the pod runs and removed once the pod is deleted."""
    with k8s_cluster.namespace("dra") as ns:
        k8s_cluster.apply(
            _template(ns, "h100", H100_CEL), _pod(ns, "sees", SHOW, {"resourceClaimTemplateName": "h100"})
        )
        # the scheduler takes pods made together in no set order: the second once the first has the H100
        wait_until("sees scheduled", lambda: k8s_cluster.pod(ns, "sees")["spec"].get("nodeName"), 60)
        k8s_cluster.apply(_pod(ns, "holds", SLEEP, {"resourceClaimTemplateName": "h100"}))
        k8s_cluster.wait_phase(ns, "sees", "Succeeded")
        out = k8s_cluster.logs(ns, "sees")
        assert uuids(out) == [H100] and "nvidia0" in out.split() and "nvidia1" not in out.split(), out
        # the only H100 is the first pod's until it is unprepared: the second runs after it
        k8s_cluster.kubectl("delete", "pod", "-n", ns, "sees", "--wait=true")
        holds = k8s_cluster.wait_phase(ns, "holds", "Running", timeout=120)
        (status,) = holds["status"]["resourceClaimStatuses"]
        claim = k8s_cluster.get("resourceclaim", status["resourceClaimName"], ns)
        assert _spec_files(k8s_cluster) == [f"{DRIVER}-claim_{claim['metadata']['uid']}.json"]
        k8s_cluster.kubectl("delete", "pod", "-n", ns, "holds", "--wait=true")
        wait_until("the claim's CDI spec removed", lambda: not _spec_files(k8s_cluster), 60)
        dra.wait_log(rf"unprepared {ns}/{status['resourceClaimName']}")


def test_two_pods_sharing_one_claim_each_see_its_memory_limit(k8s_cluster: Cluster, dra: DriverRun) -> None:
    config = [
        {
            "opaque": {
                "driver": DRIVER,
                "parameters": {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuSharingConfig", "memoryLimit": "4Gi"},
            }
        }
    ]
    with k8s_cluster.namespace("dra") as ns:
        k8s_cluster.apply(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "shared", "namespace": ns},
                "spec": _claim_spec(H100_CEL, config),
            },
            _pod(ns, "holds", SLEEP, {"resourceClaimName": "shared"}),
            _pod(ns, "one", SHOW, {"resourceClaimName": "shared"}),
            _pod(ns, "two", SHOW, {"resourceClaimName": "shared"}),
        )
        # the claim controller deallocates a claim once no pod it is reserved for runs: one holds it
        k8s_cluster.wait_phase(ns, "holds", "Running")
        for name in ("one", "two"):
            k8s_cluster.wait_phase(ns, name, "Succeeded")
            out = k8s_cluster.logs(ns, name)
            assert uuids(out) == [H100] and str(4 * GIB) in out, out
        claim = k8s_cluster.get("resourceclaim", "shared", ns)
        assert [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]] == ["gpu-0"]


def test_a_claim_no_device_satisfies_leaves_its_pod_pending(k8s_cluster: Cluster, dra: DriverRun) -> None:
    with k8s_cluster.namespace("dra") as ns:
        k8s_cluster.apply(
            _template(ns, "none", f'device.attributes["{DRIVER}"].productName == "NVIDIA B200"'),
            _pod(ns, "waits", SLEEP, {"resourceClaimTemplateName": "none"}),
        )

        def unschedulable() -> str | None:
            pod = k8s_cluster.pod(ns, "waits")
            for condition in pod.get("status", {}).get("conditions", []):
                if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
                    return condition.get("message", "")
            return None

        message = wait_until("the scheduler's reason", unschedulable, 60)
        assert "cannot allocate all claims" in message, message
        assert k8s_cluster.pod(ns, "waits")["status"]["phase"] == "Pending"
        assert not _spec_files(k8s_cluster), json.dumps(k8s_cluster.get("resourceclaims", namespace=ns))
