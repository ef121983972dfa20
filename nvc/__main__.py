"""``python -m nvc`` and the ``nvc-py`` console script."""

import sys

from nvc.hook.server.handover import hand_over
from nvc.system.loaderenv import restart_without_unsafe_variables
from nvc.system.stdio import reopen_closed

reopen_closed()  # before anything opened (the server's socket, a helper's) could become stdout
restart_without_unsafe_variables()  # before any import that may load a shared library
hand_over(sys.argv)  # to a running server's warm worker (nvc-py-hook serve), when there is one

if "info" in sys.argv[1:]:  # a guess that only affects speed: a wrong one costs an unused fork
    from nvc.rpc import driver_service

    driver_service.prefork()  # pynvml imports in the helper while the CLI imports click

from nvc.commands.cli import main  # noqa: E402


def run() -> None:
    """Exit with the CLI's status (console-script entry point), without the interpreter's
    teardown (:mod:`nvc.system.quickexit` says why)."""
    from nvc.system.quickexit import exit_now

    exit_now(main())


if __name__ == "__main__":
    run()
