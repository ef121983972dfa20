"""The ``nvc-py`` command line.

The CLI parses and plans; privileged work happens in forked helpers (``nvc.rpc``).
Every :class:`~nvc.errors.NvcError` becomes one line on stderr and its stable exit code.
"""

from __future__ import annotations

import sys

import click

from nvc import __version__
from nvc.errors import NvcError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="nvc-py", message="%(prog)s %(version)s")
def cli() -> None:
    """Make NVIDIA GPUs appear inside containers."""


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI and turn nvc-py errors into one line and an exit code."""
    try:
        cli.main(args=argv, prog_name="nvc-py", standalone_mode=False)
    except NvcError as err:
        click.echo(f"nvc-py: {err}", err=True)
        return err.exit_code
    except click.exceptions.Exit as done:
        return done.exit_code
    except click.ClickException as err:
        err.show()
        return err.exit_code
    except click.exceptions.Abort:
        click.echo("nvc-py: aborted", err=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
