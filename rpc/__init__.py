"""Privileged helpers of nvc-py and the framed protocol they speak over a socketpair.

Installed as ``nvc.rpc``: the parent plans, the forked helpers act with the least privilege.

Modules: ``protocol`` (length-prefixed JSON frames, versioned schema), ``helper`` (fork a
named helper, serve a dispatch table in it, call it with a deadline, reap it) and ``driver_service`` (the
``nvc:[driver]`` helper: NVML loaded from the driver root; ``open_driver(...).snapshot()``). What
each helper keeps of root's power is a row of :mod:`nvc.system.confinement`. ``driver_wire`` is the
driver helper's parameters and result, which ``native_snapshot`` shares: the answer of the native driver
helper (native/driver), which answers every snapshot no warm Python helper does.
"""

import os

DEFAULT_TIMEOUT = 10.0  # seconds per helper call, as the reference client's hard-coded limit


def describe_status(status: int) -> str:
    """Turn a waitpid status into words: "exited with status 1", "killed by signal SIGKILL" (both
    helpers' clients say so of a helper that ended without its answer)."""
    if os.WIFSIGNALED(status):
        import signal

        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"killed by signal {name}"
    return f"exited with status {os.WEXITSTATUS(status)}"
