"""A Kubernetes API server stand-in for the DRA driver's tests, run as a process of its own:
``python apiserver.py DIR`` serves HTTPS with DIR/cert.pem and DIR/key.pem, writes its port to DIR/port.

It keeps ResourceSlices (cluster-wide) and ResourceClaims (namespaced) of resource.k8s.io/v1 and one Node
in memory, and does what the real one does with them where the driver depends on it: bearer token
authentication (401), create (409 when the name is taken), replace with a resourceVersion (409 when stale),
delete, get, list with the field selectors ResourceSlices support (spec.nodeName, spec.driver), and the
checks of a slice's devices that would make a real API server refuse it (device names, attribute names,
one typed value each, semantic versions, at most 32 attributes and capacities). A process of its own:
the tests' process must have no threads (tests/harness/deviceplugin.py says why).
"""

from __future__ import annotations

import json
import re
import ssl
import sys
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

TOKEN = "nvc-py-test-token"
NODE = "node-a"
NODE_UID = "3f1e7a52-0b7d-4f43-9d0e-6a5b2c1d8e90"
RESOURCE = "/apis/resource.k8s.io/v1"
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_ATTRIBUTE = re.compile(r"([a-z0-9.-]{1,63}/)?[A-Za-z][A-Za-z0-9_]{0,31}")
_SEMVER = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)")

store: dict[str, dict[str, Any]] = {"resourceslices": {}, "resourceclaims": {}}
version = [0]


def slice_problem(item: dict[str, Any]) -> str | None:
    for device in item.get("spec", {}).get("devices", []):
        if not _LABEL.fullmatch(device.get("name", "")):
            return f"device name {device.get('name')!r}"
        if len(device.get("attributes", {})) + len(device.get("capacity", {})) > 32:
            return f"device {device['name']}: more than 32 attributes and capacities"
        for name, value in device.get("attributes", {}).items():
            if (
                not _ATTRIBUTE.fullmatch(name)
                or len(value) != 1
                or next(iter(value)) not in ("int", "bool", "string", "version")
            ):
                return f"device {device['name']}: attribute {name}: {value}"
            if "version" in value and not _SEMVER.fullmatch(value["version"]):
                return f"device {device['name']}: attribute {name}: {value['version']!r} is no semantic version"
    return None


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def answer(self, status: int, doc: dict[str, Any]) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def fail(self, status: int, message: str) -> None:
        self.answer(status, {"kind": "Status", "status": "Failure", "message": message, "code": status})

    def route(self) -> tuple[str, str | None, dict[str, str]] | None:
        """(collection, object key or None, query) of the request's path."""
        path, _, query = self.path.partition("?")
        params = dict(p.partition("=")[::2] for p in query.split("&") if p)
        if path == f"/api/v1/nodes/{NODE}":
            return "node", None, params
        found = re.fullmatch(rf"{RESOURCE}(?:/namespaces/([^/]+))?/(resourceslices|resourceclaims)(?:/([^/]+))?", path)
        if not found:
            return None
        namespace, kind, name = found.groups()
        key = None if name is None else f"{namespace}/{name}" if namespace else name
        return kind, key, params

    def handle_any(self, method: str) -> None:
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self.fail(401, "Unauthorized")
        route = self.route()
        if route is None:
            return self.fail(404, f"no {self.path}")
        kind, key, params = route
        if kind == "node":
            return self.answer(200, {"kind": "Node", "metadata": {"name": NODE, "uid": NODE_UID}})
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
        objects = store[kind]
        if method == "GET" and key is None:
            items = list(objects.values())
            from urllib.parse import unquote

            for term in filter(None, unquote(params.get("fieldSelector", "")).split(",")):
                field, _, value = term.partition("=")
                items = [i for i in items if i["spec"].get(field.removeprefix("spec.")) == value]
            return self.answer(200, {"kind": "List", "items": items})
        if method == "POST":
            namespace = self.path.split("/namespaces/")[1].split("/")[0] if "/namespaces/" in self.path else None
            key = f"{namespace}/{body['metadata']['name']}" if namespace else body["metadata"]["name"]
            if key in objects:
                return self.fail(409, f"{key} already exists")
            body["metadata"]["uid"] = str(uuid.uuid4())
        elif key not in objects:
            return self.fail(404, f"{key} not found")
        if method == "GET":
            return self.answer(200, objects[key])
        if method == "DELETE":
            return self.answer(200, objects.pop(key))
        if method == "PUT" and body["metadata"].get("resourceVersion") != objects[key]["metadata"]["resourceVersion"]:
            return self.fail(409, f"{key}: the object has been modified")
        if method == "PUT":
            body["metadata"]["uid"] = objects[key]["metadata"]["uid"]
        problem = slice_problem(body) if kind == "resourceslices" else None
        if problem:
            return self.fail(422, f"ResourceSlice {key} is invalid: {problem}")
        version[0] += 1
        body["metadata"]["resourceVersion"] = str(version[0])
        objects[key] = body
        return self.answer(201 if method == "POST" else 200, body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's names
        self.handle_any("GET")

    def do_POST(self) -> None:  # noqa: N802
        self.handle_any("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self.handle_any("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self.handle_any("DELETE")


def main(directory: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(directory / "cert.pem", directory / "key.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    (directory / "port.tmp").write_text(str(server.server_address[1]))
    (directory / "port.tmp").rename(directory / "port")
    server.serve_forever()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
