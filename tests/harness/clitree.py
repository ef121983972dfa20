"""nvc-py's click command tree walked: every command with the words that name it, and which of a
command's parameters take a value."""

from __future__ import annotations

from collections.abc import Iterator

import click


def subcommands(group: click.Group) -> dict[str, click.Command]:
    """A group's commands by name, as its ``--help`` lists them (a lazy group's imported too)."""
    ctx = click.Context(group)
    found = {name: group.get_command(ctx, name) for name in group.list_commands(ctx)}
    return {name: command for name, command in found.items() if command is not None}


def commands(group: click.Group, words: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command of the tree, groups included, with the words that name it."""
    yield words, group
    for name, command in subcommands(group).items():
        if isinstance(command, click.Group):
            yield from commands(command, (*words, name))
        else:
            yield (*words, name), command


def takes_value(param: click.Parameter) -> bool:
    return not (isinstance(param, click.Option) and (param.is_flag or param.count)) and param.name is not None
