"""The exporter's HTTP side: prometheus_client's handler (every path answers the metrics, in the
format the scraper asks for) on a TCP address or a unix socket, until SIGTERM. One request at a
time: a scrape takes milliseconds, and the NVML helper is forked with no other thread running.
"""

from __future__ import annotations

import os
import signal
import socket
import socketserver
import stat
import sys
from http.server import HTTPServer
from typing import Any, NamedTuple

from nvc.errors import InputError, shown

DEFAULT_LISTEN = "127.0.0.1:9402"  # beside the DCGM exporter's 9400, which may run on the same node
REQUEST_TIMEOUT = 10.0  # seconds a client may take to send its request


class Listen(NamedTuple):
    family: int  # AF_INET, AF_INET6 or AF_UNIX
    address: Any  # (host, port), or the socket's path

    def url(self, bound: Any) -> str:
        if self.family == socket.AF_UNIX:
            return f"unix:{self.address}"
        host = f"[{bound[0]}]" if self.family == socket.AF_INET6 else bound[0]
        return f"http://{host}:{bound[1]}/metrics"


def parse_listen(text: str) -> Listen:
    """``ADDR:PORT`` (an IPv6 address in brackets; port 0: any free one) or ``unix:PATH`` (absolute)."""
    if text.startswith("unix:"):
        path = text[len("unix:"):]
        if not os.path.isabs(path):
            raise InputError(f"--listen {shown(text)}: unix:PATH needs an absolute path")
        return Listen(socket.AF_UNIX, path)
    host, colon, port = text.rpartition(":")
    family = socket.AF_INET
    if host.startswith("[") and host.endswith("]"):
        host, family = host[1:-1], socket.AF_INET6
    if not colon or not host or not (port.isascii() and port.isdigit() and len(port) <= 5 and int(port) < 65536):
        raise InputError(f"--listen {shown(text)}: not ADDR:PORT ([ADDR]:PORT for IPv6) or unix:PATH")
    try:
        socket.inet_pton(family, host)
    except OSError:
        raise InputError(f"--listen {shown(text)}: {shown(host)} is not an IP address") from None
    return Listen(family, (host, int(port)))


class _TcpServer(HTTPServer):
    def __init__(self, listen: Listen, handler: type) -> None:
        self.address_family = listen.family
        super().__init__(listen.address, handler)


class _UnixServer(HTTPServer):
    """HTTP on a unix socket: bound as a stream server (HTTPServer's bind looks up a host name)."""

    address_family = socket.AF_UNIX

    def server_bind(self) -> None:
        old = os.umask(0o117)  # root and its group
        try:
            socketserver.TCPServer.server_bind(self)
        finally:
            os.umask(old)
        self.server_name, self.server_port = "localhost", 0


def _replace_stale_socket(path: str) -> None:
    """A socket left at ``path`` (an exporter that was killed) goes; anything else there is an error."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise InputError(f"{path}: exists and is not a socket (not replaced)")
    os.unlink(path)


def serve(listen: Listen, collector: Any) -> int:
    """Answer scrapes with ``collector``'s metrics until SIGTERM or SIGINT."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import MetricsHandler

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    handler = type("Handler", (MetricsHandler.factory(registry),), {"timeout": REQUEST_TIMEOUT})
    try:
        if listen.family == socket.AF_UNIX:
            _replace_stale_socket(listen.address)
            server: HTTPServer = _UnixServer(listen.address, handler)
        else:
            server = _TcpServer(listen, handler)
    except OSError as err:
        raise InputError(f"cannot listen on {listen.url(listen.address)}: {err.strerror}") from None

    def stop(number: int, frame: Any) -> None:
        raise SystemExit(0)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    print(f"nvc-py exporter: listening on {listen.url(server.server_address)}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except SystemExit:
        pass
    finally:
        server.server_close()
        if listen.family == socket.AF_UNIX:
            try:
                os.unlink(listen.address)
            except FileNotFoundError:
                pass
    return 0
