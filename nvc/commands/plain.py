"""``nvc-py info`` and ``nvc-py list`` as written most, with no global option, run without click.

Without a server, importing click and building the command tree took about a third of an
``nvc-py list`` on the H200, and about half of an ``info --json`` once NVML's half was native
(docs/performance.md). ``info`` and ``list`` alone, and ``info`` with one of its formats, run here, on
the functions the CLI's commands run (:mod:`nvc.commands.queries`), and print what they print; any
other command line, ``--help`` and the global options included, is click's to parse
(:mod:`nvc.commands.cli`).
"""

from __future__ import annotations

import sys

from nvc.errors import NvcError

# The command lines run here, and ``info``'s format for each (as its --csv and --json give it to click).
FORMS: dict[tuple[str, ...], str | None] = {
    ("info",): None,
    ("info", "--csv"): "csv",
    ("info", "--json"): "json",
    ("list",): None,
}


def run(argv: list[str]) -> int | None:
    """The exit status of ``argv`` (the words after the program's name) run here, where it is one of
    :data:`FORMS`; None where it is anything else."""
    form = tuple(argv)
    if form not in FORMS:
        return None
    from nvc.system import stdio

    return stdio.guarded("nvc-py", lambda: _run(form[0], FORMS[form]))


def _run(command: str, fmt: str | None) -> int:
    """Run ``command`` (``info`` in ``fmt``) with the configuration's options: its output, or one line and
    its error's status."""
    from nvc.commands import queries
    from nvc.config.options import resolve_options

    try:
        opts = resolve_options(None, None, None, False)
        with queries.driver_required():
            if command == "info":
                text = queries.info_text(opts, fmt)
            else:
                request, devices = queries.list_request()
                text = queries.run_list(opts, request, devices).text()
    except NvcError as err:
        print(f"nvc-py: {err}", file=sys.stderr)
        return err.exit_code
    sys.stdout.write(text)
    return 0
