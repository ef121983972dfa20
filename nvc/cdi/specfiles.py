"""The CDI spec files nvc-py wrote, found where the engines read them, and their refresh after a driver
upgrade (``nvc-py cdi refresh``): a spec names the driver's files by their versioned paths, so one
written before the upgrade mounts files that are gone.

A spec is nvc-py's when its hooks run nvc-py's hook (as ``nvc-py cdi generate`` writes them); it is
regenerated as it was generated: its device names (by index or by UUID) and its hooks' environment
(the configuration file they read) are read from the spec itself, its format from its name. Pure
over what the caller discovers (``generate``): the files are written by the caller.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nvc.errors import InputError
from nvc.records import NamedTuple
from nvc.system import programs
from nvc.system.untrusted import read_file

MAX_SPEC = 16 << 20  # bytes of a spec file read

# (device name strategy, the hooks' environment) -> the spec ``cdi generate`` makes for them now
Generate = Callable[[str, list[str]], dict[str, Any]]


def read(path: str) -> Any:
    """A spec file's document (JSON where its name ends in .json, else YAML)."""
    raw, _ = read_file(path, MAX_SPEC)
    if path.endswith(".json"):
        try:
            return json.loads(raw)
        except ValueError as err:
            raise InputError(f"{path}: not valid JSON ({err})") from None
    import yaml

    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as err:
        raise InputError(f"{path}: not valid YAML ({err})") from None


def _hooks(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    edits = doc.get("containerEdits")
    hooks = edits.get("hooks", []) if isinstance(edits, dict) else []
    return (
        [h for h in hooks if isinstance(h, dict) and isinstance(h.get("path"), str)] if isinstance(hooks, list) else []
    )


def ours(doc: Any) -> bool:
    """Whether a spec document runs nvc-py's hook (``cdi generate`` wrote it)."""
    return isinstance(doc, dict) and any(programs.is_ours(h["path"]) for h in _hooks(doc))


def found(paths: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """(path, document) of each of ``paths`` that is nvc-py's; one that cannot be read is not."""
    specs = []
    for path in paths:
        try:
            doc = read(path)
        except (OSError, InputError):
            continue
        if ours(doc):
            specs.append((path, doc))
    return specs


class Refresh(NamedTuple):
    """What ``cdi refresh`` writes (path -> text) and what it leaves as it is (already today's)."""

    changed: dict[str, str]
    unchanged: list[str]


def _strategy(doc: Mapping[str, Any]) -> str:
    """How the spec names its devices: by UUID where any name is one, else by index."""
    devices = doc.get("devices") if isinstance(doc.get("devices"), list) else []
    names = [d.get("name") for d in devices if isinstance(d, dict)]
    return "uuid" if any(isinstance(n, str) and n.startswith(("GPU-", "MIG-")) for n in names) else "index"


def _hook_env(doc: Mapping[str, Any]) -> list[str]:
    """The environment its nvc-py hooks run with (the configuration file they read among it)."""
    for hook in _hooks(doc):
        env = hook.get("env")
        if programs.is_ours(hook["path"]) and isinstance(env, list) and all(isinstance(v, str) for v in env):
            return list(env)
    return programs.hook_env(None)


def refresh(specs: Sequence[tuple[str, dict[str, Any]]], generate: Generate) -> Refresh:
    """Each of nvc-py's ``specs`` made again as it was made (one discovery per kind of spec)."""
    from nvc import cdi

    made: dict[tuple[str, tuple[str, ...]], dict[str, Any]] = {}
    changed: dict[str, str] = {}
    unchanged: list[str] = []
    for path, doc in specs:
        key = (_strategy(doc), tuple(_hook_env(doc)))
        if key not in made:
            made[key] = generate(key[0], list(key[1]))
        if made[key] == doc:
            unchanged.append(path)
        else:
            changed[path] = cdi.render(made[key], "json" if path.endswith(".json") else "yaml")
    return Refresh(changed, unchanged)
