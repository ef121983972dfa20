"""``nvc-py-hook``, the program: the hook's stages (:mod:`nvc.hook.oci.prestart`) or ``serve``.

The entry point sits above both the stages and the hook server (:mod:`nvc.hook.server`), since the
server runs the stages, and nvc-py's CLI, for its callers: neither imports this module back.
"""

from __future__ import annotations

import gc
import os
import sys

from nvc.errors import InputError, NvcError
from nvc.hook.oci.prestart import PROG, USAGE
from nvc.hook.oci.prestart import main as stages
from nvc.hook.server.handover import hand_over
from nvc.system.programs import DEFAULT_SOCKET, SOCKET_ENV, installed_program


def _serve(args: list[str]) -> int:
    from nvc.hook.server.loop import serve

    if args and (len(args) != 2 or args[0] != "--socket" or not args[1]):
        print(USAGE, file=sys.stderr)
        return InputError.exit_code
    gc.enable()  # a server lives on: its own warm-up collects and freezes what it imported
    try:
        return serve(args[1] if args else os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET)
    except NvcError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return err.exit_code


def main(argv: list[str] | None = None) -> int:
    """``nvc-py-hook STAGE …`` or ``nvc-py-hook serve [--socket PATH]``."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["serve"]:
        return _serve(args[1:])
    if args[:1] == ["start-server"]:  # what the native front does, starting a server detached
        print(f"{PROG}: start-server: run {installed_program(PROG)}, the installed front", file=sys.stderr)
        return InputError.exit_code
    return stages(args)


def run() -> None:
    """Console script entry point; exits without the interpreter's teardown (:mod:`nvc.system.quickexit`).

    A call runs without the cyclic garbage collector, as a server's worker does: it lives for one
    call, and at a start without a server its collections cost more than the garbage they would
    free (``serve`` turns it back on).
    A hook or runtime may be handed a container's environment: restart without the loader
    variables before anything loads a shared library (this module's own imports load none).
    Its streams are guarded (:mod:`nvc.system.stdio`): a closed or full stdout is one line and a status.
    """
    gc.disable()
    from nvc.system.loaderenv import restart_without_unsafe_variables
    from nvc.system.quickexit import exit_now
    from nvc.system.stdio import guarded, reopen_closed

    reopen_closed()  # before the server's socket could become stdout
    restart_without_unsafe_variables()
    hand_over(sys.argv)  # to a running server's warm worker, when there is one
    exit_now(guarded(PROG, main))  # no interpreter teardown (a server's SIGTERM ends it as sys.exit does)
