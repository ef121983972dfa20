"""The container environment contract: what a container may ask of nvc-py, in which words.

A container asks through its OCI spec: NVIDIA_* variables (the toolkit's names and values, so that
images built for NVIDIA's toolkit keep working), the sharing variables (``NVC_SHARE_*`` and HAMi's
``CUDA_DEVICE_*``: :mod:`.sharing`), and ``/dev/null`` volume mounts below
/var/run/nvidia-container-devices, which a device plugin writes where the kubelet would let a pod's
own env replace its answer. Every name, keyword, value grammar and path of that contract is here
(:mod:`.sharing`: the memory, compute and weight limits), with its writers (the device plugin's
answer, CDI's spec), so a reader and a writer cannot drift apart; ``nvc-py configure``'s ``--mig-*``
and ``--imex-channel`` flags take the same values. No other module names these variables
(tests/test_layers.py). The plan reads a container's request from them (:mod:`nvc.plan.fromenv`);
this package imports nothing of the plan.

Pure and light to import: the hook reads this package at every container start, GPU or not.
"""

from collections.abc import Iterable, Mapping, Sequence

from nvc.errors import InputError
from nvc.model.capabilities import CAPABILITIES
from nvc.records import NamedTuple

# The NVIDIA_* variables (and the legacy CUDA images' CUDA_VERSION), as NVIDIA's toolkit reads them.
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
DRIVER_CAPABILITIES = "NVIDIA_DRIVER_CAPABILITIES"
REQUIRE_PREFIX = "NVIDIA_REQUIRE_"  # every NVIDIA_REQUIRE_<NAME> is a requirement...
REQUIRE_CUDA = "NVIDIA_REQUIRE_CUDA"
REQUIRE_JETPACK = "NVIDIA_REQUIRE_JETPACK"  # ...but this one, which only Jetpack images mean
DISABLE_REQUIRE = "NVIDIA_DISABLE_REQUIRE"
CUDA_VERSION = "CUDA_VERSION"  # set, without NVIDIA_REQUIRE_CUDA: an image older than the rest
MIG_CONFIG_DEVICES = "NVIDIA_MIG_CONFIG_DEVICES"
MIG_MONITOR_DEVICES = "NVIDIA_MIG_MONITOR_DEVICES"
IMEX_CHANNELS = "NVIDIA_IMEX_CHANNELS"

# Keywords of NVIDIA_VISIBLE_DEVICES: every GPU, the driver without a GPU, no GPU at all.
ALL, NONE, VOID = "all", "none", "void"
MIG_FILE_VALUES = (ALL,)  # what the MIG variables and --mig-config/--mig-monitor may say
DEFAULT_CAPABILITIES = ("compute", "utility")
TRUE_WORDS = frozenset({"1", "true", "yes", "on", "t", "y"})

# Volume mounts: a mount of /dev/null on DEVICE_VOLUME_DIR<id> asks for that device, on
# IMEX_VOLUME_DIR<n> for that channel, on SHARE_VOLUME_DIR<NAME>=<value> sets a sharing limit.
VOLUME_SOURCE = "/dev/null"
DEVICE_VOLUME_DIR = "/var/run/nvidia-container-devices/"
IMEX_VOLUME_DIR = DEVICE_VOLUME_DIR + "imex/"
SHARE_VOLUME_DIR = DEVICE_VOLUME_DIR + "share/"


class Policy(NamedTuple):
    """The host's choices about what containers may ask (from the configuration file)."""

    accept_envvar_when_unprivileged: bool = True
    accept_volume_mounts: bool = False
    disable_require: bool = False
    supported_capabilities: frozenset[str] = frozenset(CAPABILITIES)


# ---- readers ---------------------------------------------------------------------------------


def parse_env(entries: Iterable[str]) -> dict[str, str]:
    """OCI ``process.env`` (``NAME=value`` strings) to a mapping; the last duplicate wins, like execve users see."""
    env: dict[str, str] = {}
    for entry in entries:
        name, sep, value = entry.partition("=")
        if sep:
            env[name] = value
    return env


def split(value: str) -> tuple[str, ...]:
    """The items of a comma list, trimmed, empty ones dropped."""
    return tuple(item.strip() for item in value.split(",") if item.strip())


def volume_ids(mounts: Iterable[Mapping[str, object]], prefix: str) -> tuple[str, ...]:
    """The names after ``prefix`` of the spec's /dev/null mounts there (one path component each)."""
    ids = []
    for m in mounts:
        dest = str(m.get("destination", ""))
        if m.get("source") == VOLUME_SOURCE and dest.startswith(prefix):
            name = dest[len(prefix) :]
            if name and "/" not in name:
                ids.append(name)
    return tuple(ids)


def imex_channel(token: str) -> int | None:
    """An IMEX channel number (decimal, below 2^20: the driver's channel minors), or None."""
    from nvc.discover.nodes import IMEX_CHANNEL_LIMIT
    from nvc.system.untrusted import decimal

    channel = decimal(token, 7)
    return channel if channel is not None and channel < IMEX_CHANNEL_LIMIT else None


def parse_imex_channels(values: Iterable[str]) -> tuple[int, ...]:
    """Channel numbers of ``--imex-channel`` values (comma lists of integers below 2^20)."""
    channels: list[int] = []
    for token in (t for v in values for t in split(v)):
        channel = imex_channel(token)
        if channel is None:
            raise InputError(f"{token}: unsupported IMEX channel value")
        channels.append(channel)
    return tuple(dict.fromkeys(channels))


# ---- writers (the device plugin's answer, CDI's spec) ----------------------------------------


def assignment(name: str, value: str) -> str:
    """``NAME=value``, as an OCI spec's env and CDI's containerEdits list a variable."""
    return f"{name}={value}"


def device_volume(device_id: str) -> str:
    """The mount destination that asks for one device (its UUID) by volume mount."""
    return DEVICE_VOLUME_DIR + device_id


def share_volume(name: str, value: str) -> str:
    """The mount destination that sets sharing variable ``name`` to ``value`` by volume mount."""
    return f"{SHARE_VOLUME_DIR}{assignment(name, value)}"


def visible_devices(device_ids: Sequence[str]) -> str:
    """NVIDIA_VISIBLE_DEVICES's value naming these devices (UUIDs or indices), in this order."""
    return ",".join(device_ids)
