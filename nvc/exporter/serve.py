"""The exporter's HTTP side: prometheus_client's handler (every path answers the metrics, in the
format the scraper asks for) on a TCP address or a unix socket until SIGTERM, with TLS and basic
authentication where the web configuration asks for them (:mod:`nvc.exporter.webconfig`).

Whoever reaches the port can hold a connection open, send slowly or send too much. So each
connection gets a thread of its own (a slow or idle client holds up no scrape), within bounds no
client can stretch:

- at most :data:`MAX_CONNECTIONS` connections at once, each with a thread and at most
  :data:`MAX_HEAD` bytes of request (plus the response it is sent);
- the request's head, the TLS handshake included, within :data:`HEAD_TIMEOUT` of the accept, the whole
  exchange within :data:`REQUEST_DEADLINE`, whatever pace the client keeps: a client that sends a byte
  every few seconds is dropped;
- one connection too many closes the oldest connection still in its head, so idle connections
  cannot keep a scrape out; when every connection is past its head, the new one gets a 503;
- a head over :data:`MAX_HEAD` bytes gets a 431 (a 414 when the request line alone is), a malformed
  request line a 400, before the connection is closed.

HTTP/1.0: one request per connection. Scrapes take turns in the collector (its lock). The NVML
helper is forked before the first connection's thread starts; one forked again later, from a
connection's thread, keeps to what a fork allows there (:mod:`nvc.rpc.helper`).
"""

from __future__ import annotations

import io
import os
import re
import signal
import socket
import socketserver
import ssl
import stat
import sys
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from nvc.errors import InputError, shown
from nvc.exporter.basicauth import BasicAuth
from nvc.exporter.webconfig import WebConfig
from nvc.records import NamedTuple

DEFAULT_LISTEN = "127.0.0.1:9402"  # beside the DCGM exporter's 9400, which may run on the same node
MAX_CONNECTIONS = 128  # connections served at once
MAX_HEAD = 16 * 1024  # bytes of request line and headers (a scrape's are a few hundred)
HEAD_TIMEOUT = 5.0  # seconds from the accept to the head's blank line, the TLS handshake included
REQUEST_DEADLINE = 30.0  # seconds from the accept to the response's last byte
DRAIN = (1.0, 1 << 20)  # after an error answer, what is still read of the request (seconds, bytes)
_SEND = 16 * 1024  # bytes sent at a time: the deadline is checked between them
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_BUSY = b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


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
        path = text[len("unix:") :]
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


class _Refused(Exception):
    """The request is answered with an error status instead of being served."""

    def __init__(self, status: HTTPStatus, why: str) -> None:
        super().__init__(why)
        self.status = status


def _left(deadline: float) -> float:
    """Seconds until ``deadline``; TimeoutError once it passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the connection's time is up")
    return left


def read_head(sock: socket.socket, deadline: float, limit: int = MAX_HEAD) -> bytes:
    """The request line and headers through their blank line, read by ``deadline``; _Refused when
    they are longer than ``limit`` bytes."""
    data = b""
    while True:
        sock.settimeout(_left(deadline))
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionAbortedError("closed before the end of its request")
        data += chunk
        end = _HEAD_END.search(data)
        if end is not None and end.end() <= limit:
            return data[: end.end()]
        if len(data) > limit:
            if b"\n" not in data[:limit]:
                raise _Refused(HTTPStatus.REQUEST_URI_TOO_LONG, f"request line over {limit} bytes")
            raise _Refused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"request headers over {limit} bytes")


class _Writer:
    """A connection's output (the handler's wfile): every byte sent by the deadline."""

    closed = False

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        for start in range(0, len(view), _SEND):
            self.sock.settimeout(_left(self.deadline))
            self.sock.sendall(view[start : start + _SEND])
        return len(view)

    def flush(self) -> None:
        pass


@dataclass
class _Slot:
    """A connection the server holds."""

    accepted: float  # time.monotonic()
    sock: socket.socket  # the accepted socket, or its TLS socket
    in_head: bool = True  # still in its TLS handshake or head: closed first when one too many arrives


class _Server(socketserver.ThreadingMixIn, HTTPServer):
    """A thread per connection, :data:`MAX_CONNECTIONS` at most (the module's docstring)."""

    daemon_threads = True
    request_queue_size = MAX_CONNECTIONS

    def __init__(self, listen: Listen, handler: type, tls: ssl.SSLContext | None, web: WebConfig) -> None:
        self.address_family = listen.family
        self.tls, self.headers = tls, web.headers
        self.auth = BasicAuth(web.users) if web.users else None
        self.lock = threading.Lock()
        self.slots: dict[socket.socket, _Slot] = {}  # by the accepted socket
        super().__init__(listen.address, handler)

    def server_bind(self) -> None:
        if self.address_family != socket.AF_UNIX:
            super().server_bind()
            return
        old = os.umask(0o117)  # root and its group
        try:
            socketserver.TCPServer.server_bind(self)  # HTTPServer's looks up a host name
        finally:
            os.umask(old)
        self.server_name, self.server_port = "localhost", 0

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.lock:
            room = len(self.slots) < MAX_CONNECTIONS or self._close_oldest_in_head()
            if room:
                self.slots[request] = _Slot(time.monotonic(), request)
        if room:
            super().process_request(request, client_address)
            return
        if self.tls is None:
            try:
                request.setblocking(False)
                request.send(_BUSY)
            except OSError:
                pass
        self.shutdown_request(request)

    def _close_oldest_in_head(self) -> bool:
        """Shut down the connection longest in its head (with the lock held), or say there is none."""
        waiting = [(slot.accepted, key) for key, slot in self.slots.items() if slot.in_head]
        if not waiting:
            return False
        oldest = self.slots.pop(min(waiting, key=lambda pair: pair[0])[1])
        try:
            socket.socket.shutdown(oldest.sock, socket.SHUT_RDWR)  # the socket's own, also under TLS
        except OSError:
            pass
        return True

    def wrap(self, slot: _Slot) -> ssl.SSLSocket:
        """The connection's TLS socket (its handshake not done yet)."""
        assert self.tls is not None
        with self.lock:  # the wrap takes the descriptor over: from now on the slot names the TLS socket
            slot.sock = self.tls.wrap_socket(slot.sock, server_side=True, do_handshake_on_connect=False)
        return slot.sock  # type: ignore[return-value]

    def past_head(self, slot: _Slot) -> None:
        with self.lock:
            slot.in_head = False

    def release(self, request: Any) -> None:
        """The connection is done: no longer counted, nor shut down by another thread after this."""
        with self.lock:
            self.slots.pop(request, None)

    def shutdown_request(self, request: Any) -> None:
        self.release(request)  # also where its thread could not start
        super().shutdown_request(request)


class _Connection(BaseHTTPRequestHandler):
    """One connection: its TLS handshake and head by their timeout, then one request."""

    server: _Server
    default_request_version = "HTTP/1.0"  # a malformed request line is answered with a status line too

    def version_string(self) -> str:
        return "nvc-py-exporter"  # no Python version for whoever probes the port

    def setup(self) -> None:
        self.slot = self.server.slots.get(self.request)
        self.connection: socket.socket = self.request
        self.rfile = io.BytesIO()
        self.wfile = _Writer(self.request, (self.slot.accepted if self.slot else 0.0) + REQUEST_DEADLINE)

    def handle(self) -> None:
        self.close_connection = True
        if self.slot is None:  # shut down for a newer connection before this thread started
            return
        head_by = min(self.wfile.deadline, self.slot.accepted + HEAD_TIMEOUT)
        try:
            if self.server.tls is not None:
                self.connection = self.wfile.sock = self.server.wrap(self.slot)
                self.connection.settimeout(_left(head_by))
                self.connection.do_handshake()  # type: ignore[attr-defined]
            head = read_head(self.connection, head_by)
        except _Refused as refused:
            self.server.past_head(self.slot)
            self._refuse(refused)
            return
        except OSError:  # its time is up, it left, its TLS failed, or a newer connection closed it
            return
        self.server.past_head(self.slot)
        self.rfile = io.BytesIO(head)
        try:
            self.handle_one_request()
        except OSError:
            pass

    def _refuse(self, refused: _Refused) -> None:
        """Answer ``refused``'s status, then read on what the client still sends for a little while:
        closing with its request unread would reset the connection before it reads the answer."""
        self.requestline = self.request_version = self.command = ""
        try:
            self.send_error(refused.status, str(refused))
            socket.socket.shutdown(self.connection, socket.SHUT_WR)
            until, left = min(self.wfile.deadline, time.monotonic() + DRAIN[0]), DRAIN[1]
            while left > 0:
                self.connection.settimeout(_left(until))
                chunk = socket.socket.recv(self.connection, min(left, 65536))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The status's own reason phrase; what was wrong (quoting the request) in the body only."""
        super().send_error(code, None, explain or message)

    def parse_request(self) -> bool:
        """The request's head, then its credentials where the web configuration names users."""
        if not super().parse_request():
            return False
        auth = self.server.auth
        if auth is None or auth.allows(self.headers.get("Authorization")):
            return True
        body = b"Unauthorized\n"
        self.send_response(HTTPStatus.UNAUTHORIZED)
        self.send_header("WWW-Authenticate", 'Basic realm="nvc-py exporter", charset="UTF-8"')
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        return False

    def end_headers(self) -> None:
        for name, value in self.server.headers.items():
            self.send_header(name, value)
        super().end_headers()

    def finish(self) -> None:
        self.server.release(self.request)
        if self.connection is not self.request:
            self.connection.close()


def _replace_stale_socket(path: str) -> None:
    """A socket left at ``path`` (an exporter that was killed) goes; anything else there is an error."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise InputError(f"{path}: exists and is not a socket (not replaced)")
    os.unlink(path)


def serve(listen: Listen, collector: Any, web: WebConfig, tls: ssl.SSLContext | None) -> int:
    """Answer scrapes with ``collector``'s metrics until SIGTERM or SIGINT; over TLS with ``tls``
    (the web configuration's, :func:`nvc.exporter.webconfig.tls_context`)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import MetricsHandler

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    handler = type("Handler", (_Connection, MetricsHandler.factory(registry)), {})
    try:
        if listen.family == socket.AF_UNIX:
            _replace_stale_socket(listen.address)
        server = _Server(listen, handler, tls, web)
    except OSError as err:
        raise InputError(f"cannot listen on {listen.url(listen.address)}: {err.strerror}") from None

    def stop(number: int, frame: Any) -> None:
        raise SystemExit(0)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    url = listen.url(server.server_address)
    print(
        f"nvc-py exporter: listening on {url.replace('http:', 'https:', 1) if tls else url}",
        file=sys.stderr,
        flush=True,
    )
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
