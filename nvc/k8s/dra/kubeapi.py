"""A small client of the Kubernetes API server: JSON over HTTPS, what the DRA driver needs and no more.

Credentials from a kubeconfig (its current context: the server, its CA, a token or client
certificate, inline or in files) or, in a pod, the service account's (the token is read again for
every request: the kubelet rotates it). Errors name the request and carry the API server's status.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import urllib.parse
from collections.abc import Mapping
from typing import Any

from nvc.errors import InputError, NvcError

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
TIMEOUT_S = 15.0
_MAX_ANSWER = 64 << 20
KUBECONFIG_MAX = 4 << 20  # inline certificates make a kubeconfig kilobytes, never megabytes


class ApiError(NvcError):
    """The API server refused a request, or could not be reached (``status`` 0)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Client:
    def __init__(
        self, server: str, context: ssl.SSLContext | None, token: str | None = None, token_file: str | None = None
    ) -> None:
        url = urllib.parse.urlsplit(server)
        if url.scheme not in ("https", "http") or not url.hostname:
            raise InputError(f"{server}: not an API server URL (https://host[:port])")
        self.scheme, self.host, self.port = url.scheme, url.hostname, url.port
        self.prefix = url.path.rstrip("/")
        self.context, self.token, self.token_file = context, token, token_file

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "Content-Type": "application/json", "User-Agent": "nvc-py-dra"}
        token = self.token
        if self.token_file is not None:
            try:
                with open(self.token_file) as f:
                    token = f.read().strip()
            except OSError as err:
                raise ApiError(f"{self.token_file}: cannot read the token: {err.strerror}") from None
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def request(
        self, method: str, path: str, body: Mapping[str, Any] | None = None, query: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """The answer's JSON object; ApiError for a status of 300 or more, or no answer."""
        target = self.prefix + path + ("?" + urllib.parse.urlencode(query) if query else "")
        if self.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                self.host, self.port, timeout=TIMEOUT_S, context=self.context
            )
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT_S)
        try:
            conn.request(method, target, None if body is None else json.dumps(body).encode(), self._headers())
            answer = conn.getresponse()
            data = answer.read(_MAX_ANSWER)
        except (OSError, http.client.HTTPException) as err:
            raise ApiError(f"{method} {path}: no answer from the API server ({err})") from None
        finally:
            conn.close()
        try:
            doc = json.loads(data) if data else {}
        except ValueError:
            doc = {}
        if answer.status >= 300:
            reason = doc.get("message") if isinstance(doc, dict) else None
            raise ApiError(f"{method} {path}: {answer.status} {reason or answer.reason}", answer.status)
        if not isinstance(doc, dict):
            raise ApiError(f"{method} {path}: the answer is no JSON object")
        return doc


def _ssl(ca_file: str | None, ca_data: bytes | None, insecure: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca_file, cadata=ca_data.decode() if ca_data else None)
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def in_cluster(directory: str = SERVICE_ACCOUNT) -> Client:
    """The pod's service account; the API server from KUBERNETES_SERVICE_HOST and _PORT."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host or not os.path.exists(os.path.join(directory, "token")):
        raise InputError(f"not in a pod (no KUBERNETES_SERVICE_HOST, or no {directory}/token): give --kubeconfig")
    host = f"[{host}]" if ":" in host else host
    return Client(
        f"https://{host}:{port}",
        _ssl(os.path.join(directory, "ca.crt"), None, False),
        token_file=os.path.join(directory, "token"),
    )


def _named(doc: Mapping[str, Any], section: str, name: str, path: str) -> dict[str, Any]:
    for item in doc.get(section) or []:
        if isinstance(item, dict) and item.get("name") == name:
            return item.get(section[:-1]) or {}
    raise InputError(f"{path}: no {section[:-1]} {name!r}")


def _data(value: str, what: str, path: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise InputError(f"{path}: {what} is not base64") from None


def from_kubeconfig(path: str) -> Client:
    """The current context of the kubeconfig at ``path`` (relative file names are the file's)."""
    import yaml

    from nvc.system import untrusted

    try:
        data, _ = untrusted.read_file(path, KUBECONFIG_MAX)  # a FIFO or a device hangs no read
        doc = yaml.safe_load(data.decode())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise InputError(f"{path}: cannot read the kubeconfig: {err}") from None
    if not isinstance(doc, dict) or not doc.get("current-context"):
        raise InputError(f"{path}: not a kubeconfig with a current-context")
    context = _named(doc, "contexts", doc["current-context"], path)
    cluster = _named(doc, "clusters", str(context.get("cluster")), path)
    user = _named(doc, "users", str(context.get("user")), path) if context.get("user") else {}
    base = os.path.dirname(os.path.abspath(path))

    def file(name: str | None) -> str | None:
        return None if name is None else os.path.join(base, name)

    ca_data = (
        _data(cluster["certificate-authority-data"], "certificate-authority-data", path)
        if cluster.get("certificate-authority-data")
        else None
    )
    tls = _ssl(file(cluster.get("certificate-authority")), ca_data, bool(cluster.get("insecure-skip-tls-verify")))
    if user.get("client-certificate") or user.get("client-certificate-data"):
        _client_certificate(tls, user, file, path)
    if "server" not in cluster:
        raise InputError(f"{path}: cluster {context.get('cluster')!r} names no server")
    return Client(str(cluster["server"]), tls, token=user.get("token"), token_file=file(user.get("tokenFile")))


def _client_certificate(tls: ssl.SSLContext, user: Mapping[str, Any], file: Any, path: str) -> None:
    """Load the user's certificate and key; inline ones through memory files (ssl reads only files)."""
    fds = []
    try:
        names = []
        for key in ("client-certificate", "client-key"):
            if user.get(key + "-data"):
                fd = os.memfd_create(key, os.MFD_CLOEXEC)
                fds.append(fd)
                os.write(fd, _data(user[key + "-data"], key + "-data", path))
                names.append(f"/proc/self/fd/{fd}")
            else:
                names.append(file(user.get(key)))
        tls.load_cert_chain(names[0], names[1])
    except (OSError, ssl.SSLError) as err:
        raise InputError(f"{path}: cannot load the client certificate: {err}") from None
    finally:
        for fd in fds:
            os.close(fd)
