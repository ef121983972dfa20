"""What a container asks for, read from its OCI spec into the plan's records: the NVIDIA_* variables
and device volume mounts (:func:`gpu_request`), the sharing variables (:func:`parse_share_env`).

Pure: takes the spec's environment, mounts and privilege, plus the host's policy, and returns the
parsed :class:`~nvc.plan.request.Request` of its devices, capabilities, requirements, MIG files and
IMEX channels (or ``None`` for a container that wants no GPU) and its
:class:`~nvc.plan.request.ShareRequest`; the hook adds where it goes (rootfs, pid) and the host's
choices. The names, keywords and value grammar are the contract's (:mod:`nvc.containerenv`), which
imports nothing of the plan. Existing images built for NVIDIA's toolkit must keep working, so the
grammar follows the toolkit's (see the reference note). Light to import (the hook reads this module
at every container start, GPU or not): a GPU container's parsers are imported when it asks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

from nvc.containerenv import (
    ALL,
    CUDA_VERSION,
    DEFAULT_CAPABILITIES,
    DEVICE_VOLUME_DIR,
    DISABLE_REQUIRE,
    DRIVER_CAPABILITIES,
    IMEX_CHANNELS,
    IMEX_VOLUME_DIR,
    MIG_CONFIG_DEVICES,
    MIG_MONITOR_DEVICES,
    NONE,
    REQUIRE_CUDA,
    REQUIRE_JETPACK,
    REQUIRE_PREFIX,
    TRUE_WORDS,
    VISIBLE_DEVICES,
    VOID,
    Policy,
    imex_channel,
    split,
    volume_ids,
)
from nvc.errors import InputError, shown
from nvc.system.untrusted import decimal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Literal

    from nvc.plan.request import Request, ShareRequest
    from nvc.plan.requirements import Requirement


def _is_legacy(env: Mapping[str, str]) -> bool:
    """An image built before NVIDIA_VISIBLE_DEVICES existed: CUDA_VERSION set, no NVIDIA_REQUIRE_CUDA."""
    return bool(env.get(CUDA_VERSION)) and not env.get(REQUIRE_CUDA)


def _env_trusted(privileged: bool, policy: Policy) -> bool:
    """Whether the container's own env may grant devices: the toolkit's rule for
    NVIDIA_VISIBLE_DEVICES, applied to every variable and default that grants a device node."""
    return privileged or policy.accept_envvar_when_unprivileged


def _ignored(name: str, warnings: list[str]) -> None:
    warnings.append(f"{name} ignored: unprivileged container and accept-envvar-when-unprivileged is false")


def _env_devices(env: Mapping[str, str]) -> tuple[str, ...] | None | Literal[False]:
    """Devices the env asks for (the legacy default included): a tuple, ``None`` for driver only,
    or ``False`` for no GPU at all."""
    if VISIBLE_DEVICES not in env:
        return (ALL,) if _is_legacy(env) else False
    devices = split(env[VISIBLE_DEVICES])
    if not devices or VOID in devices:
        return False
    if devices == (NONE,):
        return None
    if ALL in devices:
        return (ALL,)
    return devices


def _visible_devices(
    env: Mapping[str, str], mounts: list[Mapping[str, object]], privileged: bool, policy: Policy, warnings: list[str]
) -> tuple[str, ...] | None | Literal[False]:
    """Devices asked for: a tuple, ``None`` for driver only, or ``False`` for no GPU at all. The
    legacy image's "all" comes from its env too, so the policy applies to it as to the variable."""
    if policy.accept_volume_mounts:
        from_volumes = volume_ids(mounts, DEVICE_VOLUME_DIR)
        if from_volumes:
            return from_volumes
    devices = _env_devices(env)
    if devices is not False and not _env_trusted(privileged, policy):
        _ignored(
            VISIBLE_DEVICES if VISIBLE_DEVICES in env else f"{CUDA_VERSION} (a legacy image's default of all GPUs)",
            warnings,
        )
        return False
    return devices


def _capabilities(env: Mapping[str, str], policy: Policy) -> tuple[str, ...]:
    from nvc.model.capabilities import CAPABILITIES

    raw = env.get(DRIVER_CAPABILITIES)
    if raw is None:
        wanted = CAPABILITIES if _is_legacy(env) else DEFAULT_CAPABILITIES
    else:
        names = split(raw.lower())
        if not names:
            wanted = DEFAULT_CAPABILITIES
        elif ALL in names:
            wanted = CAPABILITIES
        else:
            unknown = sorted(set(names) - set(CAPABILITIES))
            if unknown:
                raise InputError(
                    f"{DRIVER_CAPABILITIES}: unknown capability {shown(unknown[0])} (known: {', '.join(CAPABILITIES)})"
                )
            wanted = names
    return tuple(sorted(set(wanted) & policy.supported_capabilities))


def _parsed_requirements(texts: tuple[str, ...]) -> tuple[Requirement, ...]:
    """The requirements' grammar is imported only for a container that states some: its patterns are
    compiled at import."""
    if not texts:
        return ()
    from nvc.plan.requirements import parse_requirement

    return tuple(parse_requirement(text) for text in texts)


def _requirements(env: Mapping[str, str], policy: Policy) -> tuple[str, ...]:
    if policy.disable_require or env.get(DISABLE_REQUIRE, "").strip().lower() in TRUE_WORDS:
        return ()
    reqs = [
        value
        for name, value in sorted(env.items())
        if name.startswith(REQUIRE_PREFIX) and name != REQUIRE_JETPACK and value.strip()
    ]
    if _is_legacy(env):
        parts = env[CUDA_VERSION].split(".")
        if len(parts) < 2 or not all(decimal(p, 9) is not None for p in parts[:2]):
            raise InputError(f"{CUDA_VERSION}: invalid version {shown(env[CUDA_VERSION])}")
        reqs.append(f"cuda>={parts[0]}.{parts[1]}")
    return tuple(reqs)


def _mig(env: Mapping[str, str], name: str, privileged: bool) -> bool:
    """Whether the container gets the MIG configuration or monitoring files (``name``: their
    variable): only ``all`` may be asked for (the reference CLI's rule), and only by a privileged
    container."""
    value = env.get(name)
    if not value:
        return False
    if not privileged:
        raise InputError(f"cannot set {name.removeprefix('NVIDIA_')} in non privileged container")
    if split(value) != (ALL,):
        raise InputError(f"{name}: only 'all' is supported (got {shown(','.join(split(value)))})")
    return True


def _imex_channels(
    env: Mapping[str, str], mounts: list[Mapping[str, object]], privileged: bool, policy: Policy, warnings: list[str]
) -> tuple[int, ...]:
    """Channel numbers from volume mounts (when accepted), else from NVIDIA_IMEX_CHANNELS, which
    grants channel nodes as NVIDIA_VISIBLE_DEVICES grants GPUs and so passes the same policy."""
    raw: tuple[str, ...] = ()
    if policy.accept_volume_mounts:
        raw = volume_ids(mounts, IMEX_VOLUME_DIR)
    if not raw:
        raw = split(env.get(IMEX_CHANNELS, ""))
        if raw == (ALL,):  # a lone "all" from the variable is ignored, as the toolkit does
            return ()
        if raw and not _env_trusted(privileged, policy):
            _ignored(IMEX_CHANNELS, warnings)
            return ()
    channels = []
    for item in raw:
        channel = imex_channel(item)
        if channel is None:
            raise InputError(f"{IMEX_CHANNELS}: unsupported IMEX channel value {shown(item)}")
        channels.append(channel)
    return tuple(sorted(set(channels)))


def gpu_request(
    env: Mapping[str, str],
    mounts: list[Mapping[str, object]] | None = None,
    privileged: bool = False,
    policy: Policy = Policy(),
    warnings: list[str] | None = None,
) -> Request | None:
    """Decide what the container gets; ``None`` means it is not a GPU container and nothing is done.

    Requests the policy ignores are reported in ``warnings`` (when given) for the user to see.
    """
    mounts = mounts or []
    warnings = warnings if warnings is not None else []
    devices = _visible_devices(env, mounts, privileged, policy, warnings)
    if devices is False:
        return None
    from nvc.plan import selection  # a GPU container's parsers and record
    from nvc.plan.request import Request

    capabilities = frozenset(_capabilities(env, policy))
    wanted = _parsed_requirements(_requirements(env, policy))
    mig_config, mig_monitor = _mig(env, MIG_CONFIG_DEVICES, privileged), _mig(env, MIG_MONITOR_DEVICES, privileged)
    imex_channels = _imex_channels(env, mounts, privileged, policy, warnings)
    return Request(
        capabilities=capabilities,
        requirements=wanted,
        selectors=selection.parse(devices or ()),
        mig_config=mig_config,
        mig_monitor=mig_monitor,
        imex_channels=imex_channels,
    )


def parse_share_env(env: Mapping[str, str]) -> ShareRequest | None:
    """The sharing request in a container's env; None when it asks for no sharing."""
    from nvc.containerenv.sharing import (
        CHOICE_VARIABLES,
        MAX_DEVICES,
        SCOPE,
        VARIABLES,
        parse_choice,
        parse_value,
        scope_key,
    )
    from nvc.plan.request import ShareRequest

    found: dict[str, dict[str, int | str]] = {field: {} for field in ShareRequest._fields}
    asked = False
    readers: list[tuple[str, str, bool, Callable[..., int | str]]] = [
        (prefix, field, hami, functools.partial(parse_value, field=field, hami=hami))
        for prefix, field, hami in VARIABLES
    ]
    readers += [
        (prefix, field, False, functools.partial(parse_choice, choices=choices))
        for prefix, field, choices in CHOICE_VARIABLES
    ]
    for prefix, field, hami, parse in readers:
        for name in sorted(env):
            if not name.startswith(prefix):
                continue
            rest = name[len(prefix) :]
            scope = SCOPE.fullmatch(rest)
            if rest and not scope:
                if hami:
                    continue  # another HAMi variable sharing the prefix
                raise InputError(
                    f"{name}: unknown sharing variable (want {prefix}, {prefix}_<index> or "
                    f"{prefix}_<GPU- or MIG- UUID>)"
                )
            found[field][scope_key(scope.group(1)) if scope else ""] = parse(name, text=env[name])
            asked = True
    if not asked:
        return None
    devices = {scope for values in found.values() for scope in values if scope}
    if len(devices) > MAX_DEVICES:
        raise InputError(f"sharing variables name {len(devices)} devices (at most {MAX_DEVICES})")
    return ShareRequest(**{field: tuple(sorted(values.items())) for field, values in found.items()})  # type: ignore[arg-type]


def with_defaults(request: ShareRequest | None, memory: str | None, compute: int | None) -> ShareRequest:
    """With sharing enabled on the host (config file ``sharing``), every GPU container gets the shim:
    its own request, with the host's defaults where it set no value for every device."""
    from nvc.containerenv.sharing import parse_percent, parse_size
    from nvc.plan.request import ShareRequest

    request = request or ShareRequest()
    memory_rules, compute_rules = dict(request.memory), dict(request.compute)
    if memory is not None:
        memory_rules.setdefault("", parse_size("sharing.device-memory-limit", memory))
    if compute is not None:
        compute_rules.setdefault("", parse_percent("sharing.device-sm-limit", str(compute), False))
    return request._replace(memory=tuple(sorted(memory_rules.items())), compute=tuple(sorted(compute_rules.items())))
