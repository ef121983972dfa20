"""The gRPC side of the DRA driver: the kubelet's plugin registration (pluginregistration.v1) and DRA
(k8s.io.kubelet.pkg.apis.dra.v1) services, each on a unix socket of its own.

The kubelet finds the registration socket in its ``plugins_registry`` directory, asks GetInfo (type
DRAPlugin, the driver's name, the DRA socket, the service versions served: ``v1.DRAPlugin``), says
whether it took the plugin (NotifyRegistrationStatus), then calls NodePrepareResources and
NodeUnprepareResources on the DRA socket. Each claim's outcome is its own entry of the answer: one
claim's error never fails the others.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent import futures
from typing import Any

os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"  # as in nvc.k8s.service: the driver forks NVML helpers

import grpc  # noqa: E402

from nvc.errors import InputError, NvcError  # noqa: E402
from nvc.k8s.dra import dra_pb2 as pb  # noqa: E402
from nvc.k8s.dra import dra_pb2_grpc as dra_api  # noqa: E402
from nvc.k8s.dra import registration_pb2 as rpb  # noqa: E402
from nvc.k8s.dra import registration_pb2_grpc as reg_api  # noqa: E402
from nvc.k8s.dra.claims import ClaimRef, Prepared  # noqa: E402
from nvc.k8s.service import identity  # noqa: E402

PLUGIN_TYPE = "DRAPlugin"  # pluginregistration v1's constant
SERVICES = ("v1.DRAPlugin",)  # k8s.io/kubelet/pkg/apis/dra/v1 DRAPluginService
_SUN_PATH = 108
_WORKERS = 4


class Registration(reg_api.RegistrationServicer):
    def __init__(self, driver: str, endpoint: str, log: Any) -> None:
        self.driver, self.endpoint, self.log = driver, endpoint, log
        self.registered: bool | None = None

    def GetInfo(self, request: Any, context: Any) -> Any:  # noqa: N802 - the API's names
        return rpb.PluginInfo(
            type=PLUGIN_TYPE, name=self.driver, endpoint=self.endpoint, supported_versions=list(SERVICES)
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.registered = request.plugin_registered
        if request.plugin_registered:
            self.log.info("the kubelet registered %s (%s)", self.driver, self.endpoint)
        else:
            self.log.error("the kubelet refused %s: %s", self.driver, request.error)
        return rpb.RegistrationStatusResponse()


class DraPlugin(dra_api.DRAPluginServicer):
    """Answers from ``prepare`` (a claim -> its devices) and ``unprepare``; NvcError: that claim's error."""

    def __init__(
        self, prepare: Callable[[ClaimRef], tuple[Prepared, ...]], unprepare: Callable[[ClaimRef], None], log: Any
    ) -> None:
        self.prepare, self.unprepare, self.log = prepare, unprepare, log

    def NodePrepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        answers = {}
        for claim in request.claims:
            ref = ClaimRef(claim.namespace, claim.uid, claim.name)
            try:
                devices = self.prepare(ref)
            except NvcError as err:
                self.log.warning("prepare %s (%s) failed: %s", ref, ref.uid, err)
                answers[claim.uid] = pb.NodePrepareResourceResponse(error=str(err))
                continue
            answers[claim.uid] = pb.NodePrepareResourceResponse(
                devices=[
                    pb.Device(
                        request_names=list(d.requests),
                        pool_name=d.pool,
                        device_name=d.device,
                        cdi_device_ids=list(d.cdi_ids),
                    )
                    for d in devices
                ]
            )
        return pb.NodePrepareResourcesResponse(claims=answers)

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        answers = {}
        for claim in request.claims:
            ref = ClaimRef(claim.namespace, claim.uid, claim.name)
            try:
                self.unprepare(ref)
                answers[claim.uid] = pb.NodeUnprepareResourceResponse()
            except NvcError as err:
                self.log.warning("unprepare %s (%s) failed: %s", ref, ref.uid, err)
                answers[claim.uid] = pb.NodeUnprepareResourceResponse(error=str(err))
        return pb.NodeUnprepareResourcesResponse(claims=answers)


class Socket:
    """One gRPC server on a unix socket of its own; ``gone()`` once the socket was removed or replaced
    (a kubelet cleaning its directories), so the driver serves it anew."""

    def __init__(self, path: str, add: Callable[[Any], None]) -> None:
        self.path, self.add = path, add
        self.server: Any = None
        self.identity: tuple[int, int] | None = None

    def start(self) -> None:
        if len(os.fsencode(self.path)) > _SUN_PATH - 1:
            raise InputError(f"{self.path}: socket path longer than {_SUN_PATH - 1} bytes (a shorter --kubelet-dir)")
        os.makedirs(os.path.dirname(self.path), 0o750, exist_ok=True)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="dra"))
        self.add(self.server)
        try:
            self.server.add_insecure_port(f"unix://{self.path}")
        except RuntimeError as err:  # grpc says only that it failed
            raise NvcError(f"{self.path}: cannot listen on it: {err}") from None
        self.server.start()
        self.identity = identity(self.path)

    def gone(self) -> bool:
        return self.identity is None or identity(self.path) != self.identity

    def stop(self) -> None:
        if self.server is None:
            return
        self.server.stop(grace=1).wait()
        if not self.gone():
            os.unlink(self.path)
        self.server = None


def sockets(
    driver: str,
    registry_path: str,
    dra_path: str,
    prepare: Callable[[ClaimRef], tuple[Prepared, ...]],
    unprepare: Callable[[ClaimRef], None],
    log: Any,
) -> tuple[Socket, Socket]:
    """The DRA socket and the registration socket (started in this order: the kubelet dials the first
    as soon as it finds the second)."""
    registration = Registration(driver, dra_path, log)
    plugin = DraPlugin(prepare, unprepare, log)
    return (
        Socket(dra_path, lambda server: dra_api.add_DRAPluginServicer_to_server(plugin, server)),
        Socket(registry_path, lambda server: reg_api.add_RegistrationServicer_to_server(registration, server)),
    )
