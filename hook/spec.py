"""The OCI side of the hook: the state a runtime passes on stdin and the bundle's ``config.json``.

Pure over the JSON text (the file reads are the only side effects), so what the hook decides
for a spec can be tested without starting a container.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nvc.errors import InputError

CAP_SYS_ADMIN = "CAP_SYS_ADMIN"


@dataclass(frozen=True)
class State:
    """The OCI state of a container being created (runtime spec "State")."""

    id: str
    pid: int | None
    bundle: str


@dataclass(frozen=True)
class Container:
    """What the hook reads of a container's spec."""

    rootfs: str  # absolute host path (before pivot_root, as seen by a prestart hook)
    env: Mapping[str, str]
    mounts: tuple[Mapping[str, Any], ...]
    privileged: bool  # CAP_SYS_ADMIN in the bounding set, the toolkit's definition
    annotations: Mapping[str, str] = field(default_factory=dict)


def parse_state(text: str | bytes) -> State:
    """The state JSON; legacy runtimes name the bundle ``bundlePath``."""
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise InputError(f"OCI state on stdin: not valid JSON ({err})") from None
    if not isinstance(doc, dict):
        raise InputError("OCI state on stdin: expected a JSON object")
    bundle = doc.get("bundle") or doc.get("bundlePath")
    if not isinstance(bundle, str) or not os.path.isabs(bundle):
        raise InputError("OCI state on stdin: no absolute 'bundle' path")
    pid = doc.get("pid")
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0):
        raise InputError(f"OCI state on stdin: invalid pid {pid!r}")
    return State(id=str(doc.get("id", "")), pid=pid or None, bundle=bundle)


def load_config(bundle: str) -> dict[str, Any]:
    """``<bundle>/config.json`` as a dict, checked for the members the hook reads."""
    path = os.path.join(bundle, "config.json")
    try:
        with open(path, "rb") as f:
            doc = json.load(f)
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror}") from None
    except ValueError as err:
        raise InputError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}: expected a JSON object")
    for key in ("ociVersion", "process", "root"):
        if key not in doc:
            raise InputError(f"{path}: no '{key}' in the OCI spec")
    return doc


def container(bundle: str, config: Mapping[str, Any]) -> Container:
    """The container described by ``config`` (the bundle's spec); relative root paths are bundle-relative."""
    from nvc.hook.request import parse_env

    root = config.get("root") or {}
    root_path = root.get("path") if isinstance(root, dict) else None
    if not isinstance(root_path, str) or not root_path:
        raise InputError(f"{bundle}/config.json: no root.path")
    rootfs = os.path.normpath(os.path.join(bundle, root_path))
    process = config.get("process") or {}
    bounding = ((process.get("capabilities") or {}).get("bounding")) or []
    mounts = tuple(m for m in config.get("mounts") or () if isinstance(m, dict))
    return Container(
        rootfs=rootfs,
        env=parse_env(e for e in process.get("env") or () if isinstance(e, str)),
        mounts=mounts,
        privileged=CAP_SYS_ADMIN in bounding,
        annotations=dict(config.get("annotations") or {}),
    )
