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
from pathlib import Path
from typing import NamedTuple

from nvc.containerenv.sharing import CONTAINER_DIR, CONTAINER_LIBRARY, CONTAINER_PEERS, CONTAINER_SCHED, PRELOAD
from nvc.errors import ContainerError, InputError
from nvc.plan.request import HostMount, ShareRequest

# Host side: the installed shim and the per-container directories (`share status` reads them).
HOST_LIBRARY = "/usr/lib/nvc-py/libnvc-share.so"
STATE_DIR = "/run/nvc-py/share"
# Beside the scheduler files, root's record of what each container was granted: ``.granted/<container-id>``,
# the compute lines of its limits file (0444; no container id starts with '.', so no name clash). Another
# container's shim takes its weight from there, never from the file the container writes itself.
GRANTED_DIR = ".granted"
GRANTED_MAX = 8192  # bytes of one container's granted limits there (native/shim/scheduling/sched.c GRANTED_MAX)

LIMITS_VERSION = 1
# The limits file's key for each ShareRequest field (native/shim/base/config.c).
LIMITS_KEYS = (("memory", "memory_limit"), ("compute", "compute_percent"), ("weight", "compute_weight"))
_GRANTED_KEYS = ("version=", *(key for field, key in LIMITS_KEYS if field != "memory"))


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

    @property
    def directory(self) -> Path:
        """The container's host directory (its id checked by :func:`files`)."""
        return Path(self.state_dir) / self.container_id


def limits_text(request: ShareRequest, origin: str = "") -> str:
    """The limits file (native/shim/base/config.c, version 1): ``key=value`` or ``key.<scope>=value`` lines after
    ``version=1``, sizes in bytes."""
    lines = [
        f"# written by nvc-py{' for ' + origin if origin else ''}; read-only in the container",
        f"version={LIMITS_VERSION}",
    ]
    for field, key in LIMITS_KEYS:
        lines += [f"{key}{'.' + scope if scope else ''}={value}" for scope, value in getattr(request, field)]
    return "\n".join(lines) + "\n"


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
    """Whether the container takes part in the GPU-time scheduler: a weight or a cap below 100 %."""
    return bool(request.weight) or any(value < 100 for _, value in request.compute)


def sched_dir_for(state_dir: str) -> str:
    """The scheduler's directory: ``gpu-sched`` beside the state dir (/run/nvc-py/gpu-sched)."""
    return os.path.join(os.path.dirname(state_dir.rstrip("/")), "gpu-sched")


def container_dir(container_id: str, state_dir: str = STATE_DIR) -> Path:
    """The host directory of one container (its id must be a plain name)."""
    if not container_id or "/" in container_id or container_id in (".", ".."):
        raise InputError(f"container id {container_id!r} cannot name a directory")
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
) -> ShareFiles:
    """The host files of one container (``image_preload``: the image's own /etc/ld.so.preload),
    decided, not made: an id that cannot name a directory, granted limits the scheduler's tmpfs has
    no room for, are refused here."""
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
    )


def without_time_slices(planned: ShareFiles, request: ShareRequest) -> ShareFiles:
    """The files of a container whose device is shared through MPS (nvc.plan.mps): no compute lines
    in its limits file (MPS shares the SMs, the shim's slices and weights stay off; its memory
    accounting stays), no scheduler file. Its MPS lines are added when its daemon is known."""
    limits = limits_text(request._replace(compute=(), weight=()), origin=f"container {planned.container_id}")
    return planned._replace(limits=limits, scheduled=False, granted="")


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
