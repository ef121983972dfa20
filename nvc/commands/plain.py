"""``nvc-py info`` and ``nvc-py list`` as written most, with no option at all, run without click.

Without a server, importing click and building the command tree took about a third of an
``nvc-py list`` on the H200 (docs/performance.md). These two forms run here, on the functions the
CLI's commands run (:mod:`nvc.commands.queries`), and print what they print; any other command
line, ``--help`` and the global options included, is click's to parse (:mod:`nvc.commands.cli`).
"""

from __future__ import annotations

import sys

from nvc.errors import NvcError

COMMANDS = ("info", "list")


def run(argv: list[str]) -> int | None:
    """The exit status of ``argv`` (the words after the program's name) run here, where it is one of
    :data:`COMMANDS` alone; None where it is anything else."""
    if len(argv) != 1 or argv[0] not in COMMANDS:
        return None
    from nvc.system import stdio

    return stdio.guarded("nvc-py", lambda: _run(argv[0]))


def _run(command: str) -> int:
    """Run ``command`` with the configuration's options: its output, or one line and its error's status."""
    from nvc.commands import queries
    from nvc.config.options import resolve_options

    try:
        opts = resolve_options(None, None, None, False)
        with queries.driver_required():
            if command == "info":
                text = queries.info_text(opts, None)
            else:
                request, devices = queries.list_request()
                text = queries.run_list(opts, request, devices).text()
    except NvcError as err:
        print(f"nvc-py: {err}", file=sys.stderr)
        return err.exit_code
    sys.stdout.write(text)
    return 0
