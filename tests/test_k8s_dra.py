"""The DRA driver (``nvc-py k8s dra-driver``) on the fake driver, against an API server stand-in over HTTPS
(tests/harness/apiserver.py) and the kubelet's gRPC calls made for real over its unix sockets.

The fake two-gpu-mig machine: the H100 is one whole GPU (gpu-0), the MIG-enabled A100 gives its two MIG
devices (mig-1-0, mig-1-1) and no whole device. Here: registration, ResourceSlices, preparing claims into
CDI specs, sharing parameters, errors per claim, and the checkpoint across a restart.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.deviceplugin import in_child
from harness.dra import DRIVER, NODE, api_server, call, kubelet_dir, registered, run_driver  # noqa: F401  (fixtures)
from harness.fakegpus import A100, DRIVER_VERSION, H100, MIG_2G, MIG_3G

GIB = 1 << 30


def _attributes(slices: list[dict]) -> dict[str, dict]:
    return {
        d["name"]: {k: next(iter(v.values())) for k, v in d["attributes"].items()}
        for s in slices
        for d in s["spec"]["devices"]
    }


def test_registers_and_publishes_the_nodes_devices(active_2gpu, kubelet_dir: Path, run_driver, api_server) -> None:
    """GetInfo names a DRAPlugin of v1 on the DRA socket; one ResourceSlice of the node's pool, owned by
    its Node, with the attributes CEL selects on; a slice removed behind the driver's back comes back."""
    run = run_driver(active_2gpu.root)
    run.wait_log(r"published 3 devices(.*\n)*.*serving " + DRIVER)
    info = in_child(registered, kubelet_dir)
    assert info == {
        "type": "DRAPlugin",
        "name": DRIVER,
        "endpoint": str(kubelet_dir / "plugins" / DRIVER / "dra.sock"),
        "versions": ["v1.DRAPlugin"],
    }
    run.wait_log(rf"the kubelet registered {DRIVER}")
    (published,) = api_server.slices()
    assert published["metadata"]["name"] == f"{NODE}-{DRIVER}-0"
    assert published["metadata"]["ownerReferences"][0]["kind"] == "Node"
    spec = published["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"], spec["pool"]["resourceSliceCount"]) == (
        DRIVER,
        NODE,
        NODE,
        1,
    )
    found = _attributes([published])
    assert set(found) == {"gpu-0", "mig-1-0", "mig-1-1"}  # the MIG-enabled A100 is no whole device
    h100 = found["gpu-0"]
    assert h100["uuid"] == H100 and h100["type"] == "gpu" and h100["index"] == 0
    assert h100["productName"].startswith("NVIDIA H100") and h100["architecture"] == "Hopper"
    assert h100["cudaComputeCapability"] == "9.0.0"
    assert h100["driverVersion"] == ".".join(str(int(p)) for p in DRIVER_VERSION.split("."))
    assert h100["cudaDriverVersion"].count(".") == 2 and h100["pciBusID"].count(":") == 2
    migs = {found[n]["uuid"]: found[n] for n in ("mig-1-0", "mig-1-1")}
    assert set(migs) == {MIG_2G, MIG_3G}
    assert migs[MIG_2G]["migProfile"] == "2g.10gb" and migs[MIG_2G]["parentUUID"] == A100
    assert migs[MIG_3G]["architecture"] == "Ampere"
    capacity = {d["name"]: d.get("capacity", {}).get("memory", {}).get("value") for d in spec["devices"]}
    assert capacity["gpu-0"] == "80Gi"
    generation = spec["pool"]["generation"]

    api_server.client().request("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{published['metadata']['name']}")
    run.wait_log(r"published 3 devices.*\n(.*\n)*.*published 3 devices")
    (again,) = api_server.slices()
    assert again["spec"]["devices"] == spec["devices"] and again["spec"]["pool"]["generation"] >= generation


def test_prepare_writes_the_claims_cdi_spec_and_survives_a_restart(
    active_2gpu, kubelet_dir: Path, run_driver, api_server
) -> None:
    """A claim of the H100 becomes a CDI spec of its own (the H100's device nodes, the driver's files and
    hooks from nvc-py's generator); a restarted driver answers it from its checkpoint (the API server
    no longer has it) and unprepares it: the spec goes; unpreparing again is no error."""
    run = run_driver(active_2gpu.root)
    run.wait_log(r"serving " + DRIVER)
    endpoint = str(kubelet_dir / "plugins" / DRIVER / "dra.sock")
    claim = api_server.add_claim("one-gpu", ["gpu-0"])
    uid = claim[1]
    answer = in_child(call, endpoint, "prepare", [claim])
    assert answer == {uid: [(["gpu"], NODE, "gpu-0", [f"{DRIVER}/claim={uid}-gpu-0"])]}
    spec_path = run_driver.cdi / f"{DRIVER}-claim_{uid}.json"
    spec = json.loads(spec_path.read_text())
    assert spec["kind"] == f"{DRIVER}/claim" and [d["name"] for d in spec["devices"]] == [f"{uid}-gpu-0"]
    nodes = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert nodes == ["/dev/nvidia0"]  # the H100 (minor 0), not the A100
    common = spec["containerEdits"]
    assert "/dev/nvidiactl" in [n["path"] for n in common["deviceNodes"]]
    assert any(m["containerPath"].endswith("libcuda.so." + DRIVER_VERSION) for m in common["mounts"])
    assert {h["args"][1] for h in common["hooks"]} == {"create-symlinks", "update-ldcache"}

    assert run.stop() == 0
    api_server.client().request("DELETE", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/one-gpu")
    again = run_driver(active_2gpu.root)
    again.wait_log(r"1 claims prepared before")
    again.wait_log(r"serving " + DRIVER)  # the slices are as they were: not published again
    assert in_child(call, endpoint, "prepare", [claim]) == answer  # from the checkpoint
    assert in_child(call, endpoint, "unprepare", [claim]) == {uid: ""}
    assert not spec_path.exists()
    assert in_child(call, endpoint, "unprepare", [claim]) == {uid: ""}
    assert json.loads((kubelet_dir / "plugins" / DRIVER / "checkpoint.json").read_text())["claims"] == {}


def _sharing(memory: object = "4Gi", **more: object) -> list[dict]:
    parameters = {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuSharingConfig", "memoryLimit": memory, **more}
    return [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": parameters}}]


def test_shared_claim_carries_its_limits_and_bad_ones_fail_alone(
    active_2gpu, kubelet_dir: Path, run_driver, api_server
) -> None:
    """A claim with a GpuSharingConfig: its device as nvc-py's hook reads a share (the device and each limit
    as /dev/null volume mounts, the limits in the env), keyed by the device's UUID. A claim whose config is
    wrong, unknown or more than the device has, or that is not allocated, fails with the field named,
    beside a good claim of the same call."""
    run = run_driver(active_2gpu.root, "{device-list-strategy: volume-mounts}")
    run.wait_log(r"serving " + DRIVER)
    endpoint = str(kubelet_dir / "plugins" / DRIVER / "dra.sock")
    shared = api_server.add_claim(
        "shared", ["gpu-0"], _sharing("4Gi", computeShare=50, weight=3, latencyClass="batch", backend="timeslice")
    )
    bad_size = api_server.add_claim("bad-size", ["mig-1-0"], _sharing("lots"))
    unknown = api_server.add_claim("unknown", ["mig-1-0"], _sharing("1Gi", memorylimit="2Gi"))
    too_big = api_server.add_claim("too-big", ["mig-1-1"], _sharing("100Gi"))
    pending = api_server.add_claim("pending", ["mig-1-0"], allocated=False)
    answer = in_child(call, endpoint, "prepare", [shared, bad_size, unknown, too_big, pending])
    assert answer[shared[1]] == [(["gpu"], NODE, "gpu-0", [f"{DRIVER}/claim={shared[1]}-gpu-0"])]
    assert "config[0].opaque.parameters.memoryLimit='lots': not a size" in answer[bad_size[1]]
    assert "config[0].opaque.parameters.memorylimit: unknown field" in answer[unknown[1]]
    assert "memoryLimit: 107374182400 bytes is more than " + MIG_3G in answer[too_big[1]]
    assert answer[pending[1]] == "input error: claim default/pending: not allocated"
    assert sorted(p.name for p in run_driver.cdi.iterdir()) == [f"{DRIVER}-claim_{shared[1]}.json"]

    spec = json.loads((run_driver.cdi / f"{DRIVER}-claim_{shared[1]}.json").read_text())
    assert "containerEdits" not in spec  # the hook injects the GPU, its files and the shim
    (device,) = spec["devices"]
    limits = {
        f"NVC_SHARE_MEMORY_LIMIT_{H100}": str(4 * GIB),
        f"NVC_SHARE_COMPUTE_{H100}": "50",
        f"NVC_SHARE_WEIGHT_{H100}": "3",
        f"NVC_SHARE_PRIORITY_{H100}": "batch",
        f"NVC_SHARE_BACKEND_{H100}": "timeslice",
    }
    assert sorted(device["containerEdits"]["env"]) == sorted(f"{k}={v}" for k, v in limits.items())
    mounts = device["containerEdits"]["mounts"]
    assert {m["hostPath"] for m in mounts} == {"/dev/null"}
    assert [m["containerPath"] for m in mounts] == [f"/var/run/nvidia-container-devices/{H100}"] + [
        f"/var/run/nvidia-container-devices/share/{k}={v}" for k, v in sorted(limits.items())
    ]
    assert in_child(call, endpoint, "unprepare", [shared, bad_size]) == {shared[1]: "", bad_size[1]: ""}
    assert list(run_driver.cdi.iterdir()) == []
