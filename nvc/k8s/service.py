"""The gRPC side of the device plugin: the kubelet's v1beta1 API (api.proto), served and called.

One :class:`Endpoint` per resource: a gRPC server on its own socket in the device plugin
directory, answering the kubelet's DevicePlugin calls from the :class:`Board` the daemon keeps
up to date; :func:`register` tells the kubelet about it. grpcio and protobuf are imported here
and only here (``nvc-py k8s device-plugin``), never by the hook or the rest of the CLI.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from concurrent import futures
from typing import Any

# The plugin forks driver helpers (nvc.rpc.helper) while gRPC's threads run; the child touches
# nothing of gRPC. gRPC's own fork handlers, which expect the child to use gRPC, then abort
# helpers now and again: they are not installed at all with this, read when grpc loads.
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"

import grpc  # noqa: E402

from nvc.config import K8s
from nvc.errors import InputError, NvcError
from nvc.k8s import api_pb2 as pb
from nvc.k8s import api_pb2_grpc as api
from nvc.k8s import resources
from nvc.k8s.health import Health

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
_WORKERS = 8  # per endpoint: a ListAndWatch stream holds one for as long as the kubelet listens
_WAKE_S = 1.0
_SUN_PATH = 108  # bytes of a unix socket address's path, its NUL included  # how often an idle ListAndWatch stream checks whether it should end


class Board:
    """What the endpoints answer from and the daemon writes: resources, health, topology; every
    change bumps ``version`` and wakes the ListAndWatch streams."""

    def __init__(self, k8s: K8s, health: Health) -> None:
        self.k8s = k8s
        self.health = health
        self.resources: dict[str, resources.Resource] = {}
        self.topology: Mapping[str, Mapping[str, int]] = {}
        self.all_unhealthy = False  # NVML stopped answering: nothing can be vouched for
        self.version = 0
        self.changed = threading.Condition()

    def publish(self, **changes: Any) -> None:
        """Set ``resources`` (a sequence), ``topology`` or ``all_unhealthy``, or only announce a
        health change (no arguments)."""
        with self.changed:
            if "resources" in changes:
                self.resources = {r.name: r for r in changes.pop("resources")}
            for name, value in changes.items():
                setattr(self, name, value)
            self.version += 1
            self.changed.notify_all()

    def devices(self, name: str) -> tuple[int, list[Any]]:
        """The version and the ListAndWatch device list of resource ``name``."""
        with self.changed:
            resource = self.resources.get(name)
            units = resource.units if resource else ()
            return self.version, [
                pb.Device(
                    ID=u.id, health=resources.HEALTHY if self._healthy(u) else resources.UNHEALTHY, topology=_numa(u)
                )
                for u in units
            ]

    def counts(self) -> tuple[tuple[str, int, int], ...]:
        """(name, healthy devices, unhealthy devices) of every resource, as ListAndWatch tells them."""
        with self.changed:
            healthy = {name: sum(map(self._healthy, r.units)) for name, r in self.resources.items()}
            return tuple((name, healthy[name], len(r.units) - healthy[name]) for name, r in self.resources.items())

    def _healthy(self, unit: resources.Unit) -> bool:
        return not self.all_unhealthy and self.health.healthy(unit)

    def wait(self, version: int, timeout: float) -> None:
        with self.changed:
            if self.version == version:
                self.changed.wait(timeout)

    def resource(self, name: str) -> resources.Resource:
        with self.changed:
            return self.resources.get(name) or resources.Resource(name, "gpu", ())


def _numa(unit: resources.Unit) -> Any:
    return pb.TopologyInfo(nodes=[pb.NUMANode(ID=unit.numa)]) if unit.numa is not None else None


class DevicePlugin(api.DevicePluginServicer):
    """The DevicePlugin service of one resource."""

    def __init__(self, board: Board, name: str, stopping: threading.Event, lost: threading.Event, log: Any) -> None:
        self.board, self.name, self.stopping, self.lost, self.log = board, name, stopping, lost, log

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:  # noqa: N802 - the API's names
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
        sent = -1
        try:
            while not self.stopping.is_set() and context.is_active():
                version, devices = self.board.devices(self.name)
                if version != sent:
                    yield pb.ListAndWatchResponse(devices=devices)
                    sent = version
                self.board.wait(version, _WAKE_S)
        finally:  # ended here, or closed by gRPC at the yield when the kubelet went
            if not self.stopping.is_set():
                self.lost.set()  # the kubelet dropped us (say, as an older instance of ours stopped): register again

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:  # noqa: N802
        resource = self.board.resource(self.name)
        answers = []
        for ask in request.container_requests:
            try:
                ids = resources.preferred(
                    resource,
                    list(ask.available_deviceIDs),
                    list(ask.must_include_deviceIDs),
                    ask.allocation_size,
                    self.board.topology,
                )
            except NvcError as err:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            answers.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=answers)

    def Allocate(self, request: Any, context: Any) -> Any:  # noqa: N802
        resource = self.board.resource(self.name)
        answers = []
        for ask in request.container_requests:
            try:
                answer = resources.allocate(resource, list(ask.devices_ids), self.board.k8s)
            except NvcError as err:
                self.log.warning("Allocate %s %s refused: %s", self.name, list(ask.devices_ids), err)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            self.log.info(
                "Allocate %s %s: %s",
                self.name,
                list(ask.devices_ids),
                " ".join(f"{k}={v}" for k, v in sorted(answer.envs.items())),
            )
            answers.append(
                pb.ContainerAllocateResponse(
                    envs=answer.envs,
                    mounts=[pb.Mount(container_path=c, host_path=h, read_only=ro) for c, h, ro in answer.mounts],
                    cdi_devices=[pb.CDIDevice(name=name) for name in answer.cdi_devices],
                )
            )
        return pb.AllocateResponse(container_responses=answers)

    def PreStartContainer(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb.PreStartContainerResponse()  # not asked for (pre_start_required is false)


class Endpoint:
    """One resource's gRPC server on ``<directory>/<socket>``."""

    def __init__(self, board: Board, resource: resources.Resource, directory: str, log: Any) -> None:
        self.name = resource.name
        self.path = os.path.join(directory, resource.socket)
        self.stopping = threading.Event()
        self.lost = threading.Event()  # the kubelet ended a ListAndWatch stream while we serve
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="k8s"))
        api.add_DevicePluginServicer_to_server(
            DevicePlugin(board, self.name, self.stopping, self.lost, log), self.server
        )
        self.identity: tuple[int, int] | None = None

    def start(self) -> None:
        """Serve on a new socket (a stale one, of an earlier run or a dead plugin, is replaced)."""
        if len(os.fsencode(self.path)) > _SUN_PATH - 1:
            raise InputError(
                f"{self.path}: socket path longer than {_SUN_PATH - 1} bytes (a shorter --device-plugin-dir)"
            )
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self.server.add_insecure_port(f"unix://{self.path}")
        self.server.start()
        self.identity = identity(self.path)

    def gone(self) -> bool:
        """Whether the socket was removed or replaced (a restarting kubelet empties its directory), or
        the kubelet ended our stream: an older instance of the plugin stopping removes our socket by its
        path and makes the kubelet drop us, whatever the socket is called."""
        return self.replaced() or self.lost.is_set()

    def replaced(self) -> bool:
        return self.identity is None or identity(self.path) != self.identity

    def stop(self) -> None:
        self.stopping.set()
        self.server.stop(grace=1).wait()
        if not self.replaced():
            os.unlink(self.path)


def identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of ``path``: a socket made anew (a restarted kubelet's) has another one."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def register(directory: str, endpoint: Endpoint, timeout: float = 5.0) -> None:
    """Register ``endpoint``'s resource with the kubelet listening on ``<directory>/kubelet.sock``."""
    with grpc.insecure_channel(f"unix://{os.path.join(directory, KUBELET_SOCKET)}") as channel:
        api.RegistrationStub(channel).Register(
            pb.RegisterRequest(
                version=API_VERSION,
                endpoint=os.path.basename(endpoint.path),
                resource_name=endpoint.name,
                options=pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True),
            ),
            timeout=timeout,
        )
