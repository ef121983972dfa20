"""What a hook server runs for its callers: the hook, the read-only commands a hook needs, and the spec
rewrite of nvc-py-runtime's create.

The server is a root daemon every GPU container start goes through; a call it runs gets a warm
worker with everything imported, nothing more. Commands that change the host (``setup``,
``config``, ``share``...) or start servers (``serve``) are not its business: it answers "fall
back", and the client runs them itself, as its own caller, exactly as without a server.
"""

from __future__ import annotations

import os

HOOK_STAGES = ("prestart", "poststart", "poststop", "create-symlinks", "update-ldcache")
CLI_COMMANDS = ("configure", "info", "list")


def served(argv: list[str]) -> bool:
    """Whether a server runs ``argv`` (argv[0]: the program, by its basename): for nvc-py-runtime, a
    create's spec rewrite (the front executes the runtime itself afterwards)."""
    program = os.path.basename(argv[0])
    if program == "nvc-py-hook":
        return len(argv) > 1 and argv[1] in HOOK_STAGES
    if program == "nvc-py-runtime":
        from nvc.hook.oci.runtime import find_create

        return find_create(argv[1:]) is not None
    return program == "nvc-py" and cli_command(argv[1:]) in CLI_COMMANDS


def cli_command(args: list[str]) -> str | None:
    """The subcommand of an ``nvc-py`` command line: the first word after the global options (None:
    none, or an option nvc-py does not know, which the CLI itself will have to explain)."""
    import click

    from nvc.commands.cli import _optional_user_value, cli

    args = _optional_user_value(args)  # as the CLI reads them: a bare --user takes no value
    takes_value = {
        name: not (param.is_flag or param.count)
        for param in cli.params
        if isinstance(param, click.Option)
        for name in (*param.opts, *param.secondary_opts)
    }
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            return args[i + 1] if i + 1 < len(args) else None
        if not word.startswith("-") or word == "-":
            return word
        name, sep, _ = word.partition("=")
        if name not in takes_value:
            return None
        i += 2 if takes_value[name] and not sep else 1
    return None
