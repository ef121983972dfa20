"""Fuzz target: the framed protocol between nvc-py and its helpers (nvc.rpc.protocol): a frame's
length prefix, and its payload read as a request (a helper's side) and as a response (what nvc-py
reads back from a helper, which runs in the container's namespaces or as an unprivileged user)."""

from __future__ import annotations

from target import fuzz, instrumented

with instrumented():
    from nvc.rpc import protocol


def one(data: bytes) -> None:
    header, payload = data[: protocol.HEADER.size], data[protocol.HEADER.size :]
    if len(header) == protocol.HEADER.size:
        try:
            protocol.frame_length(header)
        except protocol.ProtocolError:
            pass
    try:
        protocol.decode_request(payload, (7,) * (header[:1] == b"\1"))
    except protocol.ProtocolError:
        pass
    protocol.decode_response(payload)


if __name__ == "__main__":
    fuzz(one, (protocol.ProtocolError,))
