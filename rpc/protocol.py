"""The framed wire protocol between nvc-py and its forked helpers.

Each message is a 4-byte big-endian length followed by that many bytes of compact UTF-8
JSON. Framing (rather than newline-delimited JSON) lets the reader know up front how much
to expect, so a helper that dies mid-message is reported as a truncated frame instead of
as a JSON syntax error, and a corrupted length is caught by the size guard before any
allocation.

Schema, version :data:`PROTOCOL_VERSION`::

    request   {"v": 1, "id": n, "method": str, "params": {…}, "fds": n}
    response  {"v": 1, "id": n, "result": …}
              {"v": 1, "id": n, "error": {"kind": str, "message": str, "code": int | null}}

A request may carry file descriptors (a container's process, pinned: :mod:`nvc.apply.container`),
sent as SCM_RIGHTS with its frame's first byte; ``fds`` (absent: none) says how many, so that one
lost on the way is an error, not a call with fewer.

``kind`` names an :mod:`nvc.errors` class (its ``kind`` attribute) so the parent can re-raise
the error the helper hit; ``code`` carries a service-specific number (an NVML return value).

Encoding and decoding are pure functions; the socket helpers on top of them take an absolute
``time.monotonic()`` deadline so a caller's timeout covers the whole message, not each read.
"""

from __future__ import annotations

import _socket  # not socket: its module's enum conversions cost every direct hook ~1.5 ms
import array
import json
import struct
import time
from collections.abc import Mapping
from types import MappingProxyType

from nvc.records import NamedTuple

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PROTOCOL_VERSION = 1
HEADER = struct.Struct(">I")
# Far above any real message (a 64-GPU snapshot is a few tens of KiB), far below anything
# that would hurt to allocate when a length prefix is garbage.
MAX_FRAME = 1 << 20
MAX_FDS = 8  # descriptors one request may carry


class ProtocolError(Exception):
    """A frame or message broke the protocol (bad length, bad JSON, wrong schema)."""


class TruncatedFrame(ProtocolError):
    """The stream ended, or the buffer stops, inside a frame."""


class EndOfStream(ProtocolError):
    """The peer closed the stream cleanly, between two frames."""


class Request(NamedTuple):
    id: int
    method: str
    params: Mapping[str, Any] = MappingProxyType({})
    fds: tuple[int, ...] = ()  # descriptors sent with it (SCM_RIGHTS)


class RemoteError(NamedTuple):
    kind: str  # an nvc.errors kind: "driver", "initialization", …
    message: str
    code: int | None = None


class Response(NamedTuple):
    id: int
    result: Any = None
    error: RemoteError | None = None


def encode(message: Request | Response) -> bytes:
    """Return the complete frame (length prefix + JSON payload) of one message."""
    body: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": message.id}
    if isinstance(message, Request):
        body["method"] = message.method
        body["params"] = dict(message.params)
        if message.fds:
            body["fds"] = len(message.fds)
    elif message.error is not None:
        err = message.error
        body["error"] = {"kind": err.kind, "message": err.message, "code": err.code}
    else:
        body["result"] = message.result
    payload = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if len(payload) > MAX_FRAME:
        raise ProtocolError(f"message of {len(payload)} bytes exceeds the {MAX_FRAME}-byte frame limit")
    return HEADER.pack(len(payload)) + payload


def frame_length(header: bytes) -> int:
    """Return the payload length announced by a 4-byte header, refusing oversized frames."""
    (length,) = HEADER.unpack(header)
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes exceeds the {MAX_FRAME}-byte limit")
    return length


def _load(payload: bytes) -> dict[str, Any]:
    try:
        body = json.loads(payload.decode("utf-8"))
    except ValueError as err:  # not UTF-8, not JSON, an integer of more than 4300 digits
        raise ProtocolError(f"malformed payload: {err}") from None
    except RecursionError:
        raise ProtocolError("malformed payload: nested too deeply") from None
    if not isinstance(body, dict):
        raise ProtocolError(f"payload is a {type(body).__name__}, not an object")
    if body.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {body.get('v')!r} is not {PROTOCOL_VERSION}")
    if not isinstance(body.get("id"), int):
        raise ProtocolError(f"message id {body.get('id')!r} is not an integer")
    return body


def decode_request(payload: bytes, fds: tuple[int, ...] = ()) -> Request:
    """Parse and validate a request payload (without its length prefix) that came with ``fds``."""
    body = _load(payload)
    method, params = body.get("method"), body.get("params", {})
    if not isinstance(method, str) or not isinstance(params, dict):
        raise ProtocolError(f"request {body['id']} needs a string method and object params")
    if body.get("fds", 0) != len(fds):
        raise ProtocolError(f"request {body['id']} came with {len(fds)} descriptors, not {body.get('fds', 0)!r}")
    return Request(body["id"], method, params, fds)


def decode_response(payload: bytes) -> Response:
    """Parse and validate a response payload (without its length prefix)."""
    body = _load(payload)
    if ("result" in body) == ("error" in body):
        raise ProtocolError(f"response {body['id']} must have exactly one of result and error")
    if "result" in body:
        return Response(body["id"], result=body["result"])
    err = body["error"]
    if (
        not isinstance(err, dict)
        or not isinstance(err.get("kind"), str)
        or not isinstance(err.get("message"), str)
        or not isinstance(err.get("code"), (int, type(None)))
    ):
        raise ProtocolError(f"response {body['id']} has a malformed error: {err!r}")
    return Response(body["id"], error=RemoteError(err["kind"], err["message"], err.get("code")))


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    return left


def send_frame(sock: _socket.socket, frame: bytes, deadline: float | None = None, fds: tuple[int, ...] = ()) -> None:
    """Write one encoded frame, ``fds`` with its first byte; raise TimeoutError if the peer does
    not drain it before ``deadline``."""
    data = memoryview(frame)
    if fds:
        sock.settimeout(_remaining(deadline))
        data = data[sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, array.array("i", fds))]) :]
    while data:
        sock.settimeout(_remaining(deadline))
        data = data[sock.send(data) :]


def send_message(sock: _socket.socket, message: Request | Response, deadline: float | None = None) -> None:
    """Encode and write one message, a request's descriptors with it (see :func:`send_frame`)."""
    send_frame(sock, encode(message), deadline, message.fds if isinstance(message, Request) else ())


def _recv_exactly(
    sock: _socket.socket, size: int, deadline: float | None, at_boundary: bool, fds: list[int] | None = None
) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        sock.settimeout(_remaining(deadline))
        if fds is None:
            chunk = sock.recv(size - len(buf))
        else:
            chunk = _recv_with_fds(sock, size - len(buf), fds)
        if not chunk:
            if at_boundary and not buf:
                raise EndOfStream("peer closed the connection")
            raise TruncatedFrame(f"connection closed after {len(buf)} of {size} bytes")
        buf += chunk
    return bytes(buf)


def _recv_with_fds(sock: _socket.socket, size: int, fds: list[int]) -> bytes:
    """Up to ``size`` bytes; descriptors that came with them appended to ``fds`` (close-on-exec)."""
    chunk, ancillary, flags, _ = sock.recvmsg(size, _socket.CMSG_SPACE(MAX_FDS * 4), _socket.MSG_CMSG_CLOEXEC)
    for level, kind, data in ancillary:
        if (level, kind) == (_socket.SOL_SOCKET, _socket.SCM_RIGHTS):
            received = array.array("i")
            received.frombytes(data[: len(data) - len(data) % received.itemsize])
            fds.extend(received)
    if flags & _socket.MSG_CTRUNC:
        raise ProtocolError(f"more than {MAX_FDS} descriptors sent")
    return chunk


def recv_payload(sock: _socket.socket, deadline: float | None = None, fds: list[int] | None = None) -> bytes:
    """Read one frame's payload; EndOfStream on a clean close, TruncatedFrame mid-frame. With
    ``fds``, the descriptors sent with the frame are appended to it (the caller closes them, also
    on an error); without, any are dropped (the kernel closes them)."""
    length = frame_length(_recv_exactly(sock, HEADER.size, deadline, at_boundary=True, fds=fds))
    return _recv_exactly(sock, length, deadline, at_boundary=False, fds=fds)
