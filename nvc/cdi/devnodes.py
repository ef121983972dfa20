"""Device nodes of a GPU request, and their OCI spec form (``linux.devices`` + device cgroup rules).

The runtime wrapper (:mod:`nvc.hook.oci.runtime`) and the CDI generator (:mod:`nvc.cdi`) put the
nodes in the spec itself, so that the runtime creates them and owns their cgroup rules: rules added
behind the runtime's back (by a hook) vanish on a systemd daemon-reload, the reference stack's
best-known failure. Which nodes a request needs is the pipeline's (:func:`nvc.pipeline.configure.device_nodes`).
Rules in the spec survive a reload only where systemd was told of them: runc (1.1, systemd cgroup
driver) names each as ``DeviceAllow=/dev/char/MAJOR:MINOR`` and skips a node whose link is missing,
and udev makes none for the nodes nvidia-modprobe makes, hence :func:`char_links`
(tests/test_systemd_reload.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from nvc.discover import nodes
from nvc.discover.nodes import DeviceNode
from nvc.plan import mountplan

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CHAR_DIR = "/dev/char"  # udev's MAJOR:MINOR links to character devices


def find_all(root: str, specs: Iterable[nodes.NodeSpec]) -> list[DeviceNode]:
    """The nodes of ``specs`` present under ``root`` (a node with a wrong number is an error)."""
    return [n for n in (nodes.find(root, s) for s in specs) if n is not None]


def spec_device(root: str, node: DeviceNode) -> dict[str, Any]:
    """A CDI ``deviceNodes`` entry; without ``hostPath`` also an OCI ``linux.devices`` one."""
    return {
        "path": mountplan.inner_path(root, node.path),
        "hostPath": node.path,
        "type": "c",
        "major": node.major,
        "minor": node.minor,
        "fileMode": 0o666,
        "uid": 0,
        "gid": 0,
    }


def add_to_spec(spec: dict[str, Any], root: str, found: Iterable[DeviceNode]) -> bool:
    """Add ``found`` to ``spec``'s devices and allow them rw in its device cgroup; False if nothing was new."""
    linux = spec.setdefault("linux", {})
    devices = linux.setdefault("devices", [])
    rules = linux.setdefault("resources", {}).setdefault("devices", [])
    have = {d.get("path") for d in devices}
    changed = False
    for node in found:
        entry = spec_device(root, node)
        del entry["hostPath"]
        if entry["path"] in have:
            continue
        devices.append(entry)
        rules.append({"allow": True, "type": "c", "major": node.major, "minor": node.minor, "access": "rw"})
        have.add(entry["path"])
        changed = True
    return changed


def spec_nodes(doc: Mapping[str, Any]) -> list[DeviceNode]:
    """The host's character nodes a CDI spec of nvc-py's names (``deviceNodes`` of its common edits
    and of each device), once each: an engine puts them in its containers' specs."""
    devices = doc.get("devices")
    edits = [
        doc.get("containerEdits"),
        *(d.get("containerEdits") for d in (devices if isinstance(devices, list) else []) if isinstance(d, Mapping)),
    ]
    found = {}
    for edit in edits:
        entries = edit.get("deviceNodes") if isinstance(edit, Mapping) else None
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, Mapping):
                continue
            path, major, minor = entry.get("hostPath", entry.get("path")), entry.get("major"), entry.get("minor")
            if (
                entry.get("type", "c") == "c"
                and isinstance(path, str)
                and isinstance(major, int)
                and isinstance(minor, int)
            ):
                found[path] = DeviceNode(path, major, minor)
    return list(found.values())


def char_links(found: Iterable[DeviceNode], char_dir: str = CHAR_DIR) -> list[str]:
    """The ``char_dir/MAJOR:MINOR`` link made for each node of ``/dev`` in ``found`` that has none, so
    that runc passes its rule on to systemd (module docstring); what could not be made, one line each.
    Nodes outside ``/dev`` (a driver root elsewhere) are left alone: runc's links are the host's."""
    wanted = {os.path.join(char_dir, f"{n.major}:{n.minor}"): n.path for n in found if n.path.startswith("/dev/")}
    if not wanted:
        return []
    try:
        os.makedirs(char_dir, mode=0o755, exist_ok=True)
    except OSError as err:
        return [f"cannot make {char_dir}: {err.strerror}"]
    failed = []
    for link, target in wanted.items():
        try:
            os.symlink(target, link)
        except FileExistsError:
            continue  # udev's, or an earlier start's: the same device either way
        except OSError as err:
            failed.append(f"cannot make {link}: {err.strerror}")
    return failed
