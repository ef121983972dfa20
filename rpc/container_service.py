"""The container helper (``nvc:[container]``): applies a mount plan inside a container.

Joining a mount namespace is a one-way trip for a process, and the caller (the CLI or the
OCI hook) must stay in the host's. So a forked helper does it, holding only the
capabilities mounting needs (:data:`nvc.apply.HELPER_CAPS`), each raised only for the step
that uses it, with NO_NEW_PRIVS. It keeps what it did until the caller commits or rolls back.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from nvc.rpc.helper import Dispatch, HelperClient


def _confine() -> None:
    """Keep only the helper's capabilities (bounding and permitted), none effective."""
    import prctl

    from nvc.apply import HELPER_CAPS

    keep = [getattr(prctl, f"CAP_{name.upper()}") for name in HELPER_CAPS]
    prctl.capbset.limit(*keep)
    prctl.cap_inheritable.limit()
    prctl.cap_effective.limit()
    prctl.cap_permitted.limit(*keep)
    prctl.set_no_new_privs(1)


def serve_container() -> Dispatch:
    """Helper setup: confine, then serve mount / rollback / commit for one plan."""
    from nvc.apply import Applier
    from nvc.mountplan import Plan

    _confine()
    state: dict[str, Applier] = {}

    def mount(plan: dict[str, Any]) -> int:
        applier = Applier(Plan.from_wire(plan))
        state["plan"] = applier
        try:
            applier.prepare()
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

    return {"mount": mount, "rollback": rollback, "commit": commit}


class ContainerClient:
    """The caller's side: one plan, mounted, then committed or rolled back."""

    def __init__(self, helper: HelperClient) -> None:
        self.helper = helper

    def mount(self, plan: Any) -> int:  # Plan; Any keeps nvc.mountplan out of this import
        """Apply the plan's operations; on failure the helper has already undone them."""
        return self.helper.call("mount", plan=plan.to_wire())

    def rollback(self) -> list[str]:
        """Undo what ``mount`` did; return what could not be undone."""
        return self.helper.call("rollback")

    def commit(self) -> None:
        self.helper.call("commit")


@contextmanager
def open_container(timeout: float) -> Iterator[ContainerClient]:
    """Start the container helper; shut it down (and reap it) on exit."""
    helper = HelperClient.spawn("container", serve_container, timeout=timeout)
    with helper:
        yield ContainerClient(helper)
