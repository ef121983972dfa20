"""GPU sharing's host side of one container, planned: its files and where the container sees them.

A shared container gets a per-container host directory holding a read-only limits file (the only
authority the shim trusts in a container, so the workload cannot raise its own limits through its
env) and the shared region, plus a generated ``/etc/ld.so.preload``; a scheduled one also a file in
the scheduler's directory. :func:`files` decides them (a step of the container's plan, which
``configure --dry-run`` prints), :mod:`nvc.apply.sharefiles` makes them when the plan is applied,
:func:`mounts` says where the container gets them.

The limits file is written only here (:func:`limits_text`), in the one grammar the shim parses
(native/shim/base/config.c's header says it; tests/test_share_native.py feeds one table of values to both).
Pure: the facts it needs (the image's own ld.so.preload) are read by the caller.
"""

from __future__ import annotations

import os

from nvc.containerenv.sharing import (
    CONTAINER_DIR,
    CONTAINER_LIBRARY,
    CONTAINER_PEERS,
    CONTAINER_SCHED,
    PRELOAD,
    PRIORITY_CLASSES,
)
from nvc.errors import ContainerError, InputError
from nvc.plan.request import HostMount, ShareRequest
from nvc.records import NamedTuple

TYPE_CHECKING = False
if TYPE_CHECKING:  # pathlib is imported where a container shares a GPU: a plain start never pays for it
    from pathlib import Path
    from typing import TypeVar

    T = TypeVar("T")

# Host side: the installed shim and the per-container directories (`share status` reads them).
HOST_LIBRARY = "/usr/lib/nvc-py/libnvc-share.so"
STATE_DIR = "/run/nvc-py/share"
# Beside the scheduler files, root's record of what each container was granted: ``.granted/<container-id>``,
# the compute lines of its limits file (0444; no container id starts with '.', so no name clash). Another
# container's shim takes its weight from there, never from the file the container writes itself.
GRANTED_DIR = ".granted"
# Beside the owner record (never mounted into the container), a pod's container's limits as its pod was
# granted them (the device plugin's or DRA driver's allocation): `nvc-py share set` keeps within them.
BOUNDS_FILE = "bounds"
LIMITS_MAX = 16384  # bytes of a limits file the shim reads (native/shim/process/init.c)
GRANTED_MAX = 8192  # bytes of one container's granted limits there (native/shim/scheduling/sched.c GRANTED_MAX)

LIMITS_VERSION = 1
# The limits file's key for each ShareRequest field (native/shim/base/config.c): numbers, then the latency
# class (a name, nvc.containerenv.sharing.PRIORITY_CLASSES).
LIMITS_KEYS = (("memory", "memory_limit"), ("compute", "compute_percent"), ("weight", "compute_weight"))
CLASS_KEY = ("priority", "priority")
_GRANTED_KEYS = ("version=", *(key for field, key in (*LIMITS_KEYS, CLASS_KEY) if field != "memory"))


class ShareFiles(NamedTuple):
    """GPU sharing's host side of one container, made before its mounts (:func:`nvc.apply.sharefiles.make`):
    ``<state_dir>/<id>/shared``, a tmpfs of fixed size holding the ``limits`` file and the shim's
    region; ``<state_dir>/<id>/ld.so.preload`` beside it; with ``scheduled``, the container's file
    in the scheduler's directory ``sched_dir`` and its granted compute limits (``granted``) in
    ``.granted`` there. Every file's text is decided here: applying it only writes. The container
    gets them through extra mounts (:func:`mounts`)."""

    container_id: str
    state_dir: str
    sched_dir: str
    library: str  # the shim on the host (the container gets it by an extra mount)
    limits: str  # the limits file's text
    preload: str  # the container's /etc/ld.so.preload
    scheduled: bool = False
    bundle: str = ""  # the container's OCI bundle, recorded as its owner (nvc.apply.shareowner)
    granted: str = ""  # with ``scheduled``: what other containers' shims trust of it (granted_text)
    bounds: str = ""  # a pod's container: its limits as granted (BOUNDS_FILE); "" = none

    @property
    def directory(self) -> Path:
        """The container's host directory (its id checked by :func:`files`)."""
        from pathlib import Path

        return Path(self.state_dir) / self.container_id


def limits_text(request: ShareRequest, origin: str = "") -> str:
    """The limits file (native/shim/base/config.c, version 1): ``key=value`` or ``key.<scope>=value`` lines after
    ``version=1``, sizes in bytes."""
    lines = [
        f"# written by nvc-py{' for ' + origin if origin else ''}; read-only in the container",
        f"version={LIMITS_VERSION}",
    ]
    for field, key in (*LIMITS_KEYS, CLASS_KEY):
        lines += [f"{key}{'.' + scope if scope else ''}={value}" for scope, value in getattr(request, field)]
    return "\n".join(lines) + "\n"


class Limits(NamedTuple):
    """A limits file read back (:func:`parse_limits`): the rules :func:`limits_text` wrote and the MPS
    client's lines (``mps.NAME=VALUE``, :mod:`nvc.plan.mps`), kept as they are."""

    request: ShareRequest
    mps: tuple[tuple[str, str], ...] = ()


class Change(NamedTuple):
    """What `nvc-py share set` changes of a running container's share: each field's new value on
    ``gpu`` (a UUID or index as the container numbers its GPUs; "" = every GPU), None = unchanged."""

    gpu: str = ""
    memory: int | None = None
    compute: int | None = None
    weight: int | None = None
    priority: str | None = None


def parse_limits(text: str, origin: str) -> Limits:
    """The limits file :func:`limits_text` wrote (and :mod:`nvc.plan.mps` extended), read back; a line
    nvc-py never writes is refused (``origin`` names the file)."""
    keys = {key: field for field, key in LIMITS_KEYS}
    rules: dict[str, list[tuple[str, int]]] = {field: [] for field, _ in LIMITS_KEYS}
    classes: list[tuple[str, str]] = []
    mps: list[tuple[str, str]] = []
    entries = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not entries or entries[0] != f"version={LIMITS_VERSION}":
        raise ContainerError(f"{origin}: not a limits file of version {LIMITS_VERSION}")
    for entry in entries[1:]:
        name, _, value = entry.partition("=")
        key, _, scope = name.partition(".")
        if key == "mps" and scope:
            mps.append((scope, value))
        elif key == CLASS_KEY[1] and value in PRIORITY_CLASSES:
            classes.append((scope, value))
        elif key in keys and value.isascii() and value.isdigit():
            rules[keys[key]].append((scope, int(value)))
        else:
            raise ContainerError(f"{origin}: {entry!r} is not a line nvc-py writes")
    return Limits(
        ShareRequest(
            memory=tuple(rules["memory"]),
            compute=tuple(rules["compute"]),
            weight=tuple(rules["weight"]),
            priority=tuple(classes),
        ),
        tuple(mps),
    )


def changed_rules(rules: tuple[tuple[str, T], ...], gpu: str, value: T | None) -> tuple[tuple[str, T], ...]:
    """One field's rules after a change: on one GPU, its rule replaced; on every GPU (``gpu`` ""), the
    field's rules replaced by one default. None: unchanged."""
    if value is None:
        return rules
    kept = tuple(rule for rule in rules if gpu and rule[0].lower() != gpu.lower())
    return (*kept, (gpu, value))


def effective(rules: tuple[tuple[str, int], ...], scope: str) -> int | None:
    """A field's value on one scope: its own rule, else the default; None: neither."""
    found = {where.lower(): value for where, value in rules}
    return found.get(scope.lower(), found.get(""))


def beyond(limits: ShareRequest, bounds: ShareRequest) -> list[str]:
    """Where ``limits`` go past ``bounds`` (the pod's grant): each field, on every scope either names,
    at most the bound's value; a field the bounds limit cannot be left unlimited."""
    found = []
    for field, _ in LIMITS_KEYS:
        mine, most = getattr(limits, field), getattr(bounds, field)
        for scope in sorted({"", *(s for s, _ in mine), *(s for s, _ in most)}):
            bound, value = effective(most, scope), effective(mine, scope)
            if bound is not None and (value is None or value > bound):
                where = f" on {scope}" if scope else ""
                found.append(f"{field} {'unlimited' if value is None else value}{where} (granted {bound})")
    return found


def granted_text(limits: str) -> str:
    """What other containers' shims trust about a container: its limits file's compute lines (the
    shim parses them with the limits grammar; the rest is none of their business)."""
    return "".join(f"{line}\n" for line in limits.splitlines() if line.startswith(_GRANTED_KEYS))


def preload_text(image_preload: str, library: str = CONTAINER_LIBRARY) -> str:
    """The container's /etc/ld.so.preload: the shim first (its dlsym must come before any other
    preloaded library's), then the image's own entries, kept as they were."""
    rest = image_preload if not image_preload or image_preload.endswith("\n") else image_preload + "\n"
    return f"{library}\n{rest}"


def scheduled(request: ShareRequest) -> bool:
    """Whether the container takes part in the GPU-time scheduler: a weight, a cap below 100 % or a
    latency class."""
    return bool(request.weight or request.priority) or any(value < 100 for _, value in request.compute)


def sched_dir_for(state_dir: str) -> str:
    """The scheduler's directory: ``gpu-sched`` beside the state dir (/run/nvc-py/gpu-sched)."""
    return os.path.join(os.path.dirname(state_dir.rstrip("/")), "gpu-sched")


def container_dir(container_id: str, state_dir: str = STATE_DIR) -> Path:
    """The host directory of one container (its id must be a plain name)."""
    if not container_id or "/" in container_id or container_id in (".", ".."):
        raise InputError(f"container id {container_id!r} cannot name a directory")
    from pathlib import Path

    return Path(state_dir) / container_id


def files(
    request: ShareRequest,
    container_id: str,
    image_preload: str,
    *,
    library: str = HOST_LIBRARY,
    state_dir: str = STATE_DIR,
    sched_dir: str | None = None,
    bundle: str = "",
    pod: bool = False,
) -> ShareFiles:
    """The host files of one container (``image_preload``: the image's own /etc/ld.so.preload),
    decided, not made: an id that cannot name a directory, granted limits the scheduler's tmpfs has
    no room for, are refused here. A pod's container (``pod``) keeps its limits as its bounds."""
    container_dir(container_id, state_dir)
    limits, takes_part = limits_text(request, origin=f"container {container_id}"), scheduled(request)
    granted = granted_text(limits) if takes_part else ""
    if len(granted.encode()) > GRANTED_MAX:
        raise ContainerError(f"the compute limits of container {container_id} exceed {GRANTED_MAX} bytes")
    return ShareFiles(
        container_id=container_id,
        state_dir=state_dir,
        sched_dir=sched_dir or sched_dir_for(state_dir),
        library=library,
        limits=limits,
        preload=preload_text(image_preload),
        scheduled=takes_part,
        bundle=bundle,
        granted=granted,
        bounds=limits if pod else "",
    )


def without_time_slices(planned: ShareFiles, request: ShareRequest) -> ShareFiles:
    """The files of a container whose device is shared through MPS (nvc.plan.mps): no cap or class lines
    in its limits file (MPS shares the SMs, the shim's slices stay off; its memory accounting stays), and
    a scheduler file only with a weight, where the shim publishes whether it keeps work queued: a lighter
    weight's duty cycle holds while a heavier client does (native/shim/scheduling/schedpolicy.h). Its MPS
    lines, and a lighter weight's duty cycle, are added when its daemon is known
    (nvc.plan.mps.client_lines)."""
    limits = mps_limits_text(request, f"container {planned.container_id}")
    weighted = bool(request.weight)
    return planned._replace(limits=limits, scheduled=weighted, granted=granted_text(limits) if weighted else "")


def mps_limits_text(request: ShareRequest, origin: str = "") -> str:
    """The limits file of an MPS client before its MPS lines: its memory limit and weight, no cap or class
    lines."""
    return limits_text(request._replace(compute=(), priority=()), origin)


def mounts(planned: ShareFiles) -> tuple[HostMount, ...]:
    """Where the container gets the files :func:`nvc.apply.sharefiles.make` makes (its extra mounts)."""
    path = planned.directory
    shared = path / "shared"
    found = (
        HostMount(source=planned.library, target=CONTAINER_LIBRARY, readonly=True),
        HostMount(source=str(shared), target=CONTAINER_DIR, readonly=False, directory=True),
        HostMount(source=str(shared / "limits"), target=f"{CONTAINER_DIR}/limits", readonly=True),
        HostMount(source=str(path / "ld.so.preload"), target=PRELOAD, readonly=True),
    )
    if not planned.scheduled:
        return found
    return (
        *found,
        HostMount(source=planned.sched_dir, target=CONTAINER_PEERS, readonly=True, directory=True),
        HostMount(source=f"{planned.sched_dir}/{planned.container_id}", target=CONTAINER_SCHED, readonly=False),
    )
