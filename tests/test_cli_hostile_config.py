"""The configuration file's keys (from its NamedTuples) and NVC_PY_CONFIG set to hostile values, for every
command that reads the configuration.

The table, the rules and how each case runs: tests/harness/clihostile.py.

Test double: the GPUs are the fake driver's (tests/fakedriver); nothing here is a GPU result.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from harness.clihostile import (
    HOOK,
    NUMBER_VALUES,
    NVC_PY,
    PATH_VALUES,
    RUNTIME,
    Case,
    Scratch,
    run_phases,
    table_dir,  # noqa: F401  (fixture)
)
from harness.clihostile import hook_state as _state
from harness.clihostile import scratch_bundle as _bundle
from nvc import config as config_file

# ---- the configuration file ------------------------------------------------------------------------------

# Commands that read the configuration (the hook and the runtime with the base bundle: no GPU asked for).
CONFIG_READERS: dict[str, tuple[Callable[[Scratch], list[str | bytes]], bool]] = {
    "config show": (lambda s: [NVC_PY, "config", "show"], False),
    "list": (lambda s: [NVC_PY, "list"], False),
    "cdi generate": (lambda s: [NVC_PY, "cdi", "generate"], False),
    "k8s device-plugin": (
        lambda s: [NVC_PY, "k8s", "device-plugin", "--device-plugin-dir", s.path("device-plugins")],
        True,
    ),
    "hook prestart": (lambda s: [HOOK, "prestart"], False),
    "runtime create": (lambda s: [RUNTIME, "create", "--bundle", str(_bundle(s)), "ctr"], False),
}
SECTIONS = {"": config_file.Config, "sharing": config_file.Sharing, "k8s": config_file.K8s}


def _config_keys(kind: type) -> Iterator[tuple[str, str]]:
    """(section, key) of every setting whose default is of ``kind`` (a tuple: its entries')."""
    for section, fields in SECTIONS.items():
        for name, default in fields._field_defaults.items():
            if (
                isinstance(default, tuple)
                and default
                and not isinstance(default, (config_file.Sharing, config_file.K8s))
            ):
                default = default[0]
            if isinstance(default, kind) and not isinstance(default, bool):
                yield section, name.replace("_", "-")


def _config_with(scratch: Scratch, section: str, key: str, value: str) -> str:
    """The base configuration with ``key`` of ``section`` (the log's keys are log_file and log_level in
    :class:`~nvc.config.Config`, ``log: {file, level}`` in the file) set to ``value``."""
    if not section and key.startswith("log-"):
        section, key = "log", key.removeprefix("log-")
    top = {
        "load-kmods": "false",
        "runtimes": "[/bin/true]",
        "root": str(scratch.root),
        "log": f"{{file: {scratch.path('hook.log')}}}",
    }
    if section:
        top[section] = f"{{{key}: {value}}}"
    else:
        top[key] = value
    return "".join(f"{name}: {text}\n" for name, text in top.items())


def config_cases() -> tuple[list[Case], list[Case]]:
    texts: dict[str, Callable[[Scratch], str]] = {}
    for section, key in [*_config_keys(int), ("sharing", "device-sm-limit")]:
        is_list = isinstance(getattr(SECTIONS[section](), key.replace("-", "_")), tuple)
        for value_name in ("digits-5000", "digits-4000"):
            digits = NUMBER_VALUES[value_name]
            texts[f"{section or 'top'}.{key}={value_name}"] = lambda s, sec=section, k=key, d=digits, lst=is_list: (
                _config_with(s, sec, k, f"[{d(s)}]" if lst else str(d(s)))
            )
    for section, key in _config_keys(str):
        if not str(getattr(SECTIONS[section](), key.replace("-", "_"))).startswith("/"):
            continue  # not a path
        for value_name, value in PATH_VALUES.items():
            if value_name in ("newline", "not-utf8"):
                continue  # other YAML text than the path (the file is UTF-8)
            texts[f"{section or 'top'}.{key}={value_name}"] = lambda s, sec=section, k=key, v=value: _config_with(
                s, sec, k, json.dumps(v(s))
            )
    bases: list[Case] = []
    rest: list[Case] = []
    for reader, (argv, daemon) in CONFIG_READERS.items():
        bases.append(Case(f"{reader} (base configuration)", argv, stdin=_state, daemon=daemon, must_succeed=not daemon))
        for text_name, text in texts.items():

            def setup(s: Scratch, t: Callable[[Scratch], str] = text) -> None:
                s.config.write_text(t(s))

            rest.append(Case(f"{reader} with {text_name}", argv, stdin=_state, daemon=daemon, setup=setup))
        for value_name, value in PATH_VALUES.items():
            rest.append(
                Case(
                    f"{reader} with NVC_PY_CONFIG={value_name}",
                    argv,
                    stdin=_state,
                    daemon=daemon,
                    env=lambda s, v=value: {"NVC_PY_CONFIG": os.fsdecode(v(s))},
                )
            )
    return bases, rest


def test_configuration_values(active_2gpu, table_dir: Path) -> None:
    run_phases(config_cases, table_dir, active_2gpu.root)
