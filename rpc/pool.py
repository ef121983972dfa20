"""A helper of one kind kept warm: forked ahead of the call that takes it, else forked for it.

A helper's fork, confinement and set-up (NVML's load, say) are most of what a call waits for on its
first use. A process that knows it will need one starts it early: the CLI before it parses its
command line (:meth:`WarmHelper.prefork`, parameters unknown yet), a hook server's idle worker before
a call comes (:meth:`WarmHelper.prepare`). The call then takes it (:meth:`WarmHelper.take`) where it
was started for the same parameters, or was not started yet; anything else is closed and a helper
forked for the call. A kind whose set-up loads something that can change under it (the driver helper's
NVML: a driver upgrade) gives a ``stamp`` of what it loads: a helper started before the stamp changed
is closed too. One never taken exits with the process that forked it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from nvc import errors
from nvc.rpc.helper import DEFAULT_TIMEOUT, HelperClient

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from nvc.rpc.helper import Idle, Setup


class WarmHelper:
    """At most one helper named ``nvc:[name]`` running ``setup``, waiting for the call that takes it."""

    def __init__(
        self,
        name: str,
        setup: Setup,
        *,
        failure: type[errors.NvcError],
        journal: bool = False,
        stamp: Callable[[dict[str, Any]], object] | None = None,
        idle: Idle | None = None,
    ) -> None:
        self.name = name
        self.setup = setup
        self.failure = failure
        self.journal = journal
        self.stamp = stamp  # the identity of what a set-up with these parameters loads, taken at its start
        self.idle = idle  # what a helper started ahead (prepare) does while it waits for its call
        self.kept: HelperClient | None = None
        self._params: dict[str, Any] | None = None  # what ``kept`` was started with; None: not yet
        self._stamp: object = None  # ``stamp`` when ``kept`` was started

    def fork(self, params: dict[str, Any], timeout: float, wait: bool, idle: Idle | None = None) -> HelperClient:
        """A helper of this kind started with ``params`` now, never the warm one (see
        :meth:`HelperClient.spawn` for ``wait`` and ``idle``)."""
        return HelperClient.spawn(
            self.name,
            functools.partial(self.setup, **params),
            timeout=timeout,
            wait=wait,
            failure=self.failure,
            journal=self.journal,
            idle=idle,
        )

    def prefork(self, warm: Callable[[], None] | None = None) -> None:
        """Fork the helper now, before its parameters are known: it runs ``warm`` (imports) until they
        come, which :meth:`begin` or :meth:`take` sends."""
        self.kept = HelperClient.prefork(self.name, self.setup, warm=warm, failure=self.failure)
        self._params = self._stamp = None

    def begin(self, **params: Any) -> None:
        """Send the helper :meth:`prefork` forked its parameters now, before the call that takes it
        (which must ask for the same): it sets up meanwhile. No stamp is taken: this is for a process
        whose call comes within its own short run (the CLI's), not for one kept waiting."""
        if self.kept is None or self._params is not None:
            raise self.failure(f"nvc:[{self.name}]: no helper forked ahead without its parameters")
        self.kept.start(**params)
        self._params = params

    def prepare(self, **params: Any) -> None:
        """Fork the helper and start it with ``params`` now: its set-up runs before any call needs it,
        then its ``idle`` while no call has come."""
        self._stamp = self.stamp(params) if self.stamp else None
        self.kept, self._params = self.fork(params, DEFAULT_TIMEOUT, wait=False, idle=self.idle), params

    def holds(self, params: dict[str, Any]) -> bool:
        """Whether a helper started with ``params`` is kept alive (:meth:`take` would take it)."""
        return self.kept is not None and self._params == params and self.kept.alive

    def report_fd(self) -> int | None:
        """The kept helper's :meth:`HelperClient.report_fd` (None: no helper kept)."""
        return None if self.kept is None else self.kept.report_fd()

    def settle(self) -> None:
        """Receive the kept helper's set-up report (:meth:`HelperClient.report_fd` is readable): one
        whose set-up failed is reaped (no zombie while the process waits for its call) and forgotten,
        so :meth:`take` forks another, and its failure raised."""
        if self.kept is None:
            return
        try:
            self.kept.wait_ready()
        except errors.NvcError:
            self.kept = self._params = None
            raise

    def take(self, params: dict[str, Any], timeout: float, wait: bool) -> HelperClient:
        """The helper for a call with ``params``: the warm one where it is alive and was started
        with the same, over what is still there (its stamp unchanged), or not started yet (it is
        started now); else one forked now (the warm one is closed). ``wait``: return once its set-up
        is done (and raise its failure), else its first call waits."""
        helper, started = self.kept, self._params
        self.kept = self._params = None
        outdated = started is not None and (
            started != params
            or (self._stamp is not None and self.stamp is not None and self.stamp(params) != self._stamp)
        )
        if helper is not None and (not helper.alive or outdated):
            helper.close()
            helper = None
        if helper is None:
            return self.fork(params, timeout, wait)
        helper.timeout = timeout
        if started is None:
            helper.start(**params)
        if wait:
            helper.wait_ready()
        return helper
