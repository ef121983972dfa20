"""The installed DRA driver (``nvc-py k8s dra-driver``) for tests/test_k8s_dra*.py: the API server stand-in
(tests/harness/apiserver.py) with its certificate and kubeconfig, a driver run and its log, and the
kubelet's side of the gRPC calls (in a child process: tests/harness/deviceplugin.py's in_child)."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import apiserver as standin
from harness.deviceplugin import PluginRun, _config
from harness.installed import SCRIPTS

DRIVER = "gpu.nvc-py.io"
NODE = standin.NODE


class ApiServer:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
                "-keyout",
                str(directory / "key.pem"),
                "-out",
                str(directory / "cert.pem"),
            ],
            check=True,
            capture_output=True,
        )
        self.process = subprocess.Popen([sys.executable, standin.__file__, str(directory)], stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not (directory / "port").exists():
            assert self.process.poll() is None and time.monotonic() < deadline, "the API server stand-in did not start"
            time.sleep(0.05)
        self.url = f"https://127.0.0.1:{(directory / 'port').read_text()}"
        ca = base64.b64encode((directory / "cert.pem").read_bytes()).decode()
        self.kubeconfig = directory / "kubeconfig"
        self.kubeconfig.write_text(
            f"apiVersion: v1\nkind: Config\ncurrent-context: test\n"
            f"clusters: [{{name: test, cluster: {{server: '{self.url}', certificate-authority-data: {ca}}}}}]\n"
            f"users: [{{name: driver, user: {{token: {standin.TOKEN}}}}}]\n"
            f"contexts: [{{name: test, context: {{cluster: test, user: driver}}}}]\n"
        )

    def client(self) -> Any:
        from nvc.k8s.dra import kubeapi

        return kubeapi.from_kubeconfig(str(self.kubeconfig))

    def slices(self) -> list[dict[str, Any]]:
        return self.client().request("GET", f"{standin.RESOURCE}/resourceslices")["items"]

    def add_claim(
        self,
        name: str,
        devices: list[str],
        config: list[dict[str, Any]] | None = None,
        allocated: bool = True,
        namespace: str = "default",
    ) -> tuple[str, str, str]:
        """An allocated ResourceClaim of ``devices`` (request "gpu", this node's pool); (namespace, uid, name)."""
        claim: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER, "count": len(devices)}}]
                }
            },
        }
        if allocated:
            claim["status"] = {
                "allocation": {
                    "devices": {
                        "results": [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": d} for d in devices],
                        "config": config or [],
                    }
                }
            }
        made = self.client().request("POST", f"{standin.RESOURCE}/namespaces/{namespace}/resourceclaims", claim)
        return namespace, made["metadata"]["uid"], name

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


@pytest.fixture
def api_server(tmp_path: Path) -> Iterator[ApiServer]:
    directory = tmp_path / "apiserver"
    directory.mkdir()
    server = ApiServer(directory)
    yield server
    server.stop()


@pytest.fixture
def kubelet_dir() -> Iterator[Path]:
    """A short kubelet root (a socket's path has at most 107 bytes; pytest's are long)."""
    directory = Path(tempfile.mkdtemp(prefix="nvc-dra-"))
    yield directory
    shutil.rmtree(directory)


class DriverRun(PluginRun):
    """A running ``nvc-py k8s dra-driver`` and its log."""

    def __init__(
        self,
        config: Path,
        kubelet: Path,
        cdi: Path,
        kubeconfig: Path,
        log: Path,
        node: str = NODE,
        wrap: Callable[[list[str]], list[str]] = list,
    ) -> None:
        """``wrap``: the command line as run (the test cluster runs it in its node's namespace)."""
        self.log = log
        env = {**os.environ, "NVC_PY_HOOK_SOCKET": "none", "NODE_NAME": node}
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                wrap(
                    [
                        str(SCRIPTS / "nvc-py"),
                        "k8s",
                        "dra-driver",
                        "--config",
                        str(config),
                        "--kubeconfig",
                        str(kubeconfig),
                        "--kubelet-dir",
                        str(kubelet),
                        "--cdi-dir",
                        str(cdi),
                        "--resync",
                        "1",
                        "--log-level",
                        "debug",
                    ]
                ),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )

    def stop(self) -> int:
        if self.process.poll() is None:
            self.wait_log("dra-driver: ")
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


@pytest.fixture
def run_driver(kubelet_dir: Path, tmp_path: Path, api_server: ApiServer) -> Iterator[Any]:
    runs: list[DriverRun] = []
    cdi = tmp_path / "cdi"

    def start(root: Path, k8s: str = "{}") -> DriverRun:
        run = DriverRun(
            _config(tmp_path, root, k8s), kubelet_dir, cdi, api_server.kubeconfig, tmp_path / f"driver{len(runs)}.log"
        )
        runs.append(run)
        return run

    start.cdi = cdi  # type: ignore[attr-defined]
    yield start
    for run in runs:
        assert run.stop() == 0, run.text()


# ---------------------------------------------------------------- the kubelet's side (in a child process only)


def registered(kubelet: Path) -> dict[str, Any]:
    """What the kubelet's plugin watcher does with the registration socket: GetInfo, then tell it the
    plugin is registered; the plugin's info."""
    import grpc

    from nvc.k8s.dra import registration_pb2 as rpb
    from nvc.k8s.dra import registration_pb2_grpc as reg

    with grpc.insecure_channel(f"unix://{kubelet / 'plugins_registry' / (DRIVER + '-reg.sock')}") as channel:
        stub = reg.RegistrationStub(channel)
        info = stub.GetInfo(rpb.InfoRequest(), timeout=10)
        stub.NotifyRegistrationStatus(rpb.RegistrationStatus(plugin_registered=True), timeout=10)
    return {"type": info.type, "name": info.name, "endpoint": info.endpoint, "versions": list(info.supported_versions)}


def call(endpoint: str, method: str, claims: list[tuple[str, str, str]]) -> dict[str, Any]:
    """NodePrepareResources or NodeUnprepareResources of ``claims`` ((namespace, uid, name)): per claim
    UID, its error or its devices as (request names, pool, device, CDI ids)."""
    import grpc

    from nvc.k8s.dra import dra_pb2 as pb
    from nvc.k8s.dra import dra_pb2_grpc as api

    request = [pb.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]
    with grpc.insecure_channel(f"unix://{endpoint}") as channel:
        stub = api.DRAPluginStub(channel)
        if method == "prepare":
            answer = stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=request), timeout=30)
            return {
                uid: a.error
                or [(list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids)) for d in a.devices]
                for uid, a in answer.claims.items()
            }
        answer = stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=request), timeout=30)
        return {uid: a.error for uid, a in answer.claims.items()}
