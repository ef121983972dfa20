"""Fuzz target: the hook server's wire protocol, a call's first message as a worker reads it from
any process of root's (nvc.hook.server.handover.parse_call, then what nvc.hook.server.exchange checks of it
without a socket: the program, the client's connect stamp, whether the server runs the call), and
$NVC_PY_HOOK_TIMEOUT's grammar (handover.timeout_us), which the client reads from its caller."""

from __future__ import annotations

import os

from target import fuzz, instrumented

with instrumented(("click",)):
    from nvc.hook.server import exchange, handover, scope


def one(data: bytes) -> None:
    handover.timeout_us(data.decode("utf-8", "surrogateescape"))
    try:
        argv, env = handover.parse_call(data)
    except handover.CallError:
        return
    if os.path.basename(argv[0]) in handover.PROGRAMS:
        scope.served(argv)
    exchange.queue_wait_ms(env, 1 << 40)


if __name__ == "__main__":
    fuzz(one, ())
