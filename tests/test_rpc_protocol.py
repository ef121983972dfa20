"""The helper protocol: frames, requests and responses, and what is refused, over real sockets."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from nvc.rpc import protocol

# ---- protocol -----------------------------------------------------------------------------


def _payloads(data: bytes) -> Iterator[bytes]:
    """The payloads a reader gets from a peer that sent ``data`` and closed: the real reader,
    :func:`protocol.recv_payload`, over a socketpair, until the clean end of the stream."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(data)
        theirs.shutdown(socket.SHUT_WR)
        while True:
            try:
                yield protocol.recv_payload(ours, time.monotonic() + 5)
            except protocol.EndOfStream:
                return


def test_request_and_responses_round_trip() -> None:
    messages = [
        protocol.Request(7, "snapshot", {"a": [1, "ü"]}),
        protocol.Response(7, result={"gpus": [], "v": None}),
        protocol.Response(8, error=protocol.RemoteError("driver", "nvml error: gpu is lost", 15)),
    ]
    payloads = list(_payloads(b"".join(protocol.encode(m) for m in messages)))
    assert len(payloads) == 3
    assert protocol.decode_request(payloads[0]) == messages[0]
    assert [protocol.decode_response(p) for p in payloads[1:]] == messages[1:]


def test_frame_is_length_prefixed_compact_json() -> None:
    frame = protocol.encode(protocol.Request(1, "m"))
    payload = b'{"v":1,"id":1,"method":"m","params":{}}'
    assert frame == len(payload).to_bytes(4, "big") + payload


@pytest.mark.parametrize("cut", [3, 4, 10])
def test_truncated_frames_are_reported(cut: int) -> None:
    frame = protocol.encode(protocol.Request(1, "snapshot"))
    with pytest.raises(protocol.TruncatedFrame, match="connection closed after"):
        list(_payloads(frame[:cut]))
    assert list(_payloads(b"")) == []  # closed between frames: the clean end


def test_oversized_frames_are_refused_both_ways() -> None:
    with pytest.raises(protocol.ProtocolError, match="exceeds"):
        protocol.encode(protocol.Response(1, result="x" * protocol.MAX_FRAME))
    with pytest.raises(protocol.ProtocolError, match="exceeds"):
        list(_payloads((protocol.MAX_FRAME + 1).to_bytes(4, "big") + b"{}"))


@pytest.mark.parametrize(
    ("payload", "complaint"),
    [
        (b"{not json", "malformed payload"),
        (b"[1]", "not an object"),
        (b'{"v":2,"id":1,"result":0}', "protocol version 2"),
        (b'{"v":1,"id":"1","result":0}', "not an integer"),
        (b'{"v":1,"id":1,"result":0,"error":{}}', "exactly one"),
        (b'{"v":1,"id":1,"error":{"kind":"driver"}}', "malformed error"),
        # found by tests/fuzz/fuzz_rpc_frame.py: a RecursionError, int()'s ValueError
        (b"[" * 100_000, "nested too deeply"),
        (b'{"v":1,"id":' + b"1" * 5000 + b',"result":0}', "malformed payload: Exceeds the limit"),
    ],
)
def test_bad_responses_are_refused(payload: bytes, complaint: str) -> None:
    with pytest.raises(protocol.ProtocolError, match=complaint):
        protocol.decode_response(payload)


def test_an_error_without_a_code_has_none() -> None:
    """The code may be absent, as null (a KeyError found by tests/fuzz/fuzz_rpc_frame.py)."""
    payload = b'{"v":1,"id":3,"error":{"kind":"driver","message":"m"}}'
    assert protocol.decode_response(payload).error == protocol.RemoteError("driver", "m", None)


def test_bad_requests_are_refused() -> None:
    with pytest.raises(protocol.ProtocolError, match="string method"):
        protocol.decode_request(b'{"v":1,"id":1,"method":3,"params":{}}')


def test_socket_helpers_tell_clean_close_from_truncation_and_timeout() -> None:
    a, b = socket.socketpair()
    with a, b:
        protocol.send_message(a, protocol.Request(1, "x"), time.monotonic() + 1)
        assert protocol.decode_request(protocol.recv_payload(b, time.monotonic() + 1)).method == "x"
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            protocol.recv_payload(b, start + 0.1)
        assert 0.09 < time.monotonic() - start < 1
        a.sendall(protocol.encode(protocol.Request(2, "y"))[:6])
        a.shutdown(socket.SHUT_WR)
        with pytest.raises(protocol.TruncatedFrame, match="after 2 of"):
            protocol.recv_payload(b, time.monotonic() + 1)
    c, d = socket.socketpair()
    with c, d:
        c.close()
        with pytest.raises(protocol.EndOfStream):
            protocol.recv_payload(d, time.monotonic() + 1)
