"""`nvc-py share set`: a running container's share changed without restarting it.

The limits file is rewritten in place under the container directory's lock (:mod:`nvc.apply.sharechange`),
and the shim in each of the container's processes puts the change in force within 200 ms
(native/shim/process/reload.c). Under the shim's time slices every limit changes at once; under MPS
the memory limit does (the shim's accounting), while the thread percentage and client priority are
fixed by MPS as a client connects and so apply to the processes started after the change. Memory a
container holds above a lowered limit is kept, and said: only new allocations are refused.

Who may: root alone (the sharing directories are root's, /run/nvc-py 0700); the container cannot
reach its own limits file but through a read-only bind. A pod's container stays within what its pod
was granted (:data:`nvc.plan.share.BOUNDS_FILE`, recorded at its start).
"""

from __future__ import annotations

import os

from nvc.errors import ContainerError, PrivilegeError
from nvc.plan import mps as mpsplan
from nvc.plan import share
from nvc.plan.request import ShareRequest


def change(container_id: str, wanted: share.Change, state_dir: str = share.STATE_DIR) -> list[str]:
    """Changes the running container's share as ``wanted`` says; the lines that tell what it did."""
    from nvc.apply import sharechange

    if os.geteuid() != 0:
        raise PrivilegeError(f"only root changes the share of container {container_id} (its files are root's)")
    with sharechange.locked(container_id, state_dir) as current:
        origin = f"{share.container_dir(container_id, state_dir)}/shared/limits"
        limits = share.parse_limits(current.limits, origin)
        if limits.mps:
            text, checked, notes = _mps(container_id, limits, wanted)
        else:
            text, checked, notes = _timeslice(container_id, limits, wanted, current.scheduled)
        if current.bounds:
            over = share.beyond(checked, share.parse_limits(current.bounds, origin).request)
            if over:
                raise PrivilegeError(
                    f"container {container_id} would exceed what its pod was granted: {'; '.join(over)}"
                )
        granted = share.granted_text(text) if current.scheduled else None
        sharechange.rewrite(container_id, text, granted, state_dir)
    return [_summary(container_id, text), *notes, *_held_above(container_id, checked, state_dir)]


def _changed(request: ShareRequest, wanted: share.Change) -> ShareRequest:
    return request._replace(
        memory=share.changed_rules(request.memory, wanted.gpu, wanted.memory),
        compute=share.changed_rules(request.compute, wanted.gpu, wanted.compute),
        weight=share.changed_rules(request.weight, wanted.gpu, wanted.weight),
        priority=share.changed_rules(request.priority, wanted.gpu, wanted.priority),
    )


def _timeslice(
    container_id: str, limits: share.Limits, wanted: share.Change, scheduled: bool
) -> tuple[str, ShareRequest, list[str]]:
    """The new limits under the shim's time slices: every field at once."""
    if (wanted.weight is not None or wanted.priority is not None) and not scheduled:
        raise ContainerError(
            f"container {container_id} started without a weight, compute cap or latency class, so it has no "
            "scheduler file: it can be given a compute cap now, a weight or latency class only at its start"
        )
    if wanted.memory is not None and not limits.request.memory:
        raise ContainerError(
            f"container {container_id} started without a memory limit, so its memory is not counted: "
            "it can be given one only at its start"
        )
    request = _changed(limits.request, wanted)
    return share.limits_text(request, origin=f"container {container_id}"), request, []


def _mps(container_id: str, limits: share.Limits, wanted: share.Change) -> tuple[str, ShareRequest, list[str]]:
    """The new limits of a container shared through MPS: the shim's memory limit at once, MPS's own
    client variables (its limits file's mps lines) for the processes that start from now on."""
    if wanted.weight is not None:
        raise ContainerError(
            f"container {container_id} shares its GPU through MPS, where its weight, fixed at its start, "
            "sets its duty cycle among the GPU's containers: change its --compute instead"
        )
    request = _changed(limits.request, wanted)
    env = dict(limits.mps)
    if wanted.memory is not None:
        env[mpsplan.PINNED] = mpsplan.pinned_limit(wanted.memory)
    if wanted.compute is not None:
        env.pop(mpsplan.THREADS, None)
        if wanted.compute < 100:
            env[mpsplan.THREADS] = str(wanted.compute)
    if wanted.priority is not None:
        env[mpsplan.CLIENT_PRIORITY] = str(mpsplan.PRIORITY_OF_CLASS[wanted.priority])
    # a cap replaces its duty cycle (the file's compute lines) with a thread percentage
    duty = () if wanted.compute is not None else limits.request.compute
    text = share.limits_text(request._replace(compute=duty, priority=()), origin=f"container {container_id}")
    notes = []
    if wanted.compute is not None or wanted.priority is not None:
        notes.append(
            f"container {container_id} shares its GPU through MPS, which fixes a process's thread percentage "
            "and priority as it connects: they apply to its processes started from now on (memory at once)"
        )
    return text + mpsplan.limits_lines(env), request, notes


def _summary(container_id: str, text: str) -> str:
    from nvc.commands.sharestatus import limit_text

    entries = [line.partition("=") for line in text.splitlines()[2:]]
    return f"{container_id}: " + (", ".join(limit_text(key, value) for key, _, value in entries) or "no limits")


def _held_above(container_id: str, request: ShareRequest, state_dir: str) -> list[str]:
    """A note for each GPU on which the container holds more memory than its new limit."""
    from nvc.commands.sharestatus import size_text, status

    notes = []
    for found in status(state_dir):
        if found.id != container_id:
            continue
        for device in found.devices:
            limit = share.effective(request.memory, f"GPU-{device.key}") or share.effective(
                request.memory, f"MIG-{device.key}"
            )
            if limit and device.memory_used > limit:
                notes.append(
                    f"container {container_id} holds {size_text(device.memory_used)} on {device.key}, more than "
                    f"its new limit {size_text(limit)}: what it holds stays, new allocations fail until it is below"
                )
    return notes
