"""The container helper (``nvc:[container]``): carries the pipeline's mount calls into a container.

:class:`ContainerClient` is the caller's side: the plan's mounts, then commit or rollback, as
:func:`nvc.pipeline.apply.apply` orders them with the host steps, ldconfig and the device cgroup.

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

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

from nvc.errors import MountError, NvcError
from nvc.rpc.helper import HelperClient, note
from nvc.rpc.pool import WarmHelper

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from nvc.apply.container import ContainerHandle
    from nvc.plan.operations import Bind, Plan
    from nvc.rpc.helper import Dispatch

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
    from nvc.plan.operations import Plan
    from nvc.system.confinement import CONTAINER_HELPER, confine

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

    def mount_rest() -> int:  # a failure is not rolled back here: the caller stops ldconfig first
        applier = state["plan"]
        applier.execute_rest()
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

    return {"mount": mount, "mount_rest": mount_rest, "rollback": rollback, "commit": commit, "undo": undo}


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

    def mount(self, plan: Any, handle: ContainerHandle | None) -> Callable[[], int]:  # Plan: Any, as for recover
        """Start applying the plan's operations in the container of ``handle`` (its process: None
        standalone), up to those ldconfig reads (:meth:`mount_rest` does the rest); the function
        returned waits until they are (the number of changes made). On failure it raises, the helper
        having undone them already."""
        self.handle = handle
        return self.helper.begin("mount", fds=_fds(handle), plan=plan.to_wire())

    def mount_rest(self) -> Callable[[], int]:
        """Start applying the operations after those ldconfig reads (the plan's ``before_ldconfig``),
        which :meth:`mount` left for ldconfig's run to go beside; the function returned waits until
        they are. On failure it raises, and nothing is undone: the caller stops ldconfig, then rolls back."""
        return self.helper.begin("mount_rest")

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


def _copy_ahead(busy: Callable[[], bool]) -> None:
    """A helper started ahead, waiting: the host sources :func:`prestart` expects cloned
    (:mod:`nvc.apply.cloneahead`), then its own copy of what it shares with its parent, so that the
    call's first touches take no faults (:mod:`nvc.system.prefault`)."""
    from nvc.apply import cloneahead
    from nvc.apply.applier import raised
    from nvc.system import prefault

    with raised("sys_admin", "dac_read_search", "dac_override"):
        cloneahead.clone(_expected, busy)
    prefault.copy_ahead(busy)


# The container helper forked ahead of any call (see :func:`prestart`) until open_container takes it.
_ahead = WarmHelper("container", serve_container, failure=MountError, journal=True, idle=_copy_ahead)
_expected: tuple[Bind, ...] = ()  # the mounts whose host sources it clones while it waits


def prestart(expected: Plan | None = None) -> WarmHelper:
    """Fork the container helper now, before a call is known: the hook server's idle workers keep
    one so, and the call's :func:`open_container` takes it (fork and confinement already done).
    While it waits, it clones the host sources of ``expected`` (a dry plan), which a call's mounts
    of the same files take. One never taken exits with this process. Returns the warm helper (see
    driver_service.prestart)."""
    global _expected
    from nvc.plan.operations import Bind

    ops = () if expected is None else expected.operations
    _expected = tuple(op for op in ops if isinstance(op, Bind) and not op.in_rootfs)
    _ahead.prepare()
    return _ahead


def open_container(timeout: float = HELPER_TIMEOUT, wait: bool = True) -> ContainerClient:
    """The container helper: the one :func:`prestart` forked, else one forked now. ``wait=False``
    returns at once, and its first call waits for it (and raises its set-up's failure): the caller
    plans while the helper forks and confines itself."""
    return ContainerClient(_ahead.take({}, timeout, wait))
