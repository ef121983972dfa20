"""The device plugin's API: its messages' field numbers and services as the kubelet documents them, and
the generated code.

No gRPC server or channel here (tests/harness/deviceplugin.py says why those run in a child process).
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = Path(sysconfig.get_path("scripts"))


# ---------------------------------------------------------------- the API, as the kubelet documents it

# (message, field) -> number, from k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto
DOCUMENTED = {
    ("RegisterRequest", "version"): 1,
    ("RegisterRequest", "endpoint"): 2,
    ("RegisterRequest", "resource_name"): 3,
    ("RegisterRequest", "options"): 4,
    ("DevicePluginOptions", "pre_start_required"): 1,
    ("DevicePluginOptions", "get_preferred_allocation_available"): 2,
    ("ListAndWatchResponse", "devices"): 1,
    ("TopologyInfo", "nodes"): 1,
    ("NUMANode", "ID"): 1,
    ("Device", "ID"): 1,
    ("Device", "health"): 2,
    ("Device", "topology"): 3,
    ("PreStartContainerRequest", "devices_ids"): 1,
    ("PreferredAllocationRequest", "container_requests"): 1,
    ("ContainerPreferredAllocationRequest", "available_deviceIDs"): 1,
    ("ContainerPreferredAllocationRequest", "must_include_deviceIDs"): 2,
    ("ContainerPreferredAllocationRequest", "allocation_size"): 3,
    ("PreferredAllocationResponse", "container_responses"): 1,
    ("ContainerPreferredAllocationResponse", "deviceIDs"): 1,
    ("AllocateRequest", "container_requests"): 1,
    ("ContainerAllocateRequest", "devices_ids"): 1,
    ("AllocateResponse", "container_responses"): 1,
    ("ContainerAllocateResponse", "envs"): 1,
    ("ContainerAllocateResponse", "mounts"): 2,
    ("ContainerAllocateResponse", "devices"): 3,
    ("ContainerAllocateResponse", "annotations"): 4,
    ("ContainerAllocateResponse", "cdi_devices"): 5,
    ("CDIDevice", "name"): 1,
    ("Mount", "container_path"): 1,
    ("Mount", "host_path"): 2,
    ("Mount", "read_only"): 3,
    ("DeviceSpec", "container_path"): 1,
    ("DeviceSpec", "host_path"): 2,
    ("DeviceSpec", "permissions"): 3,
}
METHODS = {
    "v1beta1.Registration": ["Register"],
    "v1beta1.DevicePlugin": [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ],
}


def test_messages_and_services_are_the_documented_ones() -> None:
    from nvc.k8s import api_pb2

    found = {
        (name, field.name): field.number
        for name, message in api_pb2.DESCRIPTOR.message_types_by_name.items()
        for field in message.fields
    }
    assert found == DOCUMENTED
    services = api_pb2.DESCRIPTOR.services_by_name.values()
    assert {s.full_name: [m.name for m in s.methods] for s in services} == METHODS
    stream = api_pb2.DESCRIPTOR.services_by_name["DevicePlugin"].methods_by_name["ListAndWatch"]
    assert stream.server_streaming and not stream.client_streaming


def test_generated_code_is_what_api_proto_gives(tmp_path: Path) -> None:
    """api_pb2*.py are protoc's output for api.proto as committed (`make k8s-api` regenerates them)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{REPO}",
            f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            str(REPO / "nvc/k8s/api.proto"),
        ],
        check=True,
    )
    for name in ("api_pb2.py", "api_pb2_grpc.py"):
        assert (tmp_path / "nvc/k8s" / name).read_text() == (REPO / "nvc/k8s" / name).read_text(), name
