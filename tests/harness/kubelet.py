"""A kubelet stand-in for the device plugin tests: the kubelet's side of the v1beta1 gRPC API.

It serves the Registration service on ``<directory>/kubelet.sock``; on each Register it does what
the kubelet's device manager does: dials the plugin's endpoint in the same directory, asks its
options and keeps a ListAndWatch stream open (a thread per plugin), recording every device list.
Tests then make the calls the kubelet makes at pod admission: GetPreferredAllocation and Allocate.
``restart()`` behaves as a restarting kubelet: the directory's sockets removed, kubelet.sock new.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from nvc.k8s import api_pb2 as pb
from nvc.k8s import api_pb2_grpc as api


class Plugin:
    """The stand-in's connection to one registered plugin endpoint."""

    def __init__(self, directory: Path, request: Any) -> None:
        self.request = request
        self.resource = request.resource_name
        self.channel = grpc.insecure_channel(f"unix://{directory / request.endpoint}")
        self.stub = api.DevicePluginStub(self.channel)
        self.options = self.stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
        self.lists: list[dict[str, str]] = []  # every ListAndWatch answer: device ID -> health
        self.ended = False
        self.changed = threading.Condition()
        self.stream = self.stub.ListAndWatch(pb.Empty())
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        try:
            for answer in self.stream:
                with self.changed:
                    self.lists.append({d.ID: d.health for d in answer.devices})
                    self.changed.notify_all()
        except grpc.RpcError:
            pass
        with self.changed:
            self.ended = True
            self.changed.notify_all()

    def devices(
        self, until: Callable[[dict[str, str]], bool] = lambda devices: True, timeout: float = 20
    ) -> dict[str, str]:
        """The latest device list once ``until`` holds for it."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not (self.lists and until(self.lists[-1])):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"{self.resource}: no device list as wanted in {timeout} s: {self.lists[-1:] or 'none'}"
                    )
                self.changed.wait(left)
            return self.lists[-1]

    def preferred(self, available: list[str], size: int, must: list[str] = ()) -> list[str]:
        answer = self.stub.GetPreferredAllocation(
            pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=available, must_include_deviceIDs=list(must), allocation_size=size
                    )
                ]
            ),
            timeout=5,
        )
        return list(answer.container_responses[0].deviceIDs)

    def allocate(self, *containers: list[str]) -> list[Any]:
        answer = self.stub.Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids) for ids in containers]),
            timeout=5,
        )
        return list(answer.container_responses)

    def close(self) -> None:
        self.stream.cancel()
        self.channel.close()


class _Registration(api.RegistrationServicer):
    def __init__(self, kubelet: Kubelet) -> None:
        self.kubelet = kubelet

    def Register(self, request: Any, context: Any) -> Any:  # noqa: N802 - the API's name
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version}")
        self.kubelet.registered(request)
        return pb.Empty()


class Kubelet:
    """The stand-in; ``stop()`` must be called."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.registrations: list[Any] = []
        self.plugins: dict[str, Plugin] = {}
        self.changed = threading.Condition()
        self.server: Any = None
        self.stopped = False
        self.start()

    def start(self) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api.add_RegistrationServicer_to_server(_Registration(self), self.server)
        self.server.add_insecure_port(f"unix://{self.directory / 'kubelet.sock'}")
        self.server.start()

    def registered(self, request: Any) -> None:
        # The kubelet answers Register first and dials the endpoint afterwards.
        def connect() -> None:
            plugin = Plugin(self.directory, request)
            with self.changed:
                old = None if self.stopped else self.plugins.get(request.resource_name)
                if not self.stopped:
                    self.plugins[request.resource_name] = plugin
                    self.registrations.append(request)
                    self.changed.notify_all()
            if old is not None or self.stopped:
                (old or plugin).close()

        threading.Thread(target=connect, daemon=True).start()

    def plugin(self, resource: str, registrations: int = 1, timeout: float = 20) -> Plugin:
        """The plugin of ``resource`` once the stand-in has seen ``registrations`` Register calls for it."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while sum(r.resource_name == resource for r in self.registrations) < registrations:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"{resource} not registered {registrations} times in {timeout} s: "
                        f"{[r.resource_name for r in self.registrations]}"
                    )
                self.changed.wait(left)
            return self.plugins[resource]

    def restart(self) -> None:
        """As a restarting kubelet: stop serving, remove every socket of the directory, serve anew."""
        self.server.stop(grace=0).wait()
        for path in self.directory.iterdir():
            if path.is_socket():
                os.unlink(path)
        self.start()

    def stop(self) -> None:
        with self.changed:
            self.stopped = True
            plugins = list(self.plugins.values())
        for plugin in plugins:
            plugin.close()
        self.server.stop(grace=0).wait()
