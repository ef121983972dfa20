"""The pipeline's steps after the plan: :func:`apply` it, then :func:`ldcache`, committed together.

The host side first (the driver nodes ``--load-kmods`` found missing, like udev: they stay; the
sharing files, in this process's mount namespace), then the mounts (the container helper,
:mod:`nvc.rpc.container_service`, which only carries the calls), then the device cgroup; the ld
cache is rebuilt in ldconfig's sandbox, which is forked before the mounts (it loads its modules
while the helper mounts) and runs while the cgroup is programmed. Where any step fails, the
mounts and the sharing files are undone; where the helper died mid-apply, a fresh one undoes what
its journal names.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, NamedTuple

from nvc.logger import Logger

if TYPE_CHECKING:
    from nvc.apply.container import ContainerHandle
    from nvc.apply.ldconfig import PendingLdconfig
    from nvc.plan.operations import Plan
    from nvc.rpc.container_service import ContainerClient

log = Logger(__name__)


class Applied(NamedTuple):
    """A plan applied, not yet committed (:func:`apply`)."""

    plan: Plan
    ldconfig: PendingLdconfig | None  # started, for :func:`ldcache` to wait for


def _incomplete(problems: list[str]) -> None:
    if problems:
        log.error("rollback incomplete: %s", "; ".join(problems))


def _timed(stage: str, start: float) -> float:
    """Log how long ``stage`` took (``--debug``; bench/ reads these lines); return now."""
    now = time.perf_counter()
    log.debug("timing %s %.2f ms", stage, (now - start) * 1e3)
    return now


@contextmanager
def _host_steps(plan: Plan, handle: ContainerHandle | None) -> Iterator[None]:
    """The plan's host steps: the missing driver nodes (they stay), the sharing files (removed again
    when the ``with`` fails; :func:`nvc.apply.sharefiles.make` undoes itself on its own failure)."""
    if plan.host_nodes:
        from nvc.apply import hostnodes

        hostnodes.make(plan.host_root, plan.host_nodes)
    if plan.share is None:
        yield
        return
    from nvc.apply import sharefiles

    share = plan.share
    if plan.mps is not None:  # its daemon first: the limits file gets the MPS limits it decides
        from nvc.apply import mps

        share = share._replace(limits=share.limits + mps.attach(plan.mps, handle, share.state_dir))
    try:
        sharefiles.make(share, handle)
        try:
            yield
        except BaseException:
            sharefiles.remove(share.container_id, share.state_dir, share.sched_dir)
            raise
    except BaseException:
        if plan.mps is not None:
            mps.release(plan.mps.container_id, plan.mps.mps_dir, share.state_dir)
        raise


def _cgroup(plan: Plan, handle: ContainerHandle | None, start: float) -> None:
    """The device cgroup's rules for the plan's nodes (none standalone, or with --no-cgroups)."""
    if plan.cgroup_rules and handle is not None:
        from nvc.apply import cgroups

        cgroups.allow_devices(handle.device_cgroup(), plan.cgroup_rules)
        _timed("cgroup", start)


@contextmanager
def apply(plan: Plan, handle: ContainerHandle | None, helper: ContainerClient | None = None) -> Iterator[Applied]:
    """Step: apply ``plan`` to the container of ``handle`` (its process; None standalone), with
    ``helper`` (forked ahead by :func:`nvc.rpc.container_service.open_container` and shut down once
    its work is done; None: one forked now). Committed when the ``with`` ends, undone when it fails."""
    from nvc.apply import ldconfig
    from nvc.rpc import container_service

    start = time.perf_counter()
    with _host_steps(plan, handle):
        pending = None
        if plan.ldconfig is not None:
            pending = ldconfig.start_ldconfig(
                plan.ldconfig, plan.rootfs, plan.ldconfig_dirs, owner=plan.owner, handle=handle
            )
        try:
            start = _timed("setup", start)
            with helper if helper is not None else container_service.open_container() as client:
                try:
                    client.mount(plan, handle)
                    start = _timed("mounts", start)
                    try:
                        if pending is not None:
                            pending.start()
                        _cgroup(plan, handle, start)
                        yield Applied(plan, pending)
                    except BaseException:
                        if pending is not None:
                            pending.cancel()  # ldconfig is dead before its changes are undone
                        _incomplete(client.rollback())
                        raise
                    start = time.perf_counter()
                    client.commit()
                except BaseException:
                    _incomplete(client.recover(plan))  # a helper that died could not roll back
                    raise
            _timed("finish", start)  # the commit, the helper's shutdown and exit
        finally:
            if pending is not None:
                pending.cancel()


def ldcache(applied: Applied) -> None:
    """Step: the container's ld cache rebuilt (ldconfig in its sandbox, started by :func:`apply`),
    waited for."""
    if applied.ldconfig is not None:
        start = time.perf_counter()
        applied.ldconfig.wait()
        _timed("ldconfig", start)
