"""``python -m nvc`` and the ``nvc-py`` console script."""

import sys

from nvc.hook.server.handover import hand_over
from nvc.rpc import native_snapshot
from nvc.system.loaderenv import restart_without_unsafe_variables
from nvc.system.stdio import reopen_closed

reopen_closed()  # before anything opened (the server's socket, a helper's) could become stdout
restart_without_unsafe_variables()  # before any import that may load a shared library
native_snapshot.take()  # the native driver helper the front started for `info` (after a restart: it keeps it)
hand_over(sys.argv)  # to a running server's warm worker (nvc-py-hook serve), when there is one

# A guess that only affects speed (a wrong one costs an unused fork), for a tree without the native
# driver helper: `info` starts that one itself once its options are known (nvc.rpc.native_snapshot).
if "info" in sys.argv[1:] and not native_snapshot.handed() and not native_snapshot.installed():
    from nvc.rpc import driver_service

    driver_service.prefork(sys.argv[1:])  # NVML loads in the helper while this process imports the rest


def run() -> None:
    """Exit with the CLI's status (console-script entry point), without the interpreter's
    teardown (:mod:`nvc.system.quickexit` says why). ``info`` and ``list`` without options run
    without click (:mod:`nvc.commands.plain`)."""
    from nvc.commands import plain
    from nvc.system.quickexit import exit_now

    try:
        code = plain.run(sys.argv[1:])
        if code is None:
            from nvc.commands.cli import main

            code = main()
    finally:
        native_snapshot.discard()  # one the command did not take (its --help, an error before it) is reaped
    exit_now(code)


if __name__ == "__main__":
    run()
