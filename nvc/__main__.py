"""``python -m nvc`` and the ``nvc-py`` console script."""

import os
import sys

from nvc.hook.handover import hand_over
from nvc.loaderenv import restart_without_loader_variables

restart_without_loader_variables()  # before any import that may load a shared library
hand_over(sys.argv)  # to a running server's warm worker (nvc-py-hook serve), when there is one

if "info" in sys.argv[1:]:  # a guess that only affects speed: a wrong one costs an unused fork
    from nvc.rpc import driver_service

    driver_service.prefork()  # pynvml imports in the helper while the CLI imports click

from nvc.cli import main  # noqa: E402


def run() -> None:
    """Exit with the CLI's status (console-script entry point).

    Leaves through ``os._exit`` once the output is flushed: tearing down the interpreter
    (every imported module) costs about as much as a whole ``nvc-py list`` on the fast
    path, at every container start, and there is nothing left to clean up: helpers were
    reaped (a preforked one never used dies with this process, by its parent-death signal),
    the debug log is flushed per record, and the kernel closes the rest.
    """
    code = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:  # a closed pipe: the output is lost, say so in the status
            code = code or 1
    os._exit(code)


if __name__ == "__main__":
    run()
