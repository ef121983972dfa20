"""A GPU's DRM nodes (``/dev/dri/cardN``, ``renderDN``), found by its PCI bus id through sysfs.

Graphics and display containers need them (Vulkan, EGL on GBM, X). The numbers N have nothing to
do with the GPU's minor (another card, a BMC's VGA, may come first), so they are read where the
kernel lists the DRM devices of each PCI device: ``/sys/bus/pci/devices/<busid>/drm/<name>/dev``.
A host without nvidia-drm loaded has no such directory: the GPU then has no DRM nodes, said in a
debug line. An entry that cannot be read is named in a warning and left out.
"""

from __future__ import annotations

import os
from pathlib import Path

from nvc.discover.nodes import NodeSpec
from nvc.discover.procfs import normalize_bus_id
from nvc.logger import Logger

log = Logger(__name__)

SYS_PCI_DEVICES = Path("/sys/bus/pci/devices")
DRM_PREFIXES = ("card", "renderD")


def sysfs_name(bus_id: str) -> str | None:
    """sysfs's name of a PCI device (``0000:3b:00.0``) for an NVML bus id (``00000000:3B:00.0``)."""
    normal = normalize_bus_id(bus_id)
    if normal is None:
        return None
    domain, rest = normal.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def _read_dev(path: Path) -> tuple[int, int] | None:
    """The ``major:minor`` a sysfs ``dev`` file says, None (with a warning naming it) if it cannot."""
    try:
        text = path.read_text()
    except OSError as err:
        log.warning("left out the DRM node of %s: %s", path, err.strerror or err)
        return None
    major, sep, minor = text.strip().partition(":")
    if not sep or not major.isdigit() or not minor.isdigit():
        log.warning("left out the DRM node of %s: %r is no major:minor", path, text.strip()[:40])
        return None
    return int(major), int(minor)


def gpu_nodes(bus_id: str, sysfs: Path = SYS_PCI_DEVICES) -> tuple[NodeSpec, ...]:
    """The card and render node specs of the GPU at ``bus_id``, card first; none without DRM."""
    name = sysfs_name(bus_id)
    drm = sysfs / (name or bus_id) / "drm"
    try:
        entries = sorted(os.listdir(drm))
    except FileNotFoundError:
        log.debug("%s: no DRM devices (nvidia-drm not loaded?): no /dev/dri nodes for GPU %s", drm, bus_id)
        return ()
    except OSError as err:
        log.warning("left out the DRM nodes of GPU %s: %s: %s", bus_id, drm, err.strerror or err)
        return ()
    specs = []
    for prefix in DRM_PREFIXES:
        for entry in entries:
            if not entry.startswith(prefix) or not entry[len(prefix) :].isdigit():
                continue
            number = _read_dev(drm / entry / "dev")
            if number is not None:
                specs.append(NodeSpec(f"/dev/dri/{entry}", number[0], number[1]))
    return tuple(specs)
