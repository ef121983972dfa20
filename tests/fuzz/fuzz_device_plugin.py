"""Fuzz target: the device plugin's answers to the kubelet's Allocate and GetPreferredAllocation
calls (nvc.k8s.service.DevicePlugin), from the request's protobuf bytes, for each kind of resource
(whole GPUs with a topology, MIG devices, GPU shares) and device-list strategy.

The input's first byte chooses the resource, the call and the strategy; the rest is the request as
the kubelet serialises it. A request the handler refuses ends in ``context.abort`` (as gRPC's, an
exception here); a request protobuf cannot parse never reaches it. Besides crashes, the answers
must keep what the kubelet and the hook rely on: preferred IDs are the request's own, each once; a
container's GPU shares, read back as the hook reads them, never exceed the GPU's memory."""

from __future__ import annotations

import logging
import threading

from target import fuzz, instrumented

with instrumented():
    from google.protobuf.message import DecodeError

    from nvc.config import K8s
    from nvc.containerenv import Policy, parse_env, sharing
    from nvc.k8s import api_pb2 as pb
    from nvc.k8s import resources, service
    from nvc.k8s.health import Health
    from nvc.model.devices import Gpu, MigDevice
    from nvc.plan import fromenv

GIB = 1 << 30
_UUIDS = [f"GPU-11111111-2222-4333-8444-5555555555{i:02d}" for i in range(5)]
GPUS = (
    *(Gpu(i, i, "NVIDIA H100", "Tesla", _UUIDS[i], f"00000000:{16 + i:02X}:00.0", "9.0", 80 * GIB) for i in range(3)),
    Gpu(3, 3, "NVIDIA L4", "Tesla", _UUIDS[3], "00000000:30:00.0", "8.9", 24 * GIB),
    Gpu(
        4,
        4,
        "NVIDIA A100",
        "Tesla",
        _UUIDS[4],
        "00000000:40:00.0",
        "8.0",
        40 * GIB,
        True,
        (
            MigDevice(0, 1, 0, "MIG-aaaaaaaa-2222-4333-8444-555555555500", 10 * GIB, name="NVIDIA A100 MIG 2g.10gb"),
            MigDevice(1, 2, 0, "MIG-aaaaaaaa-2222-4333-8444-555555555501", 10 * GIB, name="NVIDIA A100 MIG 2g.10gb"),
        ),
    ),
)
# Whole GPUs 0-2 (NVLink between 0 and 1), shares of the L4 in 4 GiB units, the A100's MIG devices.
TOPOLOGY = {a: {b: (10 if {a, b} == {_UUIDS[0], _UUIDS[1]} else 40) for b in _UUIDS[:3] if b != a} for a in _UUIDS[:3]}
SETTINGS = (
    K8s(share_gpus=(_UUIDS[3],), share_slice="4Gi"),
    K8s(
        share_gpus=(_UUIDS[3],),
        share_slice="4Gi",
        device_list_strategy="volume-mounts",
        cdi_devices=True,
        share_compute="none",
        share_weight=False,
    ),
)


class Aborted(Exception):
    """gRPC's context.abort: the call ends with this status."""


class Context:
    def abort(self, code: object, details: str) -> None:
        raise Aborted(code, details)


def _plugins() -> list[tuple[service.DevicePlugin, K8s]]:
    log = logging.getLogger("nvc-py-fuzz")
    log.addHandler(logging.NullHandler())
    log.propagate = False
    plugins = []
    for k8s in SETTINGS:
        board = service.Board(k8s, Health(k8s.ignored_xids, k8s.xid_recovery))
        board.publish(resources=resources.plan(GPUS, k8s), topology=TOPOLOGY)
        plugins += [
            (service.DevicePlugin(board, name, threading.Event(), threading.Event(), log), k8s)
            for name in sorted(board.resources)
        ]
    return plugins


PLUGINS = _plugins()
GPU_MEMORY = {gpu.uuid: gpu.memory_total for gpu in GPUS}


def _preferred(plugin: service.DevicePlugin, data: bytes) -> None:
    request = pb.PreferredAllocationRequest.FromString(data)
    answer = plugin.GetPreferredAllocation(request, Context())
    for ask, got in zip(request.container_requests, answer.container_responses, strict=True):
        ids = list(got.deviceIDs)
        assert len(set(ids)) == len(ids), f"an ID given twice: {ids}"
        assert set(ids) <= {*ask.available_deviceIDs, *ask.must_include_deviceIDs}, f"an ID not offered: {ids}"


def _allocate(plugin: service.DevicePlugin, k8s: K8s, data: bytes) -> None:
    request = pb.AllocateRequest.FromString(data)
    answer = plugin.Allocate(request, Context())
    for got in answer.container_responses:
        env = parse_env(f"{name}={value}" for name, value in got.envs.items())
        volumes = [{"source": m.host_path, "destination": m.container_path} for m in got.mounts]
        policy = Policy(accept_volume_mounts=k8s.device_list_strategy == "volume-mounts")
        asked = fromenv.parse_share_env(sharing.share_env(env, volumes, policy))
        for device, memory in asked.memory if asked else ():
            assert memory <= GPU_MEMORY[device], f"{device} shares {memory} bytes, over its memory"


def one(data: bytes) -> None:
    if not data:
        return
    plugin, k8s = PLUGINS[(data[0] >> 1) % len(PLUGINS)]
    if data[0] & 1:
        _preferred(plugin, data[1:])
    else:
        _allocate(plugin, k8s, data[1:])


if __name__ == "__main__":
    fuzz(one, (DecodeError, Aborted))
