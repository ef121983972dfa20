"""The OCI side of the hook: the state a runtime passes on stdin and the bundle's ``config.json``.

Pure over the JSON text (the file reads are the only side effects), so what the hook decides
for a spec can be tested without starting a container.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping

from nvc.errors import SHOWN_LIMIT, InputError, one_line, shown
from nvc.records import NamedTuple

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CAP_SYS_ADMIN = "CAP_SYS_ADMIN"
# Annotations the kubelet's container runtimes put on a pod's containers (containerd's CRI, CRI-O): such a
# container's sharing limits are its pod's grant (nvc.plan.share.BOUNDS_FILE)
POD_ANNOTATIONS = ("io.kubernetes.cri.container-type", "io.kubernetes.cri-o.ContainerType")
MAX_STATE_SIZE = 4 << 20  # bytes: a state is an id, a pid, paths and the annotations
MAX_SPEC_SIZE = 64 << 20  # bytes: a spec with a large seccomp profile and environment stays far below
PID_MAX = 1 << 22  # the kernel's PID_MAX_LIMIT
# The container ids accepted: runc's own set (ASCII letters, digits, _ + , - .) without a leading
# punctuation character (no "-x" option look-alike, no "." or ".."), at most NAME_MAX characters,
# since an id names a directory. Docker, podman, CRI and containerd ids (64 hex digits, k8s-style
# names) and runc users' names all fit.
CONTAINER_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_+,.-]{0,254}")
# Members the hook and nvc-py-runtime read, with the JSON type each must have and, for arrays
# and objects, the type of their entries; in this order, a member's parent comes first.
_SHAPE: tuple[tuple[str, type, type | None], ...] = (
    ("ociVersion", str, None),
    ("process", dict, None),
    ("process.env", list, str),
    ("process.user", dict, None),
    ("process.capabilities", dict, None),
    ("process.capabilities.bounding", list, str),
    ("root", dict, None),
    ("root.path", str, None),
    ("mounts", list, dict),
    ("hooks", dict, list),
    ("hooks.prestart", list, dict),
    ("hooks.poststop", list, dict),
    ("linux", dict, None),
    ("linux.devices", list, dict),
    ("linux.resources", dict, None),
    ("linux.resources.devices", list, dict),
)
_REQUIRED = ("ociVersion", "process", "root")
_JSON_TYPES = {dict: "an object", list: "an array", str: "a string"}


class State(NamedTuple):
    """The OCI state of a container being created (runtime spec "State")."""

    id: str
    pid: int | None
    bundle: str


class Container(NamedTuple):
    """What the hook reads of a container's spec."""

    rootfs: str  # absolute host path (before pivot_root, as seen by a prestart hook)
    env: Mapping[str, str]
    mounts: tuple[Mapping[str, Any], ...]
    privileged: bool  # CAP_SYS_ADMIN in the bounding set, the toolkit's definition
    joined_mount_ns: str | None = None  # linux.namespaces' mount entry's path: another process's namespace
    uid: int | None = 0  # process.user.uid (in the container's user namespace); None: not a uid
    pod: bool = False  # a Kubernetes pod's container (POD_ANNOTATIONS)


def _described(value: Any) -> str:
    """A JSON value for an error message: scalars shown (cut), arrays and objects by their type."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, (int, float)):
        return one_line(repr(value), SHOWN_LIMIT)
    return "an object" if isinstance(value, dict) else "an array"


def _json(text: str | bytes, what: str, limit: int) -> Any:
    if len(text) > limit:
        raise InputError(f"{what}: larger than {limit} bytes")
    try:
        return json.loads(text)
    except RecursionError:
        raise InputError(f"{what}: not valid JSON (nested too deeply)") from None
    except ValueError as err:
        raise InputError(f"{what}: not valid JSON ({err})") from None


def _path_text(value: str) -> bool:
    """Whether ``value`` can name a file: no NUL, and bytes for every character."""
    try:
        value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return "\0" not in value


def _state(text: str | bytes) -> dict[str, Any]:
    doc = _json(text, "OCI state on stdin", MAX_STATE_SIZE)
    if not isinstance(doc, dict):
        raise InputError("OCI state on stdin: expected a JSON object")
    return doc


def _container_id(doc: dict[str, Any]) -> str:
    value = doc.get("id")
    if not isinstance(value, str) or not CONTAINER_ID.fullmatch(value):
        raise InputError(
            f"OCI state on stdin: invalid container id {_described(value)} (expected 1 to 255 "
            "ASCII letters, digits and _ + , - . starting with a letter, digit or _)"
        )
    return value


def _bundle(doc: dict[str, Any]) -> str:
    """The state's absolute bundle path (legacy runtimes name it ``bundlePath``), "" where it has none."""
    bundle = doc.get("bundle") or doc.get("bundlePath")
    return bundle if isinstance(bundle, str) and os.path.isabs(bundle) and _path_text(bundle) else ""


def stopped(text: str | bytes) -> tuple[str, str]:
    """The container id and bundle of a poststop state JSON ("" for a bundle that is absent or not
    an absolute path): a stopped container's state may hold no pid."""
    doc = _state(text)
    return _container_id(doc), _bundle(doc)


def parse_state(text: str | bytes) -> State:
    """The state JSON; legacy runtimes name the bundle ``bundlePath``. The id is checked before it
    names anything (a log line, a directory)."""
    doc = _state(text)
    bundle = _bundle(doc)
    if not bundle:
        raise InputError("OCI state on stdin: no absolute 'bundle' path")
    pid = doc.get("pid")
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < PID_MAX):
        raise InputError(f"OCI state on stdin: invalid pid {_described(pid)}")
    return State(id=_container_id(doc), pid=pid or None, bundle=bundle)


def _check_shape(doc: dict[str, Any], path: str) -> None:
    """Refuse members of the wrong JSON type, naming them; drop null optional members (null
    means absent in OCI), so that readers can rely on :data:`_SHAPE`."""
    for key in _REQUIRED:
        if key not in doc:
            raise InputError(f"{path}: no '{key}' in the OCI spec")
    for member, kind, entry in _SHAPE:
        parent_name, _, key = member.rpartition(".")
        parent: Any = doc
        for part in parent_name.split(".") if parent_name else ():
            parent = parent.get(part, {})
        if key not in parent:
            continue
        value = parent[key]
        if value is None and member not in _REQUIRED:
            del parent[key]
            continue
        if not isinstance(value, kind):
            raise InputError(f"{path}: {member}: expected {_JSON_TYPES[kind]}, got {_described(value)}")
        if entry is None:
            continue
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for name, item in items:
            if not isinstance(item, entry):
                where = f"[{name}]" if isinstance(name, int) else f"[{shown(name)}]"
                raise InputError(f"{path}: {member}{where}: expected {_JSON_TYPES[entry]}, got {_described(item)}")


def load_config(bundle: str) -> dict[str, Any]:
    """``<bundle>/config.json`` as a dict, checked for the members the hook and the runtime read.

    Read non-blocking and bounded: a FIFO or a huge file there is refused, not waited for.
    """
    from nvc.system.untrusted import read_file

    path = os.path.join(bundle, "config.json")
    try:
        raw, _ = read_file(path, MAX_SPEC_SIZE)
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror}") from None
    return parse_config(raw, path)


def parse_config(raw: str | bytes, path: str) -> dict[str, Any]:
    """The spec in ``raw`` (``path`` names it in errors), checked as :func:`load_config` says."""
    doc = _json(raw, path, MAX_SPEC_SIZE)
    if not isinstance(doc, dict):
        raise InputError(f"{path}: expected a JSON object")
    _check_shape(doc, path)
    return doc


def container(bundle: str, config: Mapping[str, Any]) -> Container:
    """The container described by ``config`` (a spec :func:`load_config` checked); relative root
    paths are bundle-relative."""
    from nvc.containerenv import parse_env

    root_path = config["root"].get("path")
    if not root_path or not _path_text(root_path):
        raise InputError(f"{bundle}/config.json: no root.path")
    rootfs = os.path.normpath(os.path.join(bundle, root_path))
    process = config["process"]
    bounding = process.get("capabilities", {}).get("bounding", [])
    return Container(
        rootfs=rootfs,
        env=parse_env(process.get("env", ())),
        mounts=tuple(config.get("mounts", ())),
        privileged=CAP_SYS_ADMIN in bounding,
        joined_mount_ns=_joined_mount_ns(config),
        uid=_uid(process.get("user", {}).get("uid", 0)),
        pod=_pod(config.get("annotations")),
    )


def _pod(annotations: Any) -> bool:
    return isinstance(annotations, dict) and any(name in annotations for name in POD_ANNOTATIONS)


def _uid(value: Any) -> int | None:
    """A user id of the spec; None for anything else (the runtime refuses it; MPS needs the uid)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 32 else None


def _joined_mount_ns(config: Mapping[str, Any]) -> str | None:
    """The path of the mount namespace the spec joins (``linux.namespaces``: a mount entry with a
    path), None where the container gets one of its own."""
    linux = config.get("linux")
    namespaces = linux.get("namespaces") if isinstance(linux, dict) else None
    for entry in namespaces if isinstance(namespaces, list) else ():
        if isinstance(entry, dict) and entry.get("type") == "mount" and entry.get("path"):
            return str(entry["path"])
    return None
