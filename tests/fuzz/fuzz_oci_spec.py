"""Fuzz target: a bundle's config.json as the hook reads it (nvc.hook.oci.spec.parse_config and
container()), and what the hook decides from it: the GPU request of its NVIDIA_* variables and
device volume mounts (nvc.plan.fromenv) and its sharing request (nvc.containerenv.sharing),
under the default policy and under one that takes volume mounts and no unprivileged env."""

from __future__ import annotations

from target import fuzz, instrumented

with instrumented():
    from nvc.containerenv import Policy, sharing
    from nvc.errors import NvcError
    from nvc.hook.oci import spec
    from nvc.plan import fromenv, requirements, selection  # noqa: F401 - imported by gpu_request: instrumented here

POLICIES = (Policy(), Policy(accept_envvar_when_unprivileged=False, accept_volume_mounts=True))


def one(data: bytes) -> None:
    ctr = spec.container("/run/bundle", spec.parse_config(data, "/run/bundle/config.json"))
    for policy in POLICIES:
        try:
            fromenv.gpu_request(ctr.env, list(ctr.mounts), ctr.privileged, policy, [])
        except NvcError:
            pass
        asked = fromenv.parse_share_env(sharing.share_env(ctr.env, ctr.mounts, policy))
        fromenv.with_defaults(asked, "8Gi", 50)


if __name__ == "__main__":
    fuzz(one, (NvcError,))
