"""Code run in a forked child with a mount namespace of its own, so that what it mounts never
reaches the test process or the host."""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable

from nvc.system import syscalls


def in_private_ns(fn: Callable[[], object], before: Callable[[], None] | None = None) -> object:
    """Run ``fn`` (after ``before``, when given) in a forked child with its own mount namespace,
    every mount private; return its JSON-able result, or raise its error here with its traceback."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            syscalls.unshare(syscalls.CLONE_NEWNS)
            syscalls.mount(None, "/", None, syscalls.MS_REC | syscalls.MS_PRIVATE)
            if before is not None:
                before()
            out = {"ok": fn()}
        except BaseException as err:  # noqa: BLE001 - reported to the parent
            out = {"error": type(err).__name__, "message": str(err), "tb": traceback.format_exc()}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    result = json.loads(data)
    if "error" in result:
        raise AssertionError(f"{result['error']}: {result['message']}\n{result['tb']}")
    return result["ok"]
