"""A click group whose subcommands of other modules are imported only when named.

Every ``nvc-py`` start imports the top-level group; ``info`` and ``list`` start without the
engine set-up's, the doctor's, the exporter's or the plugins' imports. ``--help`` lists them all
(and imports them to show their lines).
"""

from __future__ import annotations

from typing import Any

import click


class LazyGroup(click.Group):
    """A group with, beside its own commands, ``lazy``: a command's name → ``"module:attribute"``."""

    def __init__(self, *args: Any, lazy: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.lazy.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module, _, name = target.partition(":")
        # The import statement's path (importlib.import_module's does not show in ``-X importtime``).
        command: click.Command = getattr(__import__(module, fromlist=[name]), name)
        return command
