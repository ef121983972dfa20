"""Device nodes of a GPU request, and their OCI spec form (``linux.devices`` + device cgroup rules).

The runtime wrapper (:mod:`nvc.hook.oci.runtime`) and the CDI generator (:mod:`nvc.cdi`) put the
nodes in the spec itself, so that the runtime creates them and owns their cgroup rules: rules added
behind the runtime's back (by a hook) vanish on a systemd daemon-reload, the reference stack's
best-known failure. Which nodes a request needs is the pipeline's (:func:`nvc.pipeline.configure.device_nodes`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nvc.discover import nodes
from nvc.discover.nodes import DeviceNode
from nvc.plan import mountplan


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
