"""``nvc-py-hook``: the OCI hook that makes the GPUs a container asks for appear in it.

Registered as a ``prestart`` hook (podman hooks.d, ``nvc-py-runtime``, or by hand in
config.json). ``prestart`` reads the OCI state on stdin, loads the bundle's spec, decides
devices and capabilities from it (:mod:`nvc.plan.fromenv`) and runs the configure logic in
this same process: a container start pays for one interpreter, not two. A container asking
for GPU sharing (``NVC_SHARE_*``, HAMi's ``CUDA_DEVICE_*`` env) also gets the sharing shim
(:mod:`nvc.containerenv.sharing`), through MPS a daemon nvc-py runs (:mod:`nvc.apply.mps`);
``poststop`` drops its sharing directory and its place on that daemon. ``poststart`` has nothing to do.

A failure prints one line on stderr (the engine shows it to the user) and exits non-zero,
which makes the runtime abort the start. Every invocation leaves one structured line in
the configured log (:mod:`nvc.hook.oci.log`).
"""

from __future__ import annotations

import os
import sys
import time

from nvc.errors import ContainerError, InputError, NvcError, shown
from nvc.system.programs import DEFAULT_SOCKET, SOCKET_ENV

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from nvc.config import Config
    from nvc.config.options import GlobalOptions
    from nvc.containerenv import Policy
    from nvc.hook.oci.spec import Container, State
    from nvc.plan.request import Request, ShareRequest

PROG = "nvc-py-hook"
USAGE = (
    f"usage: {PROG} prestart|poststart|poststop  (OCI state on stdin)\n"
    f"       {PROG} create-symlinks --link TARGET::LINK ... | update-ldcache --folder DIR ...  (CDI hooks)\n"
    f"       {PROG} serve [--socket PATH]  (answer nvc-py-hook-client's calls; default ${SOCKET_ENV} "
    f"or {DEFAULT_SOCKET})\n"
    f"       {PROG} start-server  (the installed front's: a server that stays, where no systemd runs it)"
)
CDI_STAGES = ("create-symlinks", "update-ldcache")


def policy(config: Config) -> Policy:
    """What containers may ask for, from the configuration file."""
    from nvc.containerenv import Policy

    return Policy(
        accept_envvar_when_unprivileged=config.accept_envvar_when_unprivileged,
        accept_volume_mounts=config.accept_volume_mounts,
        disable_require=config.disable_require,
        supported_capabilities=frozenset(config.supported_capabilities),
    )


def global_options(config: Config) -> GlobalOptions:
    """The CLI's global options, as the configuration file sets them for the hook."""
    from nvc.config.options import GlobalOptions, parse_user

    return GlobalOptions(config.root, config.ldcache, parse_user(config.user), config.load_kmods)


def container_request(
    config: Config, state: State, ctr: Container, req: Request, sharing: ShareRequest | None = None
) -> Request:
    """What the spec asks for (``req``, parsed from its env), for this container (its rootfs and
    pid; its id names the sharing files) and with the host's configuration."""
    return req._replace(
        rootfs=ctr.rootfs,
        pid=state.pid,
        ldconfig=config.ldconfig,
        no_cgroups=config.no_cgroups,
        cuda_compat_mode=config.cuda_compat_mode,
        sharing=sharing,
        container_id=state.id,
        bundle=state.bundle,
        uid=ctr.uid,
        pod=ctr.pod,
    )


def share_request(config: Config, ctr: Container) -> ShareRequest | None:
    """The container's GPU sharing (its env or a device plugin's mounts, the configuration's defaults),
    None where it shares nothing; :class:`InputError` for limits that do not parse."""
    from nvc.containerenv.sharing import share_env
    from nvc.plan import fromenv

    sharing = fromenv.parse_share_env(share_env(ctr.env, ctr.mounts, policy(config)))
    if config.sharing.enabled:
        sharing = fromenv.with_defaults(sharing, config.sharing.device_memory_limit, config.sharing.device_sm_limit)
    if sharing is None:
        return None
    from nvc.plan.mps import with_configured

    return sharing._replace(backend=with_configured(sharing.backend, config.sharing.backend))


def prestart(config: Config, stdin: bytes, record: dict[str, Any]) -> None:
    """Configure the container of the state in ``stdin``; ``record`` collects the log line's fields."""
    from nvc.hook.oci import spec
    from nvc.plan import fromenv

    state = spec.parse_state(stdin)
    record["container"] = state.id
    ctr = spec.container(state.bundle, spec.load_config(state.bundle))
    warnings: list[str] = []
    req = fromenv.gpu_request(ctr.env, list(ctr.mounts), ctr.privileged, policy(config), warnings)
    for warning in warnings:
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    if warnings:
        record["warnings"] = warnings
    if req is None:
        record["outcome"] = "no-gpu"
        return
    record["devices"] = [s.text for s in req.selectors] or "none"
    record["capabilities"] = sorted(req.capabilities)
    if ctr.joined_mount_ns is not None:
        raise ContainerError(
            f"the container joins the mount namespace {shown(ctr.joined_mount_ns)} of another "
            "process (linux.namespaces): nvc-py configures only a container with a mount "
            "namespace of its own; give it one, or ask for no GPU"
        )
    from nvc.pipeline.configure import configure

    # junk limits refuse the container before anything changes; its sharing files are steps of the plan
    sharing = share_request(config, ctr)
    configure(global_options(config), container_request(config, state, ctr, req, sharing))
    if sharing:
        record["share"] = {"memory": dict(sharing.memory), "compute": dict(sharing.compute)}
        if any(backend == "mps" for _, backend in sharing.backend):
            record["share"]["backend"] = dict(sharing.backend)
    record["outcome"] = "configured"


def _cdi_hook(config: Config, stage: str, args: list[str], stdin: bytes, record: dict[str, Any]) -> None:
    from nvc.hook.oci import cdihooks

    if stage == "create-symlinks":
        cdihooks.create_symlinks(args, stdin)
    else:
        cdihooks.update_ldcache(args, stdin, config.ldconfig)
    record["outcome"] = "done"


def _stdin(given: bytes | None) -> bytes:
    """The OCI state: ``given`` (a server's call), else stdin, read up to one byte past the bound
    that :mod:`nvc.hook.oci.spec` checks, so a runtime (or anyone) streaming more cannot fill memory."""
    from nvc.hook.oci.spec import MAX_STATE_SIZE

    return sys.stdin.buffer.read(MAX_STATE_SIZE + 1) if given is None else given


def _poststop(stdin: bytes) -> int:
    """Drop the container's GPU-sharing directory, if it had one and it is this container's (not a
    running one's of the same id under another runtime root), and its place on an MPS daemon (the
    daemon stopped when it was the last); never fails the teardown. Only the id and bundle are
    read: a stopped container's state may carry pid 0 (crun), which parse_state refuses."""
    from nvc.apply import mps, sharefiles
    from nvc.hook.oci import spec

    try:
        container_id, bundle = spec.stopped(stdin)
        if sharefiles.remove_stopped(container_id, bundle):
            mps.release(container_id)
    except (NvcError, OSError):
        pass
    return 0


def _enable_debug(config: Config) -> None:
    if config.log_level == "debug" and config.log_file is not None:
        from nvc import debuglog

        debuglog.enable(config.log_file)


def main(argv: list[str] | None = None, stdin: bytes | None = None, via: str | None = None) -> int:
    """The hook's stages, for ``nvc-py-hook`` (:mod:`nvc.hook.program`), ``nvc-py hook`` and the
    server's workers; ``via`` names a server that ran the call (:mod:`nvc.hook.server`), for the log line."""
    args = sys.argv[1:] if argv is None else argv
    stage = args[0] if args else ""
    if any(arg in ("--help", "-h") for arg in args[:2]):  # before stdin or the log are touched
        print(USAGE)
        return 0
    if stage == "poststart":
        return 0
    if stage == "poststop":
        return _poststop(_stdin(stdin))
    if stage not in ("prestart", *CDI_STAGES):
        print(USAGE, file=sys.stderr)
        return InputError.exit_code
    from nvc import config as config_file
    from nvc.hook.oci import log

    started = time.monotonic()
    record: dict[str, Any] = {"stage": stage, "container": None, "pid": os.getpid(), "outcome": "crashed"}
    if via is not None:
        record["via"] = via
    config = None
    code = 0
    try:
        config = config_file.load()
        _enable_debug(config)
        data = _stdin(stdin)
        if stage == "prestart":
            prestart(config, data, record)
        else:
            _cdi_hook(config, stage, args[1:], data, record)
    except NvcError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        record.update(outcome="error", error=str(err))
        code = err.exit_code
    finally:
        record["duration_ms"] = round((time.monotonic() - started) * 1000, 1)
        if config is not None:
            log.write(config.log_file, config.log_level, code != 0, **record)
    return code
