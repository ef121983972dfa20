"""The pipeline's steps after the plan: :func:`apply` it, then :func:`ldcache`, committed together.

The host side first (the driver nodes ``--load-kmods`` found missing, like udev: they stay; the
sharing files, in this process's mount namespace), then the mounts (the container helper,
:mod:`nvc.rpc.container_service`, which only carries the calls). While the helper mounts, this
process forks ldconfig's sandbox (it loads its modules meanwhile). The ld cache is rebuilt in that
sandbox once the mounts it reads are done (the libraries and their links); while it runs, the helper
mounts the rest (:attr:`nvc.plan.operations.Plan.before_ldconfig`) and this process programs the
device cgroup (beside the mounts where no ldconfig runs). Where any step fails, the mounts and the
sharing files are undone; where the helper died mid-apply, a fresh one undoes what its journal names.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from nvc.logger import Logger
from nvc.records import NamedTuple

TYPE_CHECKING = False
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


def _cgroup(plan: Plan, handle: ContainerHandle | None, start: float) -> float:
    """The device cgroup's rules for the plan's nodes (none standalone, or with --no-cgroups); returns
    when it is done."""
    if plan.cgroup_rules and handle is not None:
        from nvc.apply import cgroups

        cgroups.allow_devices(handle.device_cgroup(), plan.cgroup_rules)
        return _timed("cgroup", start)
    return start


def _let_finish(pending: PendingLdconfig) -> None:
    """After the container helper died: ldconfig, once started, runs to its end. The dead helper's
    journal cannot put the cache back, and a run stopped midway would leave its temporary file
    (``/etc/ld.so.cache~``) half written in the image; one never started is cancelled."""
    from nvc.errors import NvcError

    try:
        pending.wait()
    except NvcError:
        pending.cancel()


def _beside_ldconfig(plan: Plan, handle: ContainerHandle | None, client: ContainerClient, start: float) -> float:
    """While ldconfig runs (the longest step): the mounts it does not read, and the device cgroup;
    returns when both are done. A failure of either is not undone here (the caller stops ldconfig,
    then rolls back)."""
    from nvc.errors import NvcError

    mounted = client.mount_rest() if plan.ldconfig_start() < len(plan.operations) else None
    try:
        start = _cgroup(plan, handle, start)
    except BaseException:
        if mounted is not None:
            try:
                mounted()  # done before they are undone
            except NvcError:
                pass  # the cgroup's failure is the one to tell
        raise
    if mounted is not None:
        mounted()
        start = _timed("mounts-beside-ldconfig", start)
    return start


@contextmanager
def apply(plan: Plan, handle: ContainerHandle | None, helper: ContainerClient | None = None) -> Iterator[Applied]:
    """Step: apply ``plan`` to the container of ``handle`` (its process; None standalone), with
    ``helper`` (forked ahead by :func:`nvc.rpc.container_service.open_container` and shut down once
    its work is done; None: one forked now). Committed when the ``with`` ends, undone when it fails."""
    from nvc.apply import ldconfig
    from nvc.errors import NvcError
    from nvc.rpc import container_service

    start = time.perf_counter()
    pending = None
    with _host_steps(plan, handle):
        try:
            with helper if helper is not None else container_service.open_container() as client:
                try:
                    mounted = client.mount(plan, handle)
                    try:  # while the helper mounts: ldconfig's sandbox forked, else the device cgroup programmed
                        if plan.ldconfig is not None:
                            pending = ldconfig.start_ldconfig(
                                plan.ldconfig, plan.rootfs, plan.ldconfig_dirs, owner=plan.owner, handle=handle
                            )
                            start = _timed("setup", start)
                        else:
                            start = _cgroup(plan, handle, start)
                    except BaseException:
                        try:
                            mounted()  # done before they are undone
                        except NvcError:
                            pass  # failed too: the helper undid them
                        else:
                            _incomplete(client.rollback())
                        raise
                    mounted()
                    start = _timed("mounts", start)  # what is left of them after the steps beside
                    try:
                        if pending is not None:
                            pending.start()
                            start = _beside_ldconfig(plan, handle, client, start)
                        yield Applied(plan, pending)
                    except BaseException:
                        if client.helper.alive:
                            if pending is not None:
                                pending.cancel()  # ldconfig is dead before its changes are undone
                            _incomplete(client.rollback())
                        elif pending is not None:  # its journal is undone below (recover)
                            _let_finish(pending)
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
