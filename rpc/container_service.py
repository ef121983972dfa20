"""The container helper (``nvc:[container]``): applies a mount plan inside a container.

:func:`apply` is the caller's side of a whole plan: it starts the helper, which mounts, then
runs ldconfig's sandbox and programs the device cgroup, and has the helper commit or roll back.

Joining a mount namespace is a one-way trip for a process, and the caller (the CLI or the
OCI hook) must stay in the host's. So a forked helper does it, holding only the
capabilities mounting needs (:data:`nvc.system.confinement.CONTAINER_HELPER`), each raised only for the
step that uses it, with NO_NEW_PRIVS. It keeps what it did until the caller commits or rolls back, and
notes each change in its journal as it makes it (nvc.rpc.helper): where it dies mid-apply (killed,
crashed), a fresh helper undoes what the journal names (:meth:`ContainerClient.recover`).

The container's process reaches the helper as the caller resolved it (:mod:`nvc.apply.container`):
its descriptors, sent with the call (SCM_RIGHTS), never its pid to look up again.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from nvc.errors import MountError, NvcError
from nvc.logger import Logger
from nvc.rpc.helper import Dispatch, HelperClient, note
from nvc.rpc.pool import WarmHelper

if TYPE_CHECKING:
    from nvc.apply.container import ContainerHandle
    from nvc.plan.operations import Plan

log = Logger(__name__)

HELPER_TIMEOUT = 10.0  # seconds per helper call


def _received(pid: int | None, fds: tuple[int, ...]) -> AbstractContextManager[ContainerHandle | None]:
    """The handle of the container's process ``pid`` on the descriptors received with the call
    (none: standalone)."""
    from nvc.apply.container import ContainerHandle

    if pid is None:
        return nullcontext()
    return ContainerHandle.adopt(pid, fds)


def serve_container() -> Dispatch:
    """Helper setup: confine, then serve mount / rollback / commit for one plan."""
    from nvc.apply.applier import Applier
    from nvc.system.confinement import CONTAINER_HELPER, confine
    from nvc.plan.operations import Plan

    confine(CONTAINER_HELPER)
    state: dict[str, Applier] = {}

    def mount(plan: dict[str, Any], fds: tuple[int, ...] = ()) -> int:
        applier = Applier(Plan.from_wire(plan), record=note)
        state["plan"] = applier
        try:
            with _received(applier.plan.pid, fds) as handle:
                applier.prepare(handle)
            applier.enter()
            applier.execute()
        except BaseException:
            applier.rollback()
            raise
        return len(applier.done)

    def rollback() -> list[str]:
        return state.pop("plan").rollback() if "plan" in state else []

    def commit() -> None:
        if "plan" in state:
            state.pop("plan").commit()

    def undo(plan: dict[str, Any], journal: list[Any], fds: tuple[int, ...] = ()) -> list[str]:
        applier = Applier(Plan.from_wire(plan))
        with _received(applier.plan.pid, fds) as handle:
            return applier.undo(journal, handle)

    return {"mount": mount, "rollback": rollback, "commit": commit, "undo": undo}


class ContainerClient:
    """The caller's side: one plan, mounted, then committed or rolled back; closing it (``with``)
    shuts the helper down and reaps it."""

    def __init__(self, helper: HelperClient) -> None:
        self.helper = helper
        self.handle: ContainerHandle | None = None  # the container's process, as mount was given it

    def __enter__(self) -> ContainerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Shut the helper down and reap it (again: a no-op; apply closes a helper it was handed
        when its work is done, the ``with`` of whoever forked it closes it on any other path)."""
        self.helper.close()

    def mount(self, plan: Any, handle: ContainerHandle | None) -> int:  # Plan: Any, as for recover
        """Apply the plan's operations in the container of ``handle`` (its process: None standalone);
        on failure the helper has already undone them."""
        self.handle = handle
        return self.helper.call("mount", fds=_fds(handle), plan=plan.to_wire())

    def rollback(self) -> list[str]:
        """Undo what ``mount`` did; return what could not be undone."""
        return self.helper.call("rollback")

    def commit(self) -> None:
        self.helper.call("commit")

    def recover(self, plan: Any) -> list[str]:  # Plan; Any keeps nvc.plan.operations out of this import
        """After a failure: where the helper died mid-apply (it could not roll back), a fresh helper
        undoes what its journal says it did; return what could not be undone. Nothing to do where
        the helper lives (it rolled back itself) or noted nothing."""
        journal = [] if self.helper.alive else self.helper.journal()
        if not journal:
            return []
        try:
            with _ahead.fork({}, self.helper.timeout, wait=True) as fresh:
                return fresh.call("undo", fds=_fds(self.handle), plan=plan.to_wire(), journal=journal)
        except NvcError as err:  # the container gone with its mounts, say: the first failure stands
            return [str(err)]


def _fds(handle: ContainerHandle | None) -> tuple[int, ...]:
    return () if handle is None else handle.fds()


# The container helper forked ahead of any call (see :func:`prestart`) until open_container takes it.
_ahead = WarmHelper("container", serve_container, failure=MountError, journal=True)


def prestart() -> WarmHelper:
    """Fork the container helper now, before a call is known: the hook server's idle workers keep
    one so, and the call's :func:`open_container` takes it (fork and confinement already done).
    One never taken exits with this process. Returns the warm helper (see driver_service.prestart)."""
    _ahead.prepare()
    return _ahead


def open_container(timeout: float = HELPER_TIMEOUT, wait: bool = True) -> ContainerClient:
    """The container helper: the one :func:`prestart` forked, else one forked now. ``wait=False``
    returns at once, and its first call waits for it (and raises its set-up's failure): the caller
    plans while the helper forks and confines itself."""
    return ContainerClient(_ahead.take({}, timeout, wait))


def _incomplete(problems: list[str]) -> None:
    if problems:
        log.error("rollback incomplete: %s", "; ".join(problems))


def _timed(stage: str, start: float) -> float:
    """Log how long ``stage`` took (``--debug``; bench/ reads these lines); return now."""
    now = time.perf_counter()
    log.debug("timing %s %.2f ms", stage, (now - start) * 1e3)
    return now


def apply(plan: Plan, container: ContainerClient | None = None, handle: ContainerHandle | None = None) -> None:
    """Apply ``plan``: the driver nodes ``--load-kmods`` found missing (on the host, like udev: they
    stay), the sharing files (on the host, in this process's mount namespace), mounts (the container
    helper: ``container``, forked ahead by :func:`open_container` and shut down once its work is
    done, else one forked now), then ldconfig and device cgroup; undo the mounts and the sharing
    files on failure. ``handle``: the container's process the plan was made for (resolved from the
    plan's pid where not given)."""
    if handle is None and plan.pid is not None:
        from nvc.apply.container import ContainerHandle

        with ContainerHandle.open(plan.pid) as handle:
            _apply(plan, container, handle)
    else:
        _apply(plan, container, handle)


def _apply(plan: Plan, container: ContainerClient | None, handle: ContainerHandle | None) -> None:
    start = time.perf_counter()
    if plan.host_nodes:
        from nvc.discover import kmods

        kmods.make(plan.host_root, plan.host_nodes)
    if plan.share is None:
        _apply_in_container(plan, start, container, handle)
        return
    from nvc.apply import sharefiles

    sharefiles.make(plan.share, handle)  # undoes itself on failure (and leaves a stale container's files alone)
    try:
        _apply_in_container(plan, start, container, handle)
    except BaseException:
        sharefiles.remove(plan.share.container_id, plan.share.state_dir, plan.share.sched_dir)
        raise


def _apply_in_container(plan: Plan, start: float, container: ContainerClient | None,
                        handle: ContainerHandle | None) -> None:
    """The plan's steps in the container: mounts (the container helper), then ldconfig and device
    cgroup; the mounts undone on failure."""
    from nvc.apply import ldconfig

    # Forked first: the ldconfig child loads its modules while this process imports the
    # helper's and the helper mounts.
    pending = None
    if plan.ldconfig is not None:
        pending = ldconfig.start_ldconfig(plan.ldconfig, plan.rootfs, plan.ldconfig_dirs, owner=plan.owner,
                                          handle=handle)
    try:
        from nvc.apply import cgroups

        start = _timed("setup", start)
        with container if container is not None else open_container() as helper:
            try:
                helper.mount(plan, handle)
                start = _timed("mounts", start)
                try:
                    # ldconfig runs in its sandbox while this process programs the device cgroup.
                    if pending is not None:
                        pending.start()
                    if plan.cgroup_rules and handle is not None:
                        cgroups.allow_devices(handle.device_cgroup(), plan.cgroup_rules)
                        start = _timed("cgroup", start)
                    if pending is not None:
                        pending.wait()
                        start = _timed("ldconfig", start)  # what was left of it after the cgroup
                except BaseException:
                    if pending is not None:
                        pending.cancel()  # ldconfig is dead before its changes are undone
                    _incomplete(helper.rollback())
                    raise
                helper.commit()
            except BaseException:
                _incomplete(helper.recover(plan))  # a helper that died could not roll back
                raise
        _timed("finish", start)  # the helper's shutdown and exit
    finally:
        if pending is not None:
            pending.cancel()
