"""Every command and option of ``nvc-py`` (from its click command tree: every option and argument
that takes a value, every eager flag such as ``--help`` and ``--version``), called with hostile values.

The table, the rules and how each case runs: tests/harness/clihostile.py.

Test double: the GPUs are the fake driver's (tests/fakedriver); nothing here is a GPU result.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from harness.clihostile import (
    CHOICE_VALUES,
    NUMBER_VALUES,
    NVC_PY,
    PATH_VALUES,
    WORD_VALUES,
    Case,
    Scratch,
    Value,
    run_phases,
    table_dir,  # noqa: F401  (fixture)
)
from harness.clitree import commands
from harness.clitree import takes_value as _takes_value
from nvc.commands.cli import cli

# ---- nvc-py: the click tree ------------------------------------------------------------------------

# The base value of each option a command writes to or reads a file from: the case's own directory
# (by command words and option name; a name alone for every command). An option missing here whose
# default is an absolute path gets ``<scratch>/<name>``; any other is left at its default.
BASE: dict[tuple[str, ...], Callable[[Scratch], str]] = {
    ("config_path",): lambda s: str(s.config),
    ("setup", "containerd", "config_path"): lambda s: s.path("containerd.toml"),
    ("setup", "docker", "config_path"): lambda s: s.path("daemon.json"),
    ("path",): lambda s: str(s.config),
    ("hooks_dir",): lambda s: s.path("hooks.d"),
    ("unit_dir",): lambda s: s.path("units"),
    ("systemctl",): lambda s: "/bin/false",
    ("drop_in",): lambda s: s.path("drop-in.toml"),
    ("state_dir",): lambda s: s.path("share"),
    ("device_plugin_dir",): lambda s: s.path("device-plugins"),
    ("rootfs",): lambda s: s.path("rootfs"),
    ("listen",): lambda s: f"unix:{s.path('metrics.sock')}",  # the exporter's: no port shared between cases
    ("k8s", "dra-driver", "kubeconfig"): lambda s: _kubeconfig(s),
    ("share", "set", "container"): lambda s: _shared_container(s),
    # short: its sockets' paths must fit a sockaddr_un, as they must for the kubelet that dials them
    ("k8s", "dra-driver", "kubelet_dir"): lambda s: _scratch(s, "k", True),
}
BASE_FLAGS = {
    ("configure",): ["--dry-run"],  # standalone configure would mount into the scratch rootfs
    ("share", "set"): ["--memory=1G"],
}
DAEMONS = {("k8s", "device-plugin"), ("k8s", "dra-driver"), ("exporter",)}
# Where every hostile value of the global options is tried (the group reads --debug for all; a driver
# command and the device plugin resolve --root, --ldcache and --user, each its own way); every other
# command gets the first value of each.
ALL_GLOBAL_VALUES = {("list",), ("k8s", "device-plugin")}
VERDICTS = {("doctor",)}  # status 1 is their answer ("a check failed"), said on stdout, not an error
SKIPPED = {("hook",)}  # nvc-py-hook's stages: test_hook_stages
PATH_METAVARS = ("PATH", "ROOTFS")


def _kubeconfig(scratch: Scratch) -> str:
    """A kubeconfig of an API server that never answers (the discard port): the DRA driver runs on,
    retrying, as with a cluster that is down."""
    path = scratch.dir / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:9', insecure-skip-tls-verify: true}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )
    return str(path)


def _shared_container(scratch: Scratch) -> str:
    """A container sharing a GPU under the case's state directory (its limits file as the hook writes
    it, in a plain directory): `share set` changes it."""
    shared = scratch.dir / "share" / "c" / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    (shared / "limits").write_text("version=1\nmemory_limit=2147483648\n")
    return "c"


def _scratch(scratch: Scratch, name: str, directory: bool) -> str:
    if directory:
        (scratch.dir / name).mkdir(exist_ok=True)
    return scratch.path(name)


def _base_value(words: tuple[str, ...], param: click.Parameter) -> Callable[[Scratch], str] | None:
    for key in ((*words, param.name), (param.name,)):
        if key in BASE:
            return BASE[key]
    default = param.default if not callable(param.default) else None
    if isinstance(default, str) and default.lstrip("@").startswith("/"):  # a directory for a directory
        is_dir = os.path.isdir(default)
        return lambda s, name=param.name: _scratch(s, f"default-{name}", is_dir)
    if param.required:
        return lambda s, name=param.name: s.path(name)
    return None


def _values(param: click.Parameter) -> dict[str, Value]:
    if isinstance(param.type, click.Choice):
        return CHOICE_VALUES
    if isinstance(param.type, (click.types.IntParamType, click.types.FloatParamType)):
        return NUMBER_VALUES
    metavar = (param.metavar or "").upper() if isinstance(param, click.Option) else param.name.upper()
    default = param.default if isinstance(param.default, str) else ""
    if (
        any(m in metavar for m in PATH_METAVARS)
        or default.lstrip("@").startswith("/")
        or param.name in (*(key[-1] for key in BASE), "root", "ldcache", "debug", "output")
    ):
        return PATH_VALUES
    return WORD_VALUES


def _argv(
    words: tuple[str, ...],
    command: click.Command,
    scratch: Scratch,
    hostile: tuple[click.Parameter, Any] | None,
    global_hostile: tuple[click.Parameter, Any] | None = None,
) -> list[str | bytes]:
    """``nvc-py [global option] WORDS [base options] [hostile option] [arguments]``."""
    argv: list[str | bytes] = [NVC_PY]
    if global_hostile is not None:
        argv.append(os.fsencode(global_hostile[0].opts[-1]) + b"=" + os.fsencode(global_hostile[1]))
    argv += list(words) + BASE_FLAGS.get(words, [])
    arguments: list[str | bytes] = []
    for param in command.params:
        if not _takes_value(param):
            continue
        value: Any = None
        if hostile is not None and param is hostile[0]:
            value = hostile[1]
        else:
            base = _base_value(words, param)
            value = base(scratch) if base is not None else None
        if value is None:
            continue
        if isinstance(param, click.Argument):
            arguments.append(value)
        else:  # --name=VALUE: a bare --user takes no value (nvc.commands.cli._optional_user_value)
            argv.append(os.fsencode(param.opts[-1]) + b"=" + os.fsencode(value))
    return argv + (["--"] if arguments else []) + arguments


def _value_params(command: click.Command) -> list[click.Parameter]:
    return [p for p in command.params if _takes_value(p) and not getattr(p, "is_eager", False)]


def _eager_flags(command: click.Command) -> list[str]:
    """``--help`` and the command's other eager flags (``--version``)."""
    return ["--help", *(p.opts[-1] for p in command.params if isinstance(p, click.Option) and p.is_eager and p.is_flag)]


def nvc_py_cases() -> tuple[list[Case], list[Case]]:
    bases: list[Case] = []
    rest: list[Case] = []
    leaves = [(w, c) for w, c in commands(cli) if not isinstance(c, click.Group) and w not in SKIPPED]
    for words, command in commands(cli):
        if words in SKIPPED:
            continue
        label = " ".join(("nvc-py", *words))
        for flag in _eager_flags(command):
            flag_argv = lambda s, w=words, f=flag: [NVC_PY, *w, f]  # noqa: E731
            for mode in ("pipe", "closed", "full", "both-closed"):
                rest.append(
                    Case(
                        f"{label} {flag} | {mode}",
                        flag_argv,
                        stdout=mode,
                        must_succeed=mode == "pipe",
                        must_fail_output=mode != "pipe",
                    )
                )
    for words, command in leaves:
        label = " ".join(("nvc-py", *words))
        kind = {"daemon": words in DAEMONS, "verdict": words in VERDICTS}
        plain = lambda s, w=words, c=command: _argv(w, c, s, None)  # noqa: E731
        bases.append(Case(label, plain, must_succeed=not kind["daemon"], **kind))
        for mode in ("closed", "full", "both-closed", "stdin-closed"):
            rest.append(Case(f"{label} | {mode}", plain, stdout=mode, **kind))
        for param in _value_params(command):
            for value_name, value in _values(param).items():
                rest.append(
                    Case(
                        f"{label} {param.name}={value_name}",
                        lambda s, w=words, c=command, p=param, v=value: _argv(w, c, s, (p, v(s))),
                        **kind,
                    )
                )
        for param in _value_params(cli):  # the global options: one value before every command, all before some
            values = list(_values(param).items())
            for value_name, value in values if words in ALL_GLOBAL_VALUES else values[:1]:
                rest.append(
                    Case(
                        f"nvc-py --{param.name}={value_name} {' '.join(words)}",
                        lambda s, w=words, c=command, p=param, v=value: _argv(w, c, s, None, (p, v(s))),
                        **kind,
                    )
                )
    return bases, rest


def test_every_nvc_py_command_and_option(active_2gpu, table_dir: Path) -> None:
    run_phases(nvc_py_cases, table_dir, active_2gpu.root)
