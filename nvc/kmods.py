"""``--load-kmods``: create the device nodes the loaded driver provides but ``<root>/dev`` lacks.

Without udev rules (containers, minimal hosts) the driver's nodes may not exist even
though the kernel module is loaded. Which nodes should exist is read from what the
kernel reports: majors from /proc/devices, GPU minors from /proc/driver/nvidia/gpus,
MIG capability minors from /proc/driver/nvidia-caps/mig-minors (only those whose
/proc access file exists, i.e. whose GPU or MIG instance is present). Modules are not
loaded here: nvc-py does not run modprobe.
"""

from __future__ import annotations

import logging
from pathlib import Path

from nvc import nodes, procfs
from nvc.nodes import NodeSpec

log = logging.getLogger(__name__)


def caps_access_path(name: str, proc: Path = procfs.PROC) -> Path:
    """The /proc access file of a mig-minors entry (``config``, ``gpu0/gi1/ci0/access`` …)."""
    if "/" not in name:
        return procfs.caps_dir(proc) / "mig" / name
    gpu, rest = name.split("/", 1)
    return procfs.caps_dir(proc) / gpu / "mig" / rest


def read_file_mode(path: Path) -> int | None:
    """``DeviceFileMode`` of a capability access file (decimal, as the driver writes it)."""
    for line in path.read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMode" and value.strip().isdigit():
            return int(value.strip()) & 0o777
    return None


def node_specs(majors: dict[str, int], gpu_minors: tuple[int, ...], mig_minors: dict[str, int], proc: Path) -> tuple[NodeSpec, ...]:
    """Every node the loaded driver provides."""
    specs = list(nodes.control_specs(majors))
    specs += [nodes.gpu_spec(majors, minor) for minor in gpu_minors]
    for name, minor in mig_minors.items():
        access = caps_access_path(name, proc)
        if not access.is_file():
            continue
        spec = nodes.caps_spec(majors, minor, read_file_mode(access) or 0o444)
        if spec is not None:
            specs.append(spec)
    return tuple(specs)


def load(root: str, proc: Path = procfs.PROC, proc_devices: Path = nodes.PROC_DEVICES) -> tuple[str, ...]:
    """Create the missing nodes under ``root``; host paths of those created."""
    majors = nodes.read_majors(proc_devices)
    if nodes.NVIDIA not in majors:
        log.debug("no '%s' major in %s: driver not loaded, no nodes to create", nodes.NVIDIA, proc_devices)
        return ()
    gpus = tuple(g.minor for g in procfs.read_gpus(proc))
    created = nodes.create_missing(root, node_specs(majors, gpus, procfs.read_mig_minors(proc), proc))
    log.debug("--load-kmods created %d device nodes under %s", len(created), root)
    return created
