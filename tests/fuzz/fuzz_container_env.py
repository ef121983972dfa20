"""Fuzz target: the NVIDIA_* and sharing variables (NVC_SHARE_*, HAMi's CUDA_DEVICE_*) of a
container's environment, and the device plugin's /dev/null volume mounts that stand for them.

The input's lines are the spec's ``process.env`` entries, and a line starting with ``/`` the
destination of a /dev/null mount. Its first byte's low bits choose the container's privilege and
the host's policy. Read as the hook reads them (nvc.plan.fromenv.gpu_request, sharing's
share_env and parse_share_env, with the configuration's defaults), then written as the shim's
limits file (nvc.plan.share.limits_text)."""

from __future__ import annotations

from target import fuzz, instrumented

with instrumented():
    from nvc.containerenv import VOLUME_SOURCE, Policy, parse_env, sharing
    from nvc.errors import NvcError
    from nvc.plan import fromenv, requirements, selection, share  # noqa: F401 - gpu_request's: instrumented here


def one(data: bytes) -> None:
    if not data:
        return
    flags, lines = data[0], data[1:].decode("utf-8", "surrogateescape").split("\n")
    env = parse_env(line for line in lines if not line.startswith("/"))
    mounts = [{"source": VOLUME_SOURCE, "destination": line, "type": "bind"} for line in lines if line.startswith("/")]
    privileged = bool(flags & 1)
    policy = Policy(
        accept_envvar_when_unprivileged=bool(flags & 2),
        accept_volume_mounts=bool(flags & 4),
        disable_require=bool(flags & 8),
    )
    try:
        fromenv.gpu_request(env, mounts, privileged, policy, [])
    except NvcError:
        pass
    asked = fromenv.parse_share_env(sharing.share_env(env, mounts, policy))
    if flags & 16:
        asked = fromenv.with_defaults(asked, "512Mi", 30)
    if asked is not None:
        share.limits_text(asked, "fuzz")


if __name__ == "__main__":
    fuzz(one, (NvcError,))
