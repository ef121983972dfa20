"""``nvc-py info`` and ``nvc-py list`` as written most run without click.

Without a server, importing click and building the command tree took about a third of an
``nvc-py list`` on the H200, about half of an ``info --json`` once NVML's half was native, and more
than half of an ``info`` after ``--root`` (docs/performance.md). ``info`` and ``list``, ``info`` with one of its
formats, after the global options (the driver root, its ld cache, the driver helper's user, the debug
log and ``--load-kmods``, in the spellings :data:`VALUE_OPTIONS`, :data:`USER_OPTIONS` and
:data:`FLAG_OPTIONS` list), run here, on the functions the CLI's commands run
(:mod:`nvc.commands.queries`), and print what they print; any other command line, ``--help``, another
spelling, an option given twice, is click's to parse (:mod:`nvc.commands.cli`), which reads these alike.
"""

from __future__ import annotations

import sys

from nvc.errors import NvcError

# The command lines run here, after the global options, and ``info``'s format for each (as its --csv and
# --json give it to click).
FORMS: dict[tuple[str, ...], str | None] = {
    ("info",): None,
    ("info", "--csv"): "csv",
    ("info", "--json"): "json",
    ("list",): None,
}
# Global options whose value is the next word (one that starts with "-" is left to click) or follows
# "=" in their long spelling, by the option they give.
VALUE_OPTIONS = {
    "-r": "root",
    "--root": "root",
    "-l": "ldcache",
    "--ldcache": "ldcache",
    "-d": "debug",
    "--debug": "debug",
}
FLAG_OPTIONS = {"-k": "load_kmods", "--load-kmods": "load_kmods"}  # options that take no value
# ``--user=VALUE``, and ``-u``/``--user`` alone: the effective ids (nvc.commands.cli._optional_user_value).
USER_OPTIONS = ("-u", "--user")


def run(argv: list[str]) -> int | None:
    """The exit status of ``argv`` (the words after the program's name) run here, where it is one of
    :data:`FORMS` after options read here; None where it is anything else."""
    read = _global_options(argv)
    if read is None or read[1] not in FORMS:
        return None
    given, form = read
    from nvc.system import stdio

    return stdio.guarded("nvc-py", lambda: _run(form[0], FORMS[form], given))


def _global_options(argv: list[str]) -> tuple[dict[str, str], tuple[str, ...]] | None:
    """The global options given (by the option they give) and the words after them; None where a word
    before the command is not read here."""
    given: dict[str, str] = {}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        name, equals, value = argv[i].partition("=")
        if equals and name.startswith("--") and (name in VALUE_OPTIONS or name in USER_OPTIONS):
            option = VALUE_OPTIONS.get(name, "user")
        elif argv[i] in VALUE_OPTIONS and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            option, value = VALUE_OPTIONS[argv[i]], argv[i + 1]
            i += 1
        elif argv[i] in USER_OPTIONS:
            option, value = "user", ""
        elif argv[i] in FLAG_OPTIONS:
            option, value = FLAG_OPTIONS[argv[i]], ""
        else:
            return None
        if option in given:
            return None
        given[option] = value
        i += 1
    return given, tuple(argv[i:])


def _run(command: str, fmt: str | None, given: dict[str, str]) -> int:
    """Run ``command`` (``info`` in ``fmt``) with the options ``given``, the configuration's standing in for
    the others: its output, or one line and its error's status."""
    from nvc.commands import queries
    from nvc.config.options import resolve_options

    try:
        if "debug" in given:
            from nvc import debuglog

            debuglog.enable(given["debug"])
        opts = resolve_options(given.get("root"), given.get("ldcache"), given.get("user"), "load_kmods" in given)
        with queries.driver_required():
            if opts.load_kmods:  # as the CLI's commands, before the query
                queries.load_nodes(opts.root)
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
