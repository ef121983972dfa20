"""Fuzz target: the OCI state a runtime writes on the hook's stdin (nvc.hook.oci.spec.parse_state, and
stopped() for poststop)."""

from __future__ import annotations

from target import fuzz, instrumented

with instrumented():
    from nvc.errors import NvcError
    from nvc.hook.oci import spec


def one(data: bytes) -> None:
    try:
        spec.stopped(data)
    except NvcError:
        pass
    spec.parse_state(data)


if __name__ == "__main__":
    fuzz(one, (NvcError,))
