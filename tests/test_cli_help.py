"""``--help`` of every nvc-py command: each command's line in its group's list is whole (click cuts a
docstring's first sentence with "..." where no short help is given), and one metavar style: PATH
for every file or directory, an upper-case word for any other value, never click's TEXT. The
commands of other modules are there, imported only once named."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from harness.clitree import commands, subcommands
from harness.clitree import takes_value as _takes_value
from nvc.commands.cli import cli

GROUPS = [words for words, command in commands(cli) if isinstance(command, click.Group)]
# What click shows for a value without a metavar of its own, the other names of a path, a literal value.
NOT_OUR_STYLE = {"TEXT", "FILE", "DIR", "FILENAME", "DIRECTORY", "INTEGER", "FLOAT", "all"}


def _help(words: tuple[str, ...]) -> str:
    result = CliRunner().invoke(cli, [*words, "--help"], prog_name="nvc-py", terminal_width=80)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("words", GROUPS, ids=[" ".join(w) or "nvc-py" for w in GROUPS])
def test_every_command_line_of_a_group_is_whole(words: tuple[str, ...]) -> None:
    listed = _help(words).split("\nCommands:\n", 1)[1]
    assert "..." not in listed and "…" not in listed, listed
    group = cli
    for word in words:
        group = subcommands(group)[word]
    found = subcommands(group)
    for name, command in found.items():
        line = command.get_short_help_str(limit=1000)
        assert line.endswith("."), (name, line)
        assert line == command.get_short_help_str(limit=80 - 6 - max(map(len, found))), (name, line)


def test_one_metavar_style() -> None:
    found = {
        (*words, param.name): param.metavar or param.type.name.upper()
        for words, command in commands(cli)
        for param in command.params
        if isinstance(param, click.Option)
        and _takes_value(param)
        and not param.hidden
        and not isinstance(param.type, click.Choice)
    }
    assert not {key: metavar for key, metavar in found.items() if metavar in NOT_OUR_STYLE}
    paths = {
        key: metavar
        for key, metavar in found.items()
        if key[-1].endswith(("dir", "file", "path", "log", "socket", "output", "drop_in", "root", "ldcache", "debug"))
    }
    assert len(paths) > 15 and set(paths.values()) == {"PATH"}, paths


def test_the_commands_of_other_modules_are_imported_only_when_named() -> None:
    """``nvc-py info`` and ``list`` start without the set-up's, the doctor's, the exporter's, the
    plugins' or ``share``'s modules; named, each is the command its module defines."""
    lazy = {
        "doctor": "nvc.doctor.command",
        "exporter": "nvc.exporter.command",
        "k8s": "nvc.k8s.command",
        "setup": "nvc.commands.engine_setup",
        "share": "nvc.commands.sharecli",
    }
    script = (
        "import sys, click\n"
        "from nvc.commands.cli import cli\n"
        f"lazy = {lazy!r}\n"
        "print(sorted(m for m in lazy.values() if m in sys.modules))\n"
        "ctx = click.Context(cli)\n"
        "print(all(cli.get_command(ctx, n) is getattr(sys.modules[m], n) for n, m in lazy.items()))\n"
        "print(sorted(m for m in lazy.values() if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["[]", "True", repr(sorted(lazy.values()))], out
    assert set(lazy) <= set(cli.list_commands(click.Context(cli)))
