"""The DRA driver's pure parts: its protocols as the kubelet defines them (and the generated code),
devices and ResourceSlices, the sharing parameters, a claim's CDI spec, the checkpoint, the manifests.

No gRPC server or channel here (tests/harness/deviceplugin.py says why those run in a child process).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nvc.errors import InputError
from nvc.model.devices import Gpu, MigDevice

REPO = Path(__file__).resolve().parent.parent
DRIVER = "gpu.nvc-py.io"
GIB = 1 << 30
H100 = Gpu(0, 0, "NVIDIA H100 80GB HBM3", "Nvidia", "GPU-aaaa", "00000000:3B:00.0", "9.0", 80 * GIB)
A100 = Gpu(
    1,
    1,
    "NVIDIA A100-SXM4-40GB",
    "Nvidia",
    "GPU-bbbb",
    "00000000:86:00.0",
    "8.0",
    40 * GIB,
    True,
    (MigDevice(0, 3, 0, "MIG-cccc", 10 * GIB, name="NVIDIA A100-SXM4-40GB MIG 2g.10gb"),),
)

# ---------------------------------------------------------------- the protocols (k8s.io/kubelet v0.34.2)

DOCUMENTED = {
    ("NodePrepareResourcesRequest", "claims"): 1,
    ("NodePrepareResourcesResponse", "claims"): 1,
    ("NodePrepareResourceResponse", "devices"): 1,
    ("NodePrepareResourceResponse", "error"): 2,
    ("Device", "request_names"): 1,
    ("Device", "pool_name"): 2,
    ("Device", "device_name"): 3,
    ("Device", "cdi_device_ids"): 4,
    ("NodeUnprepareResourcesRequest", "claims"): 1,
    ("NodeUnprepareResourcesResponse", "claims"): 1,
    ("NodeUnprepareResourceResponse", "error"): 1,
    ("Claim", "namespace"): 1,
    ("Claim", "uid"): 2,
    ("Claim", "name"): 3,
    ("PluginInfo", "type"): 1,
    ("PluginInfo", "name"): 2,
    ("PluginInfo", "endpoint"): 3,
    ("PluginInfo", "supported_versions"): 4,
    ("RegistrationStatus", "plugin_registered"): 1,
    ("RegistrationStatus", "error"): 2,
}
METHODS = {
    "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin": ["NodePrepareResources", "NodeUnprepareResources"],
    "pluginregistration.Registration": ["GetInfo", "NotifyRegistrationStatus"],
}


def test_messages_and_services_are_the_kubelets() -> None:
    from nvc.k8s.dra import dra_pb2, registration_pb2

    found, services = {}, {}
    for module in (dra_pb2, registration_pb2):
        for name, message in module.DESCRIPTOR.message_types_by_name.items():
            found.update({(name, f.name): f.number for f in message.fields})
        services.update({s.full_name: [m.name for m in s.methods] for s in module.DESCRIPTOR.services_by_name.values()})
    assert {k: v for k, v in found.items() if v} == DOCUMENTED
    assert services == METHODS


def test_generated_code_is_what_the_protos_give(tmp_path: Path) -> None:
    """dra_pb2*.py and registration_pb2*.py are protoc's output for the committed .proto (`make k8s-api`)."""
    protos = [str(REPO / "nvc/k8s/dra" / name) for name in ("dra.proto", "registration.proto")]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{REPO}",
            f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            *protos,
        ],
        check=True,
    )
    for name in ("dra_pb2.py", "dra_pb2_grpc.py", "registration_pb2.py", "registration_pb2_grpc.py"):
        assert (tmp_path / "nvc/k8s/dra" / name).read_text() == (REPO / "nvc/k8s/dra" / name).read_text(), name


# ---------------------------------------------------------------- devices and slices


def test_devices_and_their_attributes() -> None:
    from nvc.k8s.dra import slices

    gpu, mig = slices.devices([H100, A100], "580.95.05", 13000)
    assert (gpu.name, gpu.uuid, gpu.memory) == ("gpu-0", "GPU-aaaa", 80 * GIB)
    assert gpu.attributes["driverVersion"] == {"version": "580.95.5"}  # no leading zero in a semantic version
    assert gpu.attributes["cudaDriverVersion"] == {"version": "13.0.0"}
    assert gpu.attributes["cudaComputeCapability"] == {"version": "9.0.0"}
    assert gpu.attributes["architecture"] == {"string": "Hopper"}
    assert (mig.name, mig.gpu, mig.attributes["migProfile"]) == ("mig-1-0", "GPU-bbbb", {"string": "2g.10gb"})
    assert mig.attributes["parentIndex"] == {"int": 1} and mig.attributes["type"] == {"string": "mig"}
    for device in (gpu, mig):
        assert len(device.attributes) + 1 <= 32 and all(len(name) <= 32 for name in device.attributes)
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", device.name)
    assert slices.semver("not.a.version") is None and slices.quantity(81559 << 20) == "81559Mi"


def test_slices_change_only_when_the_devices_do() -> None:
    """Publishing what the API server already has changes nothing; other devices are a new generation of
    the pool, the slice beyond the new count is removed; 128 devices a slice at most."""
    from nvc.k8s.dra import slices

    found = slices.devices([H100, A100], "580.95.05", 13000)
    (first,) = slices.changes([], "n1", DRIVER, found).create
    assert first["spec"]["pool"] == {"name": "n1", "generation": 1, "resourceSliceCount": 1}
    stored = {**first, "metadata": {**first["metadata"], "resourceVersion": "7"}}
    assert slices.changes([stored], "n1", DRIVER, found) == slices.Changes([], [], [])
    extra = {**stored, "metadata": {"name": "n1-gpu.nvc-py.io-1", "resourceVersion": "8"}}
    change = slices.changes([stored, extra], "n1", DRIVER, found[:1])
    assert change.create == [] and change.delete == ["n1-gpu.nvc-py.io-1"]
    (update,) = change.update
    assert update["metadata"]["resourceVersion"] == "7" and update["spec"]["pool"]["generation"] == 2
    many = [found[0]._replace(name=f"gpu-{k}") for k in range(130)]
    assert [len(s["spec"]["devices"]) for s in slices.resource_slices("n1", DRIVER, many, 1)] == [128, 2]


# ---------------------------------------------------------------- sharing parameters


def _params(**fields: object) -> dict:
    return {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuSharingConfig", **fields}


@pytest.mark.parametrize(
    "fields, error",
    [
        ({"memoryLimit": "4 GiB"}, r"x\.memoryLimit='4 GiB': not a size"),
        ({"computeShare": 0}, r"x\.computeShare='0': not a percentage"),
        ({"weight": 1001}, r"x\.weight='1001': not a weight"),
        ({"weight": True}, r"x\.weight='True': not a number or string"),
        ({"latencyClass": "Batch!"}, r"x\.latencyClass='Batch!': not one of latency-critical, batch"),
        ({"backend": "gang"}, r"x\.backend='gang': not one of timeslice, mps"),
        ({"memory": "1Gi"}, r"x\.memory: unknown field"),
    ],
)
def test_bad_parameters_name_their_field(fields: dict, error: str) -> None:
    from nvc.k8s.dra import params

    with pytest.raises(InputError, match=error):
        params.parse(_params(**fields), DRIVER, "x")
    with pytest.raises(InputError, match="want apiVersion gpu.nvc-py.io/v1alpha1, kind GpuSharingConfig"):
        params.parse({**_params(), "kind": "Other"}, DRIVER, "x")


def test_the_claims_config_overrides_the_class_field_by_field() -> None:
    from nvc.k8s.dra import params

    configs = [
        (
            "class",
            {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": _params(memoryLimit="8Gi", weight=2)}},
        ),
        ("other", {"opaque": {"driver": "other.example.com", "parameters": {}}}),
        ("claim", {"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": _params(memoryLimit="2Gi")}}),
        ("else", {"requests": ["nic"], "opaque": {"driver": DRIVER, "parameters": _params(weight=9)}}),
    ]
    sharing = params.for_request(configs, "gpu", DRIVER)
    assert sharing == params.Sharing(memory=2 * GIB, weight=2)
    assert params.for_request(configs[1:2], "gpu", DRIVER) is None
    assert params.limits(sharing, "GPU-aaaa", 80 * GIB, "c") == {
        "NVC_SHARE_MEMORY_LIMIT_GPU-aaaa": str(2 * GIB),
        "NVC_SHARE_WEIGHT_GPU-aaaa": "2",
    }


# ---------------------------------------------------------------- a claim's CDI spec

NODE_SPEC = {
    "cdiVersion": "0.5.0",
    "kind": "nvidia.com/gpu",
    "devices": [
        {"name": "GPU-aaaa", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
        {"name": "MIG-cccc", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}]}},
    ],
    "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"], "mounts": [{"containerPath": "/lib/x"}]},
}


def _claim(
    uid: str = "u1", pool: str = "n1", devices: tuple[str, ...] = ("gpu-0",), config: list | None = None
) -> dict:
    return {
        "metadata": {"uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "r", "driver": DRIVER, "pool": pool, "device": d} for d in devices]
                    + [{"request": "nic", "driver": "net.example.com", "pool": "p", "device": "eth0"}],
                    "config": config or [],
                }
            }
        },
    }


def test_a_claims_spec_and_its_errors() -> None:
    from nvc.k8s.dra import claims, slices

    known = {d.name: d for d in slices.devices([H100, A100], "580.95.05", 13000)}
    ref = claims.ClaimRef("ns", "u1", "c")
    plan = claims.plan(_claim(devices=("gpu-0", "mig-1-0")), ref, DRIVER, "n1", known, NODE_SPEC, False)
    assert plan.devices == (
        claims.Prepared(("r",), "n1", "gpu-0", (f"{DRIVER}/claim=u1-gpu-0",)),
        claims.Prepared(("r",), "n1", "mig-1-0", (f"{DRIVER}/claim=u1-mig-1-0",)),
    )
    assert plan.spec == {
        "cdiVersion": "0.5.0",
        "kind": f"{DRIVER}/claim",
        "containerEdits": NODE_SPEC["containerEdits"],
        "devices": [
            {"name": "u1-gpu-0", "containerEdits": NODE_SPEC["devices"][0]["containerEdits"]},
            {"name": "u1-mig-1-0", "containerEdits": NODE_SPEC["devices"][1]["containerEdits"]},
        ],
    }
    shared = [{"opaque": {"driver": DRIVER, "parameters": _params(memoryLimit="1Gi")}}]
    mixed = claims.plan(
        _claim(devices=("gpu-0", "mig-1-0"), config=[{"requests": ["x"], **shared[0]}] + shared),
        ref,
        DRIVER,
        "n1",
        known,
        NODE_SPEC,
        False,
    )
    # both shared, env strategy: the hook reads NVIDIA_VISIBLE_DEVICES, so it names them (not void)
    assert mixed.spec["containerEdits"] == {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-aaaa,MIG-cccc"]}
    assert mixed.spec["devices"][1]["containerEdits"] == {"env": [f"NVC_SHARE_MEMORY_LIMIT_MIG-cccc={GIB}"]}
    for claim, error in [
        (_claim(uid="u2"), "the API server has UID 'u2', the kubelet 'u1'"),
        (_claim(pool="n2"), "device 'gpu-0' of pool 'n2' is not this node's"),
        (_claim(devices=("gpu-9",)), "device 'gpu-9' is not one of this node's"),
        ({"metadata": {"uid": "u1"}}, "not allocated"),
    ]:
        with pytest.raises(InputError, match=re.escape(f"claim ns/c: {error}")):
            claims.plan(claim, ref, DRIVER, "n1", known, NODE_SPEC, True)


def test_the_checkpoint_round_trips_and_refuses_junk(tmp_path: Path) -> None:
    from nvc.k8s.dra import checkpoint, claims

    path = str(tmp_path / "checkpoint.json")
    assert checkpoint.load(path) == {}
    saved = {
        "u1": (
            claims.ClaimRef("ns", "u1", "c"),
            "/var/run/cdi/x.json",
            (claims.Prepared(("r",), "n1", "gpu-0", ("k/claim=u1-gpu-0",)),),
        )
    }
    checkpoint.save(path, saved)
    assert checkpoint.load(path) == saved and (tmp_path / "checkpoint.json").stat().st_mode & 0o777 == 0o600
    (tmp_path / "checkpoint.json").write_text('{"version": 1, "claims": {"u1": {}}}')
    with pytest.raises(InputError, match=f"{path}: not a checkpoint of nvc-py's DRA driver"):
        checkpoint.load(path)


# ---------------------------------------------------------------- manifests


def test_the_daemonset_runs_the_driver_with_what_it_needs() -> None:
    """The DaemonSet's flags are the command's; its role allows every request the driver makes; the
    DeviceClasses select this driver's attribute values."""
    from nvc.k8s.command import dra_driver
    from nvc.k8s.dra import slices

    docs = list(yaml.safe_load_all((REPO / "deploy/kubernetes/nvc-py-dra-driver.yaml").read_text()))
    kinds = {d["kind"]: d for d in docs}
    (container,) = kinds["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert command[:5] == ["chroot", "/host", "/usr/local/bin/nvc-py", "k8s", "dra-driver"]
    options = {o for p in dra_driver.params for o in p.opts}
    assert {a for a in command if a.startswith("--")} <= options
    assert command[command.index("--driver-name") + 1] == DRIVER
    assert container["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    account = command[command.index("--service-account-dir") + 1]
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/host", "/host" + account}
    rules = {
        (g, r, v)
        for rule in kinds["ClusterRole"]["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    needed = {("resource.k8s.io", "resourceslices", v) for v in ("list", "create", "update", "delete")}
    assert needed | {("resource.k8s.io", "resourceclaims", "get"), ("", "nodes", "get")} <= rules
    classes = list(yaml.safe_load_all((REPO / "deploy/kubernetes/nvc-py-dra-deviceclasses.yaml").read_text()))
    types = {d.attributes["type"]["string"] for d in slices.devices([H100, A100], "580.95.05", 13000)}
    for device_class in classes:
        (selector,) = device_class["spec"]["selectors"]
        expression = selector["cel"]["expression"]
        assert f'device.driver == "{DRIVER}"' in expression
        assert re.search(r'\.type == "(\w+)"', expression).group(1) in types
